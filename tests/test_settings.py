"""Every setting is declared once: the tiny preset is the embedded default and the file users
copy; the schema describes every setting and declares which are flags, and `join`'s and
`doctor`'s flags and docs/configuration.md are rendered from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from swarmnode import assemble
from swarmnode.cli import app
from swarmnode.settings import reference
from swarmnode.settings.config import describe, load_config
from swarmnode.settings.flags import DOCTOR_FLAGS, JOIN_FLAGS

ROOT = Path(__file__).resolve().parents[1]
TINY_CPU_YAML = ROOT / "configs" / "tiny-cpu.yaml"
NOT_SETTINGS = {"config_path", "fresh", "overrides", "solo", "quiet", "verbose"}  # flags of the command itself


def _join_config(monkeypatch, *args: str):
    """The config `swarmnode join ARGS` would run, without running it."""
    seen = []
    monkeypatch.setattr(assemble, "run", lambda config, *rest, **named: seen.append(config) or {})
    result = CliRunner().invoke(app, ["join", *args])
    assert result.exit_code == 0, result.output
    (config,) = seen
    return config


def test_the_embedded_default_is_the_tiny_preset_as_configs_writes_it():
    assert load_config(None).model_dump() == load_config(TINY_CPU_YAML).model_dump()


def test_join_solo_without_a_config_trains_as_tiny_cpu_yaml(monkeypatch):
    config = _join_config(monkeypatch, "--solo")
    expected = load_config(TINY_CPU_YAML, ["swarm.enabled=false"])
    assert config.model_dump() == expected.model_dump()
    assert config.train.lr == 1e-4, "a tiny model learns at 1e-4, not the paper's 1e-6 for billions of weights"


def _options(command: str) -> dict[str, object]:
    return {param.name: param for param in typer.main.get_command(app).commands[command].params}


def _join_options() -> dict[str, object]:
    return _options("join")


def test_every_join_flag_that_sets_a_setting_has_its_description_as_help():
    options = _join_options()
    assert set(options) - NOT_SETTINGS == set(JOIN_FLAGS), "a flag for a setting is declared in JOIN_FLAGS"
    for name, flag in JOIN_FLAGS.items():
        assert options[name].help == describe(flag.setting), name
        assert options[name].opts == [flag.option] and options[name].envvar == flag.envvar


def test_doctor_takes_the_flags_its_settings_declare_and_no_other():
    options = _options("doctor")
    assert set(options) == {"config_path", "overrides", *DOCTOR_FLAGS}
    assert set(DOCTOR_FLAGS) == {"model", "task", "data", "device", "backend", "run_dir"}
    for name, flag in DOCTOR_FLAGS.items():
        assert options[name].help == describe(flag.setting), name


def test_flags_and_the_reference_are_rendered_from_the_schema():
    """Every setting has a description; flags.py and docs/configuration.md are what the schema
    renders (a setting, a description or a default changed without `make reference` fails here)."""
    assert all(setting.description for setting in reference.settings())
    stale = [str(path) for path, text in reference.rendered().items() if path.read_text() != text]
    assert not stale, f"{', '.join(stale)} stale against swarmnode/settings/config.py: run {reference.REGENERATE}"


PEER_A = "/ip4/127.0.0.1/tcp/1/p2p/QmXfV8jn6FiD1VTcSmxpstA2WmtvRCB9yYbGcw3rTYXbbb"  # multiaddrs a node could dial (preflight parses them)
PEER_B = "/ip4/127.0.0.1/tcp/2/p2p/QmXfV8jn6FiD1VTcSmxpstA2WmtvRCB9yYbGcw3rTYXccc"


@pytest.mark.parametrize(
    "args,key,value",
    [
        (["--model", "tiny-large"], "model.name", "tiny-large"),
        (["--lora-rank", "8"], "model.lora.rank", 8),
        (["--objective", "tis"], "loss.objective", "tis"),
        (["--rounds", "7"], "node.rounds", 7),
        (["--run-dir", "elsewhere"], "node.run_dir", Path("elsewhere")),
        (["--seed", "3"], "node.seed", 3),
        (["--lr", "0.01"], "train.lr", 0.01),
        (["--initial-peers", PEER_A, "--initial-peers", PEER_B], "swarm.initial_peers", [PEER_A, PEER_B]),
        (["--identity", "key.pem"], "swarm.identity_path", Path("key.pem")),
        (["--startup-timeout", "5"], "swarm.startup_timeout_s", 5.0),
        (["--min-peers", "2"], "swarm.min_peers", 2),
        (["--health-port", "9000"], "node.health_port", 9000),
        (["--fresh"], "node.resume", False),
    ],
)
def test_each_join_flag_sets_its_setting(monkeypatch, args, key, value):
    config = _join_config(monkeypatch, *args)
    section, *rest = key.split(".")
    found = getattr(config, section)
    for part in rest:
        found = getattr(found, part)
    assert found == value
    assert key in config.given, "a flag counts as the user's choice (the planner keeps it)"
