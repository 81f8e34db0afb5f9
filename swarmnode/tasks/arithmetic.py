"""A synthetic arithmetic task: verifiable, deterministic by seed, needs no data on disk.

Problems are (a op b) with operands in 0..max_operand. About a tenth of all operand pairs is
held out for evaluation by a fixed hash of the pair, so no evaluation problem is ever a
training problem, whatever the seed.
"""

from __future__ import annotations

import hashlib
import random

from swarmnode.settings.config import TaskSettings
from swarmnode.tasks.answers import graded_reward
from swarmnode.tasks.base import AnswerFormat, Grader, Problem, fingerprint_of, grader_part, grading_parts

EVAL_PERMILLE = 100


def _is_held_out(a: int, op: str, b: int) -> bool:
    digest = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % 1000 < EVAL_PERMILLE


def _solve(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


class ArithmeticTask:
    """'37+45=' -> '<answer>82</answer>'."""

    name = "arithmetic"
    num_train = 2**31

    def __init__(
        self,
        seed: int = 0,
        max_operand: int = 99,
        operations: str = "+-",
        answer_format: AnswerFormat = "answer_tag",
        strict_format: bool = True,
        strict_numbers: bool = True,
        system_prompt: str | None = None,
        grader: Grader = "numeric",
    ) -> None:
        if not operations or set(operations) - set("+-*"):
            raise ValueError(f"operations must be drawn from '+-*', got {operations!r}")
        self.seed = seed
        self.max_operand = max_operand
        self.operations = operations
        self.answer_format = answer_format
        self.strict_format = strict_format
        self.strict_numbers = strict_numbers
        self.grader = grader
        self.system_prompt = "" if system_prompt is None else system_prompt

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(
            self.name,
            str(self.seed),
            str(self.max_operand),
            self.operations,
            *grading_parts(self.answer_format, self.grader, self.strict_format, self.strict_numbers),
            self.system_prompt,
            str(EVAL_PERMILLE),
            *grader_part(self.grader),
        )

    def _draw(self, rng: random.Random, held_out: bool) -> tuple[int, str, int]:
        while True:
            op = rng.choice(self.operations)
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            if op == "-" and b > a:
                a, b = b, a
            if _is_held_out(a, op, b) == held_out:
                return a, op, b

    def _problem(self, problem_id: int, a: int, op: str, b: int) -> Problem:
        width = len(str(self.max_operand))
        question = f"{a:0{width}d}{op}{b:0{width}d}="
        return Problem(id=problem_id, question=question, answer=str(_solve(a, op, b)))

    def train_problem(self, problem_id: int) -> Problem:
        if not 0 <= problem_id < self.num_train:
            raise ValueError(f"problem id {problem_id} out of range")
        rng = random.Random(f"arith-train:{self.seed}:{problem_id}")
        return self._problem(problem_id, *self._draw(rng, held_out=False))

    def eval_problems(self, count: int) -> list[Problem]:
        rng = random.Random("arith-eval")  # same list on every node and every run
        seen: set[tuple[int, str, int]] = set()
        problems: list[Problem] = []
        for _ in range(count * 200):
            if len(problems) == count:
                break
            triple = self._draw(rng, held_out=True)
            if triple not in seen:
                seen.add(triple)
                problems.append(self._problem(len(problems), *triple))
        if len(problems) < count:
            raise ValueError(
                f"only {len(problems)} held-out problems exist for max_operand="
                f"{self.max_operand} and operations {self.operations!r}; ask for fewer"
            )
        return problems

    def target(self, problem: Problem) -> str:
        """The ideal completion, used by the tiny model's supervised warm-up."""
        if self.answer_format == "boxed":
            return f"\\boxed{{{problem.answer}}}"
        if self.answer_format == "think_answer":
            return f"<think>{problem.question}</think><answer>{problem.answer}</answer>"
        return f"<answer>{problem.answer}</answer>"

    def reward(self, completion: str, problem: Problem) -> float:
        return graded_reward(
            completion, problem.answer, self.answer_format, self.grader, self.strict_format, self.strict_numbers
        )


def make_task(settings: TaskSettings) -> ArithmeticTask:
    """The task `--task arithmetic` names (its entry point in pyproject.toml)."""
    return ArithmeticTask(
        max_operand=settings.max_operand,
        operations=settings.operations,
        answer_format=settings.answer_format,
        strict_format=settings.strict_format,
        strict_numbers=settings.strict_numbers,
        system_prompt=settings.system_prompt,
        grader=settings.grader,
    )
