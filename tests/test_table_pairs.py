"""Two tables compared member by member, paired by seed (swarmnode/lab/table_pairs.py, bench/tables_paired.py)."""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import t as student_t

from swarmnode.lab.ablation import ALONE, ConditionRun, MemberRun, Shape, paired_gains
from swarmnode.lab.table_pairs import (
    conditions_compared,
    mismatch,
    paired,
    read_table,
    same_alone,
    seed_differences,
    welch,
)
from swarmnode.ops.lines import RoundRecord

ROOT = Path(__file__).resolve().parents[1]
ALONE_ACCURACY = {0: 0.30, 1: 0.55, 2: 0.40, 3: 0.20}  # a noisy alone: seeds far apart
ROUNDS = 20
RECORD = RoundRecord(
    round=0, peer_id="a", reward_mean=0.5, peer_reward_mean=None, own_samples=8, peer_samples=8, peers=1,
    gated=0, below_bar=0, peer_weight_scale=None, filtered=0, filtered_frac=0.0, weight_mean=1.0, weight_max=2.0,
    truncated_frac=0.0, divergence_mean=0.5, loss=0.0, grad_norm=0.0, wire_bytes=0, wire_tokens=10,
    rejected=0, peer_age_s=None, peer_lag=None, tokens_per_s=0.0,
)


def _run(condition: str, seed: int, accuracy: float) -> ConditionRun:
    """One member, `a`, after ROUNDS rounds at `accuracy` (step-matched)."""
    member = MemberRun("a", before=0.1, after=accuracy, curve=[(0, 0, 0.1), (ROUNDS, 0, accuracy)], rounds=[RECORD] * ROUNDS)
    return ConditionRun(condition, "shared", seed, [member])


def _table(together: dict[int, float]) -> list[ConditionRun]:
    """The same alone runs, and the member together at `together` (seed -> accuracy)."""
    return ([_run(ALONE, seed, accuracy) for seed, accuracy in ALONE_ACCURACY.items()]
            + [_run("f-tis", seed, accuracy) for seed, accuracy in together.items()])


def _gain(runs: list[ConditionRun]):
    return next(g for g in paired_gains(runs) if g.condition == "f-tis")


def test_each_gain_keeps_its_seeds_and_two_tables_differ_by_the_member_s_accuracy_alone_cancelled():
    here = _gain(_table({0: 0.40, 1: 0.60, 2: 0.45, 3: 0.30}))
    there = _gain(_table({0: 0.42, 1: 0.61, 2: 0.49}))  # seed 3 never ran there
    assert dict(here.by_seed) == pytest.approx({0: 0.10, 1: 0.05, 2: 0.05, 3: 0.10})
    assert seed_differences(here, there) == pytest.approx({0: 0.02, 1: 0.01, 2: 0.04})
    assert seed_differences(here, there, range(1, 3)) == pytest.approx({1: 0.01, 2: 0.04})
    difference = paired(seed_differences(here, there))
    values = [0.02, 0.01, 0.04]
    se = (sum((v - 0.07 / 3) ** 2 for v in values) / 2 / 3) ** 0.5
    assert (difference.mean, difference.se) == pytest.approx((0.07 / 3, se))
    assert difference.p == pytest.approx(2 * student_t.sf(difference.mean / se, 2))
    half = student_t.ppf(0.975, 2) * se
    assert difference.interval == pytest.approx((difference.mean - half, difference.mean + half))
    near_nothing = paired({0: 0.015, 1: -0.005, 2: -0.01, 3: 0.0})  # a mean of 0: its spread still has an SE
    assert near_nothing.mean == pytest.approx(0.0) and near_nothing.se == pytest.approx(statistics.stdev([0.015, -0.005, -0.01, 0.0]) / 2)
    assert near_nothing.p == pytest.approx(1.0)
    with pytest.raises(ValueError, match="two seeds"):
        paired({0: 0.1})


