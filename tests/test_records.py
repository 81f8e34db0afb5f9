"""Bad input at the new entry points: peers' heartbeats, new settings, the health module."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest

from swarmnode.ops.health import main as health_main
from swarmnode.protocol.records import Heartbeat, RecordError
from swarmnode.settings.config import ConfigError, load_config

GOOD = {"peer": "QmPeer", "run": "r", "time": 1.0, "round": 3, "reward": 0.5}


def test_a_heartbeat_is_parsed_strictly_and_newer_fields_are_dropped():
    assert Heartbeat.parse({**GOOD, "from_the_future": 1}).round == 3
    for bad, field in [
        ({**GOOD, "round": "3"}, "round"),
        ({**GOOD, "reward": math.nan}, "reward"),
        ({**GOOD, "reward": "high"}, "reward"),
        ({**GOOD, "model": "x" * 1000}, "model"),
        ({**GOOD, "state": "winning"}, "state"),
        ({k: v for k, v in GOOD.items() if k != "time"}, "time"),
        ({**GOOD, "used": ["peer"]}, "used"),
    ]:
        with pytest.raises(RecordError, match=field):
            Heartbeat.parse(bad)
    with pytest.raises(RecordError, match="not a map"):
        Heartbeat.parse([1, 2])
    # `used` keeps its 32 largest well-formed entries; odd ones go, the heartbeat stays
    used = {f"peer{i}": i for i in range(40)} | {"negative": -1, "p" * 200: 99, "text": "1", "flag": True}
    kept = Heartbeat.parse({**GOOD, "used": used}).used
    assert kept == {f"peer{i}": i for i in range(8, 40)}


@pytest.mark.parametrize(
    "setting",
    ["node.max_age_s=0", "node.wait_share=-0.1", "node.staleness=-1", "swarm.max_missed=0",
     "trust.gate_scope=some", "task.strict_format=maybe"],
)
def test_new_settings_refuse_bad_values_by_name(setting):
    with pytest.raises(ConfigError, match=setting.split("=")[0]):
        load_config(None, [setting])


def test_the_torch_free_health_check_says_when_nobody_answers(capsys):
    assert health_main(["--port", "1", "--timeout", "1"]) == 1
    assert "no answer from 127.0.0.1:1" in capsys.readouterr().out


def test_metrics_lines_read_back_typed_and_other_versions_are_left_out(tmp_path):
    from swarmnode.ops.lines import EvalRecord, RoundRecord
    from swarmnode.ops.metrics import MetricsLog, read_evals, read_rounds

    record = RoundRecord(
        round=3, peer_id="Qm", reward_mean=0.5, peer_reward_mean=None, own_samples=64, peer_samples=32, peers=2,
        gated=1, below_bar=2, peer_weight_scale=1.0, filtered=0, filtered_frac=0.0, weight_mean=1.0, weight_max=2.0,
        truncated_frac=0.01, divergence_mean=0.1, loss=0.2, grad_norm=0.3, wire_bytes=100, wire_tokens=12,
        rejected=0, peer_age_s=0.5, peer_lag=0.0, tokens_per_s=99.0, samples_by_peer={"Qa": 32},
        timings={"generate_s": 0.25, "round_s": 0.75},
    )
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write(EvalRecord(round=-1, phase="before", eval_acc=0.4).to_json())
    log.write(record.to_json())
    log.write({"kind": "round", "round": 4})  # a line of another version
    log.close()
    assert read_rounds(tmp_path / "metrics.jsonl") == [record], "timings come back from the flat line"
    assert read_evals(tmp_path / "metrics.jsonl", "before") == [EvalRecord(round=-1, phase="before", eval_acc=0.4)]
    assert read_evals(tmp_path / "metrics.jsonl", "after") == [] and read_rounds(tmp_path / "nothing.jsonl") == []
    assert RoundRecord.from_json(asdict(record)) == record, "as the ablation's JSON keeps it (timings nested)"
