"""What counts as a useful sample, and how much a peer's samples count for what they taught.

A peer's sample is useful when screening kept it clear of the gate's bars (by `trust.near_bar`:
samples that pass by a hair are how a gate is walked) and it trained with a non-zero advantage
(a group all right or all wrong teaches nothing, nor do wrong answers whose right ones were
gated). Completions that could not be put into our tokens taught nothing either. The ledger's
standing of a peer (swarmnode.loop.ledger) moves toward each screened batch's useful share by
STANDING_WEIGHT, and orders whom the node asks and whose groups it takes first.

With `node.weight_by_usefulness`, each peer also has a running usefulness that starts at 0 and
moves the same way, and each of its kept samples counts that over our own samples' useful share
(by the same rule), at most 1. A peer whose groups teach as often as ours comes to count fully,
one that mostly sends groups that teach nothing, or samples that sit at the gate's bar, counts
that much less even in the samples that do teach, and one whose samples never taught us counts
0: its samples take no room, the next groups are screened in their place. Off, every kept sample
counts 1.

The measure is this node's own and starts at 0 for every identity, so a fresh identity earns
its weight batch by batch (a peer that drops a poor record for a new name starts lower, not
higher) and a crowd whose groups teach nothing never counts. A factor only shrinks a sample's
importance weights, so no peer weighs more through it than with it off. The price: an honest
newcomer counts fully only after some rounds (half its share after 3 batches, 9/10 after 10).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the ledger reads STANDING_WEIGHT without loading the model's stack
    from swarmnode.learn.sample import Sample

STANDING_WEIGHT = 0.2  # how far one screened batch moves a peer's standing (and its usefulness)


def is_useful(sample: Sample) -> bool:
    """A screened peer sample that taught us: kept, clear of the gate's bars, and trained with
    a non-zero advantage."""
    return sample.verdict.kept and not sample.verdict.near_bar and sample.advantage != 0


class UsefulnessWeights:
    """Per-peer factors on importance weights: running usefulness against our own useful share."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.own_share: float | None = None  # running useful share of our own samples, by a peer's rule
        self.usefulness: dict[str, float] = {}  # peer -> running useful share of its screened samples, from 0

    def observe_own(self, own: Sequence[Sample], near_bar: Sequence[bool]) -> None:
        """Move our useful share toward this round's, as fast as a peer's moves, by the rule a
        peer's samples are held to: a non-zero advantage, clear of the gate's bars
        (`near_bar[i]`: own[i] is under a bar or within `trust.near_bar` above one)."""
        if not self.enabled or not own:
            return
        share = sum(sample.advantage != 0 and not near for sample, near in zip(own, near_bar, strict=True)) / len(own)
        self.own_share = share if self.own_share is None else self.own_share + STANDING_WEIGHT * (share - self.own_share)

    def observe_peer(self, peer_id: str, offered: int, useful: int) -> None:
        """One screened batch of the peer's: `useful` of `offered` samples taught us."""
        if self.enabled and offered > 0:
            before = self.usefulness.get(peer_id, 0.0)
            self.usefulness[peer_id] = before + STANDING_WEIGHT * (useful / offered - before)

    def forget(self, peer_id: str) -> None:
        """The peer was forgotten (loop.ledger.forget_silent): it starts again from 0."""
        self.usefulness.pop(peer_id, None)

    def factor(self, peer_id: str) -> float:
        """What each of the peer's samples counts, in [0, 1]; 1 when off. When our own
        samples teach nothing (all groups right or all wrong), any useful peer counts fully."""
        if not self.enabled:
            return 1.0
        usefulness = self.usefulness.get(peer_id, 0.0)
        if usefulness <= 0:
            return 0.0
        if not self.own_share:
            return 1.0
        return min(1.0, usefulness / self.own_share)
