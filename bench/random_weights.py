"""Random-weight models of real shapes for the bench scripts: no download, same memory and speed."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from swarmnode.model.tiny import build_tokenizer
from swarmnode.sizing.shapes import ModelShape


def build_random_model(shape: ModelShape, directory: Path, dtype: torch.dtype) -> None:
    """A Qwen2 of `shape` with random weights, saved with the tiny tokenizer where HF and vLLM
    can open it (only token ids matter to these benches, never text)."""
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        tie_word_embeddings=shape.tied, max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(dtype).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
