"""Model shapes: the dimensions that decide a model's memory.

Known Qwen2.5 shapes are built in, so a volunteer can be told what fits before any weights
are fetched; other models are read from their config.json. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmnode.settings.models import TINY_NAMES, resolve_model_name


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
    name = resolve_model_name(name)
    base = name.removesuffix("-Instruct") if name not in KNOWN_SHAPES else name
    if base in KNOWN_SHAPES:
        return KNOWN_SHAPES[base]
    if name in TINY_NAMES:
        return None  # built here, a few MB
    try:
        from transformers import AutoConfig

        return ModelShape.from_hf_config(AutoConfig.from_pretrained(name, revision=revision))
    except Exception:  # offline, unknown architecture, missing file: no estimate, not an error
        return None
