"""Content attacks (swarmnode/poison.py) against honest tiny nodes, in one process.

The tiny preset (warmed up, so its completions are the answer block alone) is what makes the
likelihood gate meaningful: random-weight models find every text about equally likely.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from swarmnode import wire
from swarmnode.assemble import assemble
from swarmnode.config import load_config
from swarmnode.poison import DEFENCES_OFF, carries_injection, poisoning_link
from swarmnode.policy import Policy
from swarmnode.swarm.local import InMemoryHub


def _config(tmp_path, name, *sets):
    return load_config(
        None,
        [
            f"node.run_dir={tmp_path / name}",
            "model.device=cpu",
            "task.system_prompt=''",
            "rollout.backend=hf",
            "rollout.group_size=8",
            "rollout.prompts_per_round=4",
            "rollout.max_new_tokens=16",
            "train.lr=1e-4",
            "node.eval_size=50",
            "node.checkpoint_every=0",
            "node.gather_timeout_s=5",
            "swarm.enabled=false",
            *sets,
        ],
    )


@contextlib.contextmanager
def _swarm(tmp_path, attack, honest=("h1", "h2"), sets=()):
    """Honest tiny nodes and one poisoning peer on an in-memory hub."""
    hub = InMemoryHub()
    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(assemble(_config(tmp_path, name, *sets), join=lambda run, n=name: hub.join(n)))
            for name in honest
        ]
        config = _config(tmp_path, "evil", *sets)
        policy = Policy.load(config.model, config.train)
        evil = stack.enter_context(
            assemble(config, policy=policy, join=lambda run: poisoning_link(hub.join("evil"), attack, config, nodes[0].task, policy))
        )
        yield nodes, evil, hub


def _rounds(nodes, evil, rounds):
    """Step every node through `rounds`; the honest nodes' records, per round."""
    history = []
    for round_ in rounds:
        states = [node.produce(round_) for node in nodes]
        evil.produce(round_)
        history.append([node.consume(round_, state) for node, state in zip(nodes, states)])
    return history


@pytest.mark.parametrize("attack", ["before", "after", "high-lp"])
def test_injected_text_is_gated_every_round(tmp_path, attack):
    with _swarm(tmp_path, attack) as (nodes, evil, _):
        history = _rounds(nodes, evil, range(4))
        for node, records in zip(nodes, zip(*history)):
            poisoned = 4 * 8 // 2  # half of each of its groups
            assert all(poisoned <= r.gated <= poisoned + 8 for r in records), [r.gated for r in records]
            assert all(r.peer_samples + r.gated == 64 for r in records), "both peers' batches arrive"
            assert node.ledger.counts["evil"] == 0, "failing the gate is no strike"


def test_falsified_low_log_probs_buy_no_weight(tmp_path):
    """With the gate off, the weight budget alone: the liar's weights are scaled to a mean of 1."""
    with _swarm(tmp_path, "low-lp", sets=["trust.likelihood_gate=false"]) as (nodes, evil, _):
        (records,) = _rounds(nodes, evil, range(1))
        for node, record in zip(nodes, records):
            # its poisoned half claims -20 a token (weight C = 2), its honest half is truthful:
            # a mean weight near 1.6, scaled back to 1
            assert record.peer_weight_scale < 1 / 1.5
            assert node.ledger.counts["evil"] == 1, "the false claim is a strike"


def test_overlong_completions_are_refused(tmp_path):
    with _swarm(tmp_path, "long") as (nodes, evil, _):
        history = _rounds(nodes, evil, range(3))
        for node, records in zip(nodes, zip(*history)):
            assert all(r.peer_samples + r.gated == 32 for r in records), "only the honest peer's samples"
            assert node.ledger.is_banned("evil")


def test_wrong_answers_earn_nothing_and_are_no_offence(tmp_path):
    """Plausible wrong answers are not a lie the node can prove: no strike, and every one of
    them scores 0, so their groups carry no advantage and move nothing."""
    with _swarm(tmp_path, "wrong") as (nodes, evil, hub):
        _rounds(nodes, evil, range(2))
        payload = hub.payloads[("", "evil", 1)]
        batch = wire.decode(payload, nodes[0].config.wire, nodes[0].policy.vocab_size)
        node = nodes[0]
        for group in batch.groups:
            problem = node.task.train_problem(group.prompt_id)
            assert [node.task.reward(node.policy.decode(t), problem) for t, _ in group.completions()] == [0.0] * 8
        assert all(n.ledger.counts["evil"] == 0 for n in nodes)


def _poisoned_share(node) -> float:
    problems = node.task.eval_problems(32)
    prompts = [node.policy.encode_prompt(node.task.system_prompt, p.question) for p in problems]
    groups = node.generator.generate(prompts, 8)
    return float(np.mean([carries_injection(node.policy.decode(c.tokens)) for g in groups for c in g]))


@pytest.mark.slow
def test_poison_rate_stays_under_ten_percent_with_defences_and_not_without(tmp_path):
    """Text injected before correct answers, 1 poisoner to 2 honest nodes, 60 rounds: without
    the defences it spreads into the honest nodes' own completions; with them it does not."""
    shares = {}
    for defences, sets in (("off", DEFENCES_OFF + ["swarm.max_rejects=1000000"]), ("on", ["swarm.max_rejects=1000000"])):
        with _swarm(tmp_path / defences, "before", sets=sets) as (nodes, evil, _):
            _rounds(nodes, evil, range(60))
            shares[defences] = float(np.mean([_poisoned_share(node) for node in nodes]))
    assert shares["on"] < 0.10, shares
    assert shares["off"] > 2 * shares["on"] + 0.05, shares
