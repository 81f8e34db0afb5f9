"""The rollout exchange over hivemind: signed manifests in the DHT, payloads pulled peer to peer.

There is no shared round. publish(r): keep the payload of our round r in memory for a few
rounds and announce it, in the background, with a manifest (our round, size, digest, tokens)
in our own subkey of our shards of the run's manifests (swarm.hivemind.shards), which hold each
peer's newest manifest. gather(): ask the peers that delivered before directly for anything
newer, read a few random manifest shards every `swarm.discovery_interval_s`, and pull every new batch (a round newer than any handed out for its peer) from its producer,
checked against the manifest; polling and downloads run in the background of the node's
rounds, and gather() hands out what arrived, waiting until every peer the node waits for has
delivered or the deadline passes. Downloads run as tasks of their own: a download still running at the deadline
goes on in the background (up to `swarm.fetch_timeout_s`) and is handed out by a later gather.
One download per peer at a time; peers the ledger has seen deliver are fetched first, others
within a bound on count and promised bytes (`choose_downloads`), the smallest promise first, so
a thousand junk manifests cost a bounded number of doomed downloads and bounded memory, not a
round. A download must keep to a floor rate (swarm.hivemind.payloads), and a stranger whose
download failed waits out a growing back-off (`Backoff`) before it is asked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable

from hivemind.utils.timed_storage import get_dht_time

from swarmnode.protocol.records import RecordError, short_peer
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.base import NO_WAIT, GatherWait, PeerStanding, Received, is_proven
from swarmnode.swarm.hivemind.dht import Manifest, owner_or_none, owner_peer_id, payload_digest
from swarmnode.swarm.hivemind.introductions import Introductions
from swarmnode.swarm.hivemind.payloads import (
    FetchError,
    PayloadServer,
    fetch_newest,
    fetch_payload,
    fetch_tokenizer,
)
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import ShardedFamily, manifest_family
from swarmnode.swarm.tokenizer_wants import TokenizerWants

log = logging.getLogger(__name__)

MANIFEST_TTL_S = 600.0
MAX_FETCH_ATTEMPTS = 3
LOOKUP_TIMEOUT_S = 5.0  # one DHT lookup of a manifest shard, in the background poller
STORE_TIMEOUT_S = 10.0  # one store of our manifest, in the background
GATHER_GRACE_S = 30.0  # how long past its deadline a gather may run before the node goes on without it
UNEARNED_PAYLOADS_IN_FLIGHT = 2  # strangers' downloads at once, in promised bytes, as max-size payloads
DIRECT = -1  # the round of a direct pull's key while it runs (the answer names the round)
UNPROVEN_PER_POLL = 2  # peers not proven useful asked directly each poll, in turn
WAITING_POLL_S = 0.05  # while a round waits for known peers, they are asked this often
STRANGER_PULL_TIMEOUT_S = 5.0  # a direct pull of a peer seen only in heartbeats (its batch is found through the DHT too)
STRANGER_BACKOFF_S = 10.0  # a stranger whose download wasted its place waits this long before the next ...
STRANGER_BACKOFF_MAX_S = 600.0  # ... doubled at each failure in a row, up to this

Key = tuple[str, int]  # (peer, its round)


class Backoff:
    """Strangers whose last downloads wasted their place (silent, too slow, cut, unreachable),
    and until when each waits before it is downloaded from again: STRANGER_BACKOFF_S, doubled
    at each failure in a row. An identity that announces a new round every second cannot
    re-arm a doomed download every second; a new identity costs a key and a DHT store."""

    def __init__(self, base_s: float = STRANGER_BACKOFF_S, cap_s: float = STRANGER_BACKOFF_MAX_S) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self._failures: Counter[str] = Counter()
        self._until: dict[str, float] = {}

    def failed(self, peer: str, now: float) -> None:
        self._failures[peer] += 1
        self._until[peer] = now + min(self.cap_s, self.base_s * 2 ** min(self._failures[peer] - 1, 30))
        for old in [p for p, until in self._until.items() if until < now - self.cap_s]:  # bounded memory
            del self._until[old]
            del self._failures[old]

    def delivered(self, peer: str) -> None:
        self._failures.pop(peer, None)
        self._until.pop(peer, None)

    def waiting(self, peer: str, now: float) -> bool:
        return self._until.get(peer, 0.0) > now


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
    ) -> None:
        self.runtime = runtime
        self.live_peers = live_peers  # peers of the run seen lately in heartbeats (membership)
        self.peer_id = runtime.peer_id
        self.run_id = run_id
        self.settings = settings
        self.server = server
        self.ledger = ledger  # the loop's verified view of peers, read on the swarm loop
        self.max_payload_bytes = max_payload_bytes
        self._newest: dict[str, int] = {}  # peer -> newest round handed out or given up on
        self._blamed: set[tuple[str, bytes]] = set()  # (owner, record) of bad manifests already counted
        self._attempts: Counter[Key] = Counter()
        self._inflight: dict[Key, asyncio.Task] = {}
        self._inflight_bytes: dict[Key, int] = {}  # what each running download's manifest promised
        self._ready: dict[Key, bytes] = {}  # downloaded, not yet handed out
        self._arrival = asyncio.Event()  # set when a download completes (used on the swarm loop only)
        self._unannounced: Manifest | None = None  # our newest manifest, not yet stored
        self._announcer: asyncio.Task | None = None  # the background store of our manifests
        self._next_announce = 0.0  # time.monotonic() before which no manifest is stored
        self._lookup: asyncio.Task | None = None  # the running DHT lookup for new peers' manifests
        self._introducer: asyncio.Task | None = None  # the running round of 'whom do you know?'
        self._polls = 0  # polls so far: whose turn it is among the peers not proven useful
        self._held: frozenset[str] = frozenset()  # peers whose groups the node holds unused (its last gather)
        self._rng = random.Random()  # breaks ties among equally useful peers for the pull set
        self._backoff = Backoff()  # strangers whose downloads failed: on the swarm loop only
        self._tokenizer_wants = TokenizerWants()  # on the swarm loop
        self._tokenizer_fetch: asyncio.Task | None = None
        self._tokenizers_lock = threading.Lock()
        self._tokenizers_ready: list[tuple[str, bytes]] = []  # fetched, not yet handed out
        self.introductions = Introductions(runtime, run_id, ledger.known_peers)  # discovery without the DHT
        server.introductions = self.introductions.ours
        server.is_known = ledger.known
        self.manifests = ShardedFamily(manifest_family(run_id), self.peer_id, owner_or_none)
        runtime.shards.add(self.manifests.family)  # our DHT node checks the run's shards too
        runtime.call(self.server.register(runtime.p2p), timeout=10)
        self._poller = runtime.call(_spawn(self._poll_forever()), timeout=10)

    def publish(self, round_: int, payload: bytes, tokens: int = 0) -> None:
        """Serve the payload of our round `round_` and announce it in the background: a DHT
        store can take seconds when the nodes that hold the key are slow (or slow on purpose),
        and a round never waits on it. A newer publish supersedes one not yet announced.

        The DHT is for strangers (peers that know us pull directly), and they read it every
        `swarm.discovery_interval_s`, so a manifest is stored at most that often: a store
        asks the nodes near each of its keys, and they answer with every record there (a
        crowd's too), each checked by its RSA signature. The announced round stays served
        until the next announcement, however fast the rounds go."""
        manifest = Manifest(self.peer_id, round_, len(payload), payload_digest(payload), tokens)
        self.runtime.loop.call_soon_threadsafe(self._publish_on_loop, round_, payload, manifest)

    def _publish_on_loop(self, round_: int, payload: bytes, manifest: Manifest) -> None:
        self.server.put(round_, payload)
        self._unannounced = manifest
        if self._announcer is None or self._announcer.done():
            self._announcer = asyncio.create_task(self._announce_newest())

    async def _announce_newest(self) -> None:
        """Store our newest manifest until none is waiting: one store at a time, at most one
        every discovery interval, the newest wins."""
        while self._unannounced is not None:
            await asyncio.sleep(max(0.0, self._next_announce - time.monotonic()))
            manifest, self._unannounced = self._unannounced, None
            self.server.pin(manifest.round)
            self._next_announce = time.monotonic() + self.settings.discovery_interval_s
            expiration = get_dht_time() + MANIFEST_TTL_S
            try:
                ok = await asyncio.wait_for(
                    self.runtime.store_owned_all(self.manifests.write_keys(), manifest.to_value(), expiration),
                    2 * STORE_TIMEOUT_S,  # a store, then perhaps a read-back
                )
            except Exception as err:  # a slow or failing DHT: the next round's manifest tries again
                log.debug("announcing round %d: %s", manifest.round, err)
                ok = False
            self.server.settle_pin(manifest.round, ok)
            if not ok:
                log.warning("could not announce round %d in the DHT; peers may miss it", manifest.round)

    def gather(self, wait: GatherWait = NO_WAIT) -> list[Received]:
        deadline = time.monotonic() + wait.timeout_s
        self._held = wait.held  # read by the polls on the swarm loop: one reference, swapped whole
        try:
            found = self.runtime.call(self._gather(deadline, wait), timeout=wait.timeout_s + GATHER_GRACE_S)
        except TimeoutError:  # the swarm loop is stuck: train on what we have, try again next round
            log.warning("a gather ran %.0f s past its deadline; going on without peers", GATHER_GRACE_S)
            return []
        self._held = self._held | {item.peer_id for item in found}  # their groups go to the pool now
        return found

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
        try:
            self.runtime.loop.call_soon_threadsafe(self._want_tokenizer, peer_id, digest)
        except RuntimeError:  # the swarm loop closed (shutting down): nothing to fetch for
            log.debug("not fetching tokenizer %s: the swarm is closed", digest[:16])

    def tokenizers(self) -> list[tuple[str, bytes]]:
        with self._tokenizers_lock:
            fetched, self._tokenizers_ready = self._tokenizers_ready, []
        return fetched

    def _want_tokenizer(self, peer_id: str, digest: str) -> None:
        self._tokenizer_wants.want(peer_id, digest)
        self._fetch_next_tokenizer()

    def _fetch_next_tokenizer(self) -> None:
        """Start the next tokenizer fetch the rule allows (swarm.tokenizer_wants: one at a time)."""
        job = self._tokenizer_wants.next(self.ledger.known)
        if job is None:
            return
        peer, digest = job
        self._tokenizer_fetch = asyncio.create_task(fetch_tokenizer(self.runtime.p2p, peer, self.run_id, digest))
        self._tokenizer_fetch.add_done_callback(lambda done: self._tokenizer_settled(peer, digest, done))

    def _tokenizer_settled(self, peer: str, digest: str, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        err = task.exception()
        if err is None:
            with self._tokenizers_lock:
                self._tokenizers_ready.append((digest, task.result()))
        else:
            if isinstance(err, FetchError) and err.misbehaved:
                self.ledger.reject(peer, f"tokenizer document: {err}")
            log.info("could not fetch tokenizer %s from %s: %s", digest[:16], short_peer(peer), err)
        self._tokenizer_wants.settle(err is None)
        self._fetch_next_tokenizer()

    def close(self) -> None:
        """Stop downloads in flight; the runtime owns the daemon and the handler."""
        try:
            self.runtime.call(self._cancel_all(), timeout=5)
        except Exception as err:  # closing anyway
            log.debug("cancelling downloads: %s", err)

    # -- inside the swarm loop ---------------------------------------------------------------

    async def _gather(self, deadline: float, wait: GatherWait) -> list[Received]:
        while True:
            delivered = {peer for peer, _ in self._ready}
            if time.monotonic() >= deadline or wait.satisfied(delivered):
                break
            # proven peers waited for are asked at once and again every WAITING_POLL_S, not at the
            # next poll (at most max_pull_peers of them: others wait for their turn in the polls)
            pulled = set(self.pull_set())
            self._ask_directly(
                peer for peer in wait.wait_for - delivered if peer in pulled and is_proven(self.ledger.standing(peer))
            )
            self._arrival.clear()
            pause = min(WAITING_POLL_S, max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrival.wait(), pause)
        found = [
            Received(peer, r, payload) for (peer, r), payload in sorted(self._ready.items())
        ]
        self._ready.clear()
        for item in found:
            self._handed_out(item.peer_id, item.round)
        return found

    def _handed_out(self, peer: str, round_: int) -> None:
        """From now on only rounds newer than `round_` of `peer` are fetched."""
        self._newest[peer] = max(round_, self._newest.get(peer, round_))
        self._attempts = Counter({k: v for k, v in self._attempts.items() if k[1] > self._newest.get(k[0], -1)})

    def _start_fetches(self, manifests: list[Manifest]) -> None:
        """Start the downloads `choose_downloads` allows; the rest wait for a later poll."""
        now = time.monotonic()
        waiting = [m for m in manifests if not self.ledger.known(m.peer_id) and self._backoff.waiting(m.peer_id, now)]
        for manifest in choose_downloads(
            [m for m in manifests if m not in waiting], self._inflight_bytes, self.ledger.known,
            self.settings.max_peers_per_round, UNEARNED_PAYLOADS_IN_FLIGHT * self.max_payload_bytes,
        ):
            self._start_fetch(manifest)

    def _start_fetch(self, manifest: Manifest) -> None:
        key = (manifest.peer_id, manifest.round)  # _parse left out rounds handed out, in flight or ready
        self._inflight_bytes[key] = manifest.size
        task = asyncio.create_task(
            fetch_payload(
                self.runtime.p2p, manifest.peer_id, self.run_id, manifest.round, manifest.size, manifest.digest,
                self.settings.fetch_timeout_s,
            )
        )
        self._inflight[key] = task
        task.add_done_callback(lambda done, key=key: self._settle(key, done))

    def _settle(self, key: Key, task: asyncio.Task) -> None:
        """A download ended: keep the payload, blame the peer, or count a failed attempt."""
        self._inflight.pop(key, None)
        self._inflight_bytes.pop(key, None)
        if task.cancelled():
            return
        result = task.exception() or task.result()
        if key[1] == DIRECT:  # a direct pull names its round, or found nothing newer
            if result is None:
                return
            if isinstance(result, tuple):
                key, result = (key[0], result[0]), result[1]
                if key[1] <= self._newest.get(key[0], -1):
                    return
        if isinstance(result, FetchError) and not (result.misbehaved or result.gone) and not self.ledger.known(key[0]):
            self._backoff.failed(key[0], time.monotonic())
        if isinstance(result, bytes):
            self._backoff.delivered(key[0])
            self._ready[key] = result
            self._arrival.set()
        elif isinstance(result, FetchError) and result.misbehaved:
            self._handed_out(*key)
            self.ledger.reject(key[0], str(result))
        elif isinstance(result, FetchError) and result.cut:
            self._handed_out(*key)
            self.ledger.cut(key[0])
            log.debug("fetch %s round %d: %s", key[0], key[1], result)
        elif key[1] == DIRECT:  # unreachable or slow: asked again next poll, while the ledger knows it
            log.debug("direct pull from %s: %s", key[0], result)
        else:
            self._attempts[key] += 1
            log.debug("fetch %s round %d: %s", key[0], key[1], result)
            if self._attempts[key] >= MAX_FETCH_ATTEMPTS:
                self._handed_out(*key)  # unreachable: stop asking for this round, without blaming it

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
        bound: `choose_downloads`)."""
        known = self.ledger.known_peers()
        standing = {peer: self.ledger.standing(peer) for peer in known}
        return choose_pull_set(known, standing, self.settings.max_pull_peers, self._rng)

    def _pull_known(self) -> None:
        """Ask the pull set, and the peers seen in heartbeats that never delivered, for anything
        newer (`direct_pulls`: the useful every poll, the others a few a poll in turn, none of
        those whose recent batch the node still holds unused)."""
        pull_set = self.pull_set()
        strangers = self._strangers()
        standing = {peer: self.ledger.standing(peer) for peer in pull_set} | dict.fromkeys(strangers)
        self._ask_directly(direct_pulls(list(standing), standing, self._polls, self._held), strangers=set(strangers))
        self._polls += 1

    def _ask_directly(self, peers: Iterable[str], strangers: set[str] = frozenset()) -> None:
        """Ask each of `peers` not already being downloaded from for its newest batch after
        the last one we have of it. A pull of one of `strangers` counts as a stranger's
        download of a max-size payload (`choose_downloads`' bound) and gives up after
        STRANGER_PULL_TIMEOUT_S."""
        busy = {peer for peer, _ in self._inflight}
        for peer in peers:
            if peer in busy:
                continue
            timeout_s = self.settings.fetch_timeout_s
            key = (peer, DIRECT)
            if peer in strangers:
                if not self._room_for_stranger():
                    continue
                timeout_s = STRANGER_PULL_TIMEOUT_S
                self._inflight_bytes[key] = self.max_payload_bytes
            after = max([self._newest.get(peer, -1), *(r for p, r in self._ready if p == peer)])
            task = asyncio.create_task(
                fetch_newest(self.runtime.p2p, peer, self.run_id, after, self.max_payload_bytes, timeout_s)
            )
            self._inflight[key] = task
            task.add_done_callback(lambda done, key=key: self._settle(key, done))

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
            and not self._backoff.waiting(peer, now)
        ]

    def _room_for_stranger(self) -> bool:
        """Another stranger's download of a max-size payload fits `choose_downloads`' bounds."""
        count, promised = strangers_in_flight(self._inflight_bytes, self.ledger.known)
        return (
            count < self.settings.max_peers_per_round
            and promised + self.max_payload_bytes <= UNEARNED_PAYLOADS_IN_FLIGHT * self.max_payload_bytes
        )

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
            blame = (owner, raw if isinstance(raw, bytes) else repr(raw).encode())
            if blame not in self._blamed:  # one bad record, one strike, however often it is read
                self._blamed.add(blame)
                self.ledger.reject(owner, f"bad manifest: {err}")
            return None
        key = (owner, manifest.round)
        if manifest.round <= self._newest.get(owner, -1) or key in self._inflight or key in self._ready:
            return None
        if owner in pulled:  # asked directly every poll
            return None
        if owner in self._held and not is_proven(self.ledger.standing(owner)):  # as in direct_pulls
            return None
        return manifest

    async def _cancel_all(self) -> None:
        self._poller.cancel()
        if self._introducer is not None:
            self._introducer.cancel()
        if self._lookup is not None:
            self._lookup.cancel()
        if self._announcer is not None:
            self._announcer.cancel()
        if self._tokenizer_fetch is not None:
            self._tokenizer_fetch.cancel()
        for task in list(self._inflight.values()):
            task.cancel()
        self._inflight.clear()
        self._inflight_bytes.clear()


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
    out those whose recent batch the node still holds unused (`held`: pool.PeerPool.holding):
    their next batch would only wait behind it, and the node takes their groups only where
    useful peers leave room. A few such peers are each asked every poll (an honest peer whose
    batch happened to teach nothing is still heard at once); sixteen identities delivering junk
    cost a download each every pool.HOLD_ROUNDS rounds, not two a poll."""
    proven = [peer for peer in pull_set if is_proven(standing.get(peer))]
    others = [peer for peer in pull_set if not is_proven(standing.get(peer)) and peer not in held]
    if len(others) <= others_per_poll:
        return proven + others
    start = (poll * others_per_poll) % len(others)
    turn = [others[(start + i) % len(others)] for i in range(others_per_poll)]
    return proven + turn


def choose_downloads(
    manifests: list[Manifest],
    inflight: dict[Key, int],
    known: Callable[[str], bool],
    max_others: int,
    max_other_bytes: int,
) -> list[Manifest]:
    """Which new manifests to download now, given the downloads running (key -> promised
    bytes). One download per peer at a time, so identities cannot multiply their share by
    announcing many batches; peers that delivered before always; others up to `max_others`
    downloads and `max_other_bytes` promised bytes at once, so payloads promised by strangers
    (and cut before their last byte) hold a bounded amount of memory."""
    busy = {peer for peer, _ in inflight}
    count, promised = strangers_in_flight(inflight, known)
    chosen = []
    for manifest in manifests:
        if manifest.peer_id in busy:
            continue
        if not known(manifest.peer_id):
            if count >= max_others or promised + manifest.size > max_other_bytes:
                continue
            count, promised = count + 1, promised + manifest.size
        busy.add(manifest.peer_id)
        chosen.append(manifest)
    return chosen


def strangers_in_flight(inflight: dict[Key, int], known: Callable[[str], bool]) -> tuple[int, int]:
    """The downloads running (key -> promised bytes) from peers without a delivery record: how
    many, and the bytes they promised."""
    others = [size for (peer, _), size in inflight.items() if not known(peer)]
    return len(others), sum(others)


async def _spawn(coro) -> asyncio.Task:  # noqa: ANN001
    """A task made on the swarm loop (asyncio.Event and tasks belong to the loop they run on)."""
    return asyncio.create_task(coro)


async def _copy_set(items: set[str]) -> set[str]:
    """A copy made on the swarm loop, which is the one that changes the set."""
    return set(items)
