"""Group advantages and the off-policy GRPO objectives, F-TIS and its neighbours.

Every objective is the paper's (arXiv 2605.22537)

    L = -1/N sum_i 1/|a_i| sum_t w_it * min(R_it A_i, clip(R_it, 1-eps, 1+eps) A_i)

with R = pi_theta / pi_old (pi_old = pi_theta.detach() for one step per batch) and w a
detached per-token importance weight:

    nois: w = 1                 (pretend every sample is on-policy)
    vis:  w = pi_theta / pi_gen (vanilla importance sampling); with `vis_clip` (the default,
          the paper's and its authors' reading) PPO-clipped against pi_gen: a token whose
          ratio already left [1-eps, 1+eps] in the direction of its advantage adds no gradient
    tis:  w = min(pi_theta / pi_gen, C)

The ``f-`` variants also drop samples with A_i < 0 whose divergence from the generator exceeds
g: they add nothing to the sum, yet N counts them and they stay in their group's mean and std.
With `filter_shape` soft they drop none and weight each such sample by g / (g + divergence).
A peer's samples may carry a weight scale below 1 (screening's weight budget, swarmnode.screening),
which multiplies w. `importance_weights` is the one place w is computed: the loss and screening
both call it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from swarmnode.learn.alignment import SpanBatch
from swarmnode.settings.config import LossSettings
from swarmnode.settings.registry import DIVERGENCES, OBJECTIVES


def group_advantages(rewards: torch.Tensor, scale_by_std: bool = False, eps: float = 1e-4) -> torch.Tensor:
    """A_i = r_i - mean within one group; divided by (std + eps) when `scale_by_std` (GRPO's
    population std). The paper's authors (HeterogeneousRL) do not divide, so 0/1 rewards give
    advantages in [-1, 1] and a group with one success is not amplified threefold."""
    rewards = rewards.to(torch.float32)
    centred = rewards - rewards.mean()
    return centred / (rewards.std(unbiased=False) + eps) if scale_by_std else centred


def sequence_divergence(
    logp_theta: torch.Tensor,
    logp_gen: torch.Tensor,
    mask: torch.Tensor,
    estimator: str = "k3-mean",
    clamp: float = 20.0,
) -> torch.Tensor:
    """How far our policy has drifted from the generator, per sequence, on its own tokens.

    With d = log pi_gen - log pi_theta per token, k1 = d (a KL(pi_gen || pi_theta) estimate)
    and k3 = exp(d) - d - 1, the authors' estimator (HeterogeneousRL, src/grpo.py): always
    >= 0 and fast-growing where the generator liked a token our policy finds unlikely, which
    is the case the filter exists to catch. Default: k3-mean, the authors' choice.
    """
    d = (logp_gen - logp_theta.detach()).clamp(-clamp, clamp)
    mask = mask.to(d.dtype)
    lengths = mask.sum(-1).clamp_min(1.0)
    if estimator == "k1-mean":
        return (d * mask).sum(-1) / lengths
    k3 = torch.expm1(d) - d
    if estimator == "k3-mean":
        return (k3 * mask).sum(-1) / lengths
    if estimator == "k3-sum":
        return (k3 * mask).sum(-1)
    DIVERGENCES.get(estimator)  # raises, naming the valid ones
    raise NotImplementedError(f"divergence estimator {estimator!r} is registered but not implemented")


def _no_weight(log_w: torch.Tensor, settings: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones_like(log_w), torch.zeros_like(log_w, dtype=torch.bool)


def _vanilla_weight(log_w: torch.Tensor, settings: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    return log_w.exp(), torch.zeros_like(log_w, dtype=torch.bool)


def _truncated_weight(log_w: torch.Tensor, settings: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    raw = log_w.exp()
    return raw.clamp(max=settings.trunc_c), raw > settings.trunc_c


def _clipped_against_generator(
    ratio: torch.Tensor, advantages: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """VIS as PPO with pi_gen for pi_old: min(r A, clip(r, 1-eps, 1+eps) A) has the gradient
    r A grad log pi where r is inside the range or on the side the advantage does not push,
    and none where the clipped branch binds. Those tokens get weight 0 (counted as truncated)."""
    adv = advantages.to(ratio.dtype).unsqueeze(-1)
    binds = ((adv > 0) & (ratio > 1.0 + eps)) | ((adv < 0) & (ratio < 1.0 - eps))
    return torch.where(binds, torch.zeros_like(ratio), ratio), binds


def soft_filter_weights(advantages: torch.Tensor, divergence: torch.Tensor, g: float) -> torch.Tensor:
    """The hard filter made smooth: a negative-advantage sample counts g / (g + divergence),
    so 1 on-policy, 1/2 at the hard filter's threshold, and less the further its generator is
    from us; other samples count 1. A negative divergence (k1 can be) counts as none, so no
    sample ever counts more than 1."""
    distance = divergence.to(torch.float32).clamp_min(0.0)
    share = torch.where(distance > 0, g / (g + distance).clamp_min(1e-12), torch.ones_like(distance))
    return torch.where(advantages.to(share.device) < 0, share, torch.ones_like(share))


# (weight, truncated?) per token from the clamped log-ratio log pi_theta - log pi_gen.
WEIGHTINGS: dict[str, Callable[[torch.Tensor, LossSettings], tuple[torch.Tensor, torch.Tensor]]] = {
    "none": _no_weight,
    "vanilla": _vanilla_weight,
    "truncated": _truncated_weight,
}
if missing := {o.weighting for o in OBJECTIVES} - WEIGHTINGS.keys():
    raise RuntimeError(f"objectives name weightings without an implementation: {missing}")


def importance_weights(
    log_ratios: torch.Tensor,
    settings: LossSettings,
    advantages: torch.Tensor | None = None,
    *,
    weighting: str | None = None,
    clip_vis: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token, the importance weight w and whether it was truncated, from the log-ratios
    log pi_theta - log pi_gen (clamped to `log_ratio_clamp` here).

    `weighting` is the objective's (`loss.objective`) unless named. With `clip_vis` and
    `loss.vis_clip`, a vanilla weight is PPO-clipped against the generator, which needs each
    sequence's advantage (`advantages`, one per row of `log_ratios`); `clip_vis=False` gives the
    unclipped ratio, which is what screening's weight budget measures."""
    weighting = weighting or OBJECTIVES.get(settings.objective).weighting
    log_w = log_ratios.clamp(-settings.log_ratio_clamp, settings.log_ratio_clamp)
    weight, truncated = WEIGHTINGS[weighting](log_w, settings)
    if weighting == "vanilla" and settings.vis_clip and clip_vis:
        if advantages is None:
            raise ValueError("vis_clip needs the advantages: the clip's direction is the advantage's")
        weight, truncated = _clipped_against_generator(weight, advantages, settings.clip_eps)
    return weight, truncated


