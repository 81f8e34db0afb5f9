"""What training on top of its own batch costs this node: generation's share of its round, timed.

A node that trains far peers' groups on top of its whole batch (`node.far_room` top or
top-scored) pays for them in training time only. How much of a round that is depends on the
machine and the batch: on a GPU generation is 0.66-0.95 of a round (docs/gpu.md), so the same
groups on top cost a round 2 % at one shape and 15 % at another. A lever that runs by default
may add at most a tenth to a round (`ON_TOP_COST`), so the node times its own rounds, seconds a
sequence generated and seconds a sample trained (running means), and takes on top only what
that tenth pays for. Until it has timed a round it takes the cost model's share (GPU's, at 24
sequences); the lab, which prices rounds by the model rather than by its clock, pins the share
it prices with. Only this node's own clock enters: nothing a peer says.
"""

from __future__ import annotations

import math
from typing import Any

from swarmnode.loop.share import smoothed
from swarmnode.sizing.cost import GEN_SHARE, CostModel

ON_TOP_COST = 0.1  # the most far peers' groups on top may add to a round, as a share of a round alone


class RoundCosts:
    """Generation's share of this node's round, from its own timings (or pinned), and how many
    groups on top it pays for."""

    def __init__(self) -> None:
        self.generate_s_per_sequence: float | None = None
        self.train_s_per_sample: float | None = None
        self.pinned: float | None = None  # the lab's modelled share; never checkpointed

    def pin(self, gen_share: float) -> None:
        """Price rounds by `gen_share` instead of this node's clock (the lab's cost model)."""
        if not 0.0 <= gen_share < 1.0:
            raise ValueError(f"generation's share of a round must be in [0, 1), got {gen_share}")
        self.pinned = gen_share

    def note(self, generate_s: float, generated: int, train_s: float, trained: int) -> None:
        """One round's timings: `generated` sequences in `generate_s`, `trained` samples in
        `train_s`. A round without either, or with a clock reading that is not a positive
        number, changes nothing."""
        if generated > 0 and trained > 0 and _positive(generate_s) and _positive(train_s):
            self.generate_s_per_sequence = _running(self.generate_s_per_sequence, generate_s / generated)
            self.train_s_per_sample = _running(self.train_s_per_sample, train_s / trained)

    @property
    def gen_share(self) -> float:
        """Generation's share of a round alone (as many samples trained as sequences generated)."""
        if self.pinned is not None:
            return self.pinned
        if self.generate_s_per_sequence is None or self.train_s_per_sample is None:
            return GEN_SHARE
        return self.generate_s_per_sequence / (self.generate_s_per_sequence + self.train_s_per_sample)

    def on_top_groups(self, batch_groups: int) -> int:
        """The most groups this node may train on beyond its batch of `batch_groups` for
        ON_TOP_COST of a round alone."""
        share = CostModel(self.gen_share).trained_for(ON_TOP_COST)
        return max(0, math.floor(share * batch_groups + 1e-9))

    def checkpoint_state(self) -> dict[str, Any]:
        """The running seconds, so a resumed node prices its first rounds as it left off."""
        return {"generate_s_per_sequence": self.generate_s_per_sequence, "train_s_per_sample": self.train_s_per_sample}

    def restore(self, state: dict[str, Any]) -> None:
        """A checkpoint's running seconds; a missing or unusable pair is timed afresh."""
        generate, train = state.get("generate_s_per_sequence"), state.get("train_s_per_sample")
        if _positive(generate) and _positive(train):
            self.generate_s_per_sequence, self.train_s_per_sample = float(generate), float(train)
        else:
            self.generate_s_per_sequence = self.train_s_per_sample = None


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _running(before: float | None, found: float) -> float:
    """The first finding as it is, later ones smoothed as a peer's measures are (loop.share)."""
    return found if before is None else smoothed(before, found)