def test_welch_compares_two_draws_unpaired_and_is_antisymmetric():
    first, second = [0.05, 0.07, 0.03, 0.06], [0.01, 0.02, 0.00, 0.04, 0.03]
    later = welch(first, second)
    earlier = welch(second, first)
    assert later.mean == pytest.approx(0.02 - 0.0525)
    assert earlier.mean == pytest.approx(-later.mean) and earlier.p == pytest.approx(later.p)
    assert later.interval[0] < later.mean < later.interval[1] < 0, "four and five seeds this far apart differ"
    assert later.p < 0.05
    assert welch(first, [x + 0.001 for x in first]).p > 0.9
    with pytest.raises(ValueError):
        welch([0.1], second)


def _header(name: str, shape: dict, member_settings: tuple[str, ...] = ()) -> dict:
    return {"setting": {"name": name, "about": "", "members": [{"label": "a", "overrides": list(member_settings)}]},
            "accounting": "shared", "shape": shape, "defaults": "d" * 64, "records": name}


def _save(path: Path, runs: list[ConditionRun], header: dict) -> Path:
    path.write_text(json.dumps({**header, "runs": [dataclasses.asdict(r) for r in runs]}))
    return path


def _bench(*args: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench/tables_paired.py"), *map(str, args)], capture_output=True, text=True)


def test_the_bench_prints_the_paired_difference_on_the_seeds_both_tables_ran(tmp_path):
    shape = {"rounds": ROUNDS, "match": "step"}
    here = _save(tmp_path / "here.json", _table({0: 0.40, 1: 0.60, 2: 0.45, 3: 0.30, 4: 0.9}), _header("swarm4", shape))
    there = _save(tmp_path / "there.json", _table({0: 0.42, 1: 0.64, 2: 0.48, 3: 0.37}), _header("swarm5", shape))
    shown = _bench(here, there, "--split", "2")
    assert shown.returncode == 0, shown.stderr
    assert "alone: the same runs in both" in shown.stdout
    rows = {tuple(line.split()[:2]): line for line in shown.stdout.splitlines() if line.startswith("a ")}
    assert "+0.075 (0.014)" in rows[("a", "all")], "seed 4, which only the first table ran, is left out of its gain too"
    assert "+0.040" in rows[("a", "all")] and "(4 seeds)" in rows[("a", "all")]
    assert "+0.030" in rows[("a", "<")] and "(2 seeds)" in rows[("a", "<")]
    assert "+0.050" in rows[("a", ">=")]
    welch_row = shown.stdout.split("unpaired (Welch)")[1]
    assert "there - here +0.020" in welch_row, "seeds 2-3 differ by 0.05, seeds 0-1 by 0.03"


def test_every_seed_the_same_is_said_so_without_a_p(tmp_path):
    shape = {"rounds": ROUNDS, "match": "step"}
    here = _save(tmp_path / "here.json", _table({0: 0.40, 1: 0.60, 2: 0.45}), _header("swarm4", shape))
    there = _save(tmp_path / "there.json", _table({0: 0.42, 1: 0.62, 2: 0.47}), _header("swarm5", shape))
    shown = _bench(here, there)
    assert shown.returncode == 0, shown.stderr
    assert "+0.020, the same on every seed" in shown.stdout and "nan" not in shown.stdout
    assert paired({0: 0.0, 1: 0.0}).se == 0.0


def test_tables_that_are_not_the_same_members_on_one_shape_are_refused_with_what_differs(tmp_path):
    shape = {"rounds": ROUNDS, "match": "step"}
    here = _header("swarm4", shape)
    assert mismatch(here, _header("swarm5", {**shape, "eval_size": Shape().eval_size})) == [], "a field at its default"
    cases = {
        "rounds 40 (here 20)": _header("lora", {"rounds": 40, "match": "step"}),
        "a's settings ['train.lr=3e-4'] (here [])": _header("lora", shape, ("train.lr=3e-4",)),
        "defaults eeee": {**_header("lora", shape), "defaults": "e" * 64},
        "accounting on-top (here shared)": {**_header("lora", shape), "accounting": "on-top"},
    }
    for expected, header in cases.items():
        assert any(expected in line for line in mismatch(here, header)), (expected, mismatch(here, header))
    not_a_table = tmp_path / "list.json"
    not_a_table.write_text("[]")
    with pytest.raises(ValueError, match="is not an ablation.json"):
        read_table(not_a_table)
    with pytest.raises(ValueError, match="cannot read"):
        read_table(tmp_path / "missing.json")
    saved = _save(tmp_path / "table.json", _table({0: 0.4}), here)
    assert [r.condition for r in read_table(saved)[1]] == [ALONE] * 4 + ["f-tis"]


def test_the_bench_refuses_tables_without_two_seeds_in_common(tmp_path):
    shape = {"rounds": ROUNDS, "match": "step"}
    here = _save(tmp_path / "here.json", _table({0: 0.40, 1: 0.60}), _header("swarm4", shape))
    later_seeds = _save(tmp_path / "later.json", _table({10: 0.5, 11: 0.5}), _header("swarm5", shape))
    refused = _bench(here, later_seeds)
    assert refused.returncode != 0 and "no member has two seeds" in refused.stderr


def test_differently_named_conditions_are_compared_only_when_named():
    here = _table({0: 0.40, 1: 0.60})
    there = [dataclasses.replace(r, condition="f-tis:x=1") if r.condition == "f-tis" else r for r in _table({0: 0.42, 1: 0.63})]
    with pytest.raises(ValueError, match=r"the second \['f-tis:x=1'\]"):
        conditions_compared(here, there, None)
    assert conditions_compared(here, there, ["f-tis", "f-tis:x=1"]) == ("f-tis", "f-tis:x=1")
    assert conditions_compared(here, here, None) == ("f-tis", "f-tis")
    with pytest.raises(ValueError, match="the second table has no f-tis"):
        conditions_compared(here, there, ["f-tis"])


def test_alone_cancels_only_where_both_tables_read_the_same_alone_runs():
    first, second = _table({0: 0.4, 1: 0.5}), _table({0: 0.4, 1: 0.5})
    assert same_alone(first, second, {(0, "a"), (1, "a")})
    other_alone = [_run(ALONE, 1, 0.9) if (r.condition, r.seed) == (ALONE, 1) else r for r in second]
    assert not same_alone(first, other_alone, {(0, "a"), (1, "a")})
    assert not same_alone(first, second, set()), "no shared runs is no evidence they are the same"
    assert not same_alone(first, second, {(5, "a")})


def test_the_rounds_bench_counts_the_rounds_a_member_generated_its_whole_batch_and_whose_samples_it_took(tmp_path):
    shape = {"rounds": ROUNDS, "match": "step", "prompts_per_round": 2, "group_size": 4}
    alone_only = dataclasses.replace(RECORD, own_samples=8)
    shared = dataclasses.replace(RECORD, own_samples=4, samples_by_peer={"copy": 4, "far": 8})
    member = MemberRun("a", before=0.1, after=0.3, curve=[(0, 0, 0.1), (3, 0, 0.3)], rounds=[shared, alone_only, alone_only])
    runs = [_run(ALONE, 7, 0.2), ConditionRun("f-tis", "shared", 7, [member])]
    table = _save(tmp_path / "table.json", runs, _header("swarm4", shape))
    by_seed = subprocess.run([sys.executable, str(ROOT / "bench/rounds.py"), str(table), "--member", "a"],
                             capture_output=True, text=True, check=True).stdout
    assert "seed   7:    3 rounds,    2 generating its whole batch; taken from peers: {'copy': 4, 'far': 8}" in by_seed
    by_round = subprocess.run([sys.executable, str(ROOT / "bench/rounds.py"), str(table), "--member", "a", "--seed", "7",
                               "--upto", "2"], capture_output=True, text=True, check=True).stdout
    assert by_round.count("round ") == 2 and "own    4" in by_round and "{'copy': 4, 'far': 8}" in by_round
