"""Token log-probs for the training step without a full [tokens x vocabulary] fp32 tensor.

log pi(t) = z_t / T - logsumexp(z / T) over the vocabulary, with z the LM head's output. Done
for a whole micro-batch at once, the model's logits, an fp32 copy, the log-softmax and their
gradients are each [micro-batch x tokens x vocabulary]: about 4 GiB for 4 x 768 tokens of a
Qwen2.5 (152k entries). Here the LM head runs on chunks of completion positions inside
activation checkpointing, so at most one chunk's logits exist at a time, in forward and in
backward (where the chunk is recomputed: one more LM-head matmul per chunk).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., V] logits, [...] target ids -> [...] log-probs at `temperature` (computed in fp32)."""
    scaled = logits.float() / temperature
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


def _head_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module, temperature: float) -> torch.Tensor:
    return logprobs_from_logits(head(hidden), targets, temperature)


def chunked_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module, temperature: float, chunk: int
) -> torch.Tensor:
    """hidden [B, T, H] (the states that predict each target), targets [B, T] -> [B, T]."""
    pieces = []
    for start in range(0, hidden.shape[1], chunk):
        h, t = hidden[:, start : start + chunk], targets[:, start : start + chunk]
        if torch.is_grad_enabled() and h.requires_grad:
            pieces.append(checkpoint(_head_logprobs, h, t, head, temperature, use_reentrant=False))
        else:
            pieces.append(_head_logprobs(h, t, head, temperature))
    return torch.cat(pieces, dim=1)


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body (hidden states out) and the LM head of a causal LM, through peft."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix), base.get_output_embeddings()
