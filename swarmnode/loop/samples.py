"""Groups scored by this node and the samples a step trains on, with their advantages.

Rewards are always ours: a group's completions are decoded and scored with our own task,
whoever generated them. Advantages are taken per (generator, prompt) group over all of its
samples, before anything is screened out, so a sample dropped later still counts in its
group's mean (as the F-TIS filter's do).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from swarmnode.learn.alignment import Spans, Tokenization, translate
from swarmnode.learn.loss import TrainSample, group_advantages
from swarmnode.model.policy import Policy
from swarmnode.protocol.wire import Completion
from swarmnode.tasks.base import Problem, Task

OWN = ""  # the generator id of this node's own groups


@dataclass
class ScoredGroup:
    """One generator's completions for one prompt, scored by this node."""

    peer_id: str  # OWN for ours
    problem: Problem
    prompt_ids: list[int]
    completions: list[Completion]  # in our tokens
    rewards: list[float]
    spans: list[Spans] | None = None  # per completion, when its generator's tokenizer is not ours
    untranslated: int = 0  # its completions that could not be put into our tokens (left out)

    @property
    def own(self) -> bool:
        return self.peer_id == OWN


@dataclass
class Sample:
    """One completion ready for the step, with the reward it earned."""

    train: TrainSample
    reward: float

    @property
    def peer_id(self) -> str:
        """Who generated it: OWN for ours."""
        return self.train.source

    def screened(self, scale: float, advantage: float) -> Sample:
        """This sample as screening lets it train: its importance weights scaled by `scale` (a
        peer's weight budget), with `advantage` (its group's balanced after gating)."""
        return replace(self, train=replace(self.train, weight_scale=scale, advantage=advantage))


def score_group(
    task: Task, policy: Policy, peer_id: str, problem: Problem, prompt_ids: list[int], completions: list[Completion],
    translation: tuple[Tokenization, Tokenization] | None = None, max_tokens: int | None = None,
) -> ScoredGroup:
    """Decode each completion and score it with our own task. With `translation` (the sender's
    tokenizer, ours) the completions are first put into our tokens, their log-probs by span, at
    most `max_tokens` of ours (swarmnode.learn.alignment.translate); one that cannot be is left
    out of the group, whose advantages are then taken over the rest."""
    spans: list[Spans] | None = None
    untranslated = 0
    if translation is not None:
        translated = [t for c in completions if (t := translate(c.tokens, c.logprobs, *translation, max_tokens)) is not None]
        untranslated = len(completions) - len(translated)
        completions = [Completion(t.tokens, _spread(t.spans)) for t in translated]
        spans = [t.spans for t in translated]
    rewards = [task.reward(policy.decode(c.tokens), problem) for c in completions]
    return ScoredGroup(peer_id, problem, prompt_ids, completions, rewards, spans, untranslated)


def _spread(spans: Spans) -> np.ndarray:
    """Per token, an equal part of its span's log-prob: a stand-in where a per-token value is
    read (the loss and screening read the spans)."""
    counts = np.bincount(spans.of_token, minlength=len(spans.gen))
    return (spans.gen / np.maximum(counts, 1))[spans.of_token].astype(np.float32)


def train_samples(groups: list[ScoredGroup], scale_by_std: bool) -> list[Sample]:
    """Every completion of the groups with its group-relative advantage."""
    samples: list[Sample] = []
    for group in groups:
        if not group.completions:
            continue
        advantages = group_advantages(torch.tensor(group.rewards), scale_by_std)
        spans = group.spans or [None] * len(group.completions)
        for completion, advantage, reward, span in zip(group.completions, advantages.tolist(), group.rewards, spans):
            samples.append(Sample(TrainSample(group.prompt_ids, completion, advantage, group.peer_id, spans=span), reward))
    return samples
