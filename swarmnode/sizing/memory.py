"""Memory a node will need, estimated before any weights load, so a config that cannot fit
fails at start-up with a suggestion instead of running out of memory mid-round.

The figures are a budget, not a measurement: weights, gradients and AdamW state are exact
byte counts; activations and logits follow a per-token rule of thumb; vLLM gets its share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from swarmnode.settings.config import Config, ConfigError, load_config
from swarmnode.sizing.devices import device_of, resolve_backend
from swarmnode.sizing.shapes import ModelShape, shape_of

GIB = 2**30
TYPICAL_PROMPT_TOKENS = 256  # a GSM8K question in a chat template is ~100-250 tokens

# Calibration: one NVIDIA H100 80 GB, HF backend, random weights of the real Qwen2.5 shapes,
# the project's own code, whole-process peak from nvidia-smi (docs/gpu.md, 'The memory estimate'), measured with
# log-probs over whole sequences and generation from the trainer's own weights (the settings in
# CALIBRATION_SETTINGS). Before calibration this module's parts were 9-21 % below them.
# Persistent parts (weights, gradients, optimiser state) were within 4 % of torch's own
# counters; the shortfall is in what comes and goes: the allocator keeps freed blocks cached
# (nvidia-smi sees them), and the unchunked log-prob path holds more [tokens x vocabulary]
# copies than counted. So: a fixed context, a small slack on persistent parts and a larger one
# on transient parts. tests/test_plan.py holds each measured peak at or below its estimate and
# within 15 %; `python bench/config_memory.py` prints the ratios. Re-measure with
# bench/gpu_round.py.
CALIBRATION_PEAKS_GIB = {  # shipped config -> measured process peak
    "qwen2.5-1.5b.yaml": 45.7,
    "qwen2.5-1.5b-lora-24gb.yaml": 11.5,
    "qwen2.5-3b-lora-24gb.yaml": 12.2,
    "qwen2.5-3b-lora.yaml": 32.7,
}
CALIBRATION_SETTINGS = ["train.logprob_chunk_tokens=0", "rollout.hf_inference_copy=false", "rollout.batch_size=24"]
CALIBRATION_CAPACITY_GIB = 79.2
CUDA_CONTEXT = 2.5 * GIB  # CUDA context, cuBLAS workspaces, allocator reserve
PERSISTENT_SLACK = 0.05
TRANSIENT_SLACK = 0.33
TRANSIENT_PARTS = ("activations", "logits", "generation KV cache")


@dataclass
class MemoryEstimate:
    parts: dict[str, float] = field(default_factory=dict)  # bytes
    capacity: float = 0.0  # bytes on the device
    device: str = "cuda"
    problems: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return not self.problems and self.total <= self.capacity

    def describe(self) -> str:
        lines = [f"  {name:<30} {size / GIB:7.1f} GiB" for name, size in self.parts.items()]
        lines.append(f"  {'total':<30} {self.total / GIB:7.1f} GiB of {self.capacity / GIB:.1f} GiB ({self.device})")
        return "\n".join(lines)


def logits_bytes(config: Config, shape: ModelShape, compute: int) -> float:
    """[tokens x vocabulary] tensors of one micro-batch's log-probs and their gradients."""
    seq = TYPICAL_PROMPT_TOKENS + config.rollout.max_new_tokens
    micro = config.train.micro_batch_size
    chunk = config.train.logprob_chunk_tokens
    if not chunk:  # whole sequences at once: bf16 logits, fp32 log-softmax and its gradient
        return micro * seq * shape.vocab * (compute + 8)
    # chunked (swarmnode.model.logprobs): one chunk's logits, fp32 copy, exp and gradient at a time
    return micro * min(chunk, seq) * shape.vocab * (compute + 14)


