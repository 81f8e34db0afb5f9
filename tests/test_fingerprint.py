"""A table's records digest (swarmnode/lab/fingerprint.py) tells two computations apart and
nothing else: the clock's fields move between machines and between runs, the rest must not."""

import copy

from swarmnode.lab.fingerprint import CLOCK_FIELDS, records_digest

RUN = {
    "condition": "f-tis", "accounting": "shared", "seed": 3,
    "members": [{
        "label": "tiny", "before": 0.415, "after": 0.62, "curve": [[0, 0, 0.415], [100, 9000, 0.62]],
        "rounds": [{"round": 0, "loss": 0.25, "reward_mean": 0.5, "timings": {"train": 0.1}, "peer_age_s": 1.5,
                    "tokens_per_s": 800.0}],
        "time_matched_at": None, "budget_rounds": {},
    }],
}


def test_the_clock_does_not_move_the_digest():
    timed_otherwise = copy.deepcopy(RUN)
    record = timed_otherwise["members"][0]["rounds"][0]
    record.update(timings={"train": 9.9}, peer_age_s=0.0, tokens_per_s=1.0)
    assert set(record) >= CLOCK_FIELDS
    assert records_digest([timed_otherwise]) == records_digest([RUN])


def test_any_computed_field_moves_it():
    base = records_digest([RUN])
    for change in (lambda r: r["members"][0]["rounds"][0].update(loss=0.25 + 1e-12),
                   lambda r: r["members"][0].update(after=0.621),
                   lambda r: r["members"][0]["curve"].append([50, 4000, 0.5]),
                   lambda r: r.update(seed=4)):
        changed = copy.deepcopy(RUN)
        change(changed)
        assert records_digest([changed]) != base
    assert records_digest([RUN, RUN]) != base, "a table of two runs is not a table of one"


def test_the_digest_leaves_the_runs_as_they_were():
    kept = copy.deepcopy(RUN)
    records_digest([RUN])
    assert RUN == kept
