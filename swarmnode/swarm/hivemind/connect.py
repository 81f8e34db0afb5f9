"""Joining over hivemind in two steps, as the composition root needs them: start the daemon and
DHT before the model loads (a bad address fails fast), attach the two seams once the run id is
known (it depends on the tokenizer)."""

from __future__ import annotations

import logging
from pathlib import Path

from swarmnode.settings.config import Config
from swarmnode.swarm.base import PeerStanding, SwarmLink
from swarmnode.swarm.hivemind.addresses import check_swarm_addresses
from swarmnode.swarm.hivemind.exchange import HivemindExchange
from swarmnode.swarm.hivemind.membership import HivemindMembership
from swarmnode.swarm.hivemind.payloads import PayloadServer
from swarmnode.swarm.hivemind.reach import ADVICE
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.swarm_file import read_peers_file, write_swarm_file

log = logging.getLogger(__name__)


def initial_peers_of(config: Config) -> list[str]:
    """The configured initial peers plus those of `swarm.initial_peers_file` (waits for it)."""
    s = config.swarm
    peers = list(s.initial_peers)
    if s.initial_peers_file:
        peers += read_peers_file(s.initial_peers_file, s.startup_timeout_s)
    check_swarm_addresses(s, peers)
    return peers


def identity_path_of(config: Config) -> Path:
    return config.swarm.identity_path or Path(config.node.run_dir) / "identity.key"


def start_runtime(config: Config, initial_peers: list[str]) -> SwarmRuntime:
    """Start the p2p daemon and DHT node and write <run_dir>/swarm.json; the caller shuts it down."""
    runtime = SwarmRuntime(config.swarm, identity_path_of(config), initial_peers)
    runtime.start()
    return runtime


def announce_address(config: Config, runtime: SwarmRuntime) -> list[str]:
    """This node's visible addresses, also written to <run_dir>/swarm.json for others."""
    maddrs = runtime.visible_maddrs()
    write_swarm_file(Path(config.node.run_dir), runtime.peer_id, maddrs)
    return maddrs


def attach(runtime: SwarmRuntime, run_id: str, config: Config, ledger: PeerStanding) -> SwarmLink:
    """The node's exchange and membership on a started runtime."""
    server = PayloadServer(run_id, keep_rounds=config.node.staleness + 3)

    def note_reach(reach: str, maddrs: list[str]) -> None:
        """Say how peers reach us, with what to do, and keep swarm.json's addresses current."""
        (log.warning if reach == "private" else log.info)("reach: %s: %s", reach, ADVICE[reach])
        write_swarm_file(Path(config.node.run_dir), runtime.peer_id, maddrs, reach)

    membership = HivemindMembership(
        runtime, run_id, config.swarm, served=lambda: server.served, on_reach=note_reach
    )
    try:
        exchange = HivemindExchange(
            runtime, run_id, config.swarm, server=server, ledger=ledger, max_payload_bytes=config.wire.max_bytes,
            live_peers=lambda: membership.live_peers().keys(), catch_up_rounds=config.node.staleness,
        )
    except BaseException:
        membership.close()
        raise
    membership.met_directly = exchange.met_directly
    return SwarmLink(exchange, membership)
