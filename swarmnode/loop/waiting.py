"""How long a round waits for peers' batches, and for whom: the whole rule in one place.

A round waits only when the pool cannot fill the peers' share. Then it waits for the peers
that earned it (swarmnode.loop.ledger: delivered before, not missed `swarm.max_missed` rounds
in a row) and hold nothing fresh in the pool, at most `node.wait_share` of this node's own
recent round time (capped by `node.gather_timeout_s`), so nobody waits long for the slow.
Before anyone ever delivered, it waits for a first batch from anyone (a peer is live in the
heartbeats, or answered us while the node waited for `swarm.min_peers`), up to
`node.gather_timeout_s` and at most `swarm.max_missed` rounds in a row, so nodes that start
together fall into step and silent identities cost little, once. The result is one
GatherWait (swarmnode.swarm.base), on which every exchange stops by the same predicate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection

import numpy as np

from swarmnode.settings.config import Config
from swarmnode.swarm.base import GatherWait

OWN_ROUND_HISTORY = 16  # recent own round times behind the wait for peers


class WaitRule:
    """The node's own clock for waiting: its recent round times and its vain first waits."""

    def __init__(self, config: Config) -> None:
        self.node = config.node
        self.max_missed = config.swarm.max_missed
        self._own_round_s: deque[float] = deque(maxlen=OWN_ROUND_HISTORY)  # recent rounds, waiting excluded
        self._vain_waits = 0  # rounds in a row spent waiting for a first delivery in vain
        self._answered_at_start = False  # a peer answered a direct request before the first round

    def answered_at_start(self, peers: int) -> None:
        """`peers` answered a direct request while the node waited for `swarm.min_peers`: a
        peer is there even before its heartbeat is read, so the first rounds wait for anyone.
        Without this a fast node whose peer's heartbeat it has not read yet runs its first
        rounds (or a short run) without waiting, and its peer never hears from it."""
        self._answered_at_start = peers > 0

    def note_round(self, own_s: float) -> None:
        """A round took `own_s` seconds of this node's own work (its waiting excluded)."""
        self._own_round_s.append(own_s)

    def budget_s(self, generate_s: float) -> float:
        """The longest a round waits for peers that earned it: `node.wait_share` of our own
        recent round time (this round's generation before there is any), at most
        `node.gather_timeout_s`."""
        own_s = float(np.median(self._own_round_s)) if self._own_round_s else generate_s
        return min(self.node.gather_timeout_s, self.node.wait_share * own_s)

    def plan(
        self, *, short: bool, live: Collection[str], earned: set[str], pooled: Collection[str],
        ever_delivered: bool, held: frozenset[str], generate_s: float,
    ) -> GatherWait:
        """This round's wait. `short`: the pool cannot fill the peers' share; `earned`: the
        live peers the ledger expects; `pooled`: peers with fresh groups in the pool."""
        waiting = earned - set(pooled) if short else set()
        someone = bool(live) or self._answered_at_start
        anyone = short and someone and not ever_delivered and self._vain_waits < self.max_missed
        timeout_s = self.node.gather_timeout_s if anyone else self.budget_s(generate_s) if waiting else 0.0
        return GatherWait(timeout_s, frozenset(waiting), anyone, held)

    def settle(self, wait: GatherWait, delivered: Collection[str]) -> set[str]:
        """After the gather: the peers waited for in vain (each one missed round). A wait for
        anyone that brought nothing counts toward `swarm.max_missed` until someone delivers; a
        round that did not wait resets nothing (silent identities would otherwise arm the
        wait again every other round)."""
        if delivered:
            self._vain_waits = 0
        elif wait.wait_for_any:
            self._vain_waits += 1
        return set(wait.wait_for) - set(delivered)
