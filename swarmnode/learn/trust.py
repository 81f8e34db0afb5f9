"""Judging peers' samples by what this node can compute itself, before it trains on them.

A peer controls its text and the log pi_gen it reports; it does not control how likely its text
is under *our* model. So:

- **Likelihood gate.** Each sample gets a score: the mean log pi_theta (at the sampling
  temperature) of its least likely window of `gate_window` tokens, so a short injected phrase in
  a long completion is not averaged away. Our own samples of the round (whose log-probs our
  generator reported, no extra work) set the bar: their `gate_quantile` score minus
  `gate_margin` nats. A peer's sample below the bar *with a positive advantage* leaves the
  batch (`gate_scope` "positive", the default). Why only those: poison is learned only
  through a positive advantage (it raises the likelihood of its text); a negative-advantage
  sample pushes its text down, and F-TIS's filter already drops negative-advantage samples
  that diverge more than g from our policy. Gating every unlikely sample (`gate_scope` "all")
  drops mostly wrong answers of honest peers, after their group's advantages were computed, so
  the kept advantages no longer sum to zero and wrong answers are under-penalised: two copies
  of one model then learned less together than one alone (docs/figures.md, "Does it pay?"). A gated
  sample, like a filtered one, still counts in its group's mean, and a group with nothing gated
  is left untouched. The converse bias is an attack: a group whose right answers carry text we
  would not write has them gated, and what is left, its wrong answers, would push down what
  all its answers share (the answer's own format) with nothing to balance it. Model-less
  identities sending such groups took a tiny node's accuracy from 0.59 to 0.02 in 25 rounds
  (bench/attacks.py drift). So when the gate drops part of a group's positive advantage, the
  group's negative advantages shrink in proportion (`Screening.advantages`): the kept ones
  never sum below zero, and those shrunk to nothing leave the batch as gated ones do.
- **Anchored gate.** The bar above moves with the model it protects, and so does a sample's
  score: a payload that sits just under the bar passes now and then, each pass makes it
  likelier, and the next passes more often. Three model-less identities walked it that way
  (docs/security.md, "drift"). So a sample must also reach a second bar under a reference the
  peers cannot move (`trust.anchor`): the starting weights (a LoRA's frozen base, else a frozen
  copy, swarmnode.model.policy). Its bar comes from our own samples scored by the reference,
  as above, but it follows them slowly (ANCHOR_FOLLOW a round) and never falls more than
  `anchor_slack` below where it started (AnchorBar): text the starting model found unlikely
  stays out however our model drifts, and honest drift within the slack is followed.
- **Weight budget.** An honest generator draws tokens from pi_gen, so a token's importance
  weight pi_theta / pi_gen has expectation sum_x pi_theta(x) <= 1. A peer that reports a low
  log pi_gen gets weight C on every token instead. Each peer's weights are scaled so their
  mean over its batch is at most 1: a reported log-prob can move weight between that peer's
  tokens, never add to it. A batch whose mean weight is above `max_weight_mean` counts as
  a strike (PeerLedger), adding up to a ban with other bad data.

Failing the gate is never a strike: a peer with another model (a different size, a LoRA, a few
hundred steps of its own training) honestly writes text our model finds unlikely, more of it
as the models drift apart, and banning it would end the collaboration the swarm is for. The
gate already keeps those samples out of our batch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from swarmnode.learn.loss import WEIGHTINGS, TrainSample
from swarmnode.settings.config import LossSettings, TrustSettings
from swarmnode.settings.registry import OBJECTIVES

GATE_MIN_OWN = 8  # fewer own samples than this set no bar: the gate is off for that round
ANCHOR_FOLLOW = 0.05  # how far one round's measured bar moves the anchored gate's bar


def least_likely_window(logprobs: np.ndarray, window: int) -> float:
    """Mean log-prob of the least likely `window` consecutive tokens (the whole completion
    when shorter); 0.0 for an empty one."""
    values = np.asarray(logprobs, dtype=np.float64)
    if values.size == 0:
        return 0.0
    if values.size <= window:
        return float(values.mean())
    sums = np.convolve(values, np.ones(window), mode="valid")
    return float(sums.min() / window)


def gate_bar(own_logprobs: list[np.ndarray], settings: TrustSettings) -> float | None:
    """The score a peer's sample must reach, from our own samples; None when too few."""
    if len(own_logprobs) < GATE_MIN_OWN:
        return None
    scores = [least_likely_window(lp, settings.gate_window) for lp in own_logprobs]
    return float(np.quantile(scores, settings.gate_quantile)) - settings.gate_margin


