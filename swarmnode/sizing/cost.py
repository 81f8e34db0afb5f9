"""What a round costs a volunteer, in rounds of the same node alone: a stated model.

On a GPU generation is most of a round (0.87-0.95 of one that trains on its own samples alone:
docs/gpu.md, bench/gpu_round.py), so a node that generates part of its batch and takes the rest
from peers runs more rounds in the same time, and one that trains on peers' samples on top of
its own pays a little more a round. The model: generation costs `gen_share` of a round alone and
grows with the tokens generated; screening and training cost the rest and grow with the samples
trained on. On the CPU benches generation is cheap, so they price rounds by this model rather
than by their clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

GEN_SHARE = 0.93  # generation's share of a round alone: qwen2.5-1.5b.yaml on an H200 (docs/gpu.md, bench/gpu_round.py)
# a forward pass over samples, as a share of a training step over them: the backward pass costs
# about two forwards in FLOPs; bench/objective_overhead.py measures 0.3 on a CPU at half a batch
FORWARD_OF_STEP = 1 / 3


@dataclass(frozen=True)
class CostModel:
    """A round's modelled cost against a round alone (see the module's docstring)."""

    gen_share: float = GEN_SHARE

    def round_cost(self, generated: float, trained: float, alone_generated: float, alone_trained: float) -> float:
        return self.gen_share * generated / max(alone_generated, 1e-9) + (1 - self.gen_share) * trained / max(alone_trained, 1e-9)

    def trained_for(self, added_cost: float) -> float:
        """How much a node may train beyond a round alone's batch, as a share of that batch, for
        `added_cost` of a round alone: training is the part of a round that is not generation."""
        return added_cost / max(1 - self.gen_share, 1e-9)

    def elapsed(self, rounds: Sequence[tuple[float, float]], alone: Sequence[tuple[float, float]]) -> list[float]:
        """The modelled time after each of `rounds`, each (tokens generated, samples trained), in
        rounds of a run alone whose rounds are `alone` (their means price a round alone); [] when
        there is no run alone to price against."""
        if not alone:
            return []
        generated = statistics.mean(tokens for tokens, _ in alone)
        trained = statistics.mean(samples for _, samples in alone)
        spent, times = 0.0, []
        for tokens, samples in rounds:
            spent += self.round_cost(tokens, samples, generated, trained)
            times.append(spent)
        return times
