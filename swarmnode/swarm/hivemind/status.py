"""What `swarmnode status` reads: peers' heartbeats in the DHT, with their age and state.

Heartbeats of all runs live in shards (swarm.hivemind.shards); status finds the level the
writers use and reads every shard of it, up to STATUS_SHARDS (about 500 peers; of a larger
swarm, a random sample). Each row says which run the peer is in. A heartbeat older than `stale_after_s` is shown as stale; one
the peer marked 'left' as left. Records expire from the DHT a minute after the last beat.
"""

from __future__ import annotations

import logging

from hivemind.utils.timed_storage import get_dht_time

from swarmnode.protocol.records import PeerRow, RecordError
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind.dht import heartbeat_from_record, owner_or_none
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, ShardedFamily, ShardReads

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
STATUS_SHARDS = 64  # heartbeat shards one status read covers at most


def open_status_client(initial_peers: list[str], timeout_s: float) -> SwarmRuntime:
    """A DHT client on a throwaway identity: reads the swarm, stores nothing, listens on
    loopback only. Raises SwarmError when no initial peer answers; the caller shuts it down."""
    logging.getLogger("hivemind").setLevel(logging.WARNING)  # the daemon's start-up chatter is not status
    settings = SwarmSettings(initial_peers=initial_peers, host_maddrs=LOOPBACK, startup_timeout_s=timeout_s)
    runtime = SwarmRuntime(settings, client_mode=True)
    runtime.start()
    return runtime


def read_heartbeats(runtime: SwarmRuntime, stale_after_s: float) -> list[PeerRow]:
    """Every valid heartbeat found as a row, with its age and the shown state (training,
    stale, left); one row a peer, its newest heartbeat."""
    newest: dict[str, PeerRow] = {}
    for subkey, raw in runtime.call(_read_shards(runtime), timeout=30).items:
        try:
            heartbeat = heartbeat_from_record(subkey, raw)
        except RecordError:
            continue  # malformed: status shows only what a node would accept
        if heartbeat.from_the_future(get_dht_time()):
            continue  # dated ahead of our clock: a node refuses it too
        age_s = round(max(0.0, get_dht_time() - heartbeat.time), 1)
        state = "stale" if heartbeat.state != "left" and age_s > stale_after_s else heartbeat.state
        if heartbeat.peer not in newest or heartbeat.time > newest[heartbeat.peer].heartbeat.time:
            newest[heartbeat.peer] = PeerRow(heartbeat, age_s, state)
    return sorted(newest.values(), key=lambda r: (r.heartbeat.run, r.state != "training", r.heartbeat.peer))


async def _read_shards(runtime: SwarmRuntime) -> ShardReads:
    """Probe where the writers are, then read up to STATUS_SHARDS shards of that level."""
    family = ShardedFamily(HEARTBEAT_FAMILY, runtime.peer_id, owner_or_none)
    await family.read(runtime.read_owned_many, shards=1)  # the first read probes every level
    return await family.read_level(runtime.read_owned_many, family.estimate.level, STATUS_SHARDS)
