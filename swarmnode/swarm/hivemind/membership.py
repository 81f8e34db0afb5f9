"""Membership over hivemind: every node keeps a signed heartbeat in its own subkey of its
heartbeat shards (swarm.hivemind.shards) and reads a few random shards a beat, keeping what it
saw until it goes stale. A heartbeat is a claim; it decides only who is shown and who is
waited for, never what is trained on."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any

from hivemind.utils.timed_storage import get_dht_time

from swarmnode import __version__
from swarmnode.protocol.records import MAX_CLOCK_SKEW_S, Heartbeat, NodeStatus, RecordError
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind.dht import heartbeat_from_record, owner_or_none, owner_peer_id, pack
from swarmnode.swarm.hivemind.fetch import answers
from swarmnode.swarm.hivemind.payloads import ANSWER_TIMEOUT_S
from swarmnode.swarm.hivemind.reach import classify
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, ShardedFamily

log = logging.getLogger(__name__)

ANSWERS_AT_ONCE = 16  # peers asked at once while waiting for swarm.min_peers


class HivemindMembership:
    """Beats every `heartbeat_interval_s` and keeps the live peers of this run."""

    def __init__(
        self,
        runtime: SwarmRuntime,
        run_id: str,
        settings: SwarmSettings,
        served: Callable[[], int] = lambda: 0,
        on_reach: Callable[[str, list[str]], None] = lambda reach, maddrs: None,
    ) -> None:
        self.runtime = runtime
        self.peer_id = runtime.peer_id
        self.run_id = run_id
        self.settings = settings
        self.served = served  # payloads served to peers, shown in the heartbeat
        self.on_reach = on_reach  # told (reach, visible addresses) whenever how we are reached changes
        self.reach: str | None = None
        self.peers: dict[str, Heartbeat] = {}  # heartbeats of this run seen lately
        self._fresh_at: dict[str, float] = {}  # peer -> time.monotonic() when its heartbeat last moved on
        self._newest: dict[str, float] = {}  # peer -> the newest time its heartbeats claimed, while it matters
        self.heartbeats = ShardedFamily(HEARTBEAT_FAMILY, self.peer_id, owner_or_none)
        self.read_at = 0.0  # monotonic time of the last read
        self._status = NodeStatus()
        self._answering: set[str] = set()  # peers that answered a direct request (wait_for_peers)
        # peers met without the DHT (the exchange's: initial, introduced, asking), also asked by
        # wait_for_peers: a node whose DHT keys are eclipsed still counts the peer it joined through
        self.met_directly: Callable[[], list[str]] = list
        self._state = "training"
        self._other_runs: set[str] = set()
        self._bad_heartbeats: set[str] = set()
        self._started = time.time()
        self._beaten_at = -math.inf  # time.monotonic() of our last heartbeat store
        self._task = runtime.call(_spawn(self._loop()), timeout=5)

    def announce(self, status: NodeStatus) -> None:
        """Set what the heartbeat says; send it now unless a heartbeat went out within the
        last `swarm.heartbeat_interval_s` (the loop sends the newest on time). A node with
        fast rounds would otherwise store one a round, and each store looks up the nodes near
        its keys, which answer with every record there, each checked by its RSA signature."""
        self._status = status
        if time.monotonic() - self._beaten_at >= self.settings.heartbeat_interval_s:
            self._beaten_at = time.monotonic()  # now, not when the loop gets to it: one beat scheduled
            asyncio.run_coroutine_threadsafe(self._beat(), self.runtime.loop)

    def live_peers(self) -> dict[str, Heartbeat]:
        """Peers whose heartbeat moved on within `stale_after_s` of our own clock: a record
        stored once and left in the DHT (a ghost's, or a dead node's) stops counting then,
        whatever time it claims."""
        now = time.monotonic()
        peers = self.peers  # replaced whole by read(), after its fresh_at: never changed in place
        fresh_at = self._fresh_at
        return {
            peer: hb
            for peer, hb in peers.items()
            if now - fresh_at.get(peer, -math.inf) <= self.settings.stale_after_s and hb.state != "left"
        }

    def wait_for_peers(self, count: int, timeout_s: float) -> int:
        """Wait until `count` peers answered a direct request, or `timeout_s`; how many did.
        Asked: the peers live in heartbeats and those met without the DHT. A heartbeat alone
        is a claim any throwaway identity can store and leave."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.runtime.call(self.read(), timeout=30)
            answered = self.runtime.call(self._answered_candidates(), timeout=ANSWER_TIMEOUT_S + 10)
            if answered >= count or time.monotonic() >= deadline:
                return answered
            time.sleep(min(1.0, self.settings.heartbeat_interval_s))

    async def _answered_candidates(self) -> int:
        """`_answered` of the peers live in heartbeats and those met without the DHT, gathered
        on the swarm loop, where the exchange keeps the latter."""
        return await self._answered((set(self.live_peers()) | set(self.met_directly())) - {self.peer_id})

    async def _answered(self, live: set[str]) -> int:
        """How many of `live` answered a direct request, asking (ANSWERS_AT_ONCE at most)
        those that have not yet."""
        unasked = list(live - self._answering)
        asked = random.sample(unasked, min(ANSWERS_AT_ONCE, len(unasked)))  # not by id: ids are chosen freely
        results = await asyncio.gather(*(answers(self.runtime.p2p, peer, self.run_id, ANSWER_TIMEOUT_S) for peer in asked))
        self._answering.update(peer for peer, seconds in zip(asked, results) if seconds is not None)
        return len(self._answering & live)

    def close(self) -> None:
        """Say goodbye in the heartbeat, so peers stop waiting for us."""
        self.runtime.loop.call_soon_threadsafe(self._task.cancel)
        self._state = "left"
        try:
            self.runtime.call(self._beat(), timeout=5)
        except Exception as err:  # leaving anyway
            log.debug("farewell heartbeat failed: %s", err)

    # -- inside the swarm loop ---------------------------------------------------------------

    async def read(self) -> None:
        """Add the heartbeats of this run in a few random shards to those seen lately: a
        heartbeat counts when it claims a time newer than any this peer claimed before (and
        not ahead of our clock), and the peer stays live for `stale_after_s` of our own clock
        after that; note other runs once."""
        self.read_at = time.monotonic()
        found = await self.heartbeats.read(self.runtime.read_owned_many)
        now, seen_at = get_dht_time(), time.monotonic()
        stale_s = self.settings.stale_after_s
        fresh_at = {peer: t for peer, t in self._fresh_at.items() if seen_at - t <= stale_s}
        peers = {peer: hb for peer, hb in self.peers.items() if peer in fresh_at}
        # a record older than this is refused on its own claim, so what it claimed is forgotten
        newest = {peer: t for peer, t in self._newest.items() if now - t <= stale_s + MAX_CLOCK_SKEW_S}
        for subkey, raw in found.items:
            try:
                heartbeat = heartbeat_from_record(subkey, raw)
            except RecordError as err:
                self._note_malformed(subkey, err)
                continue
            if heartbeat.peer == self.peer_id:
                continue
            if heartbeat.run != self.run_id:
                self._note_other_run(heartbeat)
                continue
            if heartbeat.from_the_future(now):
                self._note_malformed(subkey, RecordError(f"dated {heartbeat.time - now:.0f} s ahead of our clock"))
                continue
            if now - heartbeat.time > stale_s or heartbeat.time <= newest.get(heartbeat.peer, -math.inf):
                continue  # an old record, or one read before: it did not move on
            newest[heartbeat.peer] = heartbeat.time
            peers[heartbeat.peer] = heartbeat
            fresh_at[heartbeat.peer] = seen_at
        # in this order: live_peers() reads peers, then fresh_at, so a peer it sees has its time
        self._newest, self._fresh_at = newest, fresh_at
        self.peers = peers

    def _note_malformed(self, subkey: Any, err: RecordError) -> None:
        try:
            owner = owner_peer_id(subkey)
        except RecordError:
            return
        if owner not in self._bad_heartbeats:
            self._bad_heartbeats.add(owner)
            log.warning("ignoring a malformed heartbeat from %s: %s", owner, err)

    def _note_other_run(self, heartbeat: Heartbeat) -> None:
        if heartbeat.peer in self._other_runs:
            return
        self._other_runs.add(heartbeat.peer)
        log.warning(
            "peer %s (model %s, version %s) is in run %s, not ours (%s): its rollouts are ignored. "
            "Runs differ when swarmnode's protocol versions, task, data, group size, max new tokens, "
            "sampling, prompt template, tokenizer or seed differ.",
            heartbeat.peer, heartbeat.model, heartbeat.version, heartbeat.run, self.run_id,
        )

    async def _update_reach(self) -> None:
        """How peers reach us now (a relay reservation comes some time after start)."""
        try:
            maddrs = [str(m) for m in await self.runtime.p2p.get_visible_maddrs()]
        except Exception as err:  # the daemon is going down: keep the last answer
            log.debug("visible addresses: %s", err)
            return
        reach = classify(maddrs, self.settings.announce_maddrs)
        if reach != self.reach:
            self.reach = reach
            self.on_reach(reach, maddrs)

    async def _beat(self) -> None:
        self._beaten_at = time.monotonic()
        await self._update_reach()
        heartbeat = Heartbeat(
            **self._status.model_dump(),
            peer=self.peer_id,
            run=self.run_id,
            time=get_dht_time(),
            state=self._state,
            version=__version__,
            uptime_s=round(time.time() - self._started, 1),
            served=self.served(),
            reach=self.reach,
        )
        ttl = max(60.0, 6 * self.settings.heartbeat_interval_s)
        try:
            await self.runtime.store_owned_all(
                self.heartbeats.write_keys(), pack(heartbeat.model_dump()), get_dht_time() + ttl
            )
        except Exception as err:  # keep beating through transient DHT trouble
            log.debug("heartbeat failed: %s", err)

    async def _loop(self) -> None:
        while True:
            await self.read()  # first: a read finds the level our heartbeat belongs at
            await self._beat()
            await asyncio.sleep(self.settings.heartbeat_interval_s)


async def _spawn(coro: Any) -> asyncio.Task:
    return asyncio.create_task(coro)
