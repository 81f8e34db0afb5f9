"""Does a member gain differently in two tables? Paired by seed, alone's noise cancelled.

    python bench/ablation.py --setting swarm4 ... --runs RUNS --out out4   # two tables, one run store
    python bench/ablation.py --setting swarm5 ... --runs RUNS --out out5
    python bench/tables_paired.py out4/ablation.json out5/ablation.json --split 10

For every member both tables hold, on the seeds both ran: its gain against alone in each (mean
(SE) over those seeds), and the second's minus the first's seed by seed, with its 95 % interval
and two-sided p (Student's t). Read against the same alone runs (the bench says whether they
were), that difference is the member's accuracy in the one setting minus the other, so alone's
noise, which both gains carry, drops out (swarmnode/lab/table_pairs.py).

With --split S the seeds below S and from S on are shown apart, and for each table the draw from
S on against the draw below it, unpaired (Welch): whether a table's untuned seeds read differently
from the ones it was tuned on, and how much of that the other table's same seeds read too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from swarmnode.lab.ablation import paired_gains
from swarmnode.lab.table_pairs import (
    Difference,
    conditions_compared,
    mismatch,
    paired,
    read_table,
    same_alone,
    seed_differences,
    welch,
)
from swarmnode.lab.verdicts import verdict


def shown(d: Difference) -> str:
    if d.se == 0:
        return f"{d.mean:+.3f}, the same on every seed"
    low, high = d.interval
    return f"{d.mean:+.3f} ({d.se:.3f}) [{low:+.3f}, {high:+.3f}] p {d.p:.3f}"


def mean_se(values: list[float]) -> str:
    if len(values) < 2:
        return "-"
    judged = verdict(values)
    return f"{judged.mean:+.3f} ({judged.se:.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("here", type=Path, help="the first table's ablation.json")
    parser.add_argument("there", type=Path, help="the second table's ablation.json: differences are there - here")
    parser.add_argument("--condition", nargs="+", metavar="NAME", default=None,
                        help="the condition compared: one for both tables, or the first's then the second's "
                             "(default: the one both hold)")
    parser.add_argument("--split", type=int, default=None, help="show the seeds below S and from S on apart")
    args = parser.parse_args()
    if args.condition is not None and len(args.condition) > 2:
        parser.error("--condition takes one name, or two (the first table's, then the second's)")
    try:
        (head_a, runs_a), (head_b, runs_b) = read_table(args.here), read_table(args.there)
        differ = mismatch(head_a, head_b)
        if differ:
            raise ValueError(f"{args.there} did not run the same members on the same shape as {args.here}: " + "; ".join(differ))
        condition_a, condition_b = conditions_compared(runs_a, runs_b, args.condition)
    except ValueError as error:
        raise SystemExit(str(error)) from error
    match = head_a["shape"].get("match", "step")
    gains_a = {g.label: g for g in paired_gains(runs_a, match=match) if g.condition == condition_a}
    gains_b = {g.label: g for g in paired_gains(runs_b, match=match) if g.condition == condition_b}
    labels = [label for label in gains_a if label in gains_b]
    seeds = {label: sorted(dict(gains_a[label].by_seed).keys() & dict(gains_b[label].by_seed).keys()) for label in labels}
    if not any(len(s) > 1 for s in seeds.values()):
        raise SystemExit("no member has two seeds or more that both tables ran")
    conditions = condition_a if condition_a == condition_b else f"{condition_a} against {condition_b}"
    print(f"here: {head_a['setting']['name']} (records {head_a.get('records', '?')}), "
          f"there: {head_b['setting']['name']} (records {head_b.get('records', '?')}), {conditions}, {match}-matched")
    keys = {(seed, label) for label in labels for seed in seeds[label]}
    print("alone: the same runs in both, so alone's noise cancels" if same_alone(runs_a, runs_b, keys)
          else "alone: other runs in the two tables, so alone's noise does not cancel from the differences")
    parts: list[tuple[str, Callable[[int], bool]]] = [("all", lambda seed: True)]
    if args.split is not None:
        cut = args.split
        parts += [(f"< {cut}", lambda seed: seed < cut), (f">= {cut}", lambda seed: seed >= cut)]
    print("\nseeds both tables ran; gains against alone, then there - here paired by seed: mean (SE) [95 %] p")
    print(f"{'member':<12} {'seeds':<7} {'gain here':<16} {'gain there':<16} there - here")
    for label in labels:
        here, there = dict(gains_a[label].by_seed), dict(gains_b[label].by_seed)
        for name, chosen in parts:
            picked = [seed for seed in seeds[label] if chosen(seed)]
            differences = seed_differences(gains_a[label], gains_b[label], picked)
            diff = shown(paired(differences)) if len(differences) > 1 else "-"
            print(f"{label:<12} {name:<7} {mean_se([here[s] for s in picked]):<16} {mean_se([there[s] for s in picked]):<16} "
                  f"{diff} ({len(picked)} seeds)")
    if args.split is not None:
        print(f"\nseeds from {args.split} on against below, unpaired (Welch): mean (SE) [95 %] p")
        for label in labels:
            here, there = dict(gains_a[label].by_seed), dict(gains_b[label].by_seed)
            both = seed_differences(gains_a[label], gains_b[label])
            rows = []
            for name, values in (("here", here), ("there", there), ("there - here", both)):
                low = [values[s] for s in seeds[label] if s < args.split]
                high = [values[s] for s in seeds[label] if s >= args.split]
                rows.append(f"{name} {shown(welch(low, high))}" if len(low) > 1 and len(high) > 1 else f"{name} -")
            print(f"{label:<12} " + "; ".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
