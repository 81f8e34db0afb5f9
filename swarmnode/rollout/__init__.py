"""Generators: (policy, prompts, G) -> completions with the log-prob of every sampled token."""

from swarmnode.rollout.base import Completion, Generator

__all__ = ["Completion", "Generator", "make_generator"]


def make_generator(backend: str, policy, settings) -> Generator:  # noqa: ANN001
    """The generator named by `rollout.backend`."""
    if backend == "hf":
        from swarmnode.rollout.hf import HFGenerator

        return HFGenerator(policy, settings)
    raise ValueError(f"unknown generation backend {backend!r}")
