"""The seam between the round loop and the swarm: publish my batch, gather peers' batches.

The round loop only sees this interface, so it runs the same over the in-memory exchange
(several nodes in one process, for tests) and over the hivemind one.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Received:
    """A peer's encoded batch, not yet decoded or trusted."""

    peer_id: str
    round: int
    payload: bytes


class PeerLedger:
    """Counts bad batches per peer, logs the first one, and ignores a peer after `max_rejects`.

    Shared by the exchange (transport faults: wrong digest, bad manifest) and the node (wire
    and consistency faults), so both kinds add up to one verdict per peer.
    """

    def __init__(self, max_rejects: int = 3) -> None:
        self.max_rejects = max_rejects
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def reject(self, peer_id: str, reason: str) -> None:
        with self._lock:
            self.counts[peer_id] += 1
            count = self.counts[peer_id]
        if count == 1:
            log.warning("rejected data from %s: %s", peer_id, reason)
        if count == self.max_rejects:
            log.warning("ignoring %s from now on: %d bad batches", peer_id, count)

    def is_banned(self, peer_id: str) -> bool:
        return self.counts[peer_id] >= self.max_rejects

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Exchange:
    """Base of every exchange; the swarm-only methods do nothing for local ones."""

    peer_id: str = ""

    def publish(self, round_: int, payload: bytes, tokens: int = 0) -> None:
        """Make this node's batch for `round_` (of `tokens` completion tokens) available to peers."""
        raise NotImplementedError

    def gather(self, round_: int, staleness: int, timeout_s: float) -> list[Received]:
        """Peers' batches of rounds round_-staleness..round_ not returned before."""
        raise NotImplementedError

    def update_status(self, fields: dict[str, Any]) -> None:
        """What this node's heartbeat says about it (model, round, reward ...)."""

    def swarm_round(self) -> int | None:
        """The round the other live nodes of this run are at (lower median), None when alone."""
        return None

    def wait_for_peers(self, count: int, timeout_s: float) -> int:
        """Block until `count` peers of this run are live or the timeout; return how many are."""
        return 0

    def close(self) -> None:
        pass


class InMemoryHub:
    """Holds every node's published payloads; nodes connect through `exchange(peer_id)`."""

    def __init__(self, keep_rounds: int = 8) -> None:
        self._lock = threading.Condition()
        self._payloads: dict[tuple[str, int], bytes] = {}
        self.keep_rounds = keep_rounds

    def exchange(self, peer_id: str) -> InMemoryExchange:
        return InMemoryExchange(self, peer_id)

    def _publish(self, peer_id: str, round_: int, payload: bytes) -> None:
        with self._lock:
            self._payloads[(peer_id, round_)] = payload
            for key in [k for k in self._payloads if k[1] < round_ - self.keep_rounds]:
                del self._payloads[key]
            self._lock.notify_all()

    def _snapshot(self) -> dict[tuple[str, int], bytes]:
        with self._lock:
            return dict(self._payloads)


class InMemoryExchange(Exchange):
    """One node's view of an `InMemoryHub`; each peer batch is handed out at most once."""

    def __init__(self, hub: InMemoryHub, peer_id: str) -> None:
        self.hub = hub
        self.peer_id = peer_id
        self._seen: set[tuple[str, int]] = set()

    def publish(self, round_: int, payload: bytes, tokens: int = 0) -> None:
        self.hub._publish(self.peer_id, round_, payload)

    def gather(self, round_: int, staleness: int, timeout_s: float = 0.0) -> list[Received]:
        with self.hub._lock:
            self.hub._lock.wait_for(
                lambda: any(self._fresh(k, round_, staleness) for k in self.hub._payloads),
                timeout=timeout_s,
            )
        found = [
            Received(peer, r, payload)
            for (peer, r), payload in sorted(self.hub._snapshot().items())
            if self._fresh((peer, r), round_, staleness)
        ]
        self._seen.update((item.peer_id, item.round) for item in found)
        return found

    def _fresh(self, key: tuple[str, int], round_: int, staleness: int) -> bool:
        peer, r = key
        return peer != self.peer_id and round_ - staleness <= r <= round_ and key not in self._seen

    def close(self) -> None:
        pass


class NoExchange(Exchange):
    """A node training alone."""

    def publish(self, round_: int, payload: bytes, tokens: int = 0) -> None:
        pass

    def gather(self, round_: int, staleness: int, timeout_s: float = 0.0) -> list[Received]:
        return []

    def close(self) -> None:
        pass
