"""The rollout exchange over hivemind: whom a node asks for batches, and when.

There is no shared round. publish(r) serves the payload of our round r for a few rounds and
announces it to strangers in the background (swarm.hivemind.announcer). In the background of
the node's rounds, every poll interval, the exchange asks the peers that delivered before
directly for anything newer (no DHT), asks strangers a few at a time, and every
`swarm.discovery_interval_s` reads a few random manifest shards of the run (every poll until
someone delivered) and downloads what they announce within the bounds on strangers
(swarm.hivemind.downloads). gather() hands out what arrived, waiting until every peer the node
waits for has delivered or the deadline passes; a download still running then goes on (up to
`swarm.fetch_timeout_s`) and is handed out by a later gather.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable

from swarmnode.bounded import note_newest
from swarmnode.protocol.records import RecordError
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.base import NO_WAIT, GatherWait, PeerStanding, Received, is_proven
from swarmnode.swarm.hivemind.announcer import Announcer
from swarmnode.swarm.hivemind.dht import Manifest, owner_or_none, owner_peer_id, payload_digest
from swarmnode.swarm.hivemind.downloads import (
    MAX_NEWEST_KEPT,
    UNEARNED_PAYLOADS_IN_FLIGHT,
    Downloads,
    choose_downloads,
)
from swarmnode.swarm.hivemind.fetch import fetch_next, fetch_payload
from swarmnode.swarm.hivemind.handover import HandOut
from swarmnode.swarm.hivemind.introductions import Introductions
from swarmnode.swarm.hivemind.payloads import PayloadServer
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import ShardedFamily, manifest_family
from swarmnode.swarm.hivemind.tokenizer_fetcher import TokenizerFetcher

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT_S = 5.0  # one DHT lookup of a manifest shard, in the background poller
GATHER_GRACE_S = 30.0  # how long past its deadline a gather may run before the node goes on without it
UNPROVEN_PER_POLL = 2  # peers not proven useful asked directly each poll, in turn
WAITING_POLL_S = 0.05  # while a round waits for known peers, they are asked this often
STRANGER_PULL_TIMEOUT_S = 5.0  # a direct pull of a peer seen only in heartbeats (its batch is found through the DHT too)


class StruckOnce:
    """The bad manifest each owner was last struck for, for the `kept` owners struck last: the
    same record read at every poll is one lie and one strike, and the memory does not grow with
    the names a crowd makes (names are free). A new bad record of the same owner is a new lie."""

    def __init__(self, kept: int = MAX_NEWEST_KEPT) -> None:
        self.kept = kept
        self._last: OrderedDict[str, bytes] = OrderedDict()  # owner -> sha256 of its record struck last

    def first(self, owner: str, record: bytes) -> bool:
        """Whether this bad record of `owner` is one it was not struck for (and note it)."""
        digest = hashlib.sha256(record).digest()
        new = self._last.get(owner) != digest
        note_newest(self._last, owner, digest, self.kept)
        return new

    def __len__(self) -> int:
        return len(self._last)


class HivemindExchange:
    """One node's data seam to the swarm; whom to wait for and how long is the node's call."""

    def __init__(
        self,
        runtime: SwarmRuntime,
        run_id: str,
        settings: SwarmSettings,
        *,
        server: PayloadServer,
        ledger: PeerStanding,
        max_payload_bytes: int,
        live_peers: Callable[[], Iterable[str]] = tuple,
        catch_up_rounds: int = 0,
    ) -> None:
        self.runtime = runtime
        # a direct pull of a peer proven useful asks for its oldest round at most this many behind
        # its newest (the node's staleness: rounds it still trains on), so rounds between pulls
        # are not skipped; any other peer is asked for its newest (`_ask_directly`)
        self.catch_up_rounds = catch_up_rounds
        self.live_peers = live_peers  # peers of the run seen lately in heartbeats (membership)
        self.peer_id = runtime.peer_id
        self.run_id = run_id
        self.settings = settings
        self.server = server
        self.ledger = ledger  # the loop's verified view of peers, read on the swarm loop
        self.max_payload_bytes = max_payload_bytes
        self.downloads = Downloads(ledger, max_payload_bytes, settings.max_peers_per_round)  # on the swarm loop
        self.tokenizer_fetcher = TokenizerFetcher(runtime, run_id, ledger)
        self._struck = StruckOnce()  # bad manifests already counted
        self._lookup: asyncio.Task | None = None  # the running DHT lookup for new peers' manifests
        self._introducer: asyncio.Task | None = None  # the running round of 'whom do you know?'
        self._polls = 0  # polls so far: whose turn it is among the peers not proven useful
        self._held: frozenset[str] = frozenset()  # peers whose groups the node holds unused (its last gather or take)
        self._rng = random.Random()  # breaks ties among equally useful peers for the pull set
        self.introductions = Introductions(runtime, run_id, ledger.known_peers)  # discovery without the DHT
        server.introductions = self.introductions.ours
        server.is_known = ledger.known
        self.manifests = ShardedFamily(manifest_family(run_id), self.peer_id, owner_or_none)
        runtime.shards.add(self.manifests.family)  # our DHT node checks the run's shards too
        self.announcer = Announcer(runtime, server, self.manifests, settings)
        runtime.call(self.server.register(runtime.p2p), timeout=10)
        self._poller = runtime.call(_spawn(self._poll_forever()), timeout=10)

    def publish(self, round_: int, payload: bytes, tokens: int = 0) -> None:
        """Serve the payload of our round `round_` and announce it in the background; returns at once."""
        manifest = Manifest(self.peer_id, round_, len(payload), payload_digest(payload), tokens)
        self.runtime.loop.call_soon_threadsafe(self._publish_on_loop, round_, payload, manifest)

    def _publish_on_loop(self, round_: int, payload: bytes, manifest: Manifest) -> None:
        self.server.put(round_, payload)
        self.announcer.announce(manifest)

    def gather(self, wait: GatherWait = NO_WAIT) -> list[Received]:
        deadline = time.monotonic() + wait.timeout_s
        self._held = wait.held  # read by the polls on the swarm loop: one reference, swapped whole
        hand_out: HandOut[Received] = HandOut()  # a gather the node gave up on hands out nothing
        timed_out = False
        try:
            self.runtime.call(self._gather(deadline, wait, hand_out), timeout=wait.timeout_s + GATHER_GRACE_S)
        except TimeoutError:  # the swarm loop is stuck: train on what we have, try again next round
            timed_out = True
        finally:  # what it handed out if it got that far; else it never will (on any exception too)
            found = hand_out.settle()
        if timed_out:
            log.warning("a gather ran %.0f s past its deadline; going on with %d batches", GATHER_GRACE_S, len(found))
        return found

    def hold(self, held: frozenset[str]) -> None:
        self._held = frozenset(held)  # read by the polls on the swarm loop: one reference, swapped whole

    def linger(self, round_: int, peers: set[str], timeout_s: float) -> None:
        """Keep serving until each of `peers` downloaded our batch of `round_`, or `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            served = self.runtime.call(_copy_set(self.server.served_to.get(round_, set())), timeout=5)
            if peers <= served:
                return
            time.sleep(self.settings.poll_interval_s)

    def offer_tokenizer(self, digest: str, document: bytes) -> None:
        self.runtime.loop.call_soon_threadsafe(self.server.tokenizer_documents.__setitem__, digest, document)

    def want_tokenizer(self, peer_id: str, digest: str) -> None:
        self.tokenizer_fetcher.want(peer_id, digest)

    def tokenizers(self) -> list[tuple[str, bytes]]:
        return self.tokenizer_fetcher.take()

    def close(self) -> None:
        """Stop downloads in flight; the runtime owns the daemon and the handler."""
        try:
            self.runtime.call(self._cancel_all(), timeout=5)
        except Exception as err:  # closing anyway
            log.debug("cancelling downloads: %s", err)

    # -- inside the swarm loop ---------------------------------------------------------------

    async def _gather(self, deadline: float, wait: GatherWait, hand_out: HandOut[Received]) -> None:
        downloads = self.downloads
        while True:
            delivered = {peer for peer, _ in downloads.ready}
            if time.monotonic() >= deadline or wait.satisfied(delivered):
                break
            # proven peers waited for are asked at once and again every WAITING_POLL_S, not at the
            # next poll (at most max_pull_peers of them: others wait for their turn in the polls)
            pulled = set(self.pull_set())
            self._ask_directly(
                peer for peer in wait.wait_for - delivered if peer in pulled and is_proven(self.ledger.standing(peer))
            )
            downloads.arrival.clear()
            pause = min(WAITING_POLL_S, max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(downloads.arrival.wait(), pause)
        hand_out.run(functools.partial(self._hand_out, wait.held))

    def _hand_out(self, held: frozenset[str]) -> list[Received]:
        """On the loop, for a gather the node still waits for: what arrived, its peers held."""
        found = self.downloads.hand_out()
        # their groups go to the pool now, held until the node's take says otherwise (`hold`);
        # set here on the loop, so no poll runs between the hand-out and it
        self._held = held | {item.peer_id for item in found}
        return found

    async def _poll_forever(self) -> None:
        """In the background of the node's rounds, every poll interval: ask the peers we pull
        from directly for anything newer (no DHT), and every `swarm.discovery_interval_s` (every
        poll until someone delivered) look in the DHT for manifests of other peers. A round
        never waits on a DHT lookup, and a lookup slowed by dead or slow DHT nodes costs the
        exchange between known peers nothing: the lookup runs beside the polls (one at a time),
        never in their way."""
        next_lookup = 0.0
        while True:
            try:
                self._pull_known()
                if self._introducer is None or self._introducer.done():
                    self._introducer = asyncio.create_task(self.introductions.maybe_ask(self.ledger.ever_delivered()))
                due = time.monotonic() >= next_lookup or not self.ledger.ever_delivered()
                if due and (self._lookup is None or self._lookup.done()):
                    next_lookup = time.monotonic() + self.settings.discovery_interval_s
                    self._lookup = asyncio.create_task(self._look_up())
            except Exception as err:  # keep polling through anything one poll does
                log.debug("poll failed: %s", err)
            await asyncio.sleep(self.settings.poll_interval_s)

    async def _look_up(self) -> None:
        """One DHT lookup for new peers' manifests, and downloads of what it found."""
        try:
            self._start_fetches(await self._new_manifests())
        except Exception as err:  # the next lookup reads again
            log.debug("manifest lookup failed: %s", err)

    def pull_set(self) -> list[str]:
        """The peers asked directly for their newest batch: those the ledger knows (delivered,
        not cut since, not banned; however slow), the most useful first, at most
        `swarm.max_pull_peers`. Everyone else is found through the DHT (strangers within a
        bound: downloads.choose_downloads)."""
        known = self.ledger.known_peers()
        standing = {peer: self.ledger.standing(peer) for peer in known}
        return choose_pull_set(known, standing, self.settings.max_pull_peers, self._rng)

    def _pull_known(self) -> None:
        """Ask the pull set, and the peers seen in heartbeats that never delivered, for anything
        newer (`direct_pulls`: the useful every poll, the others a few a poll in turn, none of
        those whose recent batch the node still holds unused or has here not handed out yet)."""
        pull_set = self.pull_set()
        strangers = self._strangers()
        standing = {peer: self.ledger.standing(peer) for peer in pull_set} | dict.fromkeys(strangers)
        self._ask_directly(direct_pulls(list(standing), standing, self._polls, self._holding()), strangers=set(strangers))
        self._polls += 1

    def _holding(self) -> frozenset[str]:
        """Peers not to fetch from unless proven useful: those whose groups the node holds
        unused (`hold`; at a gather, `GatherWait.held` and those it handed out), and those with
        a batch arrived here and not yet handed out. Without the second, a peer whose hold
        ended, or all of whose groups were used, would be fetched again at every poll of the
        round (each batch it publishes meanwhile): such a peer gets at most one batch a round,
        its newest. That holds too for a peer whose batches never reach the pool (unreadable,
        or rejected before a ban): one download a round at most, two such peers a poll."""
        return self._held | {peer for peer, _ in self.downloads.ready}

    def _ask_directly(self, peers: Iterable[str], strangers: set[str] = frozenset()) -> None:
        """Ask each of `peers` not already being downloaded from for its next batch after the
        last one we have of it (at most `catch_up_rounds` behind its newest; a peer not proven
        useful, its newest). A pull of one of
        `strangers` is a knock (downloads.Downloads.room_for_knock): the length its answer
        names must fit the strangers' budget (`admit`), and it gives up after
        STRANGER_PULL_TIMEOUT_S."""
        downloads = self.downloads
        for peer in peers:
            if downloads.busy(peer):
                continue
            timeout_s, promised, admit = self.settings.fetch_timeout_s, None, None
            # a peer not proven useful gets one batch at a time (`_holding`): its newest, not the
            # oldest of the rounds a proven peer's catch-up takes one by one
            behind = self.catch_up_rounds if is_proven(self.ledger.standing(peer)) else 0
            if peer in strangers:
                if not downloads.room_for_knock():
                    continue
                timeout_s, promised, admit = STRANGER_PULL_TIMEOUT_S, 0, functools.partial(downloads.admit, peer)
            fetch = fetch_next(
                self.runtime.p2p, peer, self.run_id, downloads.after(peer), self.max_payload_bytes, timeout_s,
                behind=behind, admit=admit,
            )
            downloads.start(peer, fetch, None, promised)

    def met_directly(self) -> list[str]:
        """Peers met without the DHT: those a known peer introduced, our initial peers, those
        that downloaded from us, then those that only asked. Claims, as heartbeats are: a
        caller checks them. On the swarm loop (candidates() prunes what it holds)."""
        return list(dict.fromkeys([
            *self.introductions.candidates(), *reversed(self.server.requesters), *reversed(self.server.askers),
        ]))

    def _strangers(self) -> list[str]:
        """Peers that never delivered to us (nor cut a download, nor are banned, nor wait out
        a back-off), asked directly in turn, so a new peer is heard within a few polls without
        waiting for its manifest to turn up in the shards we read: those a known peer
        introduced and our initial peers first, then those that downloaded from us or asked us
        for batches, then those seen live in heartbeats (swarm.hivemind.introductions: none of
        them needs the DHT but the last)."""
        now = time.monotonic()
        named = [*self.met_directly(), *self.live_peers()]
        return [
            peer for peer in dict.fromkeys(named)
            if peer != self.peer_id and not self.ledger.is_banned(peer)
            and not self.ledger.has_delivered(peer) and not self.ledger.has_cut(peer)
            and not self.downloads.backoff.waiting(peer, now)
        ]

    def _start_fetches(self, manifests: list[Manifest]) -> None:
        """Start the downloads `choose_downloads` allows; the rest wait for a later poll."""
        now, downloads = time.monotonic(), self.downloads
        waiting = [m for m in manifests if not self.ledger.known(m.peer_id) and downloads.backoff.waiting(m.peer_id, now)]
        for manifest in choose_downloads(
            [m for m in manifests if m not in waiting], downloads.promises(), self.ledger.known,
            self.settings.max_peers_per_round, UNEARNED_PAYLOADS_IN_FLIGHT * self.max_payload_bytes,
        ):
            fetch = fetch_payload(
                self.runtime.p2p, manifest.peer_id, self.run_id, manifest.round, manifest.size, manifest.digest,
                self.settings.fetch_timeout_s,
            )
            downloads.start(manifest.peer_id, fetch, manifest.round, manifest.size)

    async def _new_manifests(self) -> list[Manifest]:
        """Peers' newest manifests not yet fetched, from a few random shards: peers with
        deliveries first, then others. A shard lookup that fails or does not answer within
        LOOKUP_TIMEOUT_S counts as empty (the next poll reads again)."""
        found = await self.manifests.read(functools.partial(self.runtime.read_owned_many, timeout_s=LOOKUP_TIMEOUT_S))
        known, others = [], []
        pulled = set(self.pull_set())
        for subkey, raw in found.items:
            manifest = self._parse(subkey, raw, pulled)
            if manifest is not None:
                (known if self.ledger.known(manifest.peer_id) else others).append(manifest)
        return known + sorted(others, key=lambda m: m.size)  # strangers promising less first: less to lose

    def _parse(self, subkey: object, raw: object, pulled: set[str]) -> Manifest | None:
        try:
            owner = owner_peer_id(subkey)
        except RecordError:
            return None  # unowned records never pass validation; nothing to blame
        if owner == self.peer_id or self.ledger.is_banned(owner):
            return None
        try:
            manifest = Manifest.from_record(subkey, raw, self.max_payload_bytes)
        except RecordError as err:
            if self._struck.first(owner, raw if isinstance(raw, bytes) else repr(raw).encode()):
                self.ledger.reject(owner, f"bad manifest: {err}")
            return None
        if not self.downloads.wanted(owner, manifest.round):
            return None
        if owner in pulled:  # asked directly every poll
            return None
        if owner in self._holding() and not is_proven(self.ledger.standing(owner)):  # as in direct_pulls
            return None
        return manifest

    async def _cancel_all(self) -> None:
        self._poller.cancel()
        for task in (self._introducer, self._lookup):
            if task is not None:
                task.cancel()
        self.announcer.cancel()
        self.tokenizer_fetcher.cancel()
        self.downloads.cancel_all()


def choose_pull_set(
    known: list[str], standing: dict[str, float | None], limit: int, rng: random.Random
) -> list[str]:
    """At most `limit` of the peers with a delivery record, the most useful first. A peer's
    standing after one batch is noisy (a batch of all-wrong groups scores 0), so the useful
    come first rather than the useless being left out; and ties (every peer scored 0 is tied,
    an honest one unlucky once among a crowd of useless identities) are broken at random at
    each call, so that when more peers are known than the set holds none is left out for good."""
    chosen = list(known)
    rng.shuffle(chosen)
    chosen.sort(key=lambda peer: -(standing.get(peer) or 0.0))
    return chosen[:limit]


def direct_pulls(
    pull_set: list[str], standing: dict[str, float | None], poll: int, held: Collection[str] = frozenset(),
    others_per_poll: int = UNPROVEN_PER_POLL,
) -> list[str]:
    """Whom to ask directly at poll number `poll`: every peer whose samples proved useful
    (standing > 0), and `others_per_poll` of the rest (new, or useless so far) in turn, leaving
    out those whose recent batch the node still holds unused or has not handed out yet (`held`:
    pool.PeerPool.holding, HivemindExchange._holding):
    their next batch would only wait behind it, and the node takes their groups only where
    useful peers leave room. A few such peers are each asked every poll (an honest peer whose
    batch happened to teach nothing is still heard at once); sixteen identities delivering junk
    cost a download each every pool.HOLD_ROUNDS rounds (sooner where `node.max_age_s` clears
    their groups first), not two a poll."""
    proven = [peer for peer in pull_set if is_proven(standing.get(peer))]
    others = [peer for peer in pull_set if not is_proven(standing.get(peer)) and peer not in held]
    if len(others) <= others_per_poll:
        return proven + others
    start = (poll * others_per_poll) % len(others)
    turn = [others[(start + i) % len(others)] for i in range(others_per_poll)]
    return proven + turn


async def _spawn(coro) -> asyncio.Task:  # noqa: ANN001
    """A task made on the swarm loop (asyncio.Event and tasks belong to the loop they run on)."""
    return asyncio.create_task(coro)


async def _copy_set(items: set[str]) -> set[str]:
    """A copy made on the swarm loop, which is the one that changes the set."""
    return set(items)
