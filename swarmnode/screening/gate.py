"""The likelihood gate: a peer's sample must be about as likely to us as our own samples are.

A peer controls its text and the log pi_gen it reports; it does not control how likely its text
is under *our* model. Each sample gets a score: the mean log pi_theta (at the sampling
temperature) of its least likely window of `trust.gate_window` tokens, so a short injected
phrase in a long completion is not averaged away. Our own samples of the round set the bar:
their `trust.gate_quantile` score minus `trust.gate_margin` nats.

The bar moves with the model it protects, and so does a sample's score: a payload just under
the bar passes now and then, each pass makes it likelier, and the next passes more often. So a
sample must also reach a second bar under a reference no peer can move (`trust.anchor`: the
starting weights, swarmnode.model.policy). Its bar is measured the same way on our own samples
as the reference scores them, but follows them slowly (ANCHOR_FOLLOW a round) and never falls
more than `trust.anchor_slack` below where it started (AnchorBar).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swarmnode.learn.sample import Sample
from swarmnode.settings.config import TrustSettings

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
    """The reference's side of the gate for a list of samples."""

    logprobs: list[np.ndarray]  # log pi_ref on each sample's tokens, in the samples' order
    bar: float


@dataclass(frozen=True)
class Bars:
    """The gate's bars in one round: ours (from our own samples now) and the anchored one."""

    ours: float | None
    anchor: Anchor | None
    trust: TrustSettings

    @staticmethod
    def of(own: list[Sample], trust: TrustSettings, anchor: Anchor | None = None) -> Bars:
        """The bars our own samples of the round set (the gate on), with the reference's side."""
        ours = gate_bar([s.logprobs for s in own], trust) if trust.likelihood_gate else None
        return Bars(ours, anchor, trust)

    def headrooms(self, theta: np.ndarray, i: int) -> list[float]:
        """How far above each bar sample i's least likely window is (`theta`: its log-probs
        under our model; the anchor's are its i-th)."""
        window = self.trust.gate_window
        return [
            *([least_likely_window(theta, window) - self.ours] if self.ours is not None else []),
            *([least_likely_window(self.anchor.logprobs[i], window) - self.anchor.bar] if self.anchor is not None else []),
        ]

    def below(self, headrooms: list[float]) -> bool:
        """Under a bar: a NaN score fails too, so nothing unscorable passes."""
        return any(not h >= 0 for h in headrooms)

    def near(self, headrooms: list[float]) -> bool:
        """Under a bar or within `trust.near_bar` above one: passing by a hair earns no standing."""
        return any(not h >= self.trust.near_bar for h in headrooms)


def gateable(advantage: float, trust: TrustSettings) -> bool:
    """Whether the gate may drop a sample with this advantage: only a positive one by default,
    since poison is learned only through a positive advantage (swarmnode.screening.screen)."""
    return trust.gate_scope == "all" or advantage > 0


def own_near_bar(own: list[Sample], trust: TrustSettings, anchor: Anchor | None = None) -> list[bool]:
    """Which of our own samples sit under a bar of the gate or within `trust.near_bar` above
    one (`anchor`: the reference's log-probs of our own samples and its bar): the rule a peer's
    samples are held to for their standing, so that a copy of our model teaches us, by that
    rule, as often as our own samples do (swarmnode.screening.usefulness)."""
    bars = Bars.of(own, trust, anchor)
    return [bars.near(bars.headrooms(sample.logprobs, i)) for i, sample in enumerate(own)]
