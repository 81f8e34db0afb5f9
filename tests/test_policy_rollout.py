from dataclasses import replace

import numpy as np
import pytest
import torch

from swarmnode.learn.alignment import Spans
from swarmnode.learn.sample import Sample
from swarmnode.model.batching import OutOfMemory
from swarmnode.model.policy import Policy
from swarmnode.model.tiny import build_model
from swarmnode.protocol.wire import Completion
from swarmnode.rollout.hf import HFGenerator
from swarmnode.settings.config import LoraSettings, LossSettings, RolloutSettings, TrainSettings
from swarmnode.settings.models import resolve_model_name


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
            Sample.of(
                _prompts(policy, 1)[0],
                Completion(tokens, -np.ones(len(tokens), np.float32)),
                advantage=1.0 if i % 2 else -1.0,
                source="peer",
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
    assert policy.lora_rank == 4


def test_model_names_resolve():
    assert resolve_model_name("Qwen2.5-3B") == "Qwen/Qwen2.5-3B"
    assert resolve_model_name("Qwen/Qwen2.5-1.5B") == "Qwen/Qwen2.5-1.5B"
    assert resolve_model_name("tiny") == "tiny"


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_chunked_log_probs_equal_the_full_log_softmax_in_value_and_gradient(make_policy, lora_rank):
    """Chunks of 3 positions through the LM head inside checkpointing, against [B, T, V] at once."""
    rng = np.random.default_rng(0)
    vocab = make_policy().vocab_size
    prompts = [list(rng.integers(0, vocab, n)) for n in (5, 9, 3)]
    completions = [rng.integers(0, vocab, n) for n in (7, 2, 11)]
    results = []
    for chunk in (0, 3):
        policy = make_policy(lora_rank=lora_rank)
        policy.train_settings.logprob_chunk_tokens = chunk
        policy.model.train()
        logp, mask = policy.completion_logprobs(prompts, completions, temperature=0.7)
        (logp * torch.linspace(0.5, 2.0, logp.shape[1])).sum().backward()
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}
        results.append((logp.detach(), mask, grads))
    (full, full_mask, full_grads), (chunked, chunked_mask, chunked_grads) = results
    assert torch.equal(full_mask, chunked_mask)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)
    assert full_grads.keys() == chunked_grads.keys()
    for name in full_grads:
        torch.testing.assert_close(chunked_grads[name], full_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def _samples(policy, count=8, length=5):
    rng = np.random.default_rng(1)
    return [
        Sample.of([1, 2, 3], Completion(rng.integers(0, policy.vocab_size, length), np.full(length, -1.0)), float(a))
        for a in np.linspace(-1, 1, count)
    ]


def test_out_of_memory_in_the_step_halves_the_micro_batch_and_retries(make_policy, monkeypatch):
    policy = make_policy(micro_batch=8)
    real = policy.completion_logprobs
    calls = []

    def flaky(prompts, completions, temperature, model=None):
        calls.append(len(prompts))
        if len(prompts) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(prompts, completions, temperature, model)

    monkeypatch.setattr(policy, "completion_logprobs", flaky)
    result = policy.train_step(_samples(policy), LossSettings(), 1.0)
    assert calls[:3] == [8, 4, 2] and policy.micro_batch.value == 2  # kept for later steps
    assert policy.train_settings.micro_batch_size == 8, "the config still says what the user set"
    assert policy.micro_batch.take_halving() == {"train.micro_batch_size": 2} and policy.micro_batch.take_halving() == {}
    assert np.isfinite(result.loss) and result.stats.sequences == 8


def test_out_of_memory_at_micro_batch_one_says_what_to_change(make_policy, monkeypatch):
    policy = make_policy(micro_batch=2)

    def always(*args):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(policy, "completion_logprobs", always)
    with pytest.raises(OutOfMemory, match="micro-batch 1: use LoRA"):
        policy.train_step(_samples(policy), LossSettings(), 1.0)


def test_out_of_memory_in_generation_halves_the_batch(make_policy, monkeypatch):
    policy = make_policy()
    generator = HFGenerator(policy, RolloutSettings(max_new_tokens=3, batch_size=16))
    real = generator._sample

    def flaky(prompts, do_sample):
        if len(prompts) > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(prompts, do_sample)

    monkeypatch.setattr(generator, "_sample", flaky)
    groups = generator.generate([[1, 2], [3, 4, 5]], 6)
    assert [len(g) for g in groups] == [6, 6] and generator.batch.value == 4 and generator.settings.batch_size == 16


def test_the_bf16_inference_copy_matches_the_trainer_and_follows_its_steps(make_policy, tokenizer):
    """fp32 master weights under bf16 autocast: generation runs on a bf16 copy, whose log-probs
    agree with the trainer's forward pass, and which a sync brings up to date after a step."""
    torch.manual_seed(0)
    source = make_policy()
    policy = Policy(source.model, tokenizer, "t", TrainSettings(lr=1e-2), LoraSettings(), False,
                    compute_dtype=torch.bfloat16, seed=0)
    assert policy.autocast
    generator = HFGenerator(policy, RolloutSettings(max_new_tokens=6, batch_size=8))
    assert generator.copy is not None
    assert all(p.dtype == torch.bfloat16 for p in generator.copy.parameters())
    assert all(p.dtype == torch.float32 for p in policy.model.parameters()), "the trained weights stay fp32"
    embed, head = generator.copy.get_input_embeddings(), generator.copy.get_output_embeddings()
    assert (embed.weight is head.weight) == policy.model.config.tie_word_embeddings

    def agreement():
        completions = [c for g in generator.generate([[1, 2, 3], [4, 5]], 4) for c in g]
        prompts = [[1, 2, 3]] * 4 + [[4, 5]] * 4
        with torch.no_grad():
            logp, mask = policy.completion_logprobs(prompts, [c.tokens for c in completions], 1.0)
        reported = torch.zeros_like(logp)
        for row, c in enumerate(completions):
            reported[row, : len(c.logprobs)] = torch.from_numpy(c.logprobs)
        return float((logp - reported)[mask].abs().max())

    assert agreement() < 0.1  # bf16 rounding only
    policy.train_step(_samples(policy), LossSettings(), 1.0)
    stale = agreement()
    generator.sync_weights()
    fresh = agreement()
    assert fresh < 0.1 < stale, (fresh, stale)  # a step moved the trainer; the sync moved the copy
    for name, param in policy.model.named_parameters():
        assert torch.equal(dict(generator.copy.named_parameters())[name], param.detach().to(torch.bfloat16))


def test_out_of_memory_while_scoring_peers_halves_the_micro_batch(make_policy, monkeypatch):
    policy = make_policy(micro_batch=8)
    real = policy.completion_logprobs

    def flaky(prompts, completions, temperature, model=None):
        if len(prompts) > 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(prompts, completions, temperature, model)

    samples = _samples(policy)
    expected = policy.token_logprobs([s.prompt_ids for s in samples], [s.tokens for s in samples], 1.0)
    monkeypatch.setattr(policy, "completion_logprobs", flaky)
    scored = policy.token_logprobs([s.prompt_ids for s in samples], [s.tokens for s in samples], 1.0)
    assert policy.micro_batch.value == 2 and policy.train_settings.micro_batch_size == 8
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(scored, expected)) and len(scored) == 8


