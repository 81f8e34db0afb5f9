"""What the swarm tests (tests/test_swarm*.py) share: a node's link to a run, records stored as
a node stores them, and waits on events rather than on the clock.

The tests run real p2p daemons and DHT nodes on 127.0.0.1 (port mapping off: the
`start_runtime` fixture, tests/conftest.py). A machine busy with other work makes everything
slower, never different: so a test waits for the event that shows the behaviour (a batch
arrived, a strike was counted, N polls ran) with a deadline far beyond its usual time, and
checks causes and orders ("returned while the store is still stalled"), never "took under N s".
Figures that only a clock can give live in bench/swarm_latency.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.loop.ledger import PeerLedger
from swarmnode.settings.config import load_config
from swarmnode.swarm.base import GatherWait, Received, SwarmLink
from swarmnode.swarm.hivemind.connect import attach
from swarmnode.swarm.hivemind.dht import Manifest, owner_or_none
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, ShardedFamily, manifest_family, shard_key

RUN = "testrun"
EVERYONES = shard_key(HEARTBEAT_FAMILY, 0, 0)  # level 0 has one shard, which every peer's records may use
EVENT_TIMEOUT_S = 60.0  # the deadline of a wait for an event that takes a second or two on an idle machine

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str, timeout_s: float = EVENT_TIMEOUT_S, every_s: float = 0.05) -> T:
    """Call `predicate` until it returns something true, and return that; fail the test with
    `what` if it has not after `timeout_s` (a deadline for a broken build, not a bound)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            pytest.fail(f"gave up after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def wait_for_polls(exchange, polls: int, what: str = "") -> None:
    """Until the exchange's background poller has run `polls` more polls (its own counter)."""
    start = exchange._polls
    wait_until(lambda: exchange._polls >= start + polls, f"{polls} polls of the exchange {what}".strip())


def count_lookups(exchange) -> list[int]:
    """A list that grows by one each time one of the exchange's DHT lookups for manifests ends
    (each read of the manifest shards and the downloads it started)."""
    done: list[int] = []
    real_look_up = exchange._look_up

    async def counted() -> None:
        try:
            await real_look_up()
        finally:
            done.append(1)

    exchange._look_up = counted
    return done


def gather_until(exchange, done: Callable[[dict[int, bytes]], bool], what: str, wait: GatherWait) -> dict[int, bytes]:
    """Gather with `wait` again and again until what arrived (round -> payload, all peers) satisfies `done`."""
    got: dict[int, bytes] = {}

    def arrived() -> bool:
        got.update({item.round: item.payload for item in exchange.gather(wait)})
        return done(got)

    wait_until(arrived, what, every_s=0)
    return got


def gathers_nothing_until(exchange, peer: str, predicate: Callable[[], bool], what: str) -> None:
    """Gather (waiting briefly for `peer`) until `predicate` holds; every gather hands out nothing."""

    def check() -> bool:
        got: list[Received] = exchange.gather(GatherWait(timeout_s=0.2, wait_for={peer}))
        assert got == [], f"{peer} delivered {[(g.peer_id, g.round) for g in got]}"
        return predicate()

    wait_until(check, what, every_s=0)


async def hangs(*args, **kwargs) -> None:
    """A DHT call that never answers."""
    await asyncio.sleep(3600)


def link(runtime: SwarmRuntime, run: str = RUN, ledger: PeerLedger | None = None, *sets: str) -> SwarmLink:
    config = load_config(None, ["swarm.heartbeat_interval_s=0.5", "wire.max_bytes=67108864", "node.staleness=1", *sets])
    return attach(runtime, run, config, ledger or PeerLedger())


def announce(runtime: SwarmRuntime, manifest: Manifest, run: str = RUN) -> bool:
    """Store a manifest where a new node of `run` writes its own (its shards at levels 0 and 1)."""
    keys = ShardedFamily(manifest_family(run), runtime.peer_id, owner_or_none).write_keys()
    return runtime.call(runtime.store_owned_all(keys, manifest.to_value(), get_dht_time() + 60), 10)


def store_times(runtime: SwarmRuntime, family: str, monkeypatch) -> list[float]:
    """When `runtime` stores records of `family` from now on (a list that fills as it does)."""
    real_store = runtime.dht.store_many
    stored: list[float] = []

    async def counting(keys, *args, **kwargs):
        if any(key.startswith(family) for key in keys):
            stored.append(time.monotonic())
        return await real_store(keys, *args, **kwargs)

    monkeypatch.setattr(runtime.dht, "store_many", counting)
    return stored


async def in_flight(exchange) -> list:
    """The exchange's downloads in flight, read on its loop."""
    return list(exchange.downloads.running)


def pulls_ended(runtime: SwarmRuntime, exchange) -> None:
    """Until the exchange has no download in flight: after a test cuts the exchange off from a
    peer (its heartbeats, its asking us), a pull of that peer a poll started before the cut
    would still bring what the peer publishes next."""
    wait_until(lambda: not runtime.call(in_flight(exchange), timeout=10), "the pulls in flight to end")
