"""GSM8K: grade-school word problems with a single numeric answer."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from swarmnode.settings.config import TaskSettings
from swarmnode.tasks.answers import graded_reward
from swarmnode.tasks.base import (
    FORMAT_INSTRUCTIONS,
    PAPER_SYSTEM_PROMPT,
    AnswerFormat,
    Grader,
    Problem,
    fingerprint_of,
    grader_part,
    grading_parts,
)

DEFAULT_SYSTEM = "Solve the math problem step by step. "


def default_system_prompt(answer_format: AnswerFormat) -> str:
    """The paper's own prompt for its format (think_answer); ours, naming the format, otherwise."""
    if answer_format == "think_answer":
        return PAPER_SYSTEM_PROMPT
    return DEFAULT_SYSTEM + FORMAT_INSTRUCTIONS[answer_format]


def reference_answer(solution: str) -> str:
    """The number after '####' in a GSM8K solution, commas removed."""
    if "####" not in solution:
        raise ValueError("GSM8K solution has no '####' final answer")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


GSM8K_SOURCE = "hf:openai/gsm8k"  # where GSM8K comes from when no --data is given (its swarmnode.task_data entry point)


def read_jsonl(path: Path, required: tuple[str, ...]) -> tuple[list[dict], str]:
    """Rows of a JSON-lines file and the sha256 of its bytes; bad rows name their line."""
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    raw = path.read_bytes()
    rows = []
    for number, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        missing = [key for key in required if key not in row]
        if missing:
            raise ValueError(f"{path}:{number}: missing field(s) {missing}")
        rows.append(row)
    if not rows:
        raise ValueError(f"data file {path} holds no rows")
    return rows, hashlib.sha256(raw).hexdigest()


def _load_split(source: str, split: str) -> tuple[list[dict], str]:
    if source.startswith("hf:"):
        try:
            from datasets import load_dataset
        except ImportError:
            raise RuntimeError(
                f"{source}: loading from the hub needs `pip install datasets`; "
                "or pass a local directory holding train.jsonl and test.jsonl"
            ) from None
        dataset = load_dataset(source[3:], "main", split=split)
        rows = [dict(row) for row in dataset]
        return rows, fingerprint_of(source, split, str(len(rows)))
    path = Path(source)
    if path.is_dir():
        path = path / f"{split}.jsonl"
    return read_jsonl(path, ("question", "answer"))


class GSM8KTask:
    """Trains on the train split; evaluates on the test split."""

    name = "gsm8k"

    def __init__(
        self,
        source: str = GSM8K_SOURCE,
        answer_format: AnswerFormat = "answer_tag",
        strict_format: bool = True,
        strict_numbers: bool = True,
        system_prompt: str | None = None,
        splits: tuple[str, str] = ("train", "test"),
        grader: Grader = "numeric",
    ) -> None:
        self.source = source
        self.answer_format = answer_format
        self.strict_format = strict_format
        self.strict_numbers = strict_numbers
        self.grader = grader
        self.system_prompt = default_system_prompt(answer_format) if system_prompt is None else system_prompt
        self._train, train_hash = _load_split(source, splits[0])
        self._test, test_hash = _load_split(source, splits[1])
        self._hashes = (train_hash, test_hash)

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(
            self.name, *self._hashes,
            *grading_parts(self.answer_format, self.grader, self.strict_format, self.strict_numbers),
            self.system_prompt,
            *grader_part(self.grader),
        )

    @property
    def num_train(self) -> int:
        return len(self._train)

    def _problem(self, rows: list[dict], index: int) -> Problem:
        row = rows[index]
        return Problem(id=index, question=row["question"], answer=reference_answer(row["answer"]))

    def train_problem(self, problem_id: int) -> Problem:
        if not 0 <= problem_id < len(self._train):
            raise ValueError(f"problem id {problem_id} outside 0..{len(self._train) - 1}")
        return self._problem(self._train, problem_id)

    def eval_problems(self, count: int) -> list[Problem]:
        """A fixed random subset of the test split (all of it when count >= its size)."""
        indices = list(range(len(self._test)))
        if count < len(indices):
            indices = sorted(random.Random("gsm8k-eval").sample(indices, count))
        return [self._problem(self._test, i) for i in indices]

    def reward(self, completion: str, problem: Problem) -> float:
        return graded_reward(
            completion, problem.answer, self.answer_format, self.grader, self.strict_format, self.strict_numbers
        )


def make_task(settings: TaskSettings) -> GSM8KTask:
    """The task `--task gsm8k` names (its entry point in pyproject.toml): task.data, else GSM8K_SOURCE."""
    return GSM8KTask(
        source=settings.data or GSM8K_SOURCE,
        answer_format=settings.answer_format,
        strict_format=settings.strict_format,
        strict_numbers=settings.strict_numbers,
        system_prompt=settings.system_prompt,
        grader=settings.grader,
    )
