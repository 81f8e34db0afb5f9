"""What training far peers' groups on top of its own batch costs this node, from its own clock.

A node that trains far peers' groups on top of its whole batch (`node.far_room` top or
top-scored) pays for them in screening and training time. How much of a round that is depends on
the machine, the batch and the completions' lengths: on a GPU generation is 0.66-0.95 of a round
(docs/gpu.md), so the same groups on top cost a round 2 % at one shape and 15 % at another. A
lever that runs by default may add at most a tenth to a round (`ON_TOP_COST`), so the node times
its own work and takes on top only the groups that tenth pays for:

- a round alone, in the rounds that generated its whole batch (generation is timed at the batch
  it runs; a share of it runs at another speed on a GPU): the generation's seconds and the
  step's part that its own samples took, by tokens;
- a group on top, in the rounds that took some: the seconds screening them took and the step's
  part their kept samples took, by tokens, over the groups.

Each is a running mean; a node's first round (warm-up) is not timed. A peer's completions move
what one of its groups costs, and so how many come, not the time they take on average. Until
both are timed the cost model's share (GEN_SHARE) prices a group. The lab prices rounds by its
cost model rather than its clock, so it pins the share it prices with: a group on top then costs
(1 - share) / groups-a-batch of a round alone, as the model says. A probation group (one a round
at most, loop.intake) is the ledger's, not this bound's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from swarmnode.loop.share import is_number, smoothed
from swarmnode.sizing.cost import GEN_SHARE, CostModel

ON_TOP_COST = 0.1  # the most far peers' groups on top may add to a round, as a share of a round alone


@dataclass(frozen=True)
class RoundTimes:
    """One round's work as this node timed it (seconds) and counted it (tokens of our own)."""

    generate_s: float
    whole_batch: bool  # it generated every group of its batch
    train_s: float
    own_tokens: int  # completion tokens of its own samples trained on
    trained_tokens: int  # completion tokens of every sample trained on
    on_top_groups: int = 0  # far peers' groups screened on top
    on_top_screen_s: float = 0.0  # seconds scoring and screening them
    on_top_tokens: int = 0  # completion tokens of their samples kept


class RoundCosts:
    """A round alone and a group on top, in this node's seconds (or the lab's pinned model), and
    how many groups on top a tenth of a round pays for."""

    def __init__(self) -> None:
        self.alone_round_s: float | None = None
        self.on_top_group_s: float | None = None
        self.pinned: float | None = None  # the lab's modelled generation share; never checkpointed
        self._warm = False  # the first round timed after a start is warm-up

    def pin(self, gen_share: float) -> None:
        """Price groups on top by the cost model at `gen_share` instead of this node's clock."""
        if not 0.0 <= gen_share <= 1.0:
            raise ValueError(f"generation's share of a round must be in [0, 1], got {gen_share}")
        self.pinned = gen_share

    def note(self, times: RoundTimes) -> None:
        """One round's timings (a first round, or a clock reading that is not a positive number,
        changes nothing)."""
        if not self._warm:
            self._warm = True
            return
        if not (_positive(times.train_s) and times.trained_tokens > 0):
            return
        step_s_per_token = times.train_s / times.trained_tokens
        if times.whole_batch and times.own_tokens > 0 and _positive(times.generate_s):
            self.alone_round_s = _running(self.alone_round_s, times.generate_s + step_s_per_token * times.own_tokens)
        if times.on_top_groups > 0:
            spent = times.on_top_screen_s + step_s_per_token * times.on_top_tokens
            if _positive(spent):
                self.on_top_group_s = _running(self.on_top_group_s, spent / times.on_top_groups)

    def on_top_groups(self, batch_groups: int) -> int:
        """The most far peers' groups this node may screen and train on beyond its batch of
        `batch_groups` for ON_TOP_COST of a round alone."""
        if self.pinned is None and self.alone_round_s is not None and self.on_top_group_s is not None:
            return max(0, math.floor(ON_TOP_COST * self.alone_round_s / self.on_top_group_s + 1e-9))
        share = GEN_SHARE if self.pinned is None else self.pinned
        return max(0, math.floor(CostModel(share).trained_for(ON_TOP_COST) * batch_groups + 1e-9))

    def checkpoint_state(self) -> dict[str, Any]:
        """The running seconds, so a resumed node prices its first rounds as it left off."""
        return {"alone_round_s": self.alone_round_s, "on_top_group_s": self.on_top_group_s}

    def restore(self, state: dict[str, Any]) -> None:
        """A checkpoint's running seconds; a missing or unusable one is timed afresh."""
        alone, group = state.get("alone_round_s"), state.get("on_top_group_s")
        self.alone_round_s = float(alone) if _positive(alone) else None
        self.on_top_group_s = float(group) if _positive(group) else None


def _positive(value: object) -> bool:
    return is_number(value) and math.isfinite(value) and value > 0


def _running(before: float | None, found: float) -> float:
    """The first finding as it is, later ones smoothed as a peer's measures are (loop.share)."""
    return found if before is None else smoothed(before, found)
