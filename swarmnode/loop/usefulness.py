"""How much a peer's samples count in our step: as much as they have been teaching us.

The ledger keeps each peer's standing: the recent share of its screened samples that were
useful (kept, clear of the gate's bars, with a non-zero advantage). Our own samples have a
useful share too (a non-zero advantage). With `node.weight_by_standing`, each of a peer's
samples counts standing / our share, at most 1: a peer whose groups teach as often as ours
counts fully, one that mostly sends groups that teach nothing, or samples that sit at the
gate's bar, counts that much less even in the samples that do teach. Off, every kept sample
counts 1, and the standing orders the share only (swarmnode.loop.pool.fair_queue).

The measure is this node's own: a peer raises its weight only by sending samples that teach
us, and a new identity starts from its first screened batch, never above what that batch
showed. A weight only shrinks a sample's importance weights (the weight budget's scale times
it), so no peer gains weight through it.
"""

from __future__ import annotations

from collections.abc import Sequence

from swarmnode.loop.ledger import STANDING_WEIGHT
from swarmnode.loop.samples import Sample


class UsefulnessWeights:
    """Per-peer factors on importance weights, from standing against our own useful share."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.own_share: float | None = None  # running share of our own samples with a non-zero advantage

    def observe_own(self, own: Sequence[Sample]) -> None:
        """Move our useful share toward this round's, as fast as a peer's standing moves."""
        if not own:
            return
        share = sum(sample.train.advantage != 0 for sample in own) / len(own)
        self.own_share = share if self.own_share is None else self.own_share + STANDING_WEIGHT * (share - self.own_share)

    def factor(self, standing: float | None) -> float:
        """What a peer's samples count, from its standing (None: never screened, counts 0).
        When our own samples teach nothing (all groups right or all wrong), any useful peer
        counts fully."""
        if not self.enabled:
            return 1.0
        if standing is None or standing <= 0:
            return 0.0
        if not self.own_share:
            return 1.0
        return min(1.0, standing / self.own_share)
