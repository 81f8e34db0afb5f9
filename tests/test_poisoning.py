"""Content attacks (swarmnode/lab/poison.py) against honest tiny nodes, in one process.

The tiny preset (warmed up, so its completions are the answer block alone) is what makes the
likelihood gate meaningful: random-weight models find every text about equally likely.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from swarmnode.assemble import assemble
from swarmnode.lab.poison import DEFENCES_OFF, carries_injection, poisoning_link, switched_family
from swarmnode.loop.pool import PROBATION_EVERY
from swarmnode.model.policy import Policy
from swarmnode.protocol import wire
from swarmnode.protocol.prompts import build_prompt
from swarmnode.settings.config import load_config
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
            "node.max_peer_groups=8",  # both peers' whole batches on top of our own
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
def _swarm(tmp_path, attack, honest=("h1", "h2"), sets=(), switch_family=False):
    """Honest tiny nodes and one poisoning peer on an in-memory hub (naming a tokenizer of its
    own with `switch_family`)."""
    hub = InMemoryHub()
    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(assemble(_config(tmp_path, name, *sets), join=lambda run, standing, n=name: hub.join(n, run, standing)))
            for name in honest
        ]
        config = _config(tmp_path, "evil", *sets)
        policy = Policy.load(config.model, config.train, seed=config.node.seed)
        family = switched_family(policy) if switch_family else None
        evil = stack.enter_context(assemble(config, policy=policy, join=lambda run, standing: poisoning_link(
            hub.join("evil", run, standing), attack, config, nodes[0].task, policy, family,
        )))
        yield nodes, evil, hub


def _rounds(nodes, evil, rounds):
    """Step every node through `rounds`; the honest nodes' records, per round."""
    history = []
    for round_ in rounds:
        states = [node.produce(round_) for node in nodes]
        evil.produce(round_)
        history.append([node.consume(round_, state) for node, state in zip(nodes, states)])
    return history


def _spy_on_steps(node) -> list:
    """Every sample the node trains on, step after step."""
    trained = []
    step = node.policy.train_step

    def recording(samples, *args, **kwargs):
        trained.extend(samples)
        return step(samples, *args, **kwargs)

    node.policy.train_step = recording
    return trained


@pytest.mark.parametrize("attack", ["before", "after", "high-lp"])
def test_injected_text_is_never_trained_on_with_a_positive_advantage(tmp_path, attack):
    """The gate drops unlikely samples with a positive advantage: every poisoned sample that
    would raise its text's likelihood is gated; one that scores below its group (text after
    the answer fails the strict format) is kept, and pushes its text down. The poisoner writes
    its text four times a group, which the repeat check would find first (below): off here, so
    the gate is what is tested."""
    with _swarm(tmp_path, attack, sets=["trust.repeat_odds=0"]) as (nodes, evil, _):
        trained = [_spy_on_steps(node) for node in nodes]
        history = _rounds(nodes, evil, range(4))
        for node, records, samples in zip(nodes, zip(*history), trained):
            injected = [s for s in samples if s.source and carries_injection(node.policy.decode(s.tokens))]
            assert all(s.advantage <= 0 for s in injected), [s.advantage for s in injected]
            assert all(r.peer_samples + r.gated == 64 for r in records), "both peers' batches arrive"
            # gated: under a bar with a positive advantage, or a wrong answer of a group whose right ones were
            assert all(r.gated <= r.below_bar + 32 for r in records)
            assert node.ledger.counts["evil"] == 0, "failing the gate is no strike"
            if attack == "after":  # reward 0: kept, with a negative advantage, in some group
                assert any(s.advantage < 0 for s in injected)
            else:  # reward 1: all but groups the attacker answered right throughout are gated
                assert sum(r.gated for r in records) >= 4 * 4 * 4 // 2, [r.gated for r in records]


