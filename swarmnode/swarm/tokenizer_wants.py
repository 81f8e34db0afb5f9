"""Which peers' tokenizer documents to fetch, and from whom: the one rule both exchanges keep.

A batch in a tokenizer this node does not know names its document's digest; the node asks
the batch's sender for that document (swarmnode.model.families). Identities are free, so what
a crowd can make a node fetch is bounded, and an honest family is not locked out by it:

- one fetch at a time; digests named by a peer that delivered before (the ledger's `known`)
  go first, strangers' in the order they came;
- a (peer, digest) is asked once per RETRY_S, and a peer for at most MAX_DIGESTS_PER_PEER
  digests in that time; a failed fetch (a busy peer, a restart) is retried after it;
- a digest fetched is not asked again for RETRY_S (the node learned it; should it forget it,
  it may fetch it again later);
- at most MAX_WAITING digests wait, each with at most MAX_PEERS_PER_DIGEST peers to ask.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable

MAX_DIGESTS_PER_PEER = 2  # a peer that names a third tokenizer within RETRY_S is not asked for it
MAX_WAITING = 32  # digests waiting for a fetch at once
MAX_PEERS_PER_DIGEST = 8  # peers kept to ask for one digest
RETRY_S = 600.0  # a (peer, digest) asked, or a digest fetched, is not asked again for this long


class TokenizerWants:
    """The queue of documents to fetch: `want` as batches name digests, `next` for the next
    fetch, `settle` when it ended. `clock` is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waiting: OrderedDict[str, list[str]] = OrderedDict()  # digest -> peers that named it, not asked yet
        self._asked: dict[tuple[str, str], float] = {}  # (peer, digest) -> when it was asked
        self._per_peer: Counter[str] = Counter()  # peer -> its entries in _asked
        self._fetched: dict[str, float] = {}  # digest -> when it was fetched
        self.busy: tuple[str, str] | None = None  # the (peer, digest) being fetched

    def want(self, peer_id: str, digest: str) -> None:
        """`peer_id` sent a batch in tokenizer `digest`: ask it for the document in turn."""
        self._forget_old()
        if digest in self._fetched or (peer_id, digest) in self._asked or self._asks_of(peer_id) >= MAX_DIGESTS_PER_PEER:
            return
        if digest not in self._waiting and len(self._waiting) >= MAX_WAITING:
            return
        peers = self._waiting.setdefault(digest, [])
        if peer_id not in peers and len(peers) < MAX_PEERS_PER_DIGEST:
            peers.append(peer_id)

    def next(self, known: Callable[[str], bool] = lambda peer: False) -> tuple[str, str] | None:
        """The (peer, digest) to fetch now, or None when one is running or none waits: a
        known peer's first."""
        if self.busy is not None:
            return None
        self._forget_old()
        candidates = [(digest, peer) for digest, peers in self._waiting.items() for peer in peers]
        candidates.sort(key=lambda pair: not known(pair[1]))  # stable: otherwise in the order they came
        for digest, peer in candidates:
            self._waiting[digest].remove(peer)
            if not self._waiting[digest]:
                del self._waiting[digest]
            if (peer, digest) in self._asked or self._asks_of(peer) >= MAX_DIGESTS_PER_PEER or digest in self._fetched:
                continue
            self._asked[(peer, digest)] = self._clock()
            self._per_peer[peer] += 1
            self.busy = (peer, digest)
            return self.busy
        return None

    def settle(self, fetched: bool) -> None:
        """The running fetch ended: the digest is done if it `fetched`; if not, the next peer
        that named it is asked, and this one again after RETRY_S."""
        if self.busy is None:
            return
        _, digest = self.busy
        self.busy = None
        if fetched:
            self._fetched[digest] = self._clock()
            self._waiting.pop(digest, None)

    def _asks_of(self, peer_id: str) -> int:
        return self._per_peer.get(peer_id, 0)

    def _forget_old(self) -> None:
        """Asks and fetches older than RETRY_S: their peers and digests may be asked again."""
        now = self._clock()
        for key in [k for k, at in self._asked.items() if now - at >= RETRY_S]:
            del self._asked[key]
            self._per_peer[key[0]] -= 1
            if not self._per_peer[key[0]]:
                del self._per_peer[key[0]]
        for digest in [d for d, at in self._fetched.items() if now - at >= RETRY_S]:
            del self._fetched[digest]
