"""<run_dir>/swarm.json: a node's peer id and addresses, written at start, read by other nodes
as their initial peers (Docker Compose, `demo`, scripts on one host). The same option reads a
bootstrap list a swarm's organisers publish: a text file of multiaddrs, one a line (`#` starts
a comment), any of which is enough to join."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

MAX_FILE_BYTES = 64 * 1024


FILE_NAME = "swarm.json"


class PeersFileError(ValueError):
    """The file never appeared, or does not hold a node's addresses."""


def read_peers_file(path: Path, timeout_s: float, poll_s: float = 0.5) -> list[str]:
    """The multiaddrs in `path` (a <run_dir>/swarm.json written by `join`, or a bootstrap list),
    waiting up to `timeout_s` for it to appear. Loopback addresses are dropped when others exist: they
    point at the reader's own host or container, not at the writer."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() >= deadline:
            raise PeersFileError(f"{path} did not appear within {timeout_s:.0f} s: is the bootstrap node running?")
        time.sleep(poll_s)
    if path.stat().st_size > MAX_FILE_BYTES:
        raise PeersFileError(f"{path} is larger than {MAX_FILE_BYTES} bytes: not a swarm.json or a list of addresses")
    text = path.read_text(errors="replace")
    maddrs = _swarm_json_maddrs(path, text) if text.lstrip().startswith("{") else _listed_maddrs(path, text)
    outside = [m for m in maddrs if not m.startswith(("/ip4/127.", "/ip6/::1/"))]
    chosen = outside or maddrs
    if not chosen:
        raise PeersFileError(f"{path} lists no addresses")
    return chosen


def _swarm_json_maddrs(path: Path, text: str) -> list[str]:
    try:
        return [str(m) for m in json.loads(text)["maddrs"]]
    except (ValueError, KeyError, TypeError) as err:
        raise PeersFileError(f"{path} is not a swarm.json written by swarmnode join ({err})") from None


def _listed_maddrs(path: Path, text: str) -> list[str]:
    """A bootstrap list: one multiaddr a line; blank lines and `#` comments are skipped (each
    address is checked in full where the swarm settings are)."""
    maddrs = []
    for number, line in enumerate(text.splitlines(), 1):
        maddr = line.split("#", 1)[0].strip()
        if maddr and not maddr.startswith("/"):
            raise PeersFileError(
                f"{path} line {number}: {maddr[:60]!r} is not a multiaddr; give a swarm.json or a list of "
                "addresses like /ip4/1.2.3.4/tcp/31337/p2p/Qm..., one a line"
            )
        if maddr:
            maddrs.append(maddr)
    return maddrs


def swarm_file_peer_id(path: Path) -> str | None:
    """The peer id a node's swarm.json names (None for a bootstrap list or a damaged file):
    `status` run beside a node shows what its peers say of it."""
    try:
        peer_id = json.loads(path.read_text()).get("peer_id")
    except (OSError, ValueError, AttributeError):
        return None
    return peer_id if isinstance(peer_id, str) else None


def write_swarm_file(run_dir: Path, peer_id: str, maddrs: list[str], reach: str | None = None) -> Path:
    """Write this node's address (and how peers reach it, once known) atomically: a reader
    never sees half a file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (FILE_NAME + ".tmp")
    tmp.write_text(json.dumps({"peer_id": peer_id, "maddrs": maddrs, "pid": os.getpid(), "reach": reach}))
    return tmp.replace(run_dir / FILE_NAME)
