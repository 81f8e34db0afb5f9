"""bench/ablation_diff.py: two ablations, or one run's file of a store against another, round by round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(seed: int, loss: float, slower: float = 1.0) -> dict:
    rounds = [{"round": r, "loss": loss if r == 1 else 0.5, "tokens_per_s": 100.0 * (r + 1) / slower} for r in range(3)]
    member = {"label": "tiny", "before": 0.2, "after": 0.4, "curve": [[0, 0.2], [2, 0.4]], "time_matched_at": None,
              "rounds": rounds}
    return {"condition": "f-tis", "accounting": "shared", "seed": seed, "members": [member]}


def _diff(before: Path, after: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench/ablation_diff.py"), str(before), str(after)],
                          capture_output=True, text=True)


def test_one_run_of_a_store_compares_with_the_same_run_of_a_table(tmp_path):
    """A seed re-run into a store compares with that seed of a table; what the clock measures
    (tokens_per_s) does not count, a record field does, and a table of two runs is not one run."""
    table = tmp_path / "ablation.json"
    table.write_text(json.dumps({"setting": "same", "runs": [_run(0, loss=1.0)]}))
    same = tmp_path / "same-seed0.json"
    same.write_text(json.dumps({**_run(0, loss=1.0, slower=2.0), "code": "other"}))
    shown = _diff(table, same)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "3 rounds compared, 0 differences" in shown.stdout
    moved = tmp_path / "moved-seed0.json"
    moved.write_text(json.dumps(_run(0, loss=1.5)))
    shown = _diff(moved, table)
    assert shown.returncode == 1
    assert "f-tis seed 0 tiny round 1 loss: 1.5 -> 1.0" in shown.stdout
    two = tmp_path / "two.json"
    two.write_text(json.dumps({"runs": [_run(0, 1.0), _run(1, 1.0)]}))
    assert "2 runs against 1" in _diff(two, same).stdout


def test_a_file_that_is_no_ablation_is_named_in_one_line(tmp_path):
    table = tmp_path / "ablation.json"
    table.write_text(json.dumps({"runs": [_run(0, loss=1.0)]}))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"setting": "same"}))
    shown = _diff(table, other)
    assert shown.returncode != 0 and "Traceback" not in shown.stderr
    assert "other.json: neither an ablation's records" in shown.stderr
    shown = _diff(tmp_path / "missing.json", table)
    assert shown.returncode != 0 and "missing.json: not an ablation's records" in shown.stderr