def estimate(config: Config, shape: ModelShape, capacity: float, on_gpu: bool, backend: str) -> MemoryEstimate:
    """Bytes a node with `config` needs on a device with `capacity` bytes (an upper bound on a
    GPU, calibrated as above)."""
    compute = 2 if on_gpu and config.model.dtype != "float32" else 4
    p, lora = shape.num_params, config.model.lora
    est = MemoryEstimate(capacity=capacity, device="cuda" if on_gpu else "cpu")
    if lora.rank:
        trainable = shape.lora_params(lora.rank, lora.target_modules)
        est.parts["weights (frozen base)"] = compute * p
        est.parts["LoRA adapters (fp32)"] = 4 * trainable
        state = 4 * trainable
    else:
        master = 4 if config.train.master_weights != "model" else compute
        mixed = master == 4 and compute == 2
        est.parts["weights" + (" (fp32 master)" if mixed else "")] = master * p
        if mixed:  # autocast keeps a bf16 copy of each weight it casts while the step runs
            est.parts["bf16 weight copies (autocast)"] = compute * p
            if backend == "hf" and config.rollout.hf_inference_copy:
                est.parts["bf16 inference copy (hf)"] = compute * p
        trainable, state = p, master * p
        if config.trust.likelihood_gate and config.trust.anchor:  # a LoRA's base is its reference already
            est.parts["frozen reference (trust.anchor)"] = compute * p
    est.parts["gradients"] = state
    est.parts["AdamW state"] = 2 * state
    seq = TYPICAL_PROMPT_TOKENS + config.rollout.max_new_tokens
    tokens = config.train.micro_batch_size * seq
    per_layer = (16 * shape.hidden + 3 * shape.intermediate) * compute  # bytes a token keeps per layer
    if config.train.gradient_checkpointing:  # one input per layer kept, one layer recomputed at a time
        est.parts["activations (micro-batch)"] = tokens * (shape.layers * shape.hidden * compute + per_layer)
    else:
        est.parts["activations (micro-batch)"] = tokens * shape.layers * per_layer
    est.parts["logits (micro-batch)"] = logits_bytes(config, shape, compute)
    sequences = config.rollout.prompts_per_round * config.rollout.group_size
    if backend == "vllm":
        fraction = config.rollout.vllm_fraction(on_gpu)
        share = fraction * capacity if on_gpu else compute * p + (config.rollout.vllm_kv_cache_gib or 0) * GIB
        est.parts["vLLM engine share"] = share
        engine_needs = vllm_engine_bytes(config, shape, compute)
        if on_gpu and engine_needs > share:
            est.problems.append(
                f"vLLM's share ({share / GIB:.1f} GiB) is below its weights and one batch of KV cache "
                f"({engine_needs / GIB:.1f} GiB): raise rollout.vllm_memory_fraction"
            )
    else:
        batch = min(sequences, config.rollout.batch_size)
        est.parts["generation KV cache (hf)"] = shape.kv_bytes_per_token(compute) * seq * batch
    if on_gpu:
        transient = sum(v for k, v in est.parts.items() if k.startswith(TRANSIENT_PARTS))
        persistent = sum(v for k, v in est.parts.items() if not k.startswith(TRANSIENT_PARTS + ("vLLM",)))
        est.parts["CUDA context, allocator slack"] = (
            CUDA_CONTEXT + PERSISTENT_SLACK * persistent + TRANSIENT_SLACK * transient
        )
    return est


def vllm_engine_bytes(config: Config, shape: ModelShape, compute: int) -> float:
    """What a colocated vLLM engine needs at least: its weights and one round's KV cache."""
    seq = TYPICAL_PROMPT_TOKENS + config.rollout.max_new_tokens
    sequences = config.rollout.prompts_per_round * config.rollout.group_size
    return compute * shape.num_params + shape.kv_bytes_per_token(compute) * seq * min(sequences, 64)


def device_capacity(on_gpu: bool, device_index: int = 0) -> float:
    """Total bytes of the GPU, or of this machine's RAM."""
    if on_gpu:
        import torch  # only on a GPU machine, where the node loads it anyway

        return float(torch.cuda.get_device_properties(device_index).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def suggest_configs(configs_dir: Path, capacity: float, on_gpu: bool, backend: str) -> list[tuple[Path, float]]:
    """Shipped configs that fit `capacity`, largest model first: (path, GiB needed)."""
    fitting = []
    for path in sorted(configs_dir.glob("*.yaml")):
        try:
            candidate = load_config(path)
        except (ConfigError, yaml.YAMLError):
            continue
        shape = shape_of(candidate.model.name)
        if shape is None:
            continue
        est = estimate(candidate, shape, capacity, on_gpu, backend)
        if est.fits:
            fitting.append((shape.num_params, path, est.total / GIB))
    fitting.sort(key=lambda item: (-item[0], item[2]))
    return [(path, gib) for _, path, gib in fitting]


def default_configs_dir() -> Path:
    """configs/ of a source checkout or of the Docker image (SWARMNODE_CONFIGS overrides)."""
    return Path(os.environ.get("SWARMNODE_CONFIGS", Path(__file__).resolve().parents[1] / "configs"))


def check_fits(config: Config) -> tuple[MemoryEstimate | None, str | None]:
    """(estimate, None) when the config fits this machine, (estimate, why and what to try)
    when not, (None, None) when the model's shape is unknown."""
    kind, index = device_of(config.model.device)
    on_gpu = kind == "cuda"
    shape = shape_of(config.model.name, config.model.revision)
    if shape is None:
        return None, None
    backend = resolve_backend(config.rollout.backend, kind)
    capacity = device_capacity(on_gpu, index)
    est = estimate(config, shape, capacity, on_gpu, backend)
    if est.fits:
        return est, None
    where = f"this GPU ({capacity / GIB:.1f} GiB)" if on_gpu else f"this machine's RAM ({capacity / GIB:.1f} GiB)"
    lines = [
        f"{config.model.name} ({shape.num_params / 1e9:.2f} B params, "
        f"{'LoRA r=' + str(config.model.lora.rank) if config.model.lora.rank else 'full fine-tuning'}, "
        f"{backend}) needs about {est.total / GIB:.1f} GiB, more than {where}:",
        est.describe(),
        *est.problems,
    ]
    if not on_gpu:
        lines.append(
            f"a model of this size is meant for a GPU: `swarmnode plan --model {config.model.name}` shows "
            "what fits one; on this machine use --model tiny"
        )
        lines.append("(to start anyway: --set node.memory_check=false)")
        return est, "\n".join(lines)
    fitting = suggest_configs(default_configs_dir(), capacity, on_gpu, backend)
    if fitting:
        lines.append("configs that fit: " + ", ".join(f"{p.name} (~{gib:.0f} GiB)" for p, gib in fitting[:3]))
        lines.append(f"e.g. swarmnode join --config {fitting[0][0]}")
    else:
        lines.append("try LoRA (--lora-rank 64), a smaller train.micro_batch_size or a smaller model")
    lines.append("(to start anyway: --set node.memory_check=false)")
    return est, "\n".join(lines)
