"""`swarmnode doctor`: what this machine can run with these settings, and what it cannot,
before joining anything.

Each check says what it found, what the node will do about it, and the fix where there is
one. A finding is fine, a note (the node works, differently: on CPU, without vLLM, from the
cache) or blocking (the node would stop: exit 1). Nothing here imports torch where there is
no GPU driver, and each question to the hub (at most three) times out after 5 s: about a
second where the network refuses at once, as here, longer where it drops packets.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants as hub_constants
from huggingface_hub.utils import get_session

from swarmnode.ops.preflight import (
    HUB_TIMEOUT_S,
    Preflight,
    PreflightError,
    check_addresses,
    check_device,
    check_model,
    check_task_data,
    check_task_source,
    hub_offline,
    run_dir_problem,
)
from swarmnode.settings.config import Config
from swarmnode.sizing.devices import cuda_available, vllm_installed
from swarmnode.sizing.memory import GIB, check_fits
from swarmnode.sizing.shapes import shape_of
from swarmnode.tasks import data_source

FINE, NOTE, BLOCKING = "ok", "note", "blocking"
BYTES_PER_PARAM_ON_DISK = 4  # a full checkpoint in fp32 (safetensors), the upper end
CHECKPOINT_COPIES = 2  # the checkpoint being written beside the last one
DISK_MARGIN_BYTES = 1 * GIB  # logs, the hub cache's temporary files


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: str  # FINE, NOTE or BLOCKING
    said: str


def examine(config: Config) -> list[Finding]:
    """Every check, in the order a node meets them."""
    device = _device(config)
    findings = [device, _generation(config)]
    hub = _hub()
    findings.append(hub)
    found = Preflight(offline=hub_offline())  # unreachable: each check says what it lacks
    model = _checked("model", lambda: check_model(config.model, found), f"{config.model.name}: found")
    findings.append(model)
    findings.append(_checked("data", lambda: check_task_data(config.task, found),
                             f"{config.task.name}: {data_source(config.task) or 'problems made here'}"))
    findings.append(_checked("task", lambda: check_task_source(config.task), f"{config.task.name} makes its problems"))
    findings.append(_checked("addresses", lambda: check_addresses(config), "every multiaddr given parses"))
    if BLOCKING not in (model.verdict, device.verdict):  # the estimate needs both
        findings.append(_memory(config))
    findings += [_run_dir(config), _disk(config, known_model=model.verdict != BLOCKING)]
    findings += [Finding("hub", NOTE, note) for note in found.notes]  # e.g. a cached model used offline
    return findings


def _checked(check: str, run, fine: str) -> Finding:  # noqa: ANN001 (a check of swarmnode.ops.preflight)
    try:
        run()
    except PreflightError as err:
        return Finding(check, BLOCKING, str(err))
    return Finding(check, FINE, fine)


def _device(config: Config) -> Finding:
    try:
        check_device(config)
    except PreflightError as err:
        return Finding("device", BLOCKING, str(err))
    if cuda_available():
        return Finding("device", FINE, "a CUDA GPU: the node trains and generates on it")
    return Finding("device", NOTE, "no GPU: the node trains and generates on CPU (the tiny presets run well; "
                                   "a real model is slow)")


def _generation(config: Config) -> Finding:
    asked = config.rollout.backend
    if vllm_installed():
        return Finding("generation", FINE, "vLLM is installed (used on a GPU with backend auto)")
    if asked == "vllm":
        return Finding("generation", BLOCKING, "rollout.backend vllm, but vLLM is not installed: pip install "
                                               "'swarmnode[vllm]' (a GPU), or --backend hf")
    return Finding("generation", NOTE, "vLLM is not installed: generation by Hugging Face transformers "
                                       "(slower on a GPU: pip install 'swarmnode[vllm]')")


def _hub() -> Finding:
    if hub_offline():
        return Finding("hub", NOTE, "HF_HUB_OFFLINE is set: models and data come from the local cache only")
    try:
        get_session().head(hub_constants.ENDPOINT, timeout=HUB_TIMEOUT_S)
    except Exception as err:  # no network, no DNS, a proxy, a timeout
        return Finding("hub", NOTE, f"the Hugging Face hub cannot be reached ({err}): the presets, local model "
                                    "directories and local data work; HF_HUB_OFFLINE=1 reads the cache")
    return Finding("hub", FINE, f"{hub_constants.ENDPOINT} answers")


def _memory(config: Config) -> Finding:
    estimate, problem = check_fits(config)
    if problem:
        return Finding("memory", BLOCKING, problem)
    if estimate is None:
        return Finding("memory", FINE, "a preset, built here (a few MB)")
    return Finding("memory", FINE, f"about {estimate.total / GIB:.1f} GiB of {estimate.capacity / GIB:.1f} GiB "
                                   f"({estimate.device})")


def _run_dir(config: Config) -> Finding:
    problem = run_dir_problem(config)
    if problem is not None:
        return Finding("run dir", BLOCKING, problem)
    return Finding("run dir", FINE, f"{config.node.run_dir} is writable")


def _disk(config: Config, known_model: bool = True) -> Finding:
    run_dir = Path(config.node.run_dir)
    where = next((p for p in [run_dir, *run_dir.parents] if p.exists()), Path.cwd())
    free = shutil.disk_usage(where).free
    # a model the checks could not find has no size to read (and asking again would cost the hub's timeout)
    shape = None if config.model.lora.rank or not known_model else shape_of(config.model.name, config.model.revision)
    checkpoint = shape.num_params * BYTES_PER_PARAM_ON_DISK if shape else 0  # LoRA and presets: megabytes
    needed = checkpoint * CHECKPOINT_COPIES + DISK_MARGIN_BYTES
    said = f"{free / GIB:.1f} GiB free in {where}; checkpoints need about {needed / GIB:.1f} GiB"
    if free < needed:
        return Finding("disk", BLOCKING, f"{said}: free some space or give --run-dir on another disk")
    return Finding("disk", FINE, said)
