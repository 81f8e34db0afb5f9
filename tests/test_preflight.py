"""Settings this machine cannot meet are refused before anything starts: in about a second,
naming the setting and the fix, in the terminal and in <run-dir>/node.log, with no daemon
started (swarmnode/ops/preflight.py)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import RepositoryNotFoundError
from typer.testing import CliRunner

from swarmnode.cli import app
from swarmnode.ops import preflight as preflight_module
from swarmnode.ops.preflight import Preflight, PreflightError, check_model, check_task_data, preflight
from swarmnode.settings.config import load_config
from swarmnode.tasks import make_task

from .conftest import data_path

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


class _NoHub(Exception):
    """What the hub client raises without a network (httpx's ConnectError, say)."""


@pytest.fixture
def hub(monkeypatch):
    """The hub as this machine has it: unreachable, nothing cached, online mode."""
    asked: list[str] = []

    def unreachable(repo_id, **_):
        asked.append(repo_id)
        raise _NoHub("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    monkeypatch.setattr(huggingface_hub, "dataset_info", unreachable)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    return asked


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "gpu"], "unknown device 'gpu'"),
        (["--device", "cuda"], "CUDA is not available; use --device cpu"),
        (["--model", "no-such/model-xyz"], "cannot reach the Hugging Face hub for no-such/model-xyz"),
        (["--model", "Qwen2.5-3b"], "did you mean Qwen/Qwen2.5-3B?"),
        (["--model", "./nowhere"], "no model directory at ./nowhere"),
        (["--model", "nothing-here"], "cannot reach the Hugging Face hub for nothing-here"),
        (["--model", "a/b/c"], "'a/b/c' is no preset"),
        (["--initial-peers", "/ip4/1.2.3/tcp/x"], "'/ip4/1.2.3/tcp/x' is not a multiaddr"),
        (["--task", "rg:no_such_set"], "no dataset 'no_such_set' among reasoning-gym's datasets"),
    ],
)
def test_a_setting_this_machine_cannot_meet_is_refused_at_once_and_said_in_node_log(tmp_path, hub, args, message):
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = runner.invoke(app, ["join", *args, "--run-dir", str(run_dir)])
    took = time.monotonic() - started
    assert result.exit_code == 2 and message in re.sub(r"\s+", " ", result.output), result.output
    assert message in re.sub(r"\s+", " ", (run_dir / "node.log").read_text().splitlines()[-1])
    assert not (run_dir / "swarm.json").exists(), "no daemon started"
    assert took < 10, took  # no minute of retries (the budget is loose: this machine's load varies)


def test_an_empty_data_file_is_refused_before_it_trains(tmp_path, hub):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("")
    (data / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(PreflightError, match="train.jsonl is empty"):
        check_task_data(load_config(None, ["task.name=gsm8k", f"task.data={data}"]).task, Preflight())
    with pytest.raises(ValueError, match="holds no rows"):  # blank lines only: the loader says it
        (data / "train.jsonl").write_text("\n\n")
        make_task(load_config(None, ["task.name=gsm8k", f"task.data={data}"]).task)


def test_a_model_the_hub_does_not_have_is_named_and_a_cached_one_runs_offline(hub, monkeypatch):
    def missing(repo_id, **_):
        err = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # as the hub's 404 (its response left out)
        Exception.__init__(err, f"404 {repo_id}")
        raise err

    monkeypatch.setattr(huggingface_hub, "model_info", missing)
    with pytest.raises(PreflightError, match="no model 'someone/nothing' on the Hugging Face hub"):
        check_model(load_config(None, ["model.name=someone/nothing"]).model, Preflight())
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: (_ for _ in ()).throw(_NoHub("no DNS")))
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: "/cache/config.json")
    found = Preflight()
    check_model(load_config(None, ["model.name=Qwen2.5-3B"]).model, found)
    assert found.offline and hub_constants.HF_HUB_OFFLINE and "using the cached Qwen/Qwen2.5-3B" in found.notes[0]
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    with pytest.raises(PreflightError, match="not in the local Hugging Face cache, and HF_HUB_OFFLINE is set"):
        check_model(load_config(None, ["model.name=Qwen2.5-3B"]).model, Preflight(offline=True))


def test_hub_data_without_the_datasets_library_says_how_to_get_it(hub, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(preflight_module.importlib.util, "find_spec",
                        lambda name, *a: None if name == "datasets" else real_find_spec(name, *a))
    with pytest.raises(PreflightError, match="pip install datasets"):
        check_task_data(load_config(None, ["task.name=gsm8k", "task.data=hf:openai/gsm8k"]).task, Preflight())


def test_a_shipped_qwen_config_with_local_data_gets_past_its_checks_and_its_data(monkeypatch, hub):
    """`join --config configs/qwen2.5-3b.yaml --data <gsm8k>` on a machine with the README's
    install: `datasets` is there for the configs' hub data, the model is asked of the hub once
    (answered here as it would be online), and the local data loads; the model itself is
    the part this machine cannot fetch."""
    assert importlib.util.find_spec("datasets") is not None, "the shipped configs read hf:openai/gsm8k"
    monkeypatch.setattr(huggingface_hub, "model_info", lambda repo_id, **_: hub.append(repo_id))
    config = load_config(ROOT / "configs/qwen2.5-3b.yaml", [f"task.data={data_path('gsm8k')}"])
    assert preflight(config).notes == [] and hub == ["Qwen/Qwen2.5-3B"]
    assert make_task(config.task).num_train > 7000


def test_a_multiaddr_is_checked_with_hivemind_s_parser_without_importing_hivemind_or_torch():
    code = (
        "import sys\n"
        "from swarmnode.swarm.hivemind.addresses import AddressError, check_multiaddr\n"
        "check_multiaddr('/ip4/1.2.3.4/tcp/31337/p2p/QmXfV8jn6FiD1VTcSmxpstA2WmtvRCB9yYbGcw3rTYXbbb', 's', True)\n"
        "try:\n    check_multiaddr('/ip4/1.2.3/tcp/x', 's')\nexcept AddressError as err:\n    print(err)\n"
        "print(sorted(m for m in ('torch', 'hivemind') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "is not a multiaddr" in out and out.strip().endswith("[]"), out


def test_a_run_dir_that_cannot_be_written_is_refused_before_anything_starts(tmp_path, hub):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    result = runner.invoke(app, ["join", "--run-dir", str(a_file / "run")])
    said = re.sub(r"\s+", " ", result.output)
    assert result.exit_code == 2 and "node.run_dir: cannot write" in said and "give --run-dir" in said, said
