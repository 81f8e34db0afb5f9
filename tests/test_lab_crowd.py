"""The lab's useful-looking crowd: the payload a same-base attacker would pick, and a padded crowd's batches."""

import numpy as np
import pytest

from swarmnode.lab.crowd import (
    ANSWER_OPEN,
    UsefulCrowd,
    UselessCrowd,
    drift_payload,
    stealthiest_payload,
)
from swarmnode.loop.ledger import PeerLedger
from swarmnode.protocol import wire
from swarmnode.protocol.batches import assigned_prompt_ids, check_batch
from swarmnode.protocol.prompts import build_prompt
from swarmnode.rollout.hf import HFGenerator
from swarmnode.screening.gate import least_likely_window
from swarmnode.settings.config import Config, TaskSettings
from swarmnode.swarm.local import InMemoryHub
from swarmnode.tasks import make_task


def _gate_score(policy, task, payload, window=4, prompts=4):
    problems = [task.train_problem(i) for i in range(prompts)]
    tokenizer = policy.tokenizer
    completions = [
        np.array(payload + tokenizer(f"{ANSWER_OPEN}{p.answer}</answer>", add_special_tokens=False)["input_ids"]
                 + [tokenizer.eos_token_id], dtype=np.int32)
        for p in problems
    ]
    logprobs = policy.token_logprobs([build_prompt(task, p, policy) for p in problems], completions, 1.0)
    return float(np.mean([least_likely_window(lp, window) for lp in logprobs]))


def test_the_stealthiest_payload_scores_at_least_as_well_as_other_payloads(make_policy):
    policy = make_policy(hidden=32, layers=1)
    task = make_task(TaskSettings(name="arithmetic"))
    chosen = stealthiest_payload(policy, task, 1, window=4, prompts=4)
    assert len(chosen) == 1
    text = policy.tokenizer.decode(chosen)
    assert not any(c.isdigit() for c in text) and "answer>" not in text
    best = _gate_score(policy, task, chosen)
    others = [drift_payload(policy, task, 1), *[[t] for t in policy.tokenizer("abc=xyz", add_special_tokens=False)["input_ids"]]]
    assert all(best >= _gate_score(policy, task, other) - 1e-6 for other in others)


def test_a_padded_crowd_writes_its_first_groups_and_fills_the_rest_with_the_public_model_s_samples(make_policy):
    policy = make_policy(hidden=32, layers=1)
    task = make_task(TaskSettings(name="arithmetic"))
    config = Config()
    hub = InMemoryHub()
    crowd = UsefulCrowd([hub.exchange("crowd0", "run", PeerLedger())], "run", config, task, policy, [],
                        sampler=HFGenerator(policy, config.rollout, seed=1), padding=0.75)
    assert crowd.written == 4, "16 groups, three quarters padding: four written"
    crowd.publish(0)
    (received,) = hub.exchange("honest", "run", PeerLedger()).gather()
    groups = wire.decode(received.payload).groups
    assert len(groups) == 16

    def starts_with_the_right_answer(group: wire.CompletionGroup) -> bool:
        answer = task.train_problem(group.prompt_id).answer
        written = policy.tokenizer(f"{ANSWER_OPEN}{answer}</answer>", add_special_tokens=False)["input_ids"]
        return [int(t) for t in group.tokens[: len(written)]] == written

    assert all(starts_with_the_right_answer(g) for g in groups[:4]), "the written groups"
    assert not any(starts_with_the_right_answer(g) for g in groups[4:]), "a random model's own samples"
    with pytest.raises(ValueError, match="sampler"):
        UsefulCrowd([], "run", config, task, policy, [], padding=0.5)
    with pytest.raises(ValueError, match="in \\[0, 1\\)"):
        UsefulCrowd([], "run", config, task, policy, [], sampler=HFGenerator(policy, config.rollout), padding=1.0)


def test_a_sampling_crowd_makes_a_round_s_groups_in_one_generate_call_scored_as_one_by_one(make_policy):
    policy = make_policy(hidden=32, layers=1)
    task = make_task(TaskSettings(name="arithmetic"))
    config = Config()
    hub = InMemoryHub()
    sampler = HFGenerator(policy, config.rollout, seed=1)
    calls: list[int] = []
    generate = sampler.generate
    sampler.generate = lambda prompts, size: calls.append(len(prompts)) or generate(prompts, size)
    crowd = UsefulCrowd([hub.exchange(f"crowd{i}", "run", PeerLedger()) for i in range(2)], "run", config, task,
                        policy, [], groups=4, sampler=sampler)
    crowd.publish(0)
    assert len(calls) == 1 and 4 < calls[0] <= 8, "both identities' distinct prompts in one call"
    crowd.publish(0)
    assert len(calls) == 1, "a group made once is sent again as made"
    received = hub.exchange("honest", "run", PeerLedger()).gather()
    groups = [g for batch in received for g in wire.decode(batch.payload).groups]
    assert len(groups) == 8
    for group in groups:
        problem = task.train_problem(group.prompt_id)
        right = policy.tokenizer(f"{ANSWER_OPEN}{problem.answer}</answer>", add_special_tokens=False)["input_ids"]
        completions = [c.tokens for c in group.completions()]
        assert [int(t) for t in completions[0][: len(right)]] == right, "the right answer in place of the first sample"
        alone = policy.token_logprobs([build_prompt(task, problem, policy)] * len(completions), completions,
                                      config.rollout.temperature)
        for completion, expected in zip(group.completions(), alone):
            np.testing.assert_allclose(completion.logprobs, expected, atol=1e-4)


