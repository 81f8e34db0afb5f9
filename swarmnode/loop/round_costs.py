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
  part their kept samples took, by tokens, over the groups;
- a group measured, in the rounds that measured some: the seconds spent measuring far peers'
  groups that are not trained on (grading them and, with the likelihood gap on, a forward pass
  under our model), over the groups; never more than a group on top costs, which is screened
  (a forward pass) and trained on besides, so one sender's long groups cannot price the others'
  out of the tenth.

The measuring is the share's (loop.share) and runs beside the groups on top, so it comes out of
the same tenth: when a far peer would be left unmeasured one group's price is set aside first,
and only what it leaves pays for groups on top; far groups beyond those are measured only as far
as the rest of the tenth pays (at least one a round, so a far peer that comes near is seen to).
Our own samples measured again under top-k or top-p (loop.intake) are not in the tenth: that
runs whether or not any peer is far, and only where a user turned truncation on.

Each is a running mean; a node's first round (warm-up) is not timed. A peer's completions move
what one of its groups costs, and so how many come, not the time they take on average. Until a
round alone is timed the cost model's share (GEN_SHARE) prices a group on top, and until a group
of each kind is timed the model prices it against that round; a group measured costs a forward
pass's part of a group on top (FORWARD_OF_STEP) until timed. The lab prices rounds by its cost
model rather than its clock, so it pins the share it prices with: a group on top then costs
(1 - share) / groups-a-batch of a round alone, as the model says. A probation group (one a round
at most, loop.intake) is the ledger's, not this bound's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from swarmnode.loop.share import is_number, smoothed
from swarmnode.sizing.cost import FORWARD_OF_STEP, GEN_SHARE, CostModel

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
    measured_groups: int = 0  # far peers' groups measured and not trained on
    measure_s: float = 0.0  # seconds measuring them


class RoundCosts:
    """A round alone, a group on top and a group measured, in this node's seconds (or the lab's
    pinned model), and how many of each a tenth of a round pays for."""

    def __init__(self) -> None:
        self.alone_round_s: float | None = None
        self.on_top_group_s: float | None = None
        self.measured_group_s: float | None = None
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
        if times.measured_groups > 0 and _positive(times.measure_s):
            self.measured_group_s = _running(self.measured_group_s, times.measure_s / times.measured_groups)

    def on_top_groups(self, batch_groups: int, measured: int = 0, forward: bool = True) -> int:
        """The most far peers' groups this node may screen and train on beyond its batch of
        `batch_groups` for ON_TOP_COST of a round alone, once `measured` groups are measured in
        the same tenth (`forward`: under our model, not only graded)."""
        tenth, on_top, one_measured = self._prices(batch_groups, forward)
        return max(0, math.floor((tenth - measured * one_measured) / on_top + 1e-9))

    def measured_groups(self, batch_groups: int, on_top: int, forward: bool = True) -> int:
        """The most groups this node may measure without training on them in what `on_top`
        groups on top leave of ON_TOP_COST of a round alone (none when they leave nothing; the
        whole batch's worth when a group measured costs the model nothing)."""
        tenth, group_on_top, one_measured = self._prices(batch_groups, forward)
        left = tenth - on_top * group_on_top + 1e-9 * tenth  # on_top_groups may fill the tenth to its rounding
        if one_measured <= 0:
            return batch_groups if left >= 0 else 0
        return max(0, math.floor(left / one_measured))

    def _prices(self, batch_groups: int, forward: bool) -> tuple[float, float, float]:
        """(ON_TOP_COST of a round alone, a group on top, a group measured), in this node's
        seconds once it timed them, else as shares of a round alone by the cost model (a group
        only graded, no forward pass, costs the model nothing)."""
        part = FORWARD_OF_STEP if forward else 0.0  # of a group on top, by the model
        share = GEN_SHARE if self.pinned is None else self.pinned
        group_on_top = 1.0 / max(CostModel(share).trained_for(1.0) * batch_groups, 1e-9)  # of a round alone
        if self.pinned is not None or self.alone_round_s is None:
            return ON_TOP_COST, group_on_top, part * group_on_top
        group_s = self.on_top_group_s if self.on_top_group_s is not None else group_on_top * self.alone_round_s
        measured_s = min(self.measured_group_s, group_s) if self.measured_group_s is not None else part * group_s
        return ON_TOP_COST * self.alone_round_s, group_s, measured_s

    def checkpoint_state(self) -> dict[str, Any]:
        """The running seconds, so a resumed node prices its first rounds as it left off."""
        return {"alone_round_s": self.alone_round_s, "on_top_group_s": self.on_top_group_s,
                "measured_group_s": self.measured_group_s}

    def restore(self, state: dict[str, Any]) -> None:
        """A checkpoint's running seconds; a missing or unusable one is timed afresh."""
        alone, group, measured = state.get("alone_round_s"), state.get("on_top_group_s"), state.get("measured_group_s")
        self.alone_round_s = float(alone) if _positive(alone) else None
        self.on_top_group_s = float(group) if _positive(group) else None
        self.measured_group_s = float(measured) if _positive(measured) else None


def _positive(value: object) -> bool:
    return is_number(value) and math.isfinite(value) and value > 0


def _running(before: float | None, found: float) -> float:
    """The first finding as it is, later ones smoothed as a peer's measures are (loop.share)."""
    return found if before is None else smoothed(before, found)
