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

from swarmnode.config import Config

GIB = 2**30
TYPICAL_PROMPT_TOKENS = 256  # a GSM8K question in a chat template is ~100-250 tokens
CONTEXT_OVERHEAD = 1.0 * GIB  # CUDA context, allocator slack
FRAGMENTATION = 0.05


@dataclass(frozen=True)
class ModelShape:
    """The dimensions that decide memory; public config.json values of each model."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def num_params(self) -> int:
        kv = self.kv_heads * self.head_dim
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv + self.hidden + 2 * kv
        mlp = 3 * self.hidden * self.intermediate
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * (attention + mlp + 2 * self.hidden) + self.hidden

    def lora_params(self, rank: int, targets: list[str]) -> int:
        """Trainable parameters of rank-`rank` adapters on the named projections."""
        kv = self.kv_heads * self.head_dim
        sizes = {  # (in, out) of each projection
            "q_proj": (self.hidden, self.hidden),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (self.hidden, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }
        return self.layers * sum(rank * sum(sizes[t]) for t in targets if t in sizes)

    @classmethod
    def from_hf_config(cls, c) -> ModelShape:  # noqa: ANN001 (any transformers PretrainedConfig)
        heads = c.num_attention_heads
        return cls(
            hidden=c.hidden_size,
            intermediate=c.intermediate_size,
            layers=c.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(c, "num_key_value_heads", None) or heads,
            vocab=c.vocab_size,
            tied=bool(getattr(c, "tie_word_embeddings", False)),
        )

    def kv_bytes_per_token(self, element: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * element


_QWEN_SMALL = dict(kv_heads=2, vocab=151936, tied=True)
KNOWN_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-0.5B": ModelShape(896, 4864, 24, 14, **_QWEN_SMALL),
    "Qwen/Qwen2.5-1.5B": ModelShape(1536, 8960, 28, 12, **_QWEN_SMALL),
    "Qwen/Qwen2.5-3B": ModelShape(2048, 11008, 36, 16, **_QWEN_SMALL),
    "Qwen/Qwen2.5-7B": ModelShape(3584, 18944, 28, 28, kv_heads=4, vocab=152064, tied=False),
}
for _size in ("0.5B", "1.5B", "3B", "7B"):  # Coder and Instruct variants share the base shapes
    for _variant in (f"Qwen/Qwen2.5-Coder-{_size}", f"Qwen/Qwen2.5-{_size}-Instruct"):
        KNOWN_SHAPES[_variant] = KNOWN_SHAPES[f"Qwen/Qwen2.5-{_size}"]


def shape_of(name: str, revision: str | None = None) -> ModelShape | None:
    """Known shape, else the model's config.json (local dir or hub); None when unreadable."""
    from swarmnode.policy import resolve_model_name

    name = resolve_model_name(name)
    base = name.removesuffix("-Instruct") if name not in KNOWN_SHAPES else name
    if base in KNOWN_SHAPES:
        return KNOWN_SHAPES[base]
    if name in ("tiny", "tiny-large"):
        return None  # built here, a few MB
    try:
        from transformers import AutoConfig

        return ModelShape.from_hf_config(AutoConfig.from_pretrained(name, revision=revision))
    except Exception:  # offline, unknown architecture, missing file: no estimate, not an error
        return None


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
        lines = [f"  {name:<28} {size / GIB:7.1f} GiB" for name, size in self.parts.items()]
        lines.append(f"  {'total':<28} {self.total / GIB:7.1f} GiB of {self.capacity / GIB:.1f} GiB ({self.device})")
        return "\n".join(lines)


def estimate(config: Config, shape: ModelShape, capacity: float, on_gpu: bool, backend: str) -> MemoryEstimate:
    """Bytes a node with `config` needs on a device with `capacity` bytes."""
    from swarmnode.rollout.vllm import CPU_MEMORY_FRACTION, GPU_MEMORY_FRACTION

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
        trainable, state = p, master * p
    est.parts["gradients"] = state
    est.parts["AdamW state"] = 2 * state
    seq = TYPICAL_PROMPT_TOKENS + config.rollout.max_new_tokens
    tokens = config.train.micro_batch_size * seq
    per_layer = (16 * shape.hidden + 3 * shape.intermediate) * compute  # bytes a token keeps per layer
    if config.train.gradient_checkpointing:  # one input per layer kept, one layer recomputed at a time
        est.parts["activations (micro-batch)"] = tokens * (shape.layers * shape.hidden * compute + per_layer)
    else:
        est.parts["activations (micro-batch)"] = tokens * shape.layers * per_layer
    est.parts["logits (micro-batch)"] = tokens * shape.vocab * (compute + 8)
    sequences = config.rollout.prompts_per_round * config.rollout.group_size
    if backend == "vllm":
        fraction = config.rollout.vllm_memory_fraction or (GPU_MEMORY_FRACTION if on_gpu else CPU_MEMORY_FRACTION)
        share = fraction * capacity if on_gpu else compute * p + (config.rollout.vllm_kv_cache_gib or 0) * GIB
        est.parts["vLLM engine share"] = share
        engine_needs = compute * p + shape.kv_bytes_per_token(compute) * seq * min(sequences, 64)
        if on_gpu and engine_needs > share:
            est.problems.append(
                f"vLLM's share ({share / GIB:.1f} GiB) is below its weights and one batch of KV cache "
                f"({engine_needs / GIB:.1f} GiB): raise rollout.vllm_memory_fraction"
            )
    else:
        batch = min(sequences, config.rollout.batch_size)
        est.parts["generation KV cache (hf)"] = shape.kv_bytes_per_token(compute) * seq * batch
    if on_gpu:
        est.parts["CUDA context, fragmentation"] = CONTEXT_OVERHEAD + FRAGMENTATION * sum(est.parts.values())
    return est


def device_capacity(on_gpu: bool, device_index: int = 0) -> float:
    """Total bytes of the GPU, or of this machine's RAM."""
    if on_gpu:
        import torch

        return float(torch.cuda.get_device_properties(device_index).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def suggest_configs(configs_dir: Path, capacity: float, on_gpu: bool, backend: str) -> list[tuple[Path, float]]:
    """Shipped configs that fit `capacity`, largest model first: (path, GiB needed)."""
    from swarmnode.config import ConfigError, load_config

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
    from swarmnode.policy import pick_device
    from swarmnode.rollout import resolve_backend

    device = pick_device(config.model.device)
    on_gpu = device.type == "cuda"
    shape = shape_of(config.model.name, config.model.revision)
    if shape is None:
        return None, None
    backend = resolve_backend(config.rollout.backend, device)
    capacity = device_capacity(on_gpu, device.index or 0)
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
    fitting = suggest_configs(default_configs_dir(), capacity, on_gpu, backend)
    if fitting:
        lines.append("configs that fit: " + ", ".join(f"{p.name} (~{gib:.0f} GiB)" for p, gib in fitting[:3]))
        lines.append(f"e.g. swarmnode join --config {fitting[0][0]}")
    else:
        lines.append("try LoRA (--lora-rank 64), a smaller train.micro_batch_size or a smaller model")
    lines.append("(to start anyway: --set node.memory_check=false)")
    return est, "\n".join(lines)
