"""Are two ablation runs the same, round by round? For a change that must not touch learning.

    python bench/ablation.py --setting lora ... --out runs/before   # at the commit before
    python bench/ablation.py --setting lora ... --out runs/after    # at the commit after
    python bench/ablation_diff.py runs/before/ablation.json runs/after/ablation.json

Compares every member's accuracies before and after, its curve, and every field of every
round's record, except what the clock measures (timings, peer_age_s, tokens_per_s). A field
only one run records (a metric added between them) is named, not compared. Runs of two machines
compare too (the presets ship built): the first round named is where they part, which is how a
difference between machines is traced (docs/figures.md, "MKL's branch follows the CPU's maker").
Either file may instead be one run's file from a `--runs` store (DIR/runs/SETTING-...-seedN-*.json),
so one seed re-run under new code compares with the same seed of a larger table.
Exit 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from swarmnode.lab.fingerprint import CLOCK_FIELDS

MEMBER_FIELDS = ("label", "before", "after", "curve", "time_matched_at")
SHOWN = 20  # differences printed; the rest are counted


def differences(before: dict, after: dict, one_sided: set[str] | None = None) -> tuple[int, list[str]]:
    """(rounds compared, the differences found, each a line); the round fields only one run
    records go into `one_sided`."""
    found: list[str] = []
    one_sided = set() if one_sided is None else one_sided
    rounds = 0
    if len(before["runs"]) != len(after["runs"]):
        return 0, [f"{len(before['runs'])} runs against {len(after['runs'])}"]
    for run_a, run_b in zip(before["runs"], after["runs"]):
        where = f"{run_a['condition']} seed {run_a['seed']}"
        for member_a, member_b in zip(run_a["members"], run_b["members"], strict=True):
            for key in MEMBER_FIELDS:
                if member_a.get(key) != member_b.get(key):
                    found.append(f"{where} {member_a['label']} {key}: {member_a.get(key)} -> {member_b.get(key)}")
            if len(member_a["rounds"]) != len(member_b["rounds"]):
                found.append(f"{where} {member_a['label']}: {len(member_a['rounds'])} rounds -> {len(member_b['rounds'])}")
            for a, b in zip(member_a["rounds"], member_b["rounds"]):
                rounds += 1
                one_sided |= (a.keys() ^ b.keys()) - CLOCK_FIELDS
                for key in sorted((a.keys() & b.keys()) - CLOCK_FIELDS):
                    if a.get(key) != b.get(key):
                        found.append(f"{where} {member_a['label']} round {a['round']} {key}: {a.get(key)} -> {b.get(key)}")
    return rounds, found


def load(path: Path) -> dict:
    """An ablation's records, or one run's file of its store as records of that one run."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"{path}: not an ablation's records or a run's file ({err})") from None
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        return data
    if isinstance(data, dict) and isinstance(data.get("members"), list):
        return {"runs": [data]}
    raise SystemExit(f"{path}: neither an ablation's records (ablation.json) nor one run's file of its store")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--shown", type=int, default=SHOWN, help=f"differences printed, the rest counted (default {SHOWN})")
    args = parser.parse_args()
    one_sided: set[str] = set()
    rounds, found = differences(load(args.before), load(args.after), one_sided)
    for line in found[:args.shown]:
        print(line)
    if len(found) > args.shown:
        print(f"... and {len(found) - args.shown} more")
    if one_sided:
        print(f"recorded by one run only, not compared: {', '.join(sorted(one_sided))}")
    print(f"{rounds} rounds compared, {len(found)} differences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
