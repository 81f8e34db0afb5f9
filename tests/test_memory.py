"""Start-up memory estimate: exact parameter counts, refusals with a suggestion, fp32 master weights."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from swarmnode.learn.sample import Sample
from swarmnode.model.policy import Policy
from swarmnode.model.tiny import build_model
from swarmnode.protocol.wire import Completion
from swarmnode.settings.config import Config, LoraSettings, TrainSettings, load_config
from swarmnode.sizing.memory import GIB, estimate, suggest_configs
from swarmnode.sizing.shapes import KNOWN_SHAPES, ModelShape

CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[1] / "configs"


def test_known_shapes_match_the_published_parameter_counts():
    # Qwen2.5 model cards: 1.54 B, 3.09 B and 7.61 B parameters.
    assert KNOWN_SHAPES["Qwen/Qwen2.5-1.5B"].num_params / 1e9 == pytest.approx(1.54, abs=0.01)
    assert KNOWN_SHAPES["Qwen/Qwen2.5-3B"].num_params / 1e9 == pytest.approx(3.09, abs=0.01)
    assert KNOWN_SHAPES["Qwen/Qwen2.5-7B"].num_params / 1e9 == pytest.approx(7.61, abs=0.01)


def test_shape_counts_equal_a_real_model_and_peft(tokenizer):
    model = build_model(tokenizer, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2)
    c = model.config
    shape = ModelShape(c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
                       c.num_key_value_heads, c.vocab_size, c.tie_word_embeddings)
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    targets = ["q_proj", "v_proj", "down_proj"]
    policy = Policy(model, tokenizer, "t", TrainSettings(), LoraSettings(rank=4, target_modules=targets), False, seed=0)
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    assert shape.lora_params(4, targets) == trainable


def test_full_3b_does_not_fit_24gb_and_the_suggestions_do():
    config = load_config(CONFIGS / "qwen2.5-3b.yaml")
    est = estimate(config, KNOWN_SHAPES["Qwen/Qwen2.5-3B"], 24 * GIB, True, "vllm")
    assert not est.fits and est.total > 40 * GIB
    fitting = suggest_configs(CONFIGS, 24 * GIB, True, "vllm")
    assert fitting and fitting[0][0].name == "qwen2.5-3b-lora-24gb.yaml"
    assert all(gib < 24 for _, gib in fitting)
    assert "qwen2.5-3b.yaml" not in {p.name for p, _ in fitting}


def test_checkpointing_and_lora_shrink_the_estimate():
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-3B"]
    base = Config.model_validate({"rollout": {"max_new_tokens": 512}, "train": {"micro_batch_size": 4}})
    full = estimate(base, shape, 80 * GIB, True, "hf").total
    ckpt = base.model_copy(deep=True)
    ckpt.train.gradient_checkpointing = True
    lora = ckpt.model_copy(deep=True)
    lora.model.lora.rank = 128
    assert estimate(lora, shape, 80 * GIB, True, "hf").total < estimate(ckpt, shape, 80 * GIB, True, "hf").total < full


def test_join_on_cpu_refuses_a_model_that_cannot_fit_and_points_to_the_planner(tmp_path):
    """A 7B-shaped model (config.json only) trained fully on CPU would need > 100 GiB of RAM;
    GPU configs are no advice for a CPU, `swarmnode plan` is."""
    model_dir = tmp_path / "seven-b"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
    }))
    done = subprocess.run(
        [sys.executable, "-m", "swarmnode", "join", "--solo", "--model", str(model_dir), "--device", "cpu",
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, env={"COLUMNS": "200", **__import__("os").environ},
    )
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, out
    assert "needs about" in out and "memory_check=false" in out
    assert "meant for a GPU" in out and f"swarmnode plan --model {model_dir}" in out and "24gb" not in out
    assert not (tmp_path / "run" / "checkpoint").exists()


def _one_step(policy: Policy, tokenizer) -> float:
    """Fraction of trained weights that moved after one step at the paper's lr 1e-6."""
    before = [p.detach().float().clone() for p in policy.model.parameters()]
    prompt = tokenizer("12+34=")["input_ids"]
    rng = np.random.default_rng(0)
    samples = [
        Sample.of(prompt, Completion(rng.integers(5, 200, 8).astype(np.int32), np.full(8, -3.0, np.float32)), adv)
        for adv in (1.0, -1.0, 0.5, -0.5)
    ]
    policy.train_step(samples, Config().loss, 1.0)
    moved = [(p.detach().float() != b).float().mean().item() for p, b in zip(policy.model.parameters(), before)]
    return float(np.mean(moved))


def test_bf16_training_keeps_fp32_master_weights_so_small_updates_survive(tokenizer):
    def policy(weights: torch.dtype, compute: torch.dtype) -> Policy:
        torch.manual_seed(0)
        model = build_model(tokenizer, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2).to(weights)
        return Policy(model, tokenizer, "t", TrainSettings(lr=1e-6), LoraSettings(), False, compute_dtype=compute, seed=0)

    mixed = policy(torch.float32, torch.bfloat16)
    assert mixed.autocast
    pure = policy(torch.bfloat16, torch.bfloat16)
    moved_mixed, moved_pure = _one_step(mixed, tokenizer), _one_step(pure, tokenizer)
    assert moved_mixed > 0.5
    assert moved_pure < 0.5 * moved_mixed  # bf16 rounds most lr-1e-6 updates away
