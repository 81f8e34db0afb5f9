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
import socket
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
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
from swarmnode.protocol.records import MAX_CLOCK_SKEW_S
from swarmnode.settings.config import Config
from swarmnode.sizing.devices import cuda_available, vllm_installed
from swarmnode.sizing.memory import GIB, check_fits
from swarmnode.sizing.shapes import shape_of
from swarmnode.swarm.hivemind.reach import ADVICE, listen_ips
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
    hub, hub_time = _hub()
    findings += [hub, _clock(hub_time)]
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
    if config.swarm.enabled:
        findings += [_initial_peers(config), _reach(config)]
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


def _hub() -> tuple[Finding, float | None]:
    """Whether the hub answers, and its clock (the Date of its answer) when it does."""
    if hub_offline():
        return Finding("hub", NOTE, "HF_HUB_OFFLINE is set: models and data come from the local cache only"), None
    try:
        answer = get_session().head(hub_constants.ENDPOINT, timeout=HUB_TIMEOUT_S)
    except Exception as err:  # no network, no DNS, a proxy, a timeout
        return Finding("hub", NOTE, f"the Hugging Face hub cannot be reached ({err}): the presets, local model "
                                    "directories and local data work; HF_HUB_OFFLINE=1 reads the cache"), None
    try:
        server_time = parsedate_to_datetime(answer.headers["Date"]).timestamp()
    except (KeyError, TypeError, ValueError):
        server_time = None
    return Finding("hub", FINE, f"{hub_constants.ENDPOINT} answers"), server_time


def _clock(server_time: float | None, now: float | None = None) -> Finding:
    """Peers refuse heartbeats dated more than MAX_CLOCK_SKEW_S ahead of their clock, and a
    node behind refuses theirs: a clock that far off keeps a node out of every view."""
    if server_time is None:
        return Finding("clock", NOTE, "not checked: no time source answered (the hub's clock is the one asked)")
    skew = (time.time() if now is None else now) - server_time
    said = f"{abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} the hub's clock"
    if abs(skew) > MAX_CLOCK_SKEW_S:
        return Finding("clock", BLOCKING, f"{said}: peers refuse heartbeats more than {MAX_CLOCK_SKEW_S:.0f} s "
                                          "off; turn on time sync (timedatectl set-ntp true)")
    return Finding("clock", FINE, said)


def _tcp_target(maddr: str) -> tuple[str, int] | None:
    """(host, port) a multiaddr dials over TCP, or None (a relay circuit, another transport)."""
    parts = maddr.split("/")
    if "p2p-circuit" in parts or "tcp" not in parts:
        return None
    host = next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p in ("ip4", "ip6", "dns", "dns4", "dns6")), None)
    try:
        port = int(parts[parts.index("tcp") + 1])
    except (IndexError, ValueError):
        return None
    return (host, port) if host else None


def _initial_peers(config: Config, timeout_s: float = 3.0) -> Finding:
    """Whether the initial peers accept a TCP connection (the swarm's handshake is the node's
    to do): none that answers stops the join."""
    peers = config.swarm.initial_peers
    if not peers:
        return Finding("initial peers", FINE, "none given: this node starts a new swarm; others join with the "
                                              "address it prints")
    answered, failures = 0, []
    for maddr in peers[:8]:
        target = _tcp_target(maddr)
        if target is None:
            failures.append(f"{maddr}: not a TCP address, not checked")
            continue
        try:
            with socket.create_connection(target, timeout=timeout_s):
                answered += 1
        except OSError as err:
            failures.append(f"{target[0]}:{target[1]} {err.strerror or err}")
    said = f"{answered} of {min(len(peers), 8)} answer on TCP" + (f" ({'; '.join(failures)})" if failures else "")
    if answered == 0:
        return Finding("initial peers", BLOCKING, f"{said}: check the address (copy it whole from a running node) "
                                                  "and that its port is open to you")
    return Finding("initial peers", FINE, said)


def _reach(config: Config) -> Finding:
    """How peers would reach this node, from its listening and announced addresses."""
    ips = listen_ips(config.swarm)
    if any(ip.is_global for ip in ips):
        return Finding("reach", FINE, f"direct: {ADVICE['direct']}")
    if ips and all(ip.is_loopback for ip in ips):
        return Finding("reach", NOTE, f"local: {ADVICE['local']}; --host-maddrs /ip4/0.0.0.0/tcp/31337 for others")
    return Finding("reach", NOTE, f"private: {ADVICE['private']}")


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
