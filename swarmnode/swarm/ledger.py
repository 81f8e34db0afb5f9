"""PeerLedger: one verdict per peer from every check that can catch it sending bad data."""

from __future__ import annotations

import logging
import threading
from collections import Counter

log = logging.getLogger(__name__)


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
