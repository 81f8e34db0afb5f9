"""One completion from scoring to the loss, and the group it belongs to.

A node scores every group it trains on with its own task, its own and its peers' alike, and
keeps the result as a `Group`: whose completions they are, for which prompt, and its samples,
each with the reward our task gave it and its advantage within the group. Screening
(swarmnode.screening) gives each of a peer's samples a `Verdict` and the advantage and weight
scale it trains with; the loss (swarmnode.learn.loss) reads the same `Sample`. Groups stay
records on the way, so screening balances a group by its own samples.

The generator's log-probs are the sender's own: per token when the completion is in our
tokenizer, per span when a peer of another family sent it and we read it in our tokens
(swarmnode.learn.alignment). A sample holds one or the other, never both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from swarmnode.learn.alignment import Spans
from swarmnode.protocol.wire import Completion
from swarmnode.tasks.base import Problem

OWN = ""  # the source of this node's own samples


@dataclass(frozen=True)
class Verdict:
    """What screening found of one peer sample (swarmnode.screening)."""

    gated: bool = False  # left out: under a bar of the gate with a positive advantage, or balanced to nothing
    below_bar: bool = False  # under a bar of the gate, gated or kept
    near_bar: bool = False  # under a bar, or within `trust.near_bar` above one: it earns its sender no standing
    weight_scale: float = 1.0  # its sender's weight budget this round
    picked: bool = False  # left out: its sender repeats completions more than its own log-probs allow

    @property
    def kept(self) -> bool:
        return not (self.gated or self.picked)


PASSED = Verdict()  # the verdict of a sample nothing judged: our own, or screening off


@dataclass(frozen=True)
class Sample:
    """One completion in our tokens, as screening and the loss take it.

    `logprobs` are its generator's per token; for a completion of another tokenizer family they
    are None and `spans` holds the generator's log-prob of each span of our tokens instead.
    `advantage` is its group's (balanced by screening when the gate dropped part of the group),
    and `weight_scale` multiplies its importance weights (a peer's weight budget and usefulness).
    """

    prompt_ids: list[int]
    tokens: np.ndarray  # int32, our tokens
    logprobs: np.ndarray | None  # float32, the generator's per token; None when `spans` holds them
    advantage: float
    reward: float = 0.0
    source: str = OWN  # the peer that generated it
    spans: Spans | None = None
    weight_scale: float = 1.0
    verdict: Verdict = PASSED

    @staticmethod
    def of(prompt_ids: list[int], completion: Completion, advantage: float, source: str = OWN, reward: float = 0.0) -> Sample:
        """A completion of our own tokenizer, with its generator's per-token log-probs."""
        return Sample(prompt_ids, completion.tokens, completion.logprobs, advantage, reward, source)

    def __post_init__(self) -> None:
        if (self.logprobs is None) == (self.spans is None):
            raise ValueError("a sample carries its generator's log-probs per token or by span: exactly one")

    @property
    def by_span(self) -> bool:
        """Its generator is of another tokenizer family: its log-probs are by span."""
        return self.spans is not None

    def gen_spans(self) -> Spans:
        """The generator's log-probs by span; each token its own span for a sample of our tokenizer."""
        return self.spans if self.spans is not None else Spans.token_level(self.logprobs)

    def log_ratios(self, logp_theta: np.ndarray) -> np.ndarray:
        """Per token: log pi_theta - log pi_gen, where pi_theta is `logp_theta` on our tokens;
        by span when its generator is of another family."""
        if self.spans is None:
            return logp_theta - self.logprobs
        return self.spans.log_ratios(logp_theta)

    def judged(self, verdict: Verdict, advantage: float) -> Sample:
        """This sample with screening's verdict, the advantage it trains with and its sender's
        weight budget."""
        return replace(self, verdict=verdict, advantage=advantage, weight_scale=verdict.weight_scale)

    def scaled(self, factor: float) -> Sample:
        """This sample with its importance weights multiplied by `factor`."""
        return replace(self, weight_scale=self.weight_scale * factor)


@dataclass
class Group:
    """One generator's completions for one prompt, scored by this node: the unit advantages
    are taken over and screening balances."""

    source: str  # OWN for ours
    problem: Problem
    prompt_ids: list[int]
    samples: list[Sample] = field(default_factory=list)
    untranslated: int = 0  # completions that could not be put into our tokens (left out)


def samples_of(groups: list[Group]) -> list[Sample]:
    """Every sample of the groups, in their order: what a step trains on."""
    return [sample for group in groups for sample in group.samples]
