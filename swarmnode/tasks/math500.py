"""MATH-500 for out-of-distribution evaluation, graded by math-verify (LaTeX-aware)."""

from __future__ import annotations

import random
from pathlib import Path

from swarmnode.tasks.answers import extract_answer
from swarmnode.tasks.base import AnswerFormat, Problem
from swarmnode.tasks.gsm8k import read_jsonl
from swarmnode.tasks.verify import answers_equal

MAX_COMPLETION_CHARS = 20_000


class Math500Eval:
    """Evaluation only: MATH-500 has no train split."""

    name = "math500"

    def __init__(self, source: str, answer_format: AnswerFormat = "boxed") -> None:
        path = Path(source)
        if path.is_dir():
            path = path / "test.jsonl"
        self._rows, self.data_hash = read_jsonl(path, ("problem", "answer"))
        self.answer_format = answer_format

    def eval_problems(self, count: int) -> list[Problem]:
        indices = list(range(len(self._rows)))
        if count < len(indices):
            indices = sorted(random.Random("math500-eval").sample(indices, count))
        return [
            Problem(id=i, question=self._rows[i]["problem"], answer=self._rows[i]["answer"]) for i in indices
        ]

    def reward(self, completion: str, problem: Problem) -> float:
        if len(completion) > MAX_COMPLETION_CHARS:
            return 0.0
        answer = extract_answer(completion, self.answer_format)
        return 1.0 if answer is not None and answers_equal(answer, problem.answer, latex=True) else 0.0
