"""`swarmnode doctor`: what this machine can run with these settings, and what it cannot,
before joining anything.

Each check says what it found, what the node will do about it, and the fix where there is
one. A finding is fine, a note (the node works, differently: on CPU, without vLLM, from the
cache) or blocking (the node would stop: exit 1). Nothing here imports torch where there is
no GPU driver, and each question to the hub (at most three) times out after 5 s: about a
second where the network refuses at once, as here, longer where it drops packets.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
import socket
import sys
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
from swarmnode.swarm.hivemind import (
    ADVICE,
    AddressError,
    PeersFileError,
    check_swarm_addresses,
    listen_ips,
    read_peers_file,
    tcp_endpoint,
)
from swarmnode.tasks import data_source

FINE, NOTE, BLOCKING = "ok", "note", "blocking"
BYTES_PER_PARAM_ON_DISK = 4  # a full checkpoint in fp32 (safetensors), the upper end
CHECKPOINT_COPIES = 2  # the checkpoint being written beside the last one
DISK_MARGIN_BYTES = 1 * GIB  # logs, the hub cache's temporary files
MAX_PEERS_ASKED = 8  # initial peers dialled, each for at most PEER_TIMEOUT_S
PEER_TIMEOUT_S = 3.0
TIMEX_BYTES = 512  # room for Linux's struct timex (208 bytes on x86-64)
TIME_ERROR = 5  # adjtimex's answer for a clock no time service keeps in sync


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


def _clock(server_time: float | None, now: float | None = None, kernel_synced: bool | None = None) -> Finding:
    """Peers refuse heartbeats dated more than MAX_CLOCK_SKEW_S ahead of their clock, and a
    node behind refuses theirs: a clock that far off keeps a node out of every view. Without
    the hub's clock, the kernel's own flag says whether a time service (NTP) keeps it in sync."""
    if server_time is None:
        synced = _kernel_clock_synced() if kernel_synced is None else kernel_synced
        if synced:
            return Finding("clock", FINE, "kept in sync by a time service (the kernel says so; the hub's clock "
                                          "could not be asked)")
        said = ("no time service keeps it in sync (the kernel says so)" if synced is False
                else "not checked: no time source answered (the hub's clock is the one asked)")
        return Finding("clock", NOTE, f"{said}: peers refuse heartbeats more than {MAX_CLOCK_SKEW_S:.0f} s off; "
                                      "timedatectl set-ntp true (or chrony) keeps it right")
    skew = (time.time() if now is None else now) - server_time
    said = f"{abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} the hub's clock"
    if abs(skew) > MAX_CLOCK_SKEW_S:
        return Finding("clock", BLOCKING, f"{said}: peers refuse heartbeats more than {MAX_CLOCK_SKEW_S:.0f} s "
                                          "off; turn on time sync (timedatectl set-ntp true)")
    return Finding("clock", FINE, said)


def _kernel_clock_synced() -> bool | None:
    """Linux's adjtimex, read only (no privilege needed): False while no time service
    disciplines the clock (TIME_ERROR), None where it cannot be asked."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        state = libc.adjtimex(ctypes.create_string_buffer(TIMEX_BYTES))  # modes 0: only read
    except (OSError, AttributeError):
        return None
    return None if state < 0 else state != TIME_ERROR


def _initial_peers(config: Config) -> Finding:
    """Whether the initial peers (and those of the peers file, as it is now) accept a TCP
    connection (the swarm's handshake is the node's to do): none that answers stops the join."""
    peers, file_said = list(config.swarm.initial_peers), ""
    path = config.swarm.initial_peers_file
    if path is not None and not path.is_file():
        file_said = (f"; {path} is not there yet: join waits {config.swarm.startup_timeout_s:.0f} s for it "
                     "(start the bootstrap node first, or check the path)")
        if not peers:
            return Finding("initial peers", NOTE, file_said.removeprefix("; "))
    elif path is not None:
        try:
            listed = read_peers_file(path, timeout_s=0)
            check_swarm_addresses(config.swarm, listed)
        except (PeersFileError, AddressError, ImportError, OSError) as err:
            return Finding("initial peers", BLOCKING, str(err))
        peers += listed
        file_said = f" ({len(listed)} from {path})"
    if not peers:
        return Finding("initial peers", FINE, "none given: this node starts a new swarm; others join with the "
                                              "address it prints")
    answered, failures = 0, []
    for maddr in peers[:MAX_PEERS_ASKED]:
        target = tcp_endpoint(maddr)
        if target is None:
            failures.append(f"{maddr}: not a TCP address, not checked")
            continue
        try:
            with socket.create_connection(target, timeout=PEER_TIMEOUT_S):
                answered += 1
        except OSError as err:
            failures.append(f"{target[0]}:{target[1]} {err.strerror or err}")
    said = (f"{answered} of {min(len(peers), MAX_PEERS_ASKED)} answer on TCP{file_said}"
            + (f" ({'; '.join(failures)})" if failures else ""))
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
