"""The Exchange over hivemind: signed manifests in the DHT, payloads pulled peer to peer.

publish(r): keep the payload in memory for a few rounds, announce it with a manifest (size,
digest, tokens) in our own subkey of the round's DHT key.
gather(r): until the round deadline, poll the manifests of rounds r-s..r, pull every new one
from its producer, check it against the manifest, and stop early once every live peer of the
run has delivered something. A slow or vanished peer costs at most the deadline.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import Counter
from typing import Any

from hivemind.utils.timed_storage import get_dht_time

from swarmnode import __version__
from swarmnode.exchange import Exchange, PeerLedger, Received
from swarmnode.swarm.payloads import FetchError, PayloadServer, fetch_payload
from swarmnode.swarm.records import (
    HEARTBEAT_KEY,
    Manifest,
    RecordError,
    heartbeat_from_record,
    manifest_key,
    owner_peer_id,
    pack,
    payload_digest,
)
from swarmnode.swarm.runtime import SwarmRuntime

log = logging.getLogger(__name__)

MANIFEST_TTL_S = 600.0
MAX_FETCH_ATTEMPTS = 3


class HivemindExchange(Exchange):
    def __init__(
        self,
        runtime: SwarmRuntime,
        run_id: str,
        *,
        max_payload_bytes: int,
        staleness: int,
        ledger: PeerLedger,
        heartbeat_interval_s: float = 5.0,
        stale_after_s: float = 20.0,
        poll_interval_s: float = 0.25,
        fetch_timeout_s: float = 60.0,
        max_peers_per_round: int = 64,
    ) -> None:
        self.runtime = runtime
        self.peer_id = runtime.peer_id
        self.run_id = run_id
        self.max_payload_bytes = max_payload_bytes
        self.ledger = ledger
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stale_after_s = stale_after_s
        self.poll_interval_s = poll_interval_s
        self.fetch_timeout_s = fetch_timeout_s
        self.max_peers_per_round = max_peers_per_round
        self.server = PayloadServer(run_id, keep_rounds=staleness + 3)
        self.peers: dict[str, dict[str, Any]] = {}  # live heartbeats of this run, replaced whole
        self._status: dict[str, Any] = {}
        self._seen: set[tuple[str, int]] = set()
        self._attempts: Counter[tuple[str, int]] = Counter()
        self._other_runs: set[str] = set()
        self._bad_heartbeats: set[str] = set()
        self._started = time.time()
        self._peers_read_at = 0.0
        runtime.call(self.server.register(runtime.p2p), timeout=10)
        self._heartbeat_task = runtime.call(self._spawn(self._heartbeat_loop()), timeout=5)

    @staticmethod
    async def _spawn(coro: Any) -> asyncio.Task:
        return asyncio.create_task(coro)

    # -- Exchange ----------------------------------------------------------------------------

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

    def update_status(self, fields: dict[str, Any]) -> None:
        """Set what the heartbeat says and send it now, so peers see our round promptly."""
        self._status = dict(fields)
        asyncio.run_coroutine_threadsafe(self._beat(), self.runtime.loop)

    def live_peers(self) -> dict[str, dict[str, Any]]:
        """Peers of this run whose heartbeat is recent and who have not said they left."""
        return {
            peer: hb
            for peer, hb in self.peers.items()
            if self._is_fresh(hb) and hb.get("state") != "left"
        }

    def swarm_round(self) -> int | None:
        rounds = [hb["round"] for hb in self.live_peers().values()]
        return statistics.median_low(rounds) if rounds else None

    def wait_for_peers(self, count: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            self.runtime.call(self._read_peers(), timeout=30)
            live = len(self.live_peers())
            if live >= count or time.monotonic() >= deadline:
                return live
            time.sleep(min(1.0, self.heartbeat_interval_s))

    def close(self) -> None:
        """Say goodbye in the heartbeat (peers stop waiting for us), then stop the daemon."""
        self.runtime.loop.call_soon_threadsafe(self._heartbeat_task.cancel)
        self._status["state"] = "left"
        try:
            self.runtime.call(self._beat(), timeout=5)
        except Exception as err:  # leaving anyway
            log.debug("farewell heartbeat failed: %s", err)
        self.runtime.shutdown()

    # -- inside the swarm loop ---------------------------------------------------------------

    async def _gather(self, round_: int, staleness: int, deadline: float) -> list[Received]:
        found: list[Received] = []
        delivered: set[str] = set()
        rounds = list(range(max(0, round_ - staleness), round_ + 1))
        while True:
            if time.monotonic() - self._peers_read_at > 1.0:
                await self._read_peers()
            manifests = await self._new_manifests(rounds)
            remaining = deadline - time.monotonic()
            if manifests and remaining > 0:
                found += await self._fetch_all(manifests, min(self.fetch_timeout_s, remaining))
                delivered |= {item.peer_id for item in found}
            # Every live peer is waited for (up to the deadline), whatever round its last heartbeat
            # showed: that keeps nodes within `staleness` rounds of each other instead of racing.
            expected = {peer for peer in self.live_peers() if not self.ledger.is_banned(peer)}
            if expected <= delivered or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(min(self.poll_interval_s, max(0.0, deadline - time.monotonic())))

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
            for subkey, item in list(entry.value.items())[: self.max_peers_per_round * 2]:
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
        return manifests[: self.max_peers_per_round]

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

    def _is_fresh(self, heartbeat: dict[str, Any]) -> bool:
        return get_dht_time() - heartbeat["time"] <= self.stale_after_s

    async def _read_peers(self) -> None:
        """Refresh the live peers of this run from their heartbeats; note other runs once."""
        self._peers_read_at = time.monotonic()
        try:
            entry = await self.runtime.dht.get(HEARTBEAT_KEY, latest=True)
        except Exception as err:
            log.debug("heartbeat lookup failed: %s", err)
            return
        peers: dict[str, dict[str, Any]] = {}
        items = entry.value.items() if entry is not None and hasattr(entry.value, "items") else []
        for subkey, item in items:
            try:
                heartbeat = heartbeat_from_record(subkey, item.value)
            except RecordError as err:
                owner = _owner_or_none(subkey)
                if owner and owner not in self._bad_heartbeats:
                    self._bad_heartbeats.add(owner)
                    log.warning("ignoring a malformed heartbeat from %s: %s", owner, err)
                continue
            peer = heartbeat["peer"]
            if peer == self.peer_id:
                continue
            if heartbeat["run"] != self.run_id:
                if peer not in self._other_runs:
                    self._other_runs.add(peer)
                    log.warning(
                        "peer %s (model %s) is in run %s, not ours (%s): its rollouts are ignored. "
                        "Runs differ when task, data, group size, max new tokens, sampling, prompt "
                        "template, tokenizer or seed differ.",
                        peer, heartbeat.get("model"), heartbeat["run"], self.run_id,
                    )
                continue
            peers[peer] = heartbeat
        self.peers = peers

    async def _beat(self) -> None:
        fields = {
            **self._status,
            "peer": self.peer_id,
            "run": self.run_id,
            "time": get_dht_time(),
            "version": __version__,
            "uptime_s": round(time.time() - self._started, 1),
            "round": int(self._status.get("round", -1)),
            "served": self.server.served,
            "state": self._status.get("state", "training"),
        }
        ttl = max(60.0, 6 * self.heartbeat_interval_s)
        try:
            await self.runtime.dht.store(
                HEARTBEAT_KEY, pack(fields), get_dht_time() + ttl, subkey=self.runtime.signer.local_public_key
            )
        except Exception as err:  # keep beating through transient DHT trouble
            log.debug("heartbeat failed: %s", err)

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._beat()
            await self._read_peers()
            await asyncio.sleep(self.heartbeat_interval_s)


def _owner_or_none(subkey: Any) -> str | None:
    try:
        return owner_peer_id(subkey)
    except RecordError:
        return None
