"""What a table's runs computed, as one digest that two machines can compare.

A table re-run on another machine should print the same numbers (docs/figures.md, "Reproducible
on another machine"), but printed figures are rounded: two machines whose runs part in the last
bits of round 80 print the same table or one 0.001 apart. The digest covers every field of every
round's record except what the clock measures, so equal digests mean equal runs to the bit, and
a line in docs/figures.md is enough to check a re-run against; `bench/ablation_diff.py` then
names the first round where two runs part.
"""

from __future__ import annotations

import hashlib
import json

CLOCK_FIELDS = frozenset({"timings", "peer_age_s", "tokens_per_s"})  # round fields the clock measures


def without_clock(run: dict) -> dict:
    """A run (as its JSON) with the clock's fields left out of every member's round records."""
    members = [{**member, "rounds": [{key: value for key, value in record.items() if key not in CLOCK_FIELDS}
                                     for record in member["rounds"]]}
               for member in run["members"]]
    return {**run, "members": members}


def records_digest(runs: list[dict]) -> str:
    """sha256 (16 hex digits) of the runs' records, the clock's fields left out, in the order given."""
    canonical = json.dumps([without_clock(run) for run in runs], sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