@dataclass
class ObjectiveTerms:
    """The summed loss of a (micro-)batch and the raw sums its diagnostics come from."""

    loss_sum: torch.Tensor  # sum over sequences of the per-sequence objective, to be divided by N
    weight_sum: float
    weight_max: float
    truncated_tokens: int
    tokens: int
    filtered: torch.Tensor  # bool per sequence
    divergence: torch.Tensor  # per sequence


def objective_terms(
    logp_theta: torch.Tensor,
    logp_gen: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    settings: LossSettings,
    logp_old: torch.Tensor | None = None,
    weight_scale: torch.Tensor | None = None,
    spans: SpanBatch | None = None,
) -> ObjectiveTerms:
    """Compute the objective for sequences shaped [B, T] (mask from lengths, 1 = real token).

    `logp_theta` carries the gradient; `logp_gen` is what the generator reported; `logp_old`
    is the policy the PPO ratio is taken against (defaults to `logp_theta` detached);
    `weight_scale` [B] multiplies each sequence's weights (screening's weight budget).
    With `spans` (tokens that are not the generator's own: swarmnode.learn.alignment), the
    generator's log-probs are per span (`spans.gen`; `logp_gen` is not read): each token's
    importance weight is its span's, and the divergence is taken over spans. Token-level spans
    give exactly the values without them.
    """
    choice = OBJECTIVES.get(settings.objective)  # an unknown name is an error, not a fallback
    mask_f = mask.to(logp_theta.dtype)
    current = logp_theta.detach()
    old = current if logp_old is None else logp_old
    if spans is None:  # the events the weights and the divergence are taken over: tokens, or spans
        event_theta, event_gen, event_mask = current, logp_gen, mask
        log_w = current - logp_gen
    else:
        event_theta, event_gen, event_mask = spans.sums(current), spans.gen.to(current.dtype), spans.mask
        log_w = spans.spread(event_theta - event_gen)
    weight, truncated = importance_weights(log_w, settings, advantages, weighting=choice.weighting)
    if weight_scale is not None:
        weight = weight * weight_scale.to(weight.dtype).unsqueeze(-1)
    ratio = (logp_theta - old).clamp(-settings.log_ratio_clamp, settings.log_ratio_clamp).exp()
    adv = advantages.to(logp_theta.dtype).unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - settings.clip_eps, 1.0 + settings.clip_eps) * adv)
    per_token = weight * surrogate * mask_f
    per_sequence = per_token.sum(-1) / mask_f.sum(-1).clamp_min(1.0)
    divergence = sequence_divergence(event_theta, event_gen, event_mask, settings.divergence, settings.log_ratio_clamp)
    filtered = torch.zeros_like(advantages, dtype=torch.bool)
    if choice.filtered and settings.filter_shape == "soft":
        per_sequence = per_sequence * soft_filter_weights(advantages, divergence, settings.filter_g).to(per_sequence.dtype)
    elif choice.filtered:
        filtered = (advantages < 0) & (divergence > settings.filter_g)
    per_sequence = torch.where(filtered, torch.zeros_like(per_sequence), per_sequence)
    real = mask.bool()
    return ObjectiveTerms(
        loss_sum=-per_sequence.sum(),
        weight_sum=float(weight[real].sum()),
        weight_max=float(weight[real].max()) if real.any() else 0.0,
        truncated_tokens=int(truncated[real].sum()),
        tokens=int(real.sum()),
        filtered=filtered,
        divergence=divergence,
    )


