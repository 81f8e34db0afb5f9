"""What `swarmnode status` reads: peers' heartbeats in the DHT, with their age and state.

Heartbeats of all runs live in shards (swarm.hivemind.shards); status finds the level the
writers use and reads every shard of it, up to STATUS_SHARDS (about 500 peers; of a larger
swarm, a random sample). Each row says which run the peer is in. A heartbeat older than `stale_after_s` is shown as stale; one
the peer marked 'left' as left. Records expire from the DHT a minute after the last beat.

Everything in a heartbeat is its peer's claim, its time included: a throwaway identity can
store one that says `training`, a famous model and a high accuracy, and exit. So status also
asks each peer (up to PROBED_ROWS) a question only a live one answers, over the payload
protocol ("anything after round 2^62?"), and shows what it checked apart from what was
claimed: whether it answered, how fast, and over which path (`probe`; payloads.answers). A
heartbeat that claims `training` is shown so only when its peer answered: otherwise `silent`
(asked, no answer) or `unchecked` (not asked), however recent the time it claims.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Collection

from hivemind.utils.timed_storage import get_dht_time

from swarmnode.protocol.records import PeerRow, RecordError
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind.dht import heartbeat_from_record, owner_or_none
from swarmnode.swarm.hivemind.fetch import answers
from swarmnode.swarm.hivemind.payloads import ANSWER_TIMEOUT_S
from swarmnode.swarm.hivemind.reach import classify
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, ShardedFamily, ShardReads

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
STATUS_SHARDS = 64  # heartbeat shards one status read covers at most
PROBED_ROWS = 64  # peers asked directly by one status read (see probe: whom first)
PROBES_AT_ONCE = 32


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


def probe(runtime: SwarmRuntime, rows: list[PeerRow], first: Collection[str] = ()) -> list[PeerRow]:
    """`rows` with what this reader checked itself: whether each peer (PROBED_ROWS of those
    not marked left: the peers in `first`, then those claiming to train, in random order
    within each, so no run's name or crowd takes every question) answered a direct request
    within ANSWER_TIMEOUT_S, and by which path."""
    budget = ANSWER_TIMEOUT_S * (PROBED_ROWS // PROBES_AT_ONCE + 1) + 10
    return runtime.call(_probe_rows(runtime, rows, frozenset(first)), timeout=budget)


async def _probe_rows(runtime: SwarmRuntime, rows: list[PeerRow], first: frozenset[str]) -> list[PeerRow]:
    slots = asyncio.Semaphore(PROBES_AT_ONCE)
    candidates = [row for row in rows if row.state != "left"]
    random.shuffle(candidates)
    asked = sorted(candidates, key=lambda row: (row.heartbeat.peer not in first, row.state != "training"))[:PROBED_ROWS]

    async def ask(row: PeerRow) -> float | None:
        async with slots:
            seconds = await answers(runtime.p2p, row.heartbeat.peer, row.heartbeat.run, ANSWER_TIMEOUT_S)
            return None if seconds is None else round(seconds * 1000, 1)

    answered_ms = dict(zip((row.heartbeat.peer for row in asked), await asyncio.gather(*(ask(row) for row in asked))))
    paths = {info.peer_id.to_base58(): [str(a) for a in info.addrs] for info in await runtime.p2p.list_peers()}
    checked = []
    for row in rows:
        answered = answered_ms.get(row.heartbeat.peer)
        reached = _path(paths.get(row.heartbeat.peer, [])) if answered is not None else None
        was_asked = row.heartbeat.peer in answered_ms
        checked.append(dataclasses.replace(
            row, state=shown_state(row.state, was_asked, answered), asked=was_asked, answered_ms=answered, reached=reached,
        ))
    return checked


def shown_state(claimed: str, asked: bool, answered_ms: float | None) -> str:
    """The state status shows: `training` only for a peer that answered; one that claims it
    but did not answer is `silent`, one not asked `unchecked` (a heartbeat's time is a claim
    too, so a ghost dated ahead within the allowed skew is not shown as training)."""
    if claimed != "training" or answered_ms is not None:
        return claimed
    return "silent" if asked else "unchecked"


def _path(addresses: list[str]) -> str:
    """How we reached a peer, from the addresses of our connection to it."""
    reach = classify(addresses, [])
    return "direct" if reach == "private" else reach  # a private address we reached: a direct path here


def peer_rows(runtime: SwarmRuntime, stale_after_s: float, first: Collection[str] = ()) -> list[PeerRow]:
    """What `swarmnode status` shows: every heartbeat's row, with what was checked of it
    (asking the peers in `first` before the rest: the page's peers that answered before)."""
    return probe(runtime, read_heartbeats(runtime, stale_after_s), first)
