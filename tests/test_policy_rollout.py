import numpy as np
import pytest
import torch

from swarmnode.config import LossSettings, RolloutSettings
from swarmnode.policy import TrainSample
from swarmnode.rollout.hf import HFGenerator
from swarmnode.shapes import resolve_model_name


def _prompts(policy, n=3):
    return [policy.encode_prompt("", q) for q in ["12+34=", "99-7=", "5+5="][:n]]


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 0), (1.0, 20)])
def test_generation_logprobs_match_a_separate_forward_pass(make_policy, temperature, top_k):
    policy = make_policy(hidden=64, layers=2)
    gen = HFGenerator(policy, RolloutSettings(max_new_tokens=12, temperature=temperature, top_k=top_k))
    torch.manual_seed(0)
    prompts = _prompts(policy)
    groups = gen.generate(prompts, group_size=4)
    assert [len(g) for g in groups] == [4, 4, 4]
    flat_prompts = [p for p in prompts for _ in range(4)]
    flat = [c for g in groups for c in g]
    with torch.no_grad():
        logp, mask = policy.completion_logprobs(flat_prompts, [c.tokens for c in flat], temperature)
    for row, c in enumerate(flat):
        assert 1 <= len(c.tokens) <= 12
        reference = logp[row, : len(c.tokens)].numpy()
        if top_k:  # truncation renormalises over the top k: generation log-probs are higher
            assert np.all(c.logprobs >= reference - 1e-4)
        else:
            np.testing.assert_allclose(c.logprobs, reference, atol=2e-4)
        if c.finished:
            assert c.tokens[-1] == policy.tokenizer.eos_token_id
            assert np.count_nonzero(c.tokens == policy.tokenizer.eos_token_id) == 1


def test_eos_keeps_its_logprob_when_pad_equals_eos(make_policy):
    policy = make_policy()
    assert policy.tokenizer.pad_token_id == policy.tokenizer.eos_token_id
    eos = policy.tokenizer.eos_token_id
    prompt = _prompts(policy, 1)
    with torch.no_grad():
        logp, mask = policy.completion_logprobs(prompt * 2, [np.array([5, eos]), np.array([5])], 1.0)
    assert mask.tolist() == [[True, True], [True, False]]
    assert logp[0, 1] < 0  # the EOS token has a real log-prob, not a masked zero


def _samples(policy, n=6):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        tokens = rng.integers(3, 200, size=4 + i % 3).astype(np.int32)
        out.append(
            TrainSample(
                _prompts(policy, 1)[0],
                tokens,
                -np.ones(len(tokens), np.float32),
                advantage=1.0 if i % 2 else -1.0,
                own=False,
            )
        )
    return out


def test_micro_batching_gives_the_same_update(make_policy):
    results = []
    for micro in (64, 2):
        policy = make_policy(micro_batch=micro)
        policy.train_step(_samples(policy), LossSettings(objective="f-tis"), 1.0)
        results.append(torch.cat([p.detach().flatten() for p in policy.model.parameters()]))
    assert torch.allclose(results[0], results[1], atol=1e-6)


def test_lora_trains_only_the_adapter(make_policy):
    policy = make_policy(lora_rank=4)
    frozen = {n: p.detach().clone() for n, p in policy.model.named_parameters() if not p.requires_grad}
    trainable = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora" in n for n in trainable)
    for _ in range(2):
        policy.train_step(_samples(policy), LossSettings(), 1.0)
    after = dict(policy.model.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in frozen.items())
    assert any(not torch.equal(after[n], v) for n, v in trainable.items())
    assert policy.info.lora_rank == 4


def test_model_names_resolve():
    assert resolve_model_name("Qwen2.5-3B") == "Qwen/Qwen2.5-3B"
    assert resolve_model_name("Qwen/Qwen2.5-1.5B") == "Qwen/Qwen2.5-1.5B"
    assert resolve_model_name("tiny") == "tiny"