@dataclass
class ObjectiveStats:
    """Per-step diagnostics: what the paper's reviewers asked every round to report."""

    weight_mean: float = 0.0
    weight_max: float = 0.0
    truncated_frac: float = 0.0
    filtered: int = 0
    filtered_frac: float = 0.0
    divergence_mean: float = 0.0
    sequences: int = 0
    tokens: int = 0

    @staticmethod
    def combine(parts: list[ObjectiveTerms]) -> ObjectiveStats:
        tokens = sum(p.tokens for p in parts)
        sequences = sum(int(p.filtered.numel()) for p in parts)
        filtered = sum(int(p.filtered.sum()) for p in parts)
        div_sum = sum(float(p.divergence.sum()) for p in parts)
        return ObjectiveStats(
            weight_mean=sum(p.weight_sum for p in parts) / max(tokens, 1),
            weight_max=max((p.weight_max for p in parts), default=0.0),
            truncated_frac=sum(p.truncated_tokens for p in parts) / max(tokens, 1),
            filtered=filtered,
            filtered_frac=filtered / max(sequences, 1),
            divergence_mean=div_sum / max(sequences, 1),
            sequences=sequences,
            tokens=tokens,
        )

    def merged(self, other: ObjectiveStats) -> ObjectiveStats:
        """The diagnostics of two steps a round took as if of one (per token and per sequence
        weighted as in `combine`), so a round's record counts every sample it trained on."""
        tokens, sequences = self.tokens + other.tokens, self.sequences + other.sequences
        filtered = self.filtered + other.filtered
        return ObjectiveStats(
            weight_mean=(self.weight_mean * self.tokens + other.weight_mean * other.tokens) / max(tokens, 1),
            weight_max=max(self.weight_max, other.weight_max),
            truncated_frac=(self.truncated_frac * self.tokens + other.truncated_frac * other.tokens) / max(tokens, 1),
            filtered=filtered,
            filtered_frac=filtered / max(sequences, 1),
            divergence_mean=(self.divergence_mean * self.sequences + other.divergence_mean * other.sequences)
            / max(sequences, 1),
            sequences=sequences,
            tokens=tokens,
        )
