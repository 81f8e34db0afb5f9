"""The rollout exchange over hivemind: signed manifests in the DHT, payloads pulled peer to peer.

publish(r): keep the payload in memory for a few rounds, announce it with a manifest (size,
digest, tokens) in our own subkey of the round's DHT key.
gather(r): poll the manifests of rounds r-s..r and pull each new one from its producer,
checked against the manifest, until every peer the node waits for has delivered or the
deadline passes. Downloads run as tasks of their own: a round never waits for a peer it was
not told to wait for, and a download still running at the deadline goes on in the background
(up to `swarm.fetch_timeout_s`) and is handed out by a later gather. Peers the ledger has seen
deliver are fetched first; at most `swarm.max_peers_per_round` downloads of others run at once,
so a thousand junk manifests cost a bounded number of doomed downloads, not a round.
probe(): fetch given peers' batches of given rounds in the background, for the node's round
clock (a claim is believed only once the batch behind it has been checked).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import Counter
from collections.abc import Callable

from swarmnode.config import SwarmSettings
from swarmnode.records import RecordError
from swarmnode.swarm.base import Received
from swarmnode.swarm.hivemind.dht import Manifest, manifest_key, owner_peer_id, payload_digest, subkey_items
from swarmnode.swarm.hivemind.payloads import FetchError, PayloadServer, fetch_payload
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.ledger import PeerLedger

log = logging.getLogger(__name__)

MANIFEST_TTL_S = 600.0
MAX_FETCH_ATTEMPTS = 3
FORGET_AFTER_ROUNDS = 8
UNEARNED_PAYLOADS_IN_FLIGHT = 2  # strangers' downloads at once, in promised bytes, as max-size payloads
GATHER_GRACE_S = 30.0  # how long past its deadline a gather may run before the node goes on without it

Key = tuple[str, int]  # (peer, round)


class HivemindExchange:
    """One node's data seam to the swarm; whom to wait for and how long is the node's call."""

    def __init__(
        self,
        runtime: SwarmRuntime,
        run_id: str,
        settings: SwarmSettings,
        *,
        server: PayloadServer,
        ledger: PeerLedger,
        max_payload_bytes: int,
    ) -> None:
        self.runtime = runtime
        self.peer_id = runtime.peer_id
        self.run_id = run_id
        self.settings = settings
        self.server = server
        self.ledger = ledger
        self.max_payload_bytes = max_payload_bytes
        self._seen: set[Key] = set()  # handed out, or given up on
        self._attempts: Counter[Key] = Counter()
        self._inflight: dict[Key, asyncio.Task] = {}
        self._inflight_bytes: dict[Key, int] = {}  # what each running download's manifest promised
        self._ready: dict[Key, bytes] = {}  # downloaded, not yet handed out
        runtime.call(self.server.register(runtime.p2p), timeout=10)

    def publish(self, round_: int, payload: bytes, tokens: int = 0) -> None:
        self.runtime.loop.call_soon_threadsafe(self.server.put, round_, payload)
        manifest = Manifest(self.peer_id, round_, len(payload), payload_digest(payload), tokens)
        key = manifest_key(self.run_id, round_)
        try:
            ok = self.runtime.store_owned(key, manifest.to_value(), MANIFEST_TTL_S)
            # hivemind reports the last replica's answer, which is False when a peer's lookup
            # already cached this very record there; so check before calling it a failure.
            ok = ok or self.runtime.signer.local_public_key in self.runtime.get_subkeys(key)
        except TimeoutError:
            ok = False
        if not ok:
            log.warning("could not announce round %d in the DHT; peers may miss it", round_)

    def gather(
        self,
        round_: int,
        staleness: int,
        timeout_s: float,
        wait_for: set[str] | frozenset[str] = frozenset(),
        wait_for_any: bool = False,
    ) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        try:
            return self.runtime.call(
                self._gather(round_, staleness, deadline, set(wait_for), wait_for_any),
                timeout=timeout_s + GATHER_GRACE_S,
            )
        except TimeoutError:  # the swarm loop is stuck: train on what we have, try again next round
            log.warning("gathering round %d ran %.0f s past its deadline; going on without peers", round_, GATHER_GRACE_S)
            return []

    def probe(self, wanted: dict[str, int], timeout_s: float) -> concurrent.futures.Future:
        """Start fetching each peer's batch of the given round; the future's result is a list of
        (peer, round, payload or None). Runs on the swarm loop, so the caller does not wait."""
        return asyncio.run_coroutine_threadsafe(self._probe(wanted, timeout_s), self.runtime.loop)

    def linger(self, round_: int, peers: set[str], timeout_s: float) -> None:
        """Keep serving until each of `peers` downloaded our batch of `round_`, or `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            served = self.runtime.call(_copy_set(self.server.served_to.get(round_, set())), timeout=5)
            if peers <= served:
                return
            time.sleep(self.settings.poll_interval_s)

    def close(self) -> None:
        """Stop downloads in flight; the runtime owns the daemon and the handler."""
        try:
            self.runtime.call(self._cancel_all(), timeout=5)
        except Exception as err:  # closing anyway
            log.debug("cancelling downloads: %s", err)

    # -- inside the swarm loop ---------------------------------------------------------------

    async def _gather(
        self, round_: int, staleness: int, deadline: float, wait_for: set[str], wait_for_any: bool
    ) -> list[Received]:
        started = time.monotonic()
        window = set(range(max(0, round_ - staleness), round_ + 1))
        arrived_at = {key: 0.0 for key in self._ready}  # already here when the gather began
        while True:
            self._start_fetches(await self._new_manifests(sorted(window), deadline))
            for key in list(self._ready):
                arrived_at.setdefault(key, time.monotonic() - started)
            delivered = {peer for peer, r in self._ready if r in window}
            in_window = {(peer, r): t for (peer, r), t in self._inflight.items() if r in window}
            busy = [t for (peer, _), t in in_window.items() if wait_for_any or peer in wait_for]
            if time.monotonic() >= deadline or (wait_for <= delivered and (delivered or not wait_for_any)):
                break
            pause = min(self.settings.poll_interval_s, max(0.0, deadline - time.monotonic()))
            if busy:
                await asyncio.wait(busy, timeout=pause, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(pause)
        # Batches that arrived after their round left the window are handed out as stale: the
        # node checks them (bad data is counted, a late peer still proves it delivers) but does
        # not train on them.
        found = [
            Received(peer, r, payload, after_s=arrived_at.get((peer, r)), stale=r not in window)
            for (peer, r), payload in sorted(self._ready.items())
            if r <= round_
        ]
        for item in found:
            del self._ready[(item.peer_id, item.round)]
            self._seen.add((item.peer_id, item.round))
        self._forget_old(round_ - staleness - FORGET_AFTER_ROUNDS)
        return found

    def _start_fetches(self, manifests: list[Manifest]) -> None:
        """Start the downloads `choose_downloads` allows; the rest wait for a later poll."""
        for manifest in choose_downloads(
            manifests, self._inflight_bytes, self.ledger.earned, self.settings.max_peers_per_round,
            UNEARNED_PAYLOADS_IN_FLIGHT * self.max_payload_bytes,
        ):
            self._start_fetch(manifest)

    def _start_fetch(self, manifest: Manifest) -> None:
        key = (manifest.peer_id, manifest.round)  # _parse left out keys seen, in flight or ready
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
        if isinstance(result, bytes):
            self._ready[key] = result
        elif isinstance(result, FetchError) and result.misbehaved:
            self._seen.add(key)
            self.ledger.reject(key[0], str(result))
        elif isinstance(result, FetchError) and result.cut:
            self._seen.add(key)
            self.ledger.cut(key[0])
            log.debug("fetch %s round %d: %s", key[0], key[1], result)
        else:
            self._attempts[key] += 1
            log.debug("fetch %s round %d: %s", key[0], key[1], result)
            if self._attempts[key] >= MAX_FETCH_ATTEMPTS:
                self._seen.add(key)  # unreachable: stop asking, without blaming it

    async def _new_manifests(self, rounds: list[int], deadline: float) -> list[Manifest]:
        """Manifests of the rounds not yet fetched: peers with deliveries first, then others.
        The lookup ends by the gather's deadline (at least one poll interval): a DHT that does
        not answer costs a round its wait, never more."""
        keys = [manifest_key(self.run_id, r) for r in rounds]
        bound_s = max(self.settings.poll_interval_s, deadline - time.monotonic())
        try:
            results = await asyncio.wait_for(
                self.runtime.dht.get_many(keys, sufficient_expiration_time=float("inf")), bound_s
            )
        except Exception as err:  # a flaky, slow or failing DHT lookup must not end the round
            log.debug("manifest lookup failed: %s", err)
            return []
        earned, others = [], []
        for r, key in zip(rounds, keys):
            for subkey, raw in subkey_items(results.get(key)):
                manifest = self._parse(subkey, raw, r)
                if manifest is not None:
                    (earned if self.ledger.earned(manifest.peer_id) else others).append(manifest)
        return earned + others

    def _parse(self, subkey: object, raw: object, round_: int) -> Manifest | None:
        try:
            owner = owner_peer_id(subkey)
        except RecordError:
            return None  # unowned records never pass validation; nothing to blame
        key = (owner, round_)
        if owner == self.peer_id or key in self._seen or key in self._inflight or key in self._ready:
            return None
        if self.ledger.is_banned(owner):
            return None
        try:
            return Manifest.from_record(subkey, raw, round_, self.max_payload_bytes)
        except RecordError as err:
            self._seen.add(key)
            self.ledger.reject(owner, f"bad manifest for round {round_}: {err}")
            return None

    async def _probe(self, wanted: dict[str, int], timeout_s: float) -> list[tuple[str, int, bytes | None]]:
        """Each wanted (peer, round): the verified-against-manifest payload, or None."""
        rounds = sorted(set(wanted.values()))
        keys = [manifest_key(self.run_id, r) for r in rounds]
        try:
            found = await asyncio.wait_for(
                self.runtime.dht.get_many(keys, sufficient_expiration_time=float("inf")), timeout_s
            )
        except Exception as err:  # no answer counts as no batch
            log.debug("probe lookup failed: %s", err)
            found = {}
        manifests: dict[str, Manifest] = {}
        for r, key in zip(rounds, keys):
            for subkey, raw in subkey_items(found.get(key)):
                try:
                    manifest = Manifest.from_record(subkey, raw, r, self.max_payload_bytes)
                except RecordError:
                    continue
                if wanted.get(manifest.peer_id) == r:
                    manifests[manifest.peer_id] = manifest
        fetched = await asyncio.gather(
            *(fetch_payload(self.runtime.p2p, m.peer_id, self.run_id, m.round, m.size, m.digest, timeout_s)
              for m in manifests.values()),
            return_exceptions=True,
        )
        payloads = {m.peer_id: p for m, p in zip(manifests.values(), fetched) if isinstance(p, bytes)}
        return [(peer, r, payloads.get(peer)) for peer, r in wanted.items()]

    def _forget_old(self, before_round: int) -> None:
        self._seen = {k for k in self._seen if k[1] >= before_round}
        self._attempts = Counter({k: v for k, v in self._attempts.items() if k[1] >= before_round})
        for key in [k for k in self._ready if k[1] < before_round]:
            del self._ready[key]

    async def _cancel_all(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        self._inflight.clear()
        self._inflight_bytes.clear()


def choose_downloads(
    manifests: list[Manifest],
    inflight: dict[Key, int],
    earned: Callable[[str], bool],
    max_others: int,
    max_other_bytes: int,
) -> list[Manifest]:
    """Which new manifests to download now, given the downloads running (key -> promised
    bytes). One download per peer at a time, so identities cannot multiply their share by
    announcing many batches; peers that delivered before always; others up to `max_others`
    downloads and `max_other_bytes` promised bytes at once, so payloads promised by strangers
    (and cut before their last byte) hold a bounded amount of memory."""
    busy = {peer for peer, _ in inflight}
    others = [size for (peer, _), size in inflight.items() if not earned(peer)]
    count, promised = len(others), sum(others)
    chosen = []
    for manifest in manifests:
        if manifest.peer_id in busy:
            continue
        if not earned(manifest.peer_id):
            if count >= max_others or promised + manifest.size > max_other_bytes:
                continue
            count, promised = count + 1, promised + manifest.size
        busy.add(manifest.peer_id)
        chosen.append(manifest)
    return chosen


async def _copy_set(items: set[str]) -> set[str]:
    """A copy made on the swarm loop, which is the one that changes the set."""
    return set(items)
