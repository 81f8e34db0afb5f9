"""One screening of peers' groups: the gate, balanced advantages and the weight budget.

**The gate** (swarmnode.screening.gate) drops a peer's sample under a bar only when its
advantage is positive (`trust.gate_scope` "positive", the default): poison is learned only
through a positive advantage, which raises the likelihood of its text, while a
negative-advantage sample pushes its text down and F-TIS's filter already drops those far from
our policy. Gating every unlikely sample (`gate_scope` "all") drops mostly honest peers' wrong
answers after their group's advantages were computed, so the kept advantages no longer sum to
zero and wrong answers are under-penalised: two copies of one model then learned less together
than one alone (docs/figures.md, "Does it pay?"). A gated sample, like a filtered one, still
counts in its group's mean.

**Balanced advantages.** The gate's bias has a converse that is an attack: a group whose right
answers carry text we would not write has them gated, and what is left, its wrong answers,
would push down what all its answers share (the answer's own format) with nothing to balance
it. Without this rule, model-less identities sending such groups took a tiny node's accuracy
from 0.59 to 0.02 in 25 rounds (bench/attacks.py drift). So when the gate drops part of a
group's positive advantage, the group's negative advantages shrink in proportion: the kept ones
never sum below zero, and those shrunk to nothing leave the batch as gated ones do. With
`trust.balance_by_weight` each kept sample counts by what it weighs in the loss (its mean
importance weight, none where F-TIS's filter drops it): a far peer's right answers, which our
model would not write, weigh little, while the wrong ones the filter keeps are those close to
our policy and weigh up to C, so its groups would otherwise push our likely text down on net.

**The weight budget** (swarmnode.screening.budget) scales each peer's weights to a mean of at
most 1 and strikes log-probs no honest sampler reports.

Failing the gate is never a strike: a peer with another model (a different size, a LoRA, a few
hundred steps of its own training) honestly writes text our model finds unlikely, more of it as
the models drift apart, and banning it would end the collaboration the swarm is for.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from swarmnode.learn.loss import importance_weights, sequence_divergence, soft_filter_weights
from swarmnode.learn.sample import Group, Sample, Verdict
from swarmnode.screening.budget import WeightBudget
from swarmnode.screening.gate import Anchor, Bars, gateable
from swarmnode.settings.config import LossSettings, TrustSettings
from swarmnode.settings.registry import OBJECTIVES


@dataclass
class PeerScreening:
    """What one screening found in one peer's samples."""

    samples: int = 0
    picked: int = 0  # samples left out as picked, not sampled (swarmnode.screening.repeats)
    below_bar: int = 0  # samples under a bar of the gate, gated or (advantage <= 0) kept
    gated: int = 0
    weight_mean: float = 1.0  # mean weight over its kept tokens under the objective
    capped_weight_mean: float = 1.0  # the same with weights capped at C: at most 1 if honest
    weight_scale: float = 1.0  # what its weights are multiplied by
    strikes: list[str] = field(default_factory=list)


@dataclass
class Screening:
    """Peers' groups as screening judged them: each sample with its verdict and the advantage
    and weight scale it trains with; per peer, what was found."""

    groups: list[Group]
    peers: dict[str, PeerScreening]

    @property
    def samples(self) -> list[Sample]:
        return [sample for group in self.groups for sample in group.samples]

    @property
    def gated(self) -> int:
        return sum(p.gated for p in self.peers.values())

    @property
    def picked(self) -> int:
        return sum(p.picked for p in self.peers.values())

    @property
    def below_bar(self) -> int:
        return sum(p.below_bar for p in self.peers.values())


def passed(groups: list[Group]) -> Screening:
    """Groups nothing screens (neither the gate nor the budget is on): every sample kept as it is."""
    return Screening(groups=groups, peers={})


def balanced_advantages(samples: list[Sample], keep: list[bool], weights: list[float] | None = None) -> list[float]:
    """The advantages of one group's samples, the negative ones shrunk so that its kept samples'
    advantages do not sum below zero once the gate dropped some of its positive ones; a group
    with nothing dropped is left as it was. With `weights` (one per sample, what it weighs in
    the loss) the sum is weighted: no advantage ever grows, and only negative ones shrink."""
    advantages = [s.advantage for s in samples]
    if weights is None:
        if all(keep):
            return advantages
        weights = [1.0] * len(samples)
    kept_up = sum(a * w for a, w, k in zip(advantages, weights, keep) if k and a > 0)
    kept_down = -sum(a * w for a, w, k in zip(advantages, weights, keep) if k and a < 0)
    wrong_kept = any(k and a < 0 for a, k in zip(advantages, keep))
    if kept_down > kept_up or (wrong_kept and kept_up == 0):  # no right answer left: its wrong ones go, weighing anything
        factor = kept_up / kept_down if kept_down > 0 else 0.0
        advantages = [a * factor if a < 0 else a for a in advantages]
    return advantages