class AnchorBar:
    """The anchored gate's bar over a run: where it started, and where it is now.

    Each round's bar is measured like the model's own (gate_bar, on our samples scored by the
    reference), then moves the bar ANCHOR_FOLLOW of the way, never below `start - slack`.
    """

    def __init__(self, slack: float, start: float | None = None) -> None:
        self.slack = slack
        self.start = start
        self.value = start

    def resume(self, start: float | None, value: float | None) -> None:
        """Go on from a checkpoint's bar (None: measured afresh)."""
        self.start = start
        self.value = start if value is None else value

    def update(self, own_reference_logprobs: list[np.ndarray], settings: TrustSettings) -> float | None:
        """The bar for this round, after our own samples' reference log-probs moved it."""
        measured = gate_bar(own_reference_logprobs, settings)
        if measured is None:
            return self.value
        if self.start is None or self.value is None:
            self.start = self.value = measured
        else:
            self.value = max(self.start - self.slack, self.value + ANCHOR_FOLLOW * (measured - self.value))
        return self.value


@dataclass(frozen=True)
class Anchor:
    """The reference's side of the gate for one batch of peers' samples."""

    logprobs: list[np.ndarray]  # log pi_ref on each peer sample's tokens
    bar: float


def token_weights(log_ratios: np.ndarray, loss: LossSettings, weighting: str) -> np.ndarray:
    """Per-token importance weights under `weighting` (none, vanilla, truncated) from the
    log-ratios log pi_theta - log pi_gen (TrainSample.log_ratios), as the loss computes them."""
    log_w = torch.from_numpy(np.asarray(log_ratios, dtype=np.float32))
    weights, _ = WEIGHTINGS[weighting](log_w.clamp(-loss.log_ratio_clamp, loss.log_ratio_clamp), loss)
    return weights.numpy()


@dataclass
class PeerVerdict:
    """What screening found in one peer's samples this round."""

    samples: int = 0
    below_bar: int = 0  # samples under the gate's bar, gated or (advantage <= 0) kept
    gated: int = 0
    weight_mean: float = 1.0  # mean weight over its kept tokens under the objective
    capped_weight_mean: float = 1.0  # the same with weights capped at C: at most 1 if honest
    weight_scale: float = 1.0  # what its weights are multiplied by
    strikes: list[str] = field(default_factory=list)


@dataclass
class Screening:
    """Per sample (in input order): kept or not, and the factor on its importance weights."""

    keep: list[bool]
    below_bar_flags: list[bool]  # per sample: under the gate's bar (gated or kept)
    near_bar_flags: list[bool]  # per sample: under a bar or within `trust.near_bar` above one (kept or not)
    weight_scale: list[float]
    advantages: list[float]  # per sample: the advantage it trains with (balanced_advantages)
    bar: float | None
    verdicts: dict[str, PeerVerdict]

    @property
    def gated(self) -> int:
        return sum(v.gated for v in self.verdicts.values())

    @property
    def below_bar(self) -> int:
        return sum(v.below_bar for v in self.verdicts.values())


def balanced_advantages(peers: list[TrainSample], keep: list[bool]) -> list[float]:
    """Each sample's advantage, the negative ones of a group shrunk so that its kept samples'
    advantages do not sum below zero once the gate dropped some of its positive ones.

    A group is a run of consecutive samples with one source and one prompt (as
    swarmnode.loop.samples lays them out); its advantages summed to zero before screening."""
    advantages = [s.advantage for s in peers]
    start = 0
    while start < len(peers):
        end = start + 1
        while end < len(peers) and peers[end].source == peers[start].source and peers[end].prompt_ids == peers[start].prompt_ids:
            end += 1
        members = range(start, end)
        if not all(keep[i] for i in members):
            kept_up = sum(advantages[i] for i in members if keep[i] and advantages[i] > 0)
            kept_down = -sum(advantages[i] for i in members if keep[i] and advantages[i] < 0)
            if kept_down > kept_up:
                for i in members:
                    if advantages[i] < 0:
                        advantages[i] *= kept_up / kept_down
        start = end
    return advantages


def gateable(advantage: float, trust: TrustSettings) -> bool:
    """Whether the gate may drop a sample with this advantage (see the module's docstring)."""
    return trust.gate_scope == "all" or advantage > 0


def _headrooms(theta: np.ndarray, bar: float | None, anchor: Anchor | None, i: int, trust: TrustSettings) -> list[float]:
    """How far above each bar (ours, the anchored one) sample i's least likely window is."""
    window = trust.gate_window
    return [
        *([least_likely_window(theta, window) - bar] if bar is not None else []),
        *([least_likely_window(anchor.logprobs[i], window) - anchor.bar] if anchor is not None else []),
    ]