def test_poison_written_four_times_a_group_is_found_picked_and_never_trained_on(tmp_path):
    """At the defaults: the poisoner's groups repeat one written completion four times, claimed
    (by its own model) far less likely than that; within a few rounds its groups are left out
    whole, its standing is 0, and nothing it sent trains; no strike. Its first batch is
    evidence enough, before any of its groups is screened; after that its groups are screened
    only on probation (round 0 here, then every PROBATION_EVERY-th round), and left out."""
    with _swarm(tmp_path, "before") as (nodes, evil, _):
        history = _rounds(nodes, evil, range(PROBATION_EVERY))
        for node, records in zip(nodes, zip(*history)):
            assert node.ledger.standing("evil") == 0.0 and node.ledger.counts["evil"] == 0
            assert all("evil" not in r.samples_by_peer for r in records)
            assert records[0].picked == 8 and all(r.picked == 0 for r in records[1:]), [r.picked for r in records]
            assert all(r.peer_samples == 32 for r in records), "the honest peer's whole batch"


def test_falsified_low_log_probs_buy_no_weight(tmp_path):
    """With the gate off, the weight budget alone: the liar's weights are scaled to a mean of 1.
    (Its written groups would be found picked before they are screened: the check is off.)"""
    with _swarm(tmp_path, "low-lp", sets=["trust.likelihood_gate=false", "trust.repeat_odds=0"]) as (nodes, evil, _):
        (records,) = _rounds(nodes, evil, range(1))
        for node, record in zip(nodes, records):
            # its poisoned half claims -20 a token (weight C = 2), its honest half is truthful:
            # a mean weight near 1.6, scaled back to 1
            assert record.peer_weight_scale < 1 / 1.5
            assert node.ledger.counts["evil"] == 1, "the false claim is a strike"


def test_a_liar_that_names_another_family_is_held_to_the_budget_by_span_not_struck(tmp_path):
    """The family switcher: the same lie under a tokenizer of its own (ours, one token added).
    The node fetches that document, reads the batch by span, and holds the claimed weights to
    the budget; a high weight by span proves no lie, so there is no strike (docs/security.md)."""
    sets = ["trust.likelihood_gate=false", "trust.repeat_odds=0"]
    with _swarm(tmp_path, "low-lp", sets=sets, switch_family=True) as (nodes, evil, _):
        history = _rounds(nodes, evil, range(3))
        for node, records in zip(nodes, zip(*history)):
            assert records[0].peer_samples == 32, "round 0: the other family's batch waits for its document"
            assert all("evil" in r.samples_by_peer for r in records[1:]), "read by span once the document is here"
            assert all(r.peer_weight_scale < 1 / 1.5 for r in records[1:])
            assert node.ledger.counts["evil"] == 0 and not node.ledger.is_banned("evil")


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
        payload = hub.payloads[(evil.run_id, "evil", 1)]
        batch = wire.decode(payload, nodes[0].config.wire, nodes[0].policy.vocab_size)
        node = nodes[0]
        for group in batch.groups:
            problem = node.task.train_problem(group.prompt_id)
            assert [node.task.reward(node.policy.decode(c.tokens), problem) for c in group.completions()] == [0.0] * 8
        assert all(n.ledger.counts["evil"] == 0 for n in nodes)


def _poisoned_share(node) -> float:
    problems = node.task.eval_problems(32)
    prompts = [build_prompt(node.task, p, node.policy) for p in problems]
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


def test_a_sender_does_not_choose_which_of_its_groups_are_taken_first(tmp_path):
    """A node holds a peer's groups in an order of its own, so a sender that puts its written
    groups first and pads with sampled ones after cannot have the written ones taken first
    (while the padding holds its evidence of picking down)."""
    with _swarm(tmp_path, "before", sets=["trust.repeat_odds=0"]) as (nodes, evil, hub):
        h1, h2 = nodes
        differs = 0
        for round_ in range(4):
            h2.produce(round_)
            h1.intake.pool._held.pop("h2", None)
            h1.intake.collect(round_, 0.0, {})
            (payload,) = [p for (_, peer, r), p in hub.payloads.items() if peer == "h2" and r == round_]
            sent = [g.prompt_id for g in wire.decode(payload).groups]
            held = [g.prompt_id for g in h1.intake.pool._held["h2"]]
            assert sorted(held) == sorted(sent)
            differs += held != sent
        assert differs >= 3, "one in 24 orders of four groups is the sender's"
