"""The generator interface shared by the Hugging Face and vLLM backends (their completions are
swarmnode.protocol.wire.Completion, the one completion type from generator to loss)."""

from __future__ import annotations

import hashlib
from typing import Protocol

from swarmnode.model.batching import AdaptiveBatch
from swarmnode.protocol.wire import Completion


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


def sampling_seed(seed: int, peer_id: str) -> int:
    """The seed of a node's sampling stream: `node.seed` with the node's identity, so nodes
    that keep the same `node.seed` (the default) draw independent noise. With one stream,
    two peers' groups for different prompts shared every random draw row by row, and a
    batch made of both was less varied than one node's own. Reproducible per identity; 31
    bits, which every backend accepts."""
    digest = hashlib.blake2b(f"{seed}:{peer_id}:sampling".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF
