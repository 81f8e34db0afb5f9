"""Pool the printed output of `bench/attacks.py probation-crowd` runs over disjoint seeds.

Ten seeds of the late newcomer take 25 min on a core, so seeds 0-9 and 10-19 run apart (one a
core, `--first-seed 10` for the second). This reads what each run printed and prints what one
run over all their seeds would have judged: accuracy with the crowd minus without, paired by
seed, per node and as a and b's mean (Student's t, swarmnode.lab.verdicts, margin 0.03), the
rounds until the late node and the node there first taught each other, and until f first taught
a node (median, most, never).

    python bench/attacks.py probation-crowd ... --seeds 10 > first.txt
    python bench/attacks.py probation-crowd ... --seeds 10 --first-seed 10 > second.txt
    python bench/crowd_seeds.py first.txt second.txt

The runs must be of one command but for their seeds; a seed printed twice is refused.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
from pathlib import Path

from swarmnode.lab.verdicts import NON_INFERIORITY_MARGIN, verdict

NODES = ("a", "b")
NODE_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([ab])\s+\d+\s+\d+\s.*\s(\d\.\d+)->(\d\.\d+)\s+[\d.]+\s*$")
LATE_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([ab])\s+(\d+|-)\s+(\d+|-)\s*$")
FAR_ROW = re.compile(r"^\s*(\d+)((?:\s+(?:\d+|-),\s+(?:\d+|-))+)\s*$")


class Pooled:
    """What the runs printed, keyed by (seed, identities, node)."""

    def __init__(self) -> None:
        self.after: dict[tuple[int, int, str], float] = {}
        self.waited: dict[tuple[int, int, str], float] = {}  # rounds after b joined (inf: never)
        self.far_taught: dict[tuple[int, int, str], float] = {}  # a's round f first taught (inf: never)
        self.cells: list[int] = []

    def read(self, text: str, source: str) -> None:
        seen: set[tuple[int, int, str]] = set()
        section = "nodes"
        for line in text.splitlines():
            if line.startswith("b joins at a's round"):
                section = "late"
            elif line.startswith("the round (a's) the far peer"):
                section = "far"
            elif line.startswith("seed ") and section == "far":
                self.cells = [int(k) for k in re.findall(r"(\d+) ids", line)]
            elif section == "nodes" and (m := NODE_ROW.match(line)):
                key = (int(m[1]), int(m[2]), m[3])
                if key in self.after:
                    raise SystemExit(f"{source}: seed {key[0]} ({key[1]} identities, node {key[2]}) is in another file too")
                self.after[key] = float(m[5])
                seen.add(key)
            elif section == "late" and (m := LATE_ROW.match(line)):
                self.waited[int(m[1]), int(m[2]), m[3]] = math.inf if m[5] == "-" else float(m[5])
            elif section == "far" and (m := FAR_ROW.match(line)):
                pairs = re.findall(r"(\d+|-),\s+(\d+|-)", m[2])
                for identities, pair in zip(self.cells, pairs):
                    for name, at in zip(NODES, pair):
                        self.far_taught[int(m[1]), identities, name] = math.inf if at == "-" else float(at)
        if not seen:
            raise SystemExit(f"{source}: no probation-crowd rows (is it that bench's output?)")

    def seeds(self) -> list[int]:
        return sorted({seed for seed, _, _ in self.after})


def median_most_never(found: list[float]) -> str:
    finite = [r for r in found if not math.isinf(r)]
    most = f"{max(finite):.0f}" if finite else "-"
    return (f"median {statistics.median(found):.1f}, most finite {most}, "
            f"never {sum(math.isinf(r) for r in found)} of {len(found)}")


def report(pooled: Pooled) -> None:
    seeds = pooled.seeds()
    crowds = sorted({k for _, k, _ in pooled.after if k})
    missing = [(s, k, n) for s in seeds for k in [0, *crowds] for n in NODES if (s, k, n) not in pooled.after]
    if missing:
        raise SystemExit(f"rows missing, e.g. seed {missing[0][0]} with {missing[0][1]} identities, node {missing[0][2]}")
    print(f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}), pooled from the runs' printed rows")
    print(f"accuracy with the crowd - without it, paired by seed: mean (SE), one-sided 95 % lower bound "
          f"(Student's t, {len(seeds) - 1} df); non-inferior: bound >= -{NON_INFERIORITY_MARGIN}")
    for k in crowds:
        for name in NODES:
            print(f"  {k} identities, node {name}: {verdict([pooled.after[s, k, name] - pooled.after[s, 0, name] for s in seeds]).against_margin()}")
        means = [statistics.mean(pooled.after[s, k, n] - pooled.after[s, 0, n] for n in NODES) for s in seeds]
        print(f"  {k} identities, a and b's mean a seed: {verdict(means).against_margin()}")
    for label, found in (("rounds after b joined until the other honest node first taught", pooled.waited),
                         ("a's round f first taught a node", pooled.far_taught)):
        if found:
            print(label)
            for k in [0, *crowds]:
                print(f"  {k} identities: {median_most_never([found[s, k, n] for s in seeds for n in NODES])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outputs", nargs="+", type=Path, help="what each probation-crowd run printed")
    args = parser.parse_args()
    pooled = Pooled()
    for path in args.outputs:
        pooled.read(path.read_text(), str(path))
    report(pooled)


if __name__ == "__main__":
    main()
