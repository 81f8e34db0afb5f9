"""Does a member gain differently in two tables? Paired by seed, alone's noise cancelled.

    python bench/ablation.py --setting swarm4 ... --runs RUNS --out out4   # two tables, one run store
    python bench/ablation.py --setting swarm5 ... --runs RUNS --out out5
    python bench/tables_paired.py out4/ablation.json out5/ablation.json --split 10

For every member both tables hold: its gain against alone in each (mean (SE) over seeds), and
the second's minus the first's seed by seed, with its 95 % interval and two-sided p (Student's t).
Read against the same alone runs, that difference is the member's accuracy in the one setting
minus the other, so alone's noise, which both gains carry, drops out (swarmnode/lab/table_pairs.py).

With --split S the seeds below S and from S on are shown apart, and for each table the draw from
S on against the draw below it, unpaired (Welch): whether a table's untuned seeds read differently
from the ones it was tuned on, and how much of that the other table's same seeds read too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from swarmnode.lab.ablation import ALONE, Gain, paired_gains, run_from_json
from swarmnode.lab.table_pairs import Difference, paired, seed_differences, welch
from swarmnode.lab.verdicts import verdict


def load(path: Path) -> tuple[dict, list]:
    """A table's saved header and its runs."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"cannot read {path}: {error}") from error
    return saved, [run_from_json(r) for r in saved["runs"]]


def alone_matches(here: list, there: list) -> bool:
    """Whether every alone run both tables hold is the same run (the same curve)."""
    mine = {(r.seed, m.label): m.curve for r in here if r.condition == ALONE for m in r.members}
    theirs = {(r.seed, m.label): m.curve for r in there if r.condition == ALONE for m in r.members}
    return all(mine[key] == theirs[key] for key in mine.keys() & theirs.keys())


def shown(d: Difference) -> str:
    low, high = d.interval
    return f"{d.mean:+.3f} ({d.se:.3f}) [{low:+.3f}, {high:+.3f}] p {d.p:.3f}"


def gain_of(gain: Gain, seeds: range | None) -> str:
    values = [g for seed, g in gain.by_seed if seeds is None or seed in seeds]
    if len(values) < 2:
        return "-"
    judged = verdict(values)
    return f"{judged.mean:+.3f} ({judged.se:.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("here", type=Path, help="the first table's ablation.json")
    parser.add_argument("there", type=Path, help="the second table's ablation.json: differences are there - here")
    parser.add_argument("--condition", default=None, help="the condition compared (default: the one both tables hold)")
    parser.add_argument("--split", type=int, default=None, help="show the seeds below S and from S on apart")
    args = parser.parse_args()
    (head_a, runs_a), (head_b, runs_b) = load(args.here), load(args.there)
    if head_a["shape"] != head_b["shape"]:
        raise SystemExit(f"{args.there} is another shape than {args.here}: its gains are not the same member's")
    conditions = ({r.condition for r in runs_a} & {r.condition for r in runs_b}) - {ALONE}
    if args.condition is None and len(conditions) != 1:
        raise SystemExit(f"the tables share {sorted(conditions) or 'no condition'}: name one with --condition")
    condition = args.condition or conditions.pop()
    match = head_a["shape"].get("match", "step")
    gains_a = {g.label: g for g in paired_gains(runs_a, match=match) if g.condition == condition}
    gains_b = {g.label: g for g in paired_gains(runs_b, match=match) if g.condition == condition}
    labels = [label for label in gains_a if label in gains_b]
    if not labels:
        raise SystemExit(f"no member holds {condition} in both tables")
    print(f"here: {head_a['setting']['name']} (records {head_a.get('records', '?')}), "
          f"there: {head_b['setting']['name']} (records {head_b.get('records', '?')}), {condition}, {match}-matched")
    print("alone: the same runs in both" if alone_matches(runs_a, runs_b)
          else "alone: other runs in each table, so alone's noise does not cancel")
    seed_sets: list[tuple[str, range | None]] = [("all", None)]
    if args.split is not None:
        seed_sets += [(f"< {args.split}", range(0, args.split)), (f">= {args.split}", range(args.split, 1 << 30))]
    print(f"\n{'member':<12} {'seeds':<7} {'gain here':<16} {'gain there':<16} there - here, paired: mean (SE) [95 %] p")
    for label in labels:
        for name, seeds in seed_sets:
            differences = seed_differences(gains_a[label], gains_b[label], seeds)
            diff = shown(paired(differences)) if len(differences) > 1 else "-"
            print(f"{label:<12} {name:<7} {gain_of(gains_a[label], seeds):<16} {gain_of(gains_b[label], seeds):<16} "
                  f"{diff} ({len(differences)} seeds)")
    if args.split is not None:
        print(f"\nseeds from {args.split} on against below, unpaired (Welch): mean (SE) [95 %] p")
        for label in labels:
            cut = args.split
            parts = []
            for name, gain in (("here", gains_a[label]), ("there", gains_b[label])):
                low = [g for seed, g in gain.by_seed if seed < cut]
                high = [g for seed, g in gain.by_seed if seed >= cut]
                parts.append(f"{name} {shown(welch(low, high))}" if len(low) > 1 and len(high) > 1 else f"{name} -")
            both = seed_differences(gains_a[label], gains_b[label])
            low = [d for seed, d in both.items() if seed < cut]
            high = [d for seed, d in both.items() if seed >= cut]
            parts.append(f"there - here {shown(welch(low, high))}" if len(low) > 1 and len(high) > 1 else "there - here -")
            print(f"{label:<12} " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
