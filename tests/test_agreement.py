"""Gradient agreement (swarmnode/learn/agreement.py, swarmnode/screening/agreement.py): measured
by source in the step without changing the update, and turned into a factor that only shrinks."""

import dataclasses

import numpy as np
import pytest
import torch

from swarmnode.learn.agreement import GradientProbe, StepAgreement, cosine, probe_parameters
from swarmnode.learn.sample import Sample
from swarmnode.protocol.wire import Completion
from swarmnode.screening.agreement import FLOOR, MEASURED_ROUNDS, RUNNING_WEIGHT, AgreementWeights
from swarmnode.settings.config import LossSettings


def _own_and_peers(policy, n: int = 8) -> list[Sample]:
    """n of our samples; a "copy" sending the same completions; a "contrary" sending them with
    the opposite advantage."""
    rng = np.random.default_rng(0)
    prompt = policy.encode_prompt("", "What is 3+4?")
    own = []
    for i in range(n):
        tokens = rng.integers(3, 200, size=4 + i % 3).astype(np.int32)
        with torch.no_grad():
            logp, _ = policy.completion_logprobs([prompt], [tokens], 1.0)
        completion = Completion(tokens, logp[0, : len(tokens)].float().numpy())
        own.append(Sample.of(prompt, completion, advantage=1.0 if i % 2 else -1.0))
    copy = [dataclasses.replace(s, source="copy") for s in own]
    contrary = [dataclasses.replace(s, source="contrary", advantage=-s.advantage) for s in own]
    return own + copy + contrary


def _weights(policy) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in policy.model.parameters()])


def test_measuring_agreement_leaves_the_update_as_it_was(make_policy):
    updates = []
    for measure in (False, True):
        policy = make_policy(micro_batch=3)
        result = policy.train_step(_own_and_peers(policy), LossSettings(objective="f-tis"), 1.0, measure)
        updates.append(_weights(policy))
        assert (result.agreement is not None) is measure
    assert torch.allclose(updates[0], updates[1], atol=1e-6)


def test_a_copy_agrees_and_samples_that_pull_the_other_way_disagree(make_policy):
    policy = make_policy()
    found = policy.train_step(_own_and_peers(policy), LossSettings(objective="f-tis"), 1.0, True).agreement
    assert set(found.peers) == {"copy", "contrary"}
    assert found.peers["copy"] == pytest.approx(1.0, abs=1e-4), "the same samples: the same gradient"
    assert found.peers["contrary"] == pytest.approx(-1.0, abs=1e-4)
    assert found.own_halves is not None and -1 <= found.own_halves <= 1


def test_the_probe_takes_the_last_parameters_within_its_size_and_each_take_is_the_new_gradient():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (5, 3, 4)]
    assert probe_parameters(params, limit=7) == [params[2], params[1]]
    assert probe_parameters(params, limit=1) == [params[2]], "at least one"
    probe = GradientProbe(params)
    params[0].grad = torch.ones(5)
    assert probe.take().tolist() == [1.0] * 5 + [0.0] * 7
    params[0].grad = torch.full((5,), 3.0)
    assert probe.take().tolist() == [2.0] * 5 + [0.0] * 7
    assert cosine(torch.zeros(3), torch.ones(3)) is None


def test_a_peer_counts_its_agreement_over_our_halves_between_the_floor_and_one():
    weights = AgreementWeights(enabled=True)
    assert weights.factor("new") == 1.0, "not yet measured: as with the weighting off"
    for _ in range(MEASURED_ROUNDS - 1):
        weights.observe(StepAgreement(own_halves=0.2, peers={"near": 0.3, "half": 0.1, "far": -0.2}))
    assert weights.factor("far") == 1.0, "measured too few times to hold it to anything"
    weights.observe(StepAgreement(own_halves=0.2, peers={"near": 0.3, "half": 0.1, "far": -0.2}))
    assert weights.factor("near") == 1.0 and weights.factor("half") == pytest.approx(0.5)
    assert weights.factor("far") == FLOOR
    weights.observe(StepAgreement(own_halves=0.2, peers={"half": 0.3}))  # a running mean, not the last step
    assert weights.factor("half") == pytest.approx((0.1 + RUNNING_WEIGHT * 0.2) / 0.2)
    off = AgreementWeights(enabled=False)
    for _ in range(MEASURED_ROUNDS):
        off.observe(StepAgreement(own_halves=0.2, peers={"far": -0.2}))
    assert off.factor("far") == 1.0


def test_without_a_yardstick_every_peer_counts_fully():
    weights = AgreementWeights(enabled=True)
    for _ in range(MEASURED_ROUNDS):
        weights.observe(StepAgreement(own_halves=-0.1, peers={"far": -0.5}))
    assert weights.factor("far") == 1.0, "our own halves disagree: nothing to hold a peer to"