def own_near_bar(own: list[TrainSample], trust: TrustSettings, anchor: Anchor | None = None) -> list[bool]:
    """Which of our own samples sit under a bar of the gate or within `trust.near_bar` above
    one (`anchor`: the reference's log-probs of our own samples and its bar): the rule a peer's
    samples are held to for their standing, so that a copy of our model teaches us, by that
    rule, as often as our own samples do (swarmnode.loop.usefulness)."""
    bar = gate_bar([s.gen_logprobs for s in own], trust) if trust.likelihood_gate else None
    return [
        any(not h >= trust.near_bar for h in _headrooms(sample.gen_logprobs, bar, anchor, i, trust))
        for i, sample in enumerate(own)
    ]


def screen(
    peers: list[TrainSample],
    theta_logprobs: list[np.ndarray],
    own: list[TrainSample],
    trust: TrustSettings,
    loss: LossSettings,
    anchor: Anchor | None = None,
) -> Screening:
    """Decide, per peer sample, whether it is trained on and how much its weights count.

    Each of `peers` names its sender (`source`), carries the group advantage we computed over
    its whole group and the log-probs its sender reported; `theta_logprobs[i]` is our model's
    on the tokens of `peers[i]`; `own` are our own samples of the round (the gate's bar);
    `anchor`, when given, the reference's log-probs and bar (a sample must reach both bars).
    """
    bar = gate_bar([s.gen_logprobs for s in own], trust) if trust.likelihood_gate else None
    keep = [True] * len(peers)
    below = [False] * len(peers)
    near = [False] * len(peers)
    verdicts: dict[str, PeerVerdict] = defaultdict(PeerVerdict)
    weighting = OBJECTIVES.get(loss.objective).weighting
    weight_sums: dict[str, float] = defaultdict(float)
    capped_sums: dict[str, float] = defaultdict(float)  # over tokens of its own tokenizer: where a mean above 1 is a lie
    token_counts: dict[str, int] = defaultdict(int)
    provable_tokens: dict[str, int] = defaultdict(int)
    for i, (sample, theta) in enumerate(zip(peers, theta_logprobs)):
        peer, advantage = sample.source, sample.advantage
        verdict = verdicts[peer]
        verdict.samples += 1
        headrooms = _headrooms(theta, bar, anchor, i, trust)
        unlikely = any(not h >= 0 for h in headrooms)  # a NaN score fails: nothing unscorable passes
        near[i] = any(not h >= trust.near_bar for h in headrooms)  # by a hair: walking the gate earns no standing
        if unlikely:
            verdict.below_bar += 1
            below[i] = True
            if gateable(advantage, trust):
                keep[i] = False
                verdict.gated += 1
                continue
        log_ratios = sample.log_ratios(theta)
        weight_sums[peer] += float(token_weights(log_ratios, loss, weighting).sum())
        token_counts[peer] += len(theta)
        if sample.spans is None:  # by span, the sender's log-prob is one segmentation's: no proof
            capped_sums[peer] += float(token_weights(log_ratios, loss, "truncated").sum())
            provable_tokens[peer] += len(theta)
    for peer, verdict in verdicts.items():
        if token_counts[peer]:
            verdict.weight_mean = weight_sums[peer] / token_counts[peer]
        if provable_tokens[peer]:
            verdict.capped_weight_mean = capped_sums[peer] / provable_tokens[peer]
        if trust.weight_budget and verdict.weight_mean > 1.0:
            verdict.weight_scale = 1.0 / verdict.weight_mean
        if verdict.capped_weight_mean > trust.max_weight_mean:
            verdict.strikes.append(
                f"its log-probs claim a mean importance weight of {verdict.capped_weight_mean:.2f} "
                f"(an honest generator's is at most 1)"
            )
    scales = [verdicts[sample.source].weight_scale for sample in peers]
    advantages = balanced_advantages(peers, keep)
    # a wrong answer whose group's right ones were all gated teaches nothing: it takes no room
    # either, and counts as gated (it left because of the gate)
    for i, (sample, advantage) in enumerate(zip(peers, advantages)):
        if keep[i] and advantage == 0 and sample.advantage != 0:
            keep[i] = False
            verdicts[sample.source].gated += 1
    return Screening(keep=keep, below_bar_flags=below, near_bar_flags=near, weight_scale=scales,
                     advantages=advantages, bar=bar, verdicts=dict(verdicts))

