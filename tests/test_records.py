"""Bad input at the new entry points: peers' heartbeats, new settings, the health module."""

from __future__ import annotations

import math

import pytest

from swarmnode.config import ConfigError, load_config
from swarmnode.health import main as health_main
from swarmnode.records import Heartbeat, RecordError

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
    ]:
        with pytest.raises(RecordError, match=field):
            Heartbeat.parse(bad)
    with pytest.raises(RecordError, match="not a map"):
        Heartbeat.parse([1, 2])


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
