"""What every task offers the node: problems by id, a prompt, and a reward it computes itself."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from swarmnode.settings.config import AnswerFormat, Grader

__all__ = ["AnswerFormat", "Grader", "Problem", "Task", "fingerprint_of", "grader_part", "grading_parts"]

FORMAT_INSTRUCTIONS: dict[str, str] = {
    "answer_tag": "Give the final answer inside <answer></answer> tags.",
    "boxed": "Give the final answer inside \\boxed{}.",
    "think_answer": "Reason inside <think></think> tags, then give the final answer inside <answer></answer> "
    "tags, and write nothing after them.",
}

# The system prompt of the paper's runs, as the authors' code sends it (NikolayBlagoev/HeterogeneousRL,
# src/runner.py): an experimental setting, kept word for word so a run can be compared with theirs.
PAPER_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it.\n"
    "The assistant needs to provide a detailed step by step solution of the problem. The reasoning process "
    "is enclosed within <think> </think> and the answer within <answer> </answer> tags with nothing outside "
    "said tags, i.e., <think> reasoning process here </think><answer> answer here </answer>\n\n"
)


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


def grading_parts(answer_format: AnswerFormat, grader: Grader, strict_format: bool, strict_numbers: bool) -> tuple[str, ...]:
    """What a task's fingerprint says of how it grades: only what changes a reward, so two
    tasks that grade alike share a run id (think_answer is always strict; math-verify reads no
    number rules). The numeric grader's parts are as they always were, so its runs keep their ids."""
    strict = strict_format or answer_format == "think_answer"
    numbers = strict_numbers or grader != "numeric"
    return (
        answer_format,
        "strict" if strict else "lenient",
        "strict-numbers" if numbers else "lenient-numbers",
    )


def grader_part(grader: Grader) -> tuple[str, ...]:
    """The grader's own part, at the fingerprint's end: none for numeric (older runs' ids)."""
    return () if grader == "numeric" else (grader,)
