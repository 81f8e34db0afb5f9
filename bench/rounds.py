"""A member's rounds in a saved table: what it generated and whose samples it took, round by round.

    python bench/rounds.py OUT/ablation.json --member tiny                    # a line a seed
    python bench/rounds.py OUT/ablation.json --member tiny --seed 16 --upto 30   # a line a round

A table's gains say how a member did; its rounds say why. A line a seed: the rounds it ran, in
how many of them it generated its whole batch (every peer read as far, or none offering), and
the samples it trained on from each peer over the run. A line a round: its own samples, the
samples it took from each peer, the farthest peer's likelihood gap and the peers' reward lead
(swarmnode/loop/share.py reads both). That is how "A near peer shut out" in docs/figures.md was
found: a member that generated its whole batch for most of a run beside its own LoRA copy.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from swarmnode.lab.ablation import ALONE, ConditionRun
from swarmnode.lab.table_pairs import read_table


def whole_batch(saved: dict) -> int:
    """Samples in a whole batch of the table's shape: prompts a round times the group size."""
    return saved["shape"]["prompts_per_round"] * saved["shape"]["group_size"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", type=Path, help="an ablation.json (bench/ablation.py --out)")
    parser.add_argument("--member", required=True, help="the member's label")
    parser.add_argument("--condition", default=None, help="the condition (default: the table's one besides alone)")
    parser.add_argument("--seed", type=int, default=None, help="a line a round of this seed's run")
    parser.add_argument("--upto", type=int, default=None, help="the first rounds only (default: all)")
    args = parser.parse_args()
    try:
        saved, runs = read_table(args.table)
    except ValueError as error:
        raise SystemExit(str(error)) from error
    held = sorted({r.condition for r in runs} - {ALONE})
    condition = args.condition or (held[0] if len(held) == 1 else None)
    if condition not in held:
        raise SystemExit(f"name a condition with --condition: the table holds {held}")
    chosen: list[ConditionRun] = [r for r in runs if r.condition == condition and (args.seed is None or r.seed == args.seed)]
    members = [(run.seed, m) for run in chosen for m in run.members if m.label == args.member]
    if not members:
        raise SystemExit(f"no run of {args.member} under {condition}" + (f" at seed {args.seed}" if args.seed is not None else ""))
    whole = whole_batch(saved)
    print(f"{args.member} under {condition} (a whole batch: {whole} samples)")
    for seed, member in sorted(members, key=lambda pair: pair[0]):
        rounds = member.rounds[:args.upto]
        if args.seed is None:
            taken: Counter[str] = Counter()
            for record in rounds:
                taken.update(record.samples_by_peer or {})
            generated_whole = sum(record.own_samples >= whole for record in rounds)
            print(f"seed {seed:>3}: {len(rounds):>4} rounds, {generated_whole:>4} generating its whole batch; "
                  f"taken from peers: {dict(sorted(taken.items()))}")
            continue
        for record in rounds:
            gap = "-" if record.likelihood_gap is None else f"{record.likelihood_gap:.2f}"
            lead = "-" if record.reward_lead is None else f"{record.reward_lead:+.3f}"
            print(f"round {record.round:>4}: own {record.own_samples:>4}, farthest gap {gap:>5}, lead {lead:>6}, "
                  f"taken {dict(sorted((record.samples_by_peer or {}).items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
