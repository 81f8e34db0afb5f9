"""Scoring a group with this node's own task: rewards and advantages, whoever generated it.

Rewards are always ours: a group's completions are decoded and scored with our own task. A
peer's completions in another tokenizer family are first put into our tokens, with the
sender's log-probs by span (swarmnode.learn.alignment.translate); one that cannot be is left
out of its group. Advantages are taken per (generator, prompt) group over all of its samples,
before anything is screened out, so a sample dropped later still counts in its group's mean
(as the F-TIS filter's do). By default (`loss.peer_baseline` lower) a peer's group whose mean
reward is above our own samples' that round is taken against ours instead: what a stronger peer
got right counts for as much as our own right answers do, where against its own mean an all-right
group teaches nothing (docs/figures.md). With own, every peer's group is taken against ours.
"""

from __future__ import annotations

import torch

from swarmnode.learn.alignment import Tokenization, translate
from swarmnode.learn.loss import group_advantages
from swarmnode.learn.sample import Group, Sample
from swarmnode.model.policy import Policy
from swarmnode.protocol.wire import Completion
from swarmnode.settings.config import PeerBaseline
from swarmnode.tasks.base import Problem, Task


def score_group(
    task: Task, policy: Policy, source: str, problem: Problem, prompt_ids: list[int], completions: list[Completion],
    advantage_std: bool, translation: tuple[Tokenization, Tokenization] | None = None, max_tokens: int | None = None,
    own_reward: float | None = None, peer_baseline: PeerBaseline | None = None,
) -> Group:
    """The group of `completions` of `source` for `problem`: each decoded and scored with our
    task, with its advantage in the group (`advantage_std`: divided by the group's std), or,
    for a peer's group with our own samples' mean reward `own_reward`, taken against that
    (`peer_baseline` own) or against the lower of it and the group's mean (lower; None or group:
    the group's mean, as for our own groups). With `translation` (the sender's
    tokenizer, ours) the completions are first put into our tokens, at most `max_tokens` of
    them; one that cannot be is left out (`untranslated`)."""
    group = Group(source, problem, prompt_ids)
    if translation is None:
        read = [(c.tokens, c.logprobs, None) for c in completions]
    else:
        translated = [t for c in completions if (t := translate(c.tokens, c.logprobs, *translation, max_tokens)) is not None]
        group.untranslated = len(completions) - len(translated)
        read = [(t.tokens, None, t.spans) for t in translated]
    if not read:
        return group
    rewards = [task.reward(policy.decode(tokens), problem) for tokens, _, _ in read]
    mean = sum(rewards) / len(rewards)
    if own_reward is not None and (peer_baseline == "own" or (peer_baseline == "lower" and own_reward < mean)):
        advantages = [reward - own_reward for reward in rewards]
    else:
        advantages = group_advantages(torch.tensor(rewards), advantage_std).tolist()
    group.samples = [
        Sample(prompt_ids, tokens, logprobs, advantage, reward, source, spans=spans)
        for (tokens, logprobs, spans), reward, advantage in zip(read, rewards, advantages)
    ]
    return group
