"""The lab's useful-looking crowd: the payload a same-base attacker would pick, and a padded crowd's batches."""

import numpy as np
import pytest

from swarmnode.lab.crowd import (
    ANSWER_OPEN,
    UsefulCrowd,
    UselessCrowd,
    drift_payload,
    off_by_one,
    stealthiest_payload,
)
from swarmnode.loop.ledger import PeerLedger
from swarmnode.protocol import wire
from swarmnode.protocol.batches import check_batch
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


def test_a_useless_crowd_sends_one_valid_group_a_round_whose_answers_all_score_alike(make_policy):
    """What contests the probation turn (bench/attacks.py probation-crowd) must be what an honest
    peer early luck left useless looks like: a batch the node accepts, sampled completions with
    the sampler's log-probs, and a group that teaches nothing."""
    policy = make_policy(hidden=32, layers=1)
    task = make_task(TaskSettings(name="arithmetic"))
    config = Config()
    hub = InMemoryHub()
    crowd = UselessCrowd([hub.exchange(f"crowd{i}", "run", PeerLedger()) for i in range(2)], "run", config, task,
                         policy, HFGenerator(policy, config.rollout, seed=1))
    crowd.publish(3)
    received = hub.exchange("honest", "run", PeerLedger()).gather()
    assert sorted(r.peer_id for r in received) == ["crowd0", "crowd1"] and crowd.published == 2
    for item in received:
        batch = wire.decode(item.payload)
        check_batch(batch, item.peer_id, 3, config, "run", len(policy.tokenizer), task.num_train)
        (group,) = batch.groups
        problem = task.train_problem(group.prompt_id)
        completions = group.completions()
        assert len({task.reward(policy.decode(c.tokens), problem) for c in completions}) == 1, "all alike"
        assert len({c.tokens.tobytes() for c in completions}) > 1, "sampled, not one completion repeated"


def test_a_useless_crowd_chooses_the_wrong_answers_first_and_sends_nothing_when_too_few_are_alike(make_policy):
    policy = make_policy(hidden=32, layers=1)
    task = make_task(TaskSettings(name="arithmetic"))
    crowd = UselessCrowd([], "run", Config(), task, policy, HFGenerator(policy, Config().rollout))
    problem = task.train_problem(0)

    def said(answer: str) -> wire.Completion:
        ids = policy.tokenizer(f"{ANSWER_OPEN}{answer}</answer>", add_special_tokens=False)["input_ids"]
        return wire.Completion(np.array(ids, dtype=np.int32), np.zeros(len(ids), dtype=np.float32))

    right, wrong = said(problem.answer), said(off_by_one(problem.answer))
    assert task.reward(policy.decode(right.tokens), problem) > task.reward(policy.decode(wrong.tokens), problem)
    def chosen(samples: list[wire.Completion]) -> list[str] | None:
        picked = crowd.alike(samples, problem, 3)
        return None if picked is None else ["right" if c is right else "wrong" for c in picked]

    assert chosen([right, wrong, wrong, right, wrong]) == ["wrong"] * 3
    assert chosen([right, right, wrong, right]) == ["right"] * 3, "too few wrong: the right ones"
    assert chosen([right, right, wrong, wrong]) is None
    with pytest.raises(ValueError, match="draws"):
        UselessCrowd([], "run", Config(), task, policy, HFGenerator(policy, Config().rollout), draws=0)
