"""One list per kind of choice: config, CLI help, code and README agree with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from swarmnode.cli import app
from swarmnode.config import ConfigError, RolloutSettings, TaskSettings, load_config
from swarmnode.loss import WEIGHTINGS
from swarmnode.registry import BACKENDS, DIVERGENCES, OBJECTIVES, TASKS, Registry
from swarmnode.rollout import resolve_backend
from swarmnode.tasks import make_task

README = Path(__file__).resolve().parents[1] / "README.md"
KEYS = {"loss.objective": OBJECTIVES, "loss.divergence": DIVERGENCES, "task.name": TASKS, "rollout.backend": BACKENDS}


@pytest.mark.parametrize("key,registry", KEYS.items())
def test_the_config_accepts_exactly_the_registered_names(key, registry):
    for name in registry.names:
        load_config(None, [f"{key}={name}"])
    with pytest.raises(ConfigError, match=key):
        load_config(None, [f"{key}=no-such-thing"])


@pytest.mark.parametrize("key,registry", KEYS.items())
def test_the_readme_table_lists_every_registered_name(key, registry):
    row = next(line for line in README.read_text().splitlines() if line.startswith(f"| {key} |"))
    listed = set(re.findall(r"`([a-z0-9][a-z0-9-]*)`", row.split("|")[3]))
    assert listed == set(registry.names), row


def test_the_cli_help_names_every_choice():
    text = " ".join(CliRunner().invoke(app, ["join", "--help"], env={"COLUMNS": "250"}).output.split())
    for registry in (OBJECTIVES, TASKS, BACKENDS):
        assert registry.cli_help() in text


def test_every_objective_has_a_weighting_and_every_task_a_constructor():
    assert {o.weighting for o in OBJECTIVES} <= WEIGHTINGS.keys()
    assert [o.filtered for o in OBJECTIVES] == [o.name.startswith("f-") for o in OBJECTIVES]
    for name in TASKS.names:
        if name != "gsm8k":  # gsm8k needs data; its constructor is covered in test_tasks
            assert make_task(TaskSettings(name=name)).name == name


def test_backends_resolve_and_unknown_names_are_errors():
    cpu = "cpu"
    assert resolve_backend("auto", cpu) == "hf" and resolve_backend("hf", cpu) == "hf"
    with pytest.raises(ValueError, match="unknown generation backend 'fast'; choose from auto, hf, vllm"):
        resolve_backend("fast", cpu)
    with pytest.raises(ValueError, match="unknown task"):
        make_task(TaskSettings.model_construct(**{**TaskSettings().model_dump(), "name": "chess"}))
    assert RolloutSettings().vllm_fraction(True) == 0.3 and RolloutSettings().vllm_fraction(False) == 0.1


def test_a_registry_refuses_duplicates_and_names_the_choices():
    with pytest.raises(ValueError, match="duplicate"):
        Registry("thing", [OBJECTIVES.get("nois"), OBJECTIVES.get("nois")])
    with pytest.raises(ValueError, match="choose from nois, vis, tis, f-nois, f-vis, f-tis"):
        OBJECTIVES.get("ppo")
