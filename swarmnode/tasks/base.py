"""What every task offers the node: problems by id, a prompt, and a reward it computes itself."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, Protocol

AnswerFormat = Literal["answer_tag", "boxed"]

FORMAT_INSTRUCTIONS: dict[str, str] = {
    "answer_tag": "Give the final answer inside <answer></answer> tags.",
    "boxed": "Give the final answer inside \\boxed{}.",
}


@dataclass(frozen=True)
class Problem:
    """One prompt. `id` is stable across nodes so peers can name it on the wire."""

    id: int
    question: str
    answer: str


class Task(Protocol):
    """A source of verifiable problems; rewards always use this node's own answers."""

    name: str
    answer_format: AnswerFormat
    system_prompt: str

    @property
    def fingerprint(self) -> str:
        """Hash of the data and grading rules: nodes with different fingerprints never mix."""
        ...

    @property
    def num_train(self) -> int:
        """Number of training problems; ids run from 0 to num_train - 1."""
        ...

    def train_problem(self, problem_id: int) -> Problem: ...

    def eval_problems(self, count: int) -> list[Problem]: ...

    def reward(self, completion: str, problem: Problem) -> float: ...


def fingerprint_of(*parts: str | bytes) -> str:
    """Short stable hash of the given parts."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\x1f")
    return digest.hexdigest()[:16]
