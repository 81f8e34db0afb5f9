"""The memory planner and `swarmnode plan`: decisions across shapes and cards, user settings
kept, the estimate calibrated to measured peaks, model-aware defaults. No GPU needed."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from swarmnode.cli import app
from swarmnode.settings.config import load_config
from swarmnode.sizing.devices import NVIDIA_DRIVER_FILES
from swarmnode.sizing.memory import (
    CALIBRATION_CAPACITY_GIB,
    CALIBRATION_PEAKS_GIB,
    CALIBRATION_SETTINGS,
    GIB,
    estimate,
)
from swarmnode.sizing.plan import MARGIN, explain, make_plan, nearest_plan
from swarmnode.sizing.shapes import KNOWN_SHAPES, shape_of

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
runner = CliRunner()


def _plan(model: str, gib: float, *sets: str, backend: str = "hf"):
    config = load_config(None, [f"model.name={model}", *sets])
    return make_plan(config, shape_of(config.model.name), gib * GIB, backend)


@pytest.mark.parametrize(
    "model,gib,lora,checkpointing",
    [
        ("Qwen2.5-3B", 24, True, True),  # the volunteer's case: LoRA with checkpointing
        ("Qwen2.5-1.5B", 80, False, False),  # room for full fine-tuning without checkpointing
        ("Qwen2.5-3B", 80, False, True),  # full only with checkpointing
        ("Qwen2.5-7B", 80, True, False),  # 7B full needs fp32 master weights + AdamW: LoRA
        ("Qwen2.5-0.5B", 24, False, False),
    ],
)
def test_planner_decisions(model, gib, lora, checkpointing):
    plan = _plan(model, gib)
    assert plan.fits
    assert bool(plan.config.model.lora.rank) == lora
    assert plan.config.train.gradient_checkpointing == checkpointing
    assert plan.estimate.total <= (1 - MARGIN) * gib * GIB


def test_hf_generation_is_chunked_when_a_whole_round_does_not_fit_and_training_gives_way_first():
    """3B full fine-tuning on 80 GB: the paper's round (12 x 12 sequences) at once fits no full
    rung, so generation goes in chunks rather than dropping to LoRA; and no rung of the chosen
    mode fits a larger chunk (the training settings shrank before generation did)."""
    plan = _plan("Qwen2.5-3B", 80)
    sequences = plan.config.rollout.prompts_per_round * plan.config.rollout.group_size
    chunk = plan.config.rollout.batch_size
    assert plan.fits and not plan.config.model.lora.rank
    assert plan.config.rollout.group_size <= chunk < sequences
    assert any(f"chunks of {chunk}" in reason for reason in plan.reasons)
    config = load_config(None, ["model.name=Qwen2.5-3B"])
    for micro_batch in (1, 2, 4, 8):
        larger = load_config(None, [
            "model.name=Qwen2.5-3B", "train.gradient_checkpointing=true", f"train.micro_batch_size={micro_batch}",
            f"rollout.batch_size={min(sequences, 2 * chunk)}",
        ])
        assert estimate(larger, shape_of(config.model.name), 80 * GIB, True, "hf").total > (1 - MARGIN) * 80 * GIB
    roomy = _plan("Qwen2.5-1.5B", 80)
    assert roomy.config.rollout.batch_size == sequences and not any("chunks" in r for r in roomy.reasons)
    given = _plan("Qwen2.5-3B", 80, "rollout.batch_size=144")
    assert given.config.rollout.batch_size == 144, "a given generation batch is kept"
    assert given.fits and given.rung.lora, "so full fine-tuning no longer fits: LoRA"
    vllm = _plan("Qwen2.5-3B", 80, backend="vllm")
    assert "rollout.batch_size" not in vllm.settings


@pytest.mark.parametrize("name", sorted({n for n in KNOWN_SHAPES if n.count("-") == 1}))
@pytest.mark.parametrize("gib", [24, 48, 80])
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_every_known_shape_gets_a_plan_or_a_reason(name, gib, backend):
    config = load_config(None, [f"model.name={name}"])
    plan, text = explain(config, shape_of(name), gib * GIB, backend)
    if plan.fits:
        assert plan.estimate.total <= (1 - MARGIN) * gib * GIB and not plan.estimate.problems
        assert "estimate" in text
    else:
        assert "does not fit" in text and ("nearest plan" in text or "no plan fits" in text)


def test_the_plan_moves_with_the_card():
    """More memory never gives a less capable plan."""
    for name in ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-7B"):
        ranks = []
        for gib in (16, 24, 48, 80, 141):
            plan = _plan(name, gib)
            ranks.append(-1 if not plan.fits else (0 if plan.config.model.lora.rank else 1))
        assert ranks == sorted(ranks), (name, ranks)


def test_settings_the_user_gave_are_kept():
    plan = _plan("Qwen2.5-3B", 24, "train.micro_batch_size=2", "train.lr=3e-5")
    assert plan.fits and plan.config.train.micro_batch_size == 2 and plan.config.train.lr == 3e-5
    assert "train.micro_batch_size" not in plan.settings
    lora64 = _plan("Qwen2.5-3B", 24, "model.lora.rank=64", "model.lora.target_modules=[q_proj,k_proj,v_proj]")
    assert lora64.config.model.lora.rank == 64
    assert lora64.config.model.lora.target_modules == ["q_proj", "k_proj", "v_proj"]


def test_settings_that_cannot_fit_are_refused_with_the_nearest_plan():
    config = load_config(None, ["model.name=Qwen2.5-3B", "model.lora.rank=0"])  # full fine-tuning asked for
    plan, text = explain(config, shape_of(config.model.name), 24 * GIB, "hf")
    assert not plan.fits
    assert "does not fit a 24.0 GiB GPU" in text and "full fine-tuning needs at least" in text
    nearest = nearest_plan(config, shape_of(config.model.name), 24 * GIB, "hf")
    assert nearest.fits and nearest.config.model.lora.rank == 128
    assert "the nearest plan that fits" in text and "LoRA r=128" in text


@pytest.mark.parametrize("config_name,measured_gib", sorted(CALIBRATION_PEAKS_GIB.items()))
def test_the_estimate_is_an_upper_bound_within_15_percent_of_measured_peaks(config_name, measured_gib):
    # nvidia-smi process peak on an H100 (docs/gpu.md), HF backend, random weights, on the path
    # those peaks were measured on (log-probs unchunked, generation from the trainer)
    config = load_config(CONFIGS / config_name, CALIBRATION_SETTINGS)
    total = estimate(config, shape_of(config.model.name), CALIBRATION_CAPACITY_GIB * GIB, True, "hf").total / GIB
    assert measured_gib <= total <= 1.15 * measured_gib, total


def test_chunked_log_probs_lower_the_estimate():
    config = load_config(CONFIGS / "qwen2.5-3b-lora.yaml")
    shape = shape_of(config.model.name)
    chunked = estimate(config, shape, 80 * GIB, True, "hf").parts["logits (micro-batch)"]
    config.train.logprob_chunk_tokens = 0
    whole = estimate(config, shape, 80 * GIB, True, "hf").parts["logits (micro-batch)"]
    assert chunked < 0.6 * whole


def test_a_real_model_starts_from_the_paper_setup_and_tiny_stays_the_cpu_default():
    config = load_config(None, ["model.name=Qwen2.5-3B"])
    assert (config.task.name, config.rollout.group_size, config.rollout.prompts_per_round) == ("gsm8k", 12, 12)
    assert (config.task.answer_format, config.task.grader) == ("think_answer", "math-verify"), "the paper's task"
    assert (config.rollout.max_new_tokens, config.loss.trunc_c, config.loss.filter_g, config.train.lr) == (512, 2.0, 50.0, 1e-6)
    assert config.train.adam_betas == (0.9, 0.999)
    assert config.given == {"model.name"}
    mine = load_config(None, ["model.name=Qwen2.5-3B", "rollout.max_new_tokens=256"], {"task.name": "arithmetic"})
    assert mine.rollout.max_new_tokens == 256 and mine.task.name == "arithmetic"
    assert mine.given == {"model.name", "rollout.max_new_tokens", "task.name"}
    tiny = load_config(None, [])
    assert (tiny.task.name, tiny.rollout.max_new_tokens, tiny.train.lr) == ("arithmetic", 10, 1e-4), "the tiny preset"
    from_file = load_config(CONFIGS / "tiny-cpu.yaml")
    assert "rollout.group_size" in from_file.given


def test_plan_command():
    result = runner.invoke(app, ["plan", "--model", "Qwen2.5-3B", "--gpu-gib", "24", "--backend", "hf"])
    assert result.exit_code == 0, result.output
    assert "LoRA r=128" in result.output and "checkpointing   on" in result.output
    two = runner.invoke(app, ["plan", "--model", "Qwen2.5-1.5B", "--backend", "vllm", "--gpu-gib", "24", "--gpu-gib", "80"])
    assert two.exit_code == 0 and two.output.count("plan for") == 2
    every = runner.invoke(app, ["plan", "--gpu-gib", "48", "--backend", "hf"])  # no --model: each Qwen2.5 size
    assert every.exit_code == 0 and every.output.count("plan for") == 4 and "Qwen/Qwen2.5-7B" in every.output
    auto = runner.invoke(app, ["plan", "--model", "Qwen2.5-3B", "--gpu-gib", "24"])  # says which backend it assumed
    assert auto.exit_code == 0 and "generation: hf (auto: vLLM is not installed" in auto.output
    assert "(auto:" not in result.output, "a backend given is not explained"


def test_plan_command_errors():
    unknown = runner.invoke(app, ["plan", "--model", "/nonexistent/model", "--gpu-gib", "24"])
    assert unknown.exit_code == 2 and "no model directory at /nonexistent/model" in unknown.output
    bad_backend = runner.invoke(app, ["plan", "--model", "Qwen2.5-3B", "--backend", "tgi"])
    assert bad_backend.exit_code == 2 and "choose hf, vllm or auto" in bad_backend.output
    no_card = runner.invoke(app, ["plan", "--model", "Qwen2.5-3B", "--gpu-gib", "0"])
    assert no_card.exit_code == 2 and "positive number" in no_card.output
    bad_set = runner.invoke(app, ["plan", "--model", "Qwen2.5-3B", "--set", "train.micro_batch_size=0"])
    assert bad_set.exit_code == 2 and "train.micro_batch_size" in bad_set.output
    too_big = runner.invoke(app, ["plan", "--model", "Qwen2.5-7B", "--gpu-gib", "24", "--set", "model.lora.rank=0"])
    assert too_big.exit_code == 1 and "nearest plan that fits" in too_big.output
    assert "with the settings given (model.lora.rank)" in too_big.output
    nothing_given = runner.invoke(app, ["plan", "--model", "Qwen2.5-7B", "--gpu-gib", "24", "--backend", "vllm"])
    assert nothing_given.exit_code == 1 and "settings given" not in nothing_given.output, "none were given"


def test_the_printed_settings_paste_into_a_shell():
    """A list value (`[q_proj,v_proj]`) is a glob in bash and an error in zsh unless quoted."""
    result = runner.invoke(app, ["plan", "--model", "Qwen2.5-3B", "--gpu-gib", "24", "--backend", "hf"])
    line = next(text for text in result.output.splitlines() if "as settings:" in text)
    words = shlex.split(line.split("as settings:", 1)[1])
    assert words[0] == "--set" and "model.lora.target_modules=[q_proj,v_proj]" in words
    assert "'model.lora.target_modules=[q_proj,v_proj]'" in line


@pytest.mark.slow
def test_gpu_round_bench_prints_plans_on_cpu_and_its_measuring_code_runs():
    root = Path(__file__).resolve().parents[1]
    plans = subprocess.run([sys.executable, str(root / "bench/gpu_round.py"), "--shapes", "Qwen/Qwen2.5-3B"],
                           capture_output=True, text=True, timeout=300)
    assert plans.returncode == 0, plans.stderr
    assert "no CUDA here" in plans.stdout and plans.stdout.count("plan for Qwen/Qwen2.5-3B") == 3
    smoke = subprocess.run([sys.executable, str(root / "bench/gpu_round.py"), "--smoke", "--rounds", "2"],
                           capture_output=True, text=True, timeout=300)
    assert smoke.returncode == 0, smoke.stderr
    row = next(line for line in smoke.stdout.splitlines() if line.startswith("smoke"))
    assert len(row.split()) >= 12 and "out of memory" not in row


@pytest.mark.skipif(any(p.exists() for p in NVIDIA_DRIVER_FILES), reason="a GPU machine: planning asks torch for the card")
def test_planning_the_built_in_shapes_imports_no_torch_on_a_machine_without_a_gpu():
    """`swarmnode plan` answers at once where there is no GPU: no torch, transformers, peft or vLLM."""
    code = ("import sys; from swarmnode.settings.config import load_config; from swarmnode.sizing.plan import plan_report; "
            "report = plan_report(load_config(None, ['model.name=Qwen2.5-3B']), None, 'auto'); "
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'vllm') if m in sys.modules), "
            "'24.0 GiB GPU' in report.text and '80.0 GiB GPU' in report.text)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["[]", "True"], done.stdout + done.stderr