def test_sampling_follows_the_generators_own_seeded_stream(make_policy):
    """Same seed, same samples, whatever else drew random numbers in between; another seed,
    other samples; the process's global RNG is not moved by sampling."""
    policy = make_policy()
    settings = RolloutSettings(max_new_tokens=8)
    prompts = [[5, 6, 7], [8, 9]]

    def tokens(generator):
        return [c.tokens.tolist() for group in generator.generate(prompts, 4) for c in group]

    first, again, other = HFGenerator(policy, settings, 3), HFGenerator(policy, settings, 3), HFGenerator(policy, settings, 4)
    run_first = [tokens(first), tokens(first)]
    torch.rand(1000)  # another consumer of the global RNG
    state = torch.get_rng_state()
    assert [tokens(again), tokens(again)] == run_first
    assert torch.equal(torch.get_rng_state(), state)
    assert tokens(other) != run_first[0]
    assert run_first[0] != run_first[1], "the stream moves on between calls"


def test_a_seed_fixes_the_lora_adapters_and_leaves_torch_s_generator_alone(tokenizer):
    """peft draws new adapters from torch's global generator: without a seed of their own,
    two starts of one LoRA run trained from different adapters and a seed fixed nothing."""

    def adapters(seed: int, draws_before: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = build_model(tokenizer, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2)
        torch.rand(draws_before)  # whatever ran before in this process moved the generator
        state = torch.get_rng_state()
        policy = Policy(model, tokenizer, "t", TrainSettings(), LoraSettings(rank=4), False, seed=seed)
        assert torch.equal(torch.get_rng_state(), state), "the global generator is where it was"
        return {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_A" in n}

    first, again, other = adapters(7, draws_before=1), adapters(7, draws_before=50), adapters(8, draws_before=1)
    assert first and all(torch.equal(first[n], again[n]) for n in first)
    assert not all(torch.equal(first[n], other[n]) for n in first)


def test_a_step_on_samples_by_span_is_the_token_level_step_when_each_span_is_a_token(make_policy):
    """The training step takes samples whose generator's log-probs are per span (a peer of another
    tokenizer): with one token a span it is the same update, bit for bit; with coarser spans
    (here two tokens each) it trains, with the span's weight on each of its tokens."""
    results = []
    for spans in ("none", "token", "pairs"):
        policy = make_policy(micro_batch=4)
        samples = _samples(policy)
        if spans != "none":
            samples = [
                replace(s, logprobs=None, spans=Spans.token_level(s.logprobs) if spans == "token" else Spans(
                    np.arange(len(s.tokens)) // 2, np.full((len(s.tokens) + 1) // 2, -2.0, np.float32)
                ))
                for s in samples
            ]
        result = policy.train_step(samples, LossSettings(objective="f-tis"), 1.0)
        results.append((result, torch.cat([p.detach().flatten() for p in policy.model.parameters()])))
    (plain, plain_weights), (token, token_weights), (pairs, pairs_weights) = results
    assert torch.equal(plain_weights, token_weights) and plain.loss == token.loss
    assert np.isfinite(pairs.loss) and not torch.equal(plain_weights, pairs_weights)


def test_the_kept_reference_does_not_move_with_training(make_policy):
    """Full fine-tuning in the weights' own dtype (fp32 on CPU): the reference the anchored
    gate judges by must stay the starting weights while the model trains. It once shared the
    trained parameters' storage, so the anchor moved with every step."""
    policy = make_policy(hidden=64, layers=1)
    policy.keep_reference()
    prompts = _prompts(policy)
    completions = [np.array([5, 6, 7], dtype=np.int32)] * len(prompts)
    before = policy.reference_logprobs(prompts, completions, 1.0)
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(torch.randn_like(param) * 0.1)  # what an optimiser step does: in place
    after = policy.reference_logprobs(prompts, completions, 1.0)
    moved = policy.token_logprobs(prompts, completions, 1.0)
    for b, a, m in zip(before, after, moved):
        np.testing.assert_array_equal(a, b)
        assert not np.allclose(m, b)
