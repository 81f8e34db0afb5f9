"""Groups scored by this node and the samples a step trains on, with their advantages.

Rewards are always ours: a group's completions are decoded and scored with our own task,
whoever generated them. Advantages are taken per (generator, prompt) group over all of its
samples, before anything is screened out, so a sample dropped later still counts in its
group's mean (as the F-TIS filter's do).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

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
    completions: list[Completion]
    rewards: list[float]

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
) -> ScoredGroup:
    """Decode each completion and score it with our own task."""
    rewards = [task.reward(policy.decode(c.tokens), problem) for c in completions]
    return ScoredGroup(peer_id, problem, prompt_ids, completions, rewards)


def train_samples(groups: list[ScoredGroup], scale_by_std: bool) -> list[Sample]:
    """Every completion of the groups with its group-relative advantage."""
    samples: list[Sample] = []
    for group in groups:
        advantages = group_advantages(torch.tensor(group.rewards), scale_by_std)
        for completion, advantage, reward in zip(group.completions, advantages.tolist(), group.rewards):
            samples.append(Sample(TrainSample(group.prompt_ids, completion, advantage, group.peer_id), reward))
    return samples
