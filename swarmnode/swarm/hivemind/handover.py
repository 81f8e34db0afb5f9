"""One gather's hand-out, run at most once, and only while the node still waits for it.

A gather waits on the swarm loop from the node's thread, and the node gives up on it
`GATHER_GRACE_S` past its deadline (the loop was stuck). Without this, a gather that went on
after that could still hand out (mark those rounds fetched, hold their peers) into a result no
one reads: the batches were lost, and its hold set over the node's newer one. So the hand-out
and the giving up take one lock: the loop hands out only while the node waits, and a node that
gives up after the loop handed out gets what it handed out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class HandOut(Generic[T]):
    """One gather's: waiting, then handed out (by the loop) or given up (by the node), once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held for the hand-out itself (no awaits) or a look at the state
        self._waiting = True  # the node still waits and nothing was handed out
        self._found: list[T] = []

    def run(self, hand_out: Callable[[], list[T]]) -> None:
        """On the swarm loop: hand out if the node still waits; else leave what arrived for
        the next gather."""
        with self._lock:
            if self._waiting:
                self._waiting = False
                self._found = hand_out()

    def settle(self) -> list[T]:
        """On the node's thread, once it stops waiting: what was handed out, or nothing, and
        then never anything. Waits for a hand-out under way (work in memory, no I/O)."""
        with self._lock:
            self._waiting = False
            return self._found
