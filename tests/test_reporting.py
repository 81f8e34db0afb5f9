"""report.to: W&B and trackio runs fed from the node's typed records (TensorBoard: test_node.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from swarmnode.ops.lines import EvalRecord, RoundRecord
from swarmnode.ops.reporting import ReportError, make_reporters
from swarmnode.settings.config import ReportSettings

FACTS = {"peer_id": "QmPeerABC123xyz789", "run_id": "run1", "model": "Qwen/Qwen2.5-1.5B", "config": {"a": 1}}


def _record(round_: int, reward: float) -> RoundRecord:
    return RoundRecord(
        round=round_, peer_id="Qm", reward_mean=reward, peer_reward_mean=None, own_samples=64, peer_samples=32,
        peers=1, gated=0, below_bar=0, peer_weight_scale=None, filtered=0, filtered_frac=0.0, weight_mean=1.0,
        weight_max=2.0, truncated_frac=0.0, divergence_mean=0.0, loss=0.5, grad_norm=0.1, wire_bytes=0,
        wire_tokens=0, rejected=0, peer_age_s=None, peer_lag=None, tokens_per_s=10.0, timings={"round_s": 1.5},
    )


class _FakeWandb(types.ModuleType):
    """The part of wandb's API the reporter uses, recording every call."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__("wandb")
        self.inits: list[dict] = []
        self.logged: list[tuple[dict, int]] = []
        self.finished = 0
        self.fail = fail

    def init(self, **kwargs):  # noqa: ANN003, ANN201
        if self.fail:
            raise RuntimeError("api key not configured")
        self.inits.append(kwargs)
        return types.SimpleNamespace(log=lambda metrics, step: self.logged.append((metrics, step)),
                                     finish=self._finish)

    def _finish(self) -> None:
        self.finished += 1


def test_a_wandb_run_gets_rounds_and_evaluations_on_one_step_axis(tmp_path, monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    reporters = make_reporters(ReportSettings(to=["wandb"], project="swarm-x"), tmp_path, FACTS)
    reporters.eval(EvalRecord(round=-1, phase="before", eval_acc=0.25))
    reporters.round(_record(0, 0.5))
    reporters.round(_record(1, 0.75))
    reporters.eval(EvalRecord(round=1, phase="after", eval_acc=0.5, ood_acc=0.125))
    reporters.close()
    [init] = fake.inits
    assert init["project"] == "swarm-x" and init["name"] == "Qwen2.5-1.5B-xyz789"
    assert init["config"] == FACTS and init["resume"] == "allow" and init["dir"] == str(tmp_path)
    assert [step for _, step in fake.logged] == [0, 1, 2, 2]
    assert fake.logged[1][0]["round/reward_mean"] == 0.5 and fake.logged[2][0]["round/reward_mean"] == 0.75
    assert fake.logged[1][0]["time/round_s"] == 1.5 and "round/peer_age_s" not in fake.logged[1][0], "None left out"
    assert fake.logged[3][0] == {"eval/eval_acc": 0.5, "eval/ood_acc": 0.125}
    assert fake.finished == 1
    # the same node (run dir and peer id) resumes its own run after a restart; another node has its own
    make_reporters(ReportSettings(to=["wandb"]), tmp_path, FACTS).close()
    make_reporters(ReportSettings(to=["wandb"]), tmp_path / "other", FACTS).close()
    assert fake.inits[1]["id"] == init["id"] != fake.inits[2]["id"]
    assert fake.inits[1]["project"] == "swarmnode", "the default project"


def test_a_tracker_that_is_missing_or_cannot_start_is_a_clear_error_and_closes_the_others(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ReportError, match=r"pip install 'swarmnode\[wandb\]'"):
        make_reporters(ReportSettings(to=["wandb"]), tmp_path, FACTS)
    fake = _FakeWandb(fail=True)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    opened = []

    class Probe:
        def close(self) -> None:
            opened.append("closed")

    monkeypatch.setattr("swarmnode.ops.reporting.TensorBoardReporter", lambda directory: Probe())
    with pytest.raises(ReportError, match="could not start a run.*api key"):
        make_reporters(ReportSettings(to=["tensorboard", "wandb"]), tmp_path, FACTS)
    assert opened == ["closed"], "the reporter made before the failing one is closed"


READ_BACK = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from swarmnode.settings.config import ReportSettings
    from swarmnode.ops.lines import EvalRecord
    from swarmnode.ops.reporting import make_reporters
    from tests.test_reporting import FACTS, _record

    reporters = make_reporters(ReportSettings(to=["trackio"], project="swarm-t"), Path(sys.argv[1]), FACTS)
    reporters.eval(EvalRecord(round=-1, phase="before", eval_acc=0.25))
    reporters.round(_record(0, 0.5))
    reporters.round(_record(1, 0.75))
    reporters.eval(EvalRecord(round=1, phase="after", eval_acc=0.5))
    reporters.close()

    from trackio.sqlite_storage import SQLiteStorage
    runs = SQLiteStorage.get_runs("swarm-t")
    logs = SQLiteStorage.get_logs("swarm-t", runs[0])
    print("RESULT " + json.dumps({"runs": runs, "logs": logs}, default=str))
    """
)


def test_a_trackio_run_is_read_back_by_trackio_itself(tmp_path):
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}  # trackio reads it once, at import
    done = subprocess.run(
        [sys.executable, "-c", READ_BACK, str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["runs"] == [f"Qwen2.5-1.5B-{FACTS['peer_id'][-6:]}"]
    by_step: dict[int, dict] = {}
    for entry in result["logs"]:
        by_step.setdefault(entry["step"], {}).update(entry)
    assert by_step[0]["eval/eval_acc"] == 0.25
    assert by_step[1]["round/reward_mean"] == 0.5 and by_step[2]["round/reward_mean"] == 0.75
    assert by_step[2]["eval/eval_acc"] == 0.5 and by_step[1]["time/round_s"] == 1.5
