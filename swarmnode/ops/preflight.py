"""What a node's settings need from this machine, checked before anything starts.

A wrong model name, a hub that cannot be reached, hub data without `datasets` or a GPU asked
for where there is none would otherwise surface a minute in (after the hub client's retries,
or after the p2p daemon started). These checks import neither torch nor transformers and ask
the hub at most once per source, with a short timeout, so `join` and `plan` refuse such
settings in about a second, naming the setting and the fix.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import huggingface_hub
from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from swarmnode.settings.config import Config, ModelSettings, TaskSettings
from swarmnode.settings.models import GYM_PRESETS, TINY_NAMES, resolve_model_name
from swarmnode.settings.registry import is_builtin_task
from swarmnode.sizing.devices import device_of
from swarmnode.sizing.shapes import KNOWN_SHAPES
from swarmnode.swarm.hivemind import AddressError, check_swarm_addresses
from swarmnode.tasks import Task, data_source, make_task
from swarmnode.tasks.gym import INSTALL_HINT, ReasoningGymTask, check_reproducible

HUB_TIMEOUT_S = 5.0  # one question to the hub: does this repository exist, can we reach it
OFFLINE_FIX = "set HF_HUB_OFFLINE=1 to use the local Hugging Face cache"
HUB_PREFIX = "hf:"  # task data from the hub (the Qwen configs' default: hf:openai/gsm8k)


class PreflightError(ValueError):
    """A setting this machine cannot meet; the message names it and the fix."""


@dataclass
class Preflight:
    """What the checks found: notes to show (the node goes on), and whether the hub was reached."""

    notes: list[str] = field(default_factory=list)
    offline: bool = False  # the hub could not be reached: from here on only the cache is read
    task: Task | None = None  # a reasoning-gym or plug-in task, built once here and handed to the node


def hub_offline() -> bool:
    """HF_HUB_OFFLINE is set: only the local cache is read."""
    return bool(hub_constants.HF_HUB_OFFLINE)


def preflight(config: Config) -> Preflight:
    """Every check below, in the order a node needs them; PreflightError for the first that fails."""
    found = Preflight(offline=hub_offline())
    check_device(config)
    check_run_dir(config)
    check_addresses(config)
    check_model(config.model, found)
    check_task_data(config.task, found)
    found.task = check_task_source(config.task)
    return found


def check_device(config: Config) -> None:
    try:
        device_of(config.model.device)
    except RuntimeError as err:
        raise PreflightError(f"model.device: {err}; use --device cpu, or auto") from None


def check_model(model: ModelSettings, found: Preflight) -> None:
    """A preset, a local model directory, or a hub id the hub (or the cache, offline) has."""
    name = resolve_model_name(model.name)
    if name in GYM_PRESETS and importlib.util.find_spec("reasoning_gym") is None:
        raise PreflightError(f"model.name: the {name} preset is warmed up on a reasoning-gym dataset: {INSTALL_HINT}")
    if name in TINY_NAMES:
        return
    path = Path(name)  # as the loader reads it: no ~ expansion there either
    if path.exists():
        if not (path / "config.json").is_file():
            raise PreflightError(f"model.name: {name} has no config.json; give a directory a model was saved to")
        return
    if name.startswith((".", "/", "~")):
        raise PreflightError(f"model.name: no model directory at {name}")
    if name.count("/") > 1:
        raise PreflightError(
            f"model.name: {model.name!r} is no preset ({', '.join(TINY_NAMES)}), no model directory and no "
            "hub id (org/name, e.g. Qwen/Qwen2.5-3B)"
        )
    try:
        _check_hub_repo(name, model.revision, "model", "model.name", found)
    except PreflightError as err:
        near = difflib.get_close_matches(name, list(KNOWN_SHAPES), n=1, cutoff=0.8)
        raise PreflightError(f"{err} (did you mean {near[0]}?)" if near and near[0] != name else str(err)) from None


def needs_no_hub(model: ModelSettings) -> bool:
    """A Qwen2.5 size whose shape is built in: `plan` needs nothing from the hub for it."""
    name = resolve_model_name(model.name)
    return name in KNOWN_SHAPES or name.removesuffix("-Instruct") in KNOWN_SHAPES


def check_task_data(task: TaskSettings, found: Preflight) -> None:
    """Local data exists; hub data has `datasets` to read it and a hub (or, offline, a cache)."""
    source = data_source(task)
    if not source:
        return
    if not source.startswith(HUB_PREFIX):
        path = Path(source)
        if not path.exists():
            raise PreflightError(f"task.data: {source} does not exist")
        for empty in [f for f in ([path] if path.is_file() else sorted(path.glob("*.jsonl"))) if f.stat().st_size == 0]:
            raise PreflightError(f"task.data: {empty} is empty")
        return
    if importlib.util.find_spec("datasets") is None:
        raise PreflightError(
            f"task.data: {source} is read with the `datasets` library: pip install datasets; or pass --data "
            "with a local directory holding train.jsonl and test.jsonl"
        )
    if not found.offline:  # offline, datasets reads its own cache and says itself what is missing
        _check_hub_repo(source.removeprefix(HUB_PREFIX), None, "dataset", "task.data", found)


def run_dir_problem(config: Config) -> str | None:
    """Why the run dir cannot hold this node's files (a file there, read-only, not ours), or None."""
    run_dir = Path(config.node.run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as err:
        return f"cannot write {run_dir} ({err.strerror or err}): give --run-dir a directory of yours"
    return None


def check_run_dir(config: Config) -> None:
    if (problem := run_dir_problem(config)) is not None:
        raise PreflightError(f"node.run_dir: {problem}")


def check_addresses(config: Config) -> None:
    """Every multiaddr of the settings parses (a typo is said in a second, not after torch loads)."""
    try:
        check_swarm_addresses(config.swarm)
    except (AddressError, ImportError) as err:
        raise PreflightError(str(err)) from None


def check_task_source(task: TaskSettings) -> Task | None:
    """A reasoning-gym dataset exists and takes its config; a plug-in is installed and makes its
    task (both cheap: reasoning-gym makes problems on demand). The task made (None: a built-in
    one, whose data the checks above read)."""
    if is_builtin_task(task.name):
        return None
    try:
        made = make_task(task)
        if isinstance(made, ReasoningGymTask):
            check_reproducible(made)
    except (ImportError, ValueError, TypeError) as err:
        raise PreflightError(f"task.name: {err}") from None
    return made


def _check_hub_repo(repo_id: str, revision: str | None, kind: str, setting: str, found: Preflight) -> None:
    """The repository exists and can be read, or is in the cache when the hub cannot be reached."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise PreflightError(f"{setting}: {repo_id!r} is no hub id: {err}") from None
    cached = kind == "model" and isinstance(
        huggingface_hub.try_to_load_from_cache(repo_id, "config.json", revision=revision), str
    )
    if found.offline:
        if kind == "model" and not cached:
            raise PreflightError(
                f"{setting}: {repo_id} is not in the local Hugging Face cache, and HF_HUB_OFFLINE is set; "
                "unset it to download, or give a local model directory"
            )
        return
    info = huggingface_hub.model_info if kind == "model" else huggingface_hub.dataset_info
    try:
        info(repo_id, revision=revision, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise PreflightError(f"{setting}: {repo_id} is gated: accept its terms on huggingface.co and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise PreflightError(f"{setting}: no {kind} {repo_id!r} on the Hugging Face hub (a private one needs HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise PreflightError(f"{setting}: {repo_id} has no revision {revision!r}") from None
    except Exception as err:  # no network, no DNS, a proxy, a timeout, an outage (5xx, 429): no answer to use
        if cached:
            go_offline(found, f"the Hugging Face hub cannot be reached ({err}): using the cached {repo_id}")
            return
        if kind == "dataset":  # `datasets` keeps a cache of its own, and says itself what is missing
            go_offline(found, f"the Hugging Face hub cannot be reached ({err}): {repo_id} from the datasets cache, "
                              "if it is there")
            return
        if isinstance(err, HfHubHTTPError):
            raise PreflightError(f"{setting}: the Hugging Face hub refused {repo_id}: {err}") from None
        raise PreflightError(
            f"{setting}: cannot reach the Hugging Face hub for {repo_id} ({err}); give a local "
            f"{'model directory' if kind == 'model' else 'data directory (--data)'}, or {OFFLINE_FIX} if it is cached"
        ) from None


def go_offline(found: Preflight, note: str) -> None:
    """Read only the cache from here on, in this process: without it every later download
    would retry the hub for a minute."""
    found.offline = True
    found.notes.append(note)
    os.environ["HF_HUB_OFFLINE"] = "1"
    hub_constants.HF_HUB_OFFLINE = True
