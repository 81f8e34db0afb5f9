"""One gather's hand-out, claimed once across two threads.

A gather waits on the swarm loop from the node's thread, and the node gives up on it
`GATHER_GRACE_S` past its deadline (the loop was stuck). Without a claim, a gather that went on
after that could still hand out (mark those rounds fetched, hold their peers) into a result no
one reads: the batches were lost, and its hold set over the node's newer one. So the hand-out
and the giving up race for one claim: the loop hands out only a gather the node still waits
for, and a node that gives up after the loop handed out gets what it handed out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Handover(Generic[T]):
    """The open gather's ticket, and what the last claimed one handed out until it is settled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held for a hand-out (no awaits) or a look at the slot
        self._tickets = 0
        self._open: int | None = None  # the gather the node still waits for
        self._claimed: tuple[int, list[T]] | None = None  # (ticket, what its hand-out gave)

    def open(self) -> int:
        """A new gather's ticket; an older gather still running can no longer hand out."""
        with self._lock:
            self._tickets += 1
            self._open = self._tickets
            self._claimed = None
            return self._tickets

    def claim(self, ticket: int, hand_out: Callable[[], list[T]]) -> list[T]:
        """On the swarm loop: run `hand_out` if the node still waits for this gather, else
        hand out nothing (what arrived stays for the next gather)."""
        with self._lock:
            if self._open != ticket:
                return []
            self._open = None
            found = hand_out()
            self._claimed = (ticket, found)
            return found

    def settle(self, ticket: int) -> list[T]:
        """On the node's thread, once it stops waiting for the gather: what it handed out, or
        nothing, and then it never will."""
        with self._lock:
            if self._open == ticket:
                self._open = None
            claimed, self._claimed = self._claimed, None
            return claimed[1] if claimed is not None and claimed[0] == ticket else []