def _said(policy, answer: str, logprob: float) -> wire.Completion:
    ids = policy.tokenizer(f"{ANSWER_OPEN}{answer}</answer>", add_special_tokens=False)["input_ids"]
    return wire.Completion(np.array(ids, dtype=np.int32), np.full(len(ids), logprob, dtype=np.float32))


class _MixedSampler:
    """Per prompt, `right` right answers then wrong ones (each a distinct number), every
    completion's log-probs its own value, so what is sent can be traced to what was sampled."""

    def __init__(self, policy, task, prompt_ids: list[int], right: int) -> None:
        self.policy, self.task, self.prompt_ids, self.right, self.sampled = policy, task, prompt_ids, right, []

    def generate(self, prompts, size):
        groups = []
        for prompt_id in self.prompt_ids:
            answer = int(self.task.train_problem(prompt_id).answer)
            group = [_said(self.policy, str(answer + (i >= self.right) * (i + 1)), -0.01 * (len(self.sampled) + i))
                     for i in range(size)]
            self.sampled += group
            groups.append(group)
        assert len(groups) == len(prompts)
        return groups


def test_a_useless_crowd_sends_one_valid_group_a_round_of_sampled_wrong_answers(make_policy):
    """What contests the probation turn (bench/attacks.py probation-crowd) must be what an honest
    peer early luck left useless looks like: a batch the node accepts, sampled completions sent
    with the sampler's own log-probs, and a group that teaches nothing (all wrong); an identity
    whose draws hold too few wrong answers sends nothing."""
    policy = make_policy(hidden=32, layers=1)
    task = make_task(TaskSettings(name="arithmetic"))
    config = Config()
    size = config.rollout.group_size
    hub = InMemoryHub()
    names = ["crowd0", "crowd1"]
    prompt_ids = [assigned_prompt_ids(config.node.seed, n, 3, 1, task.num_train)[0] for n in names]
    sampler = _MixedSampler(policy, task, prompt_ids, right=size * 4 - size)  # four draws: one group's worth wrong
    crowd = UselessCrowd([hub.exchange(n, "run", PeerLedger()) for n in names], "run", config, task, policy, sampler)
    crowd.publish(3)
    honest = hub.exchange("honest", "run", PeerLedger())
    received = honest.gather()
    assert sorted(r.peer_id for r in received) == names and crowd.published == 2
    sampled = {c.tokens.tobytes(): c.logprobs for c in sampler.sampled}
    for item in received:
        batch = wire.decode(item.payload)
        check_batch(batch, item.peer_id, 3, config, "run", len(policy.tokenizer), task.num_train)
        (group,) = batch.groups
        problem = task.train_problem(group.prompt_id)
        completions = group.completions()
        assert len(completions) == size
        assert all(task.reward(policy.decode(c.tokens), problem) == 0.0 for c in completions), "every answer wrong"
        assert len({c.tokens.tobytes() for c in completions}) == size, "as sampled, none repeated"
        for c in completions:
            np.testing.assert_array_equal(c.logprobs, sampled[c.tokens.tobytes()])
    sampler.right = size * 4 - size + 1  # one wrong answer short of a group
    crowd.publish(3)
    assert crowd.published == 2, "too few wrong answers: nothing sent"
    renewed = ["crowd0.1", "crowd1.1"]  # a churning crowd (probation-crowd --churn)
    sampler.prompt_ids = [assigned_prompt_ids(config.node.seed, n, 4, 1, task.num_train)[0] for n in renewed]
    sampler.right = size * 4 - size
    crowd.renew([hub.exchange(n, "run", PeerLedger()) for n in renewed])
    crowd.publish(4)
    assert sorted(r.peer_id for r in honest.gather()) == renewed, "the new identities send, the old ones no more"
    with pytest.raises(ValueError, match="draws"):
        UselessCrowd([], "run", config, task, policy, sampler, draws=0)
