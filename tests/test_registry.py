"""One list per kind of choice: config, CLI help, code and the configuration reference agree with it.
The built-in tasks' list is their entry points (pyproject.toml), as a plug-in's is."""

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
from swarmnode.settings.registry import (
    BACKENDS,
    DIVERGENCES,
    OBJECTIVES,
    PLUGIN_GROUP,
    Registry,
    builtin_tasks,
    data_tasks,
    makes_own_problems,
    task_entry_point,
)
from swarmnode.tasks import data_source, make_task
from swarmnode.tasks.gsm8k import GSM8K_SOURCE
from swarmnode.tasks.plugins import PluginTask

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "configuration.md"  # every setting; the README keeps a few rows
KEYS = {"loss.objective": OBJECTIVES.names, "loss.divergence": DIVERGENCES.names, "task.name": builtin_tasks(),
        "rollout.backend": BACKENDS.names}


@pytest.mark.parametrize("key,names", KEYS.items())
def test_the_config_accepts_exactly_the_registered_names(key, names):
    for name in names:
        load_config(None, [f"{key}={name}"])
    with pytest.raises(ConfigError, match=key):
        load_config(None, [f"{key}=no-such-thing"])


def _cells(row: str) -> list[str]:
    """A table row's cells (a cell's own | is escaped)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


@pytest.mark.parametrize("key,names", KEYS.items())
def test_the_reference_table_lists_every_registered_name(key, names):
    row = next(line for line in REFERENCE.read_text().splitlines() if line.startswith(f"| {key} |"))
    listed = set(re.findall(r"`([a-z0-9][a-z0-9-]*)`", _cells(row)[2]))
    assert listed == set(names), row


def test_the_cli_help_names_every_choice():
    text = " ".join(CliRunner().invoke(app, ["join", "--help"], env={"COLUMNS": "250"}).output.split())
    for names in (OBJECTIVES.names, builtin_tasks(), BACKENDS.names):
        assert " | ".join(names) in text


def test_every_objective_has_a_weighting_and_every_task_a_constructor(tmp_path):
    assert {o.weighting for o in OBJECTIVES} <= WEIGHTINGS.keys()
    assert [o.filtered for o in OBJECTIVES] == [o.name.startswith("f-") for o in OBJECTIVES]
    assert set(builtin_tasks()) >= {"arithmetic", "gsm8k"}, "swarmnode's own tasks are its entry points"
    for split in ("train", "test"):  # a GSM8K of one problem
        (tmp_path / f"{split}.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    for name in builtin_tasks():
        point = task_entry_point(name)
        assert point.group == PLUGIN_GROUP and point.module == f"swarmnode.tasks.{name}", "in the task's own module"
        settings = TaskSettings(name=name, data=None if makes_own_problems(name) else str(tmp_path))
        task = make_task(settings)
        assert task.name == name
        assert not isinstance(task, PluginTask), "a built-in task's fingerprint (the run id's) is its own"


def test_whether_a_task_reads_data_is_declared_by_its_entry_points(tmp_path):
    assert data_tasks() == ("gsm8k",) and makes_own_problems("arithmetic") and makes_own_problems("rg:chain_sum")
    assert data_source(TaskSettings(name="gsm8k")) == GSM8K_SOURCE, "where it reads without task.data"
    assert data_source(TaskSettings(name="gsm8k", data=str(tmp_path))) == str(tmp_path)
    assert data_source(TaskSettings()) is None
    with pytest.raises(ConfigError, match="task.data is given but the task is arithmetic, which makes its own "
                                          "problems: add --task gsm8k \\(or task.name: gsm8k\\), or drop the data"):
        load_config(None, [f"task.data={tmp_path}"])


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


def _plain(row: str) -> str:
    """A row as it reads: the table's escapes (\\| \\< \\*) dropped, which a README line needs not."""
    return re.sub(r"\\([|<*])", r"\1", row)


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
        cells = _cells(line)
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
    readme = [_plain(row) for row in _readme_rows()]
    reference = {_plain(row) for row in _table_rows(REFERENCE.read_text())}
    assert len(readme) >= 5, readme
    missing = [row for row in readme if row not in reference]
    assert not missing, missing
    assert "](docs/configuration.md)" in README.read_text()
