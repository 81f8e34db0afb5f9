"""The rollout exchange over hivemind: signed manifests in the DHT, payloads pulled peer to peer.

publish(r): keep the payload in memory for a few rounds, announce it with a manifest (size,
digest, tokens) in our own subkey of the round's DHT key.
gather(r): until the round deadline, poll the manifests of rounds r-s..r, pull every new one
from its producer, check it against the manifest, and stop early once every live peer of the
run (as membership sees it) has delivered something. A slow or vanished peer costs at most the
deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from swarmnode.config import SwarmSettings
from swarmnode.records import RecordError
from swarmnode.swarm.base import Received
from swarmnode.swarm.hivemind.dht import Manifest, manifest_key, owner_peer_id, payload_digest
from swarmnode.swarm.hivemind.membership import HivemindMembership
from swarmnode.swarm.hivemind.payloads import FetchError, PayloadServer, fetch_payload
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.ledger import PeerLedger

log = logging.getLogger(__name__)

MANIFEST_TTL_S = 600.0
MAX_FETCH_ATTEMPTS = 3


class HivemindExchange:
    """One node's data seam to the swarm; what it waits for comes from `membership`."""

    def __init__(
        self,
        runtime: SwarmRuntime,
        run_id: str,
        settings: SwarmSettings,
        *,
        server: PayloadServer,
        membership: HivemindMembership,
        ledger: PeerLedger,
        max_payload_bytes: int,
    ) -> None:
        self.runtime = runtime
        self.peer_id = runtime.peer_id
        self.run_id = run_id
        self.settings = settings
        self.server = server
        self.membership = membership
        self.ledger = ledger
        self.max_payload_bytes = max_payload_bytes
        self._seen: set[tuple[str, int]] = set()
        self._attempts: Counter[tuple[str, int]] = Counter()
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

    def gather(self, round_: int, staleness: int, timeout_s: float) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        return self.runtime.call(self._gather(round_, staleness, deadline), timeout=timeout_s + 30)

    def close(self) -> None:
        """Nothing of its own to stop: the runtime owns the daemon and the handler."""

    # -- inside the swarm loop ---------------------------------------------------------------

    async def _gather(self, round_: int, staleness: int, deadline: float) -> list[Received]:
        found: list[Received] = []
        delivered: set[str] = set()
        rounds = list(range(max(0, round_ - staleness), round_ + 1))
        while True:
            if time.monotonic() - self.membership.read_at > 1.0:
                await self.membership.read()
            manifests = await self._new_manifests(rounds)
            remaining = deadline - time.monotonic()
            if manifests and remaining > 0:
                found += await self._fetch_all(manifests, min(self.settings.fetch_timeout_s, remaining))
                delivered |= {item.peer_id for item in found}
            # Every live peer is waited for (up to the deadline), whatever round its last heartbeat
            # showed: that keeps nodes within `staleness` rounds of each other instead of racing.
            expected = {peer for peer in self.membership.live_peers() if not self.ledger.is_banned(peer)}
            if expected <= delivered or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(min(self.settings.poll_interval_s, max(0.0, deadline - time.monotonic())))

    async def _new_manifests(self, rounds: list[int]) -> list[Manifest]:
        keys = [manifest_key(self.run_id, r) for r in rounds]
        try:
            results = await self.runtime.dht.get_many(keys, sufficient_expiration_time=float("inf"))
        except Exception as err:  # a flaky DHT lookup must not end the round
            log.debug("manifest lookup failed: %s", err)
            return []
        manifests: list[Manifest] = []
        for r, key in zip(rounds, keys):
            entry = results.get(key)
            if entry is None or not hasattr(entry.value, "items"):
                continue
            for subkey, item in list(entry.value.items())[: self.settings.max_peers_per_round * 2]:
                try:
                    owner = owner_peer_id(subkey)
                except RecordError:
                    continue  # unowned records never pass validation; nothing to blame
                if owner == self.peer_id or (owner, r) in self._seen or self.ledger.is_banned(owner):
                    continue
                try:
                    manifests.append(Manifest.from_record(subkey, item.value, r, self.max_payload_bytes))
                except RecordError as err:
                    self._seen.add((owner, r))
                    self.ledger.reject(owner, f"bad manifest for round {r}: {err}")
        return manifests[: self.settings.max_peers_per_round]

    async def _fetch_all(self, manifests: list[Manifest], timeout_s: float) -> list[Received]:
        p2p = self.runtime.p2p
        results = await asyncio.gather(
            *(
                fetch_payload(p2p, m.peer_id, self.run_id, m.round, m.size, m.digest, timeout_s)
                for m in manifests
            ),
            return_exceptions=True,
        )
        received = []
        for manifest, result in zip(manifests, results):
            key = (manifest.peer_id, manifest.round)
            if isinstance(result, bytes):
                self._seen.add(key)
                received.append(Received(manifest.peer_id, manifest.round, result))
            elif isinstance(result, FetchError) and result.misbehaved:
                self._seen.add(key)
                self.ledger.reject(manifest.peer_id, str(result))
            else:
                self._attempts[key] += 1
                log.debug("fetch %s round %d: %s", manifest.peer_id, manifest.round, result)
                if self._attempts[key] >= MAX_FETCH_ATTEMPTS:
                    self._seen.add(key)  # unreachable: stop asking, without blaming it
        self._forget_old(min(m.round for m in manifests) - 8)
        return received

    def _forget_old(self, before_round: int) -> None:
        self._seen = {k for k in self._seen if k[1] >= before_round}
        self._attempts = Counter({k: v for k, v in self._attempts.items() if k[1] >= before_round})
