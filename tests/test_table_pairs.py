"""Two tables compared member by member, paired by seed (swarmnode/lab/table_pairs.py, bench/tables_paired.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import t as student_t

from swarmnode.lab.ablation import ALONE, ConditionRun, MemberRun, paired_gains
from swarmnode.lab.table_pairs import paired, seed_differences, welch
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
    assert (difference.mean, difference.se, difference.seeds) == pytest.approx((0.07 / 3, se, 3))
    assert difference.p == pytest.approx(2 * student_t.sf(difference.mean / se, 2))
    half = student_t.ppf(0.975, 2) * se
    assert difference.interval == pytest.approx((difference.mean - half, difference.mean + half))
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


def _save(path: Path, runs: list[ConditionRun], name: str, shape: dict) -> Path:
    path.write_text(json.dumps({"setting": {"name": name}, "shape": shape, "records": name,
                                "runs": [dataclasses.asdict(r) for r in runs]}))
    return path


def test_the_bench_prints_the_paired_difference_and_refuses_tables_of_another_shape(tmp_path):
    shape = {"rounds": 20, "match": "step"}
    here = _save(tmp_path / "here.json", _table({0: 0.40, 1: 0.60, 2: 0.45, 3: 0.30}), "swarm4", shape)
    there = _save(tmp_path / "there.json", _table({0: 0.42, 1: 0.64, 2: 0.48, 3: 0.37}), "swarm5", shape)
    shown = subprocess.run([sys.executable, str(ROOT / "bench/tables_paired.py"), str(here), str(there), "--split", "2"],
                           capture_output=True, text=True, check=True).stdout
    assert "alone: the same runs in both" in shown
    rows = {tuple(line.split()[:3]): line for line in shown.splitlines() if line.startswith("a ")}
    assert "+0.040" in rows[("a", "all", "+0.075")] and "(4 seeds)" in rows[("a", "all", "+0.075")]
    assert "+0.030" in rows[("a", "<", "2")] and "(2 seeds)" in rows[("a", "<", "2")]
    assert "+0.050" in rows[("a", ">=", "2")]
    welch_row = shown.split("unpaired (Welch)")[1]
    assert "there - here +0.020" in welch_row, "seeds 2-3 differ by 0.05, seeds 0-1 by 0.03"
    other = _save(tmp_path / "other.json", _table({0: 0.5, 1: 0.5}), "lora", {"rounds": 40, "match": "step"})
    refused = subprocess.run([sys.executable, str(ROOT / "bench/tables_paired.py"), str(here), str(other)],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "another shape" in refused.stderr
