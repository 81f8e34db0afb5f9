"""One list per kind of choice: config, CLI help, code and the configuration reference agree with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from swarmnode.cli import app
from swarmnode.learn.loss import WEIGHTINGS
from swarmnode.rollout import resolve_backend
from swarmnode.settings.config import Config, ConfigError, RolloutSettings, TaskSettings, load_config
from swarmnode.settings.registry import BACKENDS, DIVERGENCES, OBJECTIVES, TASKS, Registry
from swarmnode.tasks import make_task

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "configuration.md"  # every setting; the README keeps a few rows
KEYS = {"loss.objective": OBJECTIVES, "loss.divergence": DIVERGENCES, "task.name": TASKS, "rollout.backend": BACKENDS}


@pytest.mark.parametrize("key,registry", KEYS.items())
def test_the_config_accepts_exactly_the_registered_names(key, registry):
    for name in registry.names:
        load_config(None, [f"{key}={name}"])
    with pytest.raises(ConfigError, match=key):
        load_config(None, [f"{key}=no-such-thing"])


@pytest.mark.parametrize("key,registry", KEYS.items())
def test_the_reference_table_lists_every_registered_name(key, registry):
    row = next(line for line in REFERENCE.read_text().splitlines() if line.startswith(f"| {key} |"))
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


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


README_ITEM = re.compile(r"- (?P<key>`[^(]+?) \(default (?P<default>`.+?`)\): (?P<meaning>.+)")


def _readme_rows() -> list[str]:
    """The settings listed in the README's "Configuration reference" section (a list, so the
    README keeps to 80 columns), each written back as the reference table's row it copies:
    "- `key` (default `value`): meaning" over lines indented by two spaces."""
    section = README.read_text().split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    items: list[str] = []
    for line in section.splitlines():
        if line.startswith("- "):
            items.append(line)
        elif line.startswith("  ") and items:
            items[-1] += " " + line.strip()
        elif items and not line.strip():
            break  # the list ends
    rows = []
    for text in items:
        found = README_ITEM.fullmatch(text)
        assert found, f"not a setting as the README lists them: {text!r}"
        key, default = (found[name].replace("`", "") for name in ("key", "default"))
        rows.append(f"| {key} | {default} | {found['meaning']} |")
    return rows


def _reference() -> dict[str, str]:
    """docs/configuration.md's table as {key: default as written}; a row may name several
    keys of one section (`node.eval_every / eval_size`) with their defaults in the same order."""
    rows = {}
    for line in _table_rows(REFERENCE.read_text()):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("setting", "---"):
            continue
        first, *rest = [key.strip() for key in cells[0].split(" / ")]
        section = first.rsplit(".", 1)[0]
        keys = [first] + [f"{section}.{key}" for key in rest]
        defaults = [value.strip() for value in cells[1].split(" / ")]
        assert len(keys) == len(defaults), line
        assert not set(keys) & set(rows), f"named twice: {line}"
        rows.update(zip(keys, defaults))
    return rows


def _as_written(value: str) -> object:
    size = re.fullmatch(r"(\d+) Mi(B?)", value)
    if size:
        return int(size.group(1)) << 20
    if value in ("null", "none"):
        return None
    loaded = yaml.safe_load(value)
    try:
        return float(loaded) if isinstance(loaded, str) else loaded
    except ValueError:
        return loaded


def _leaves(model: BaseModel, prefix: str = "") -> dict[str, object]:
    found = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            found.update(_leaves(value, f"{prefix}{name}."))
        else:
            found[prefix + name] = list(value) if isinstance(value, tuple) else str(value) if isinstance(value, Path) else value
    return found


def test_the_reference_lists_every_setting_with_its_default():
    written = _reference()
    actual = _leaves(Config())
    assert set(written) == set(actual), (set(actual) - set(written), set(written) - set(actual))
    wrong = {key: (written[key], actual[key]) for key in actual if _as_written(written[key]) != actual[key]}
    assert not wrong, wrong


def test_the_readme_table_copies_rows_of_the_reference():
    readme, reference = _readme_rows(), set(_table_rows(REFERENCE.read_text()))
    assert len(readme) >= 5, readme
    missing = [row for row in readme if row not in reference]
    assert not missing, missing
    assert "](docs/configuration.md)" in README.read_text()
