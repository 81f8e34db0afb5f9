"""The weight budget: a peer's importance weights may move between its tokens, never add up.

An honest generator draws tokens from pi_gen, so a token's importance weight pi_theta / pi_gen
has expectation sum_x pi_theta(x) <= 1. A peer that reports a low log pi_gen would get weight C
on every token instead. So each peer's weights over its kept tokens are scaled to a mean of at
most 1 (`trust.weight_budget`), and a peer whose log-probs claim a mean capped weight above
`trust.max_weight_mean` reported what no honest sampler can: a strike.

By span (a peer of another tokenizer family) the sender's log-prob is that of the segmentation
it sampled, a lower bound on its text's probability, so a high mean there is held to the
budget but proves no lie: only tokens of the sender's own tokenizer count toward a strike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from swarmnode.learn.loss import importance_weights
from swarmnode.learn.sample import Sample
from swarmnode.settings.config import LossSettings, TrustSettings

# The budget measures the objective's weight without vis_clip's PPO clip against the generator
# (which a vis objective's loss applies). Measuring it clipped would change what vis and f-vis
# peers' samples count; whether it should is a learning question, not this module's.
BUDGET_CLIPS_VIS = False


def _weights(log_ratios: np.ndarray, loss: LossSettings, weighting: str) -> np.ndarray:
    """Per-token weights under `weighting` from a sample's log-ratios, as the loss computes them."""
    log_w = torch.from_numpy(np.asarray(log_ratios, dtype=np.float32))
    weights, _ = importance_weights(log_w, loss, weighting=weighting, clip_vis=BUDGET_CLIPS_VIS)
    return weights.numpy()


@dataclass
class WeightBudget:
    """One peer's importance weights over its kept tokens in one screening."""

    weight_sum: float = 0.0
    tokens: int = 0
    capped_sum: float = 0.0  # weights capped at C, over tokens of its own tokenizer: where a mean above 1 is a lie
    provable_tokens: int = 0

    def add(self, sample: Sample, theta: np.ndarray, loss: LossSettings, weighting: str) -> None:
        """A kept sample: `theta` its log-probs under our model, `weighting` the objective's."""
        log_ratios = sample.log_ratios(theta)
        self.weight_sum += float(_weights(log_ratios, loss, weighting).sum())
        self.tokens += len(theta)
        if not sample.by_span:
            self.capped_sum += float(_weights(log_ratios, loss, "truncated").sum())
            self.provable_tokens += len(theta)

    @property
    def weight_mean(self) -> float:
        """Mean weight over its kept tokens under the objective (1.0 with none)."""
        return self.weight_sum / self.tokens if self.tokens else 1.0

    @property
    def capped_weight_mean(self) -> float:
        """The same with weights capped at C, over its own tokenizer's tokens: at most 1 if honest."""
        return self.capped_sum / self.provable_tokens if self.provable_tokens else 1.0

    def scale(self, trust: TrustSettings) -> float:
        """What its weights are multiplied by: its mean brought down to 1 (with the budget on)."""
        return 1.0 / self.weight_mean if trust.weight_budget and self.weight_mean > 1.0 else 1.0

    def strike(self, trust: TrustSettings) -> str | None:
        """Why its log-probs are a lie, or None."""
        if self.capped_weight_mean > trust.max_weight_mean:
            return (f"its log-probs claim a mean importance weight of {self.capped_weight_mean:.2f} "
                    f"(an honest generator's is at most 1)")
        return None
