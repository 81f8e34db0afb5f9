"""Which peers' tokenizer documents to fetch, and from whom: the one rule both exchanges keep.

A batch in a tokenizer this node does not know names its document's digest; the node asks
the batch's sender for that document (swarmnode.model.families). Identities are free, so what
a crowd can make a node fetch is bounded: one digest is asked of one peer at a time, a digest
once fetched is never asked again, a peer is asked at most MAX_DIGESTS_PER_PEER digests ever
and each (peer, digest) once, and at most MAX_WAITING digests wait their turn (more are
dropped until a later batch names them again).
"""

from __future__ import annotations

from collections import Counter, OrderedDict

MAX_DIGESTS_PER_PEER = 2  # a peer that names a third tokenizer is not asked for it
MAX_WAITING = 32  # digests waiting for a fetch at once


class TokenizerWants:
    """The queue of documents to fetch: `want` as batches name digests, `next` for the next
    fetch, `settle` when it ended."""

    def __init__(self) -> None:
        self._waiting: OrderedDict[str, list[str]] = OrderedDict()  # digest -> peers that named it, not asked yet
        self._asked: set[tuple[str, str]] = set()  # (peer, digest) asked, or being asked
        self._per_peer: Counter[str] = Counter()  # peer -> digests asked of it
        self.fetched: set[str] = set()
        self.busy: tuple[str, str] | None = None  # the (peer, digest) being fetched

    def want(self, peer_id: str, digest: str) -> None:
        """`peer_id` sent a batch in tokenizer `digest`: ask it for the document in turn."""
        if digest in self.fetched or (peer_id, digest) in self._asked:
            return
        if self._per_peer[peer_id] >= MAX_DIGESTS_PER_PEER:
            return
        if digest not in self._waiting and len(self._waiting) >= MAX_WAITING:
            return
        peers = self._waiting.setdefault(digest, [])
        if peer_id not in peers:
            peers.append(peer_id)

    def next(self) -> tuple[str, str] | None:
        """The (peer, digest) to fetch now, or None when one is running or none waits."""
        if self.busy is not None:
            return None
        while self._waiting:
            digest, peers = next(iter(self._waiting.items()))
            while peers:
                peer = peers.pop(0)
                if (peer, digest) not in self._asked and self._per_peer[peer] < MAX_DIGESTS_PER_PEER:
                    self._asked.add((peer, digest))
                    self._per_peer[peer] += 1
                    self.busy = (peer, digest)
                    return self.busy
            del self._waiting[digest]
        return None

    def settle(self, fetched: bool) -> None:
        """The running fetch ended: the digest is done if it `fetched`, else the next peer that
        named it (if any) is asked."""
        if self.busy is None:
            return
        _, digest = self.busy
        self.busy = None
        if fetched:
            self.fetched.add(digest)
            self._waiting.pop(digest, None)