def loss_weight(sample: Sample, theta: np.ndarray, loss: LossSettings) -> float:
    """What `sample` weighs in the loss under our model's log-probs `theta`: its mean importance
    weight under the objective, taken as the loss takes it (by span for another family, PPO-clipped
    against the generator for a clipped vis), times the filter's share: none where F-TIS's hard
    filter drops it, g / (g + divergence) under the soft filter."""
    if len(theta) == 0:
        return 0.0
    choice = OBJECTIVES.get(loss.objective)
    log_ratios = torch.from_numpy(np.asarray(sample.log_ratios(theta), dtype=np.float32))[None]
    advantage = torch.tensor([sample.advantage], dtype=torch.float32)
    weights, _ = importance_weights(log_ratios, loss, advantage, weighting=choice.weighting)
    weight = float(weights.mean())
    if not choice.filtered or sample.advantage >= 0:
        return weight
    spans = sample.gen_spans()
    divergence = sequence_divergence(
        torch.tensor(spans.sums(theta), dtype=torch.float32)[None], torch.from_numpy(np.asarray(spans.gen, np.float32))[None],
        torch.ones((1, len(spans.gen))), loss.divergence, loss.log_ratio_clamp,
    )
    if loss.filter_shape == "soft":
        return weight * float(soft_filter_weights(advantage, divergence, loss.filter_g)[0])
    return 0.0 if float(divergence[0]) > loss.filter_g else weight


def screen(
    groups: list[Group],
    theta: list[np.ndarray],
    own: list[Sample],
    trust: TrustSettings,
    loss: LossSettings,
    anchor: Anchor | None = None,
    picking: frozenset[str] = frozenset(),
) -> Screening:
    """Judge every sample of peers' `groups` (each with the advantage we computed over its whole
    group and the log-probs its sender reported): whether it trains, with what advantage, and
    how much its weights count. `theta` holds our model's log-probs of each sample's tokens and
    `anchor` (when given) the reference's, both in the groups' order; `own` are our own samples
    of the round (the gate's bar). A sample must reach both bars. The samples of a peer in
    `picking` (swarmnode.screening.repeats) are left out, whatever the bars say."""
    bars = Bars.of(own, trust, anchor)
    peers: dict[str, PeerScreening] = defaultdict(PeerScreening)
    budgets: dict[str, WeightBudget] = defaultdict(WeightBudget)
    weighting = OBJECTIVES.get(loss.objective).weighting
    flags: list[list[tuple[bool, bool, bool]]] = []  # per group, per sample: (keep, below, near)
    weights: list[list[float]] | None = [] if trust.balance_by_weight else None  # per group, per sample
    i = 0
    for group in groups:
        flags.append([])
        if weights is not None:
            weights.append([loss_weight(sample, theta[i + j], loss) for j, sample in enumerate(group.samples)])
        for sample in group.samples:
            found = peers[sample.source]
            found.samples += 1
            if sample.source in picking:  # left out whole by _judge; its claims still face the budget's strike
                found.picked += 1
                budgets[sample.source].add(sample, theta[i], loss, weighting)
                flags[-1].append((False, False, False))
                i += 1
                continue
            headrooms = bars.headrooms(theta[i], i)
            below, near = bars.below(headrooms), bars.near(headrooms)
            keep = not (below and gateable(sample.advantage, trust))
            found.below_bar += below
            found.gated += not keep
            if keep:
                budgets[sample.source].add(sample, theta[i], loss, weighting)
            flags[-1].append((keep, below, near))
            i += 1
    for peer, found in peers.items():
        budget = budgets[peer]
        found.weight_mean, found.capped_weight_mean = budget.weight_mean, budget.capped_weight_mean
        found.weight_scale = budget.scale(trust)
        if strike := budget.strike(trust):
            found.strikes.append(strike)
    judged = [
        _judge(group, group_flags, peers, group.source in picking, None if weights is None else weights[g])
        for g, (group, group_flags) in enumerate(zip(groups, flags))
    ]
    return Screening(groups=judged, peers=dict(peers))


def _judge(
    group: Group, flags: list[tuple[bool, bool, bool]], peers: dict[str, PeerScreening], picked: bool,
    weights: list[float] | None = None,
) -> Group:
    """The group with each sample's verdict and balanced advantage (by `weights`, what each
    sample weighs in the loss, where given). A wrong answer whose group's right ones were all
    gated teaches nothing: it takes no room either, and counts as gated (it left because of the
    gate). A picked group is left out whole."""
    if picked:
        return Group(group.source, group.problem, group.prompt_ids,
                     [sample.judged(Verdict(picked=True), sample.advantage) for sample in group.samples],
                     group.untranslated)
    keep = [k for k, _, _ in flags]
    advantages = balanced_advantages(group.samples, keep, weights)
    samples = []
    for sample, (kept, below, near), advantage in zip(group.samples, flags, advantages):
        if kept and advantage == 0 and sample.advantage != 0:
            kept = False
            peers[sample.source].gated += 1
        verdict = Verdict(gated=not kept, below_bar=below, near_bar=near, weight_scale=peers[sample.source].weight_scale)
        samples.append(sample.judged(verdict, advantage))
    return Group(group.source, group.problem, group.prompt_ids, samples, group.untranslated)
