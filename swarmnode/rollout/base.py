"""The generator interface shared by the Hugging Face and vLLM backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from swarmnode.model.batching import AdaptiveBatch


@dataclass
class Completion:
    """Sampled token ids up to and including EOS (if reached) and log pi_gen of each."""

    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float32
    finished: bool  # True when it ended with EOS, False when cut at max_new_tokens


class Generator(Protocol):
    name: str
    adaptive: tuple[AdaptiveBatch, ...]  # its batch sizes that out-of-memory errors halve

    def generate(self, prompts: list[list[int]], group_size: int) -> list[list[Completion]]:
        """`group_size` samples for each prompt, in prompt order."""
        ...

    def sync_weights(self) -> float:
        """Make generation use the policy's current weights (after a step or a resume); seconds."""
        ...

    def close(self) -> None:
        """Release what the generator holds (vLLM's engine)."""
        ...

    def greedy(self, prompts: list[list[int]]) -> list[Completion]:
        """One deterministic (argmax) completion per prompt, for evaluation."""
        ...
