"""Tasks from reasoning-gym: `--task rg:<dataset>`, procedural and offline like arithmetic.

reasoning-gym (the task library of Gensyn's swarm) makes each problem from its dataset's
config, a seed and an index, so every node of a run draws the same problem for a prompt id
without any data on disk. Its dataset scores an answer itself (`score_answer`, 0 to 1); this
node extracts the answer by its own answer format first, so the format rules (one answer
block, nothing after it when strict) hold as for every task.

Training problem `i` is the dataset's item `i` under `task.options.seed` (0 unless set).
About a tenth of all questions are held out for evaluation by a fixed hash of the question
text, as arithmetic does, so a held-out question is never trained on, however small the
dataset's space of problems; evaluation draws from the indices after the training ones. The run
id covers the dataset, its config, the seed, the size, the reasoning-gym version, this scheme,
and a digest of the first problems it makes: a generator that gives other problems elsewhere
(one that depends on Python's hash seed, or on another library's version) puts its node in
another run rather than grading a peer's answers against other questions.

Only datasets whose grading is safe on a stranger's text are offered: those that compare text
(reasoning-gym's default scorer) and those reviewed in VETTED_SCORERS. Some datasets grade by
`eval` or sympy's parser, which would run a peer's completion as code. A scorer that still
raises scores 0.

reasoning-gym's default scorer also gives part credit to an answer that merely contains the
right one (len(right) / len(answer)): an answer listing every number scores above a wrong one,
and a group's normalised advantage turns that sliver into a full push towards listing. Where a
dataset uses that default, this node rewards the answer itself only: 1 when it is the right
one, else 0.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from swarmnode.settings.registry import GYM_DATASET, GYM_PREFIX
from swarmnode.tasks.answers import extract_answer
from swarmnode.tasks.base import FORMAT_INSTRUCTIONS, AnswerFormat, Problem, fingerprint_of, grading_parts

SCHEME = "rg-task-v1"  # the hold-out hash, the redraw walk and the evaluation seed below
EVAL_PERMILLE = 100  # questions held out for evaluation, by hash
DEFAULT_SIZE = 100_000  # training problems when the config names no size
MAX_ANSWER_CHARS = 4096  # an answer's length (a dataset's answers may be lists or grids)
MAX_REDRAWS = 200  # indices tried for a training problem whose question is held out
DIGEST_PROBLEMS = 64  # problems whose text enters the run id
INSTALL_HINT = "pip install reasoning-gym (or pip install 'swarmnode[gym]')"
# datasets whose own scorer was read for this: decimal comparison (reasoning_gym.utils.compute_decimal_reward,
# Decimal of the text) with no eval, no parser of expressions
VETTED_SCORERS = frozenset({"chain_sum", "products", "decimal_chain_sum"})


def is_gym_task(name: str) -> bool:
    return name.startswith(GYM_PREFIX)


def dataset_name(task_name: str) -> str:
    """'rg:chain_sum' -> 'chain_sum'; ValueError for a name that is no dataset name."""
    name = task_name.removeprefix(GYM_PREFIX)
    if not GYM_DATASET.fullmatch(name):
        raise ValueError(f"{task_name!r}: a reasoning-gym task is rg:<dataset>, e.g. rg:chain_sum")
    return name


def uses_default_scorer(dataset_class: type) -> bool:
    """The dataset grades with reasoning-gym's own comparison of text (no scorer of its own)."""
    from reasoning_gym.dataset import ProceduralDataset  # 0.9 s to import: only for a reasoning-gym task

    return dataset_class.score_answer is ProceduralDataset.score_answer


def gym_datasets() -> list[str]:
    """The datasets of the installed reasoning-gym this node offers (their grading is safe on a
    stranger's text); ImportError with the fix when reasoning-gym is not installed."""
    try:
        from reasoning_gym.factory import DATASETS  # 0.9 s to import: only for a reasoning-gym task
    except ImportError:
        raise ImportError(f"tasks rg:<dataset> need reasoning-gym: {INSTALL_HINT}") from None
    return sorted(name for name, (cls, _) in DATASETS.items() if uses_default_scorer(cls) or name in VETTED_SCORERS)


def check_reproducible(task: ReasoningGymTask, timeout_s: float = 120.0) -> None:
    """ValueError when another Python process (another hash seed) makes other problems from the
    same settings: such a dataset puts every node in a run of its own (its problems enter the
    run id), so it is refused before it starts rather than found alone later."""
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    code = ("import json, sys\nfrom swarmnode.tasks.gym import ReasoningGymTask\n"
            "a = json.loads(sys.argv[1])\nprint(ReasoningGymTask(a['name'], a['options']).problems_digest)")
    options = {**task.config, "seed": task.seed, "size": task.size}
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps({"name": task.name, "options": options})],
                              capture_output=True, text=True, timeout=timeout_s, env={**os.environ, "PYTHONHASHSEED": seed})
    except subprocess.TimeoutExpired:
        raise ValueError(f"{task.name}: making its first problems again took over {timeout_s:.0f} s") from None
    if done.returncode != 0 or done.stdout.strip() != task.problems_digest:
        raise ValueError(f"{task.name}: another process makes other problems from the same settings (the dataset "
                         "depends on Python's hash seed or its own state), so peers could not train together on it")


def _is_held_out(question: str) -> bool:
    digest = hashlib.blake2b(question.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % 1000 < EVAL_PERMILLE


@dataclass(frozen=True)
class GymProblem(Problem):
    """A problem with the dataset's entry, which its scorer reads."""

    entry: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


class ReasoningGymTask:
    """One reasoning-gym dataset as a swarmnode task. `options` is the dataset's config (its
    `seed` and `size` included); unknown keys are the dataset's error."""

    def __init__(
        self,
        name: str,
        options: dict[str, Any] | None = None,
        answer_format: AnswerFormat = "answer_tag",
        strict_format: bool = True,
        system_prompt: str | None = None,
    ) -> None:
        self.name = name
        self.dataset = dataset_name(name)
        offered = gym_datasets()  # ImportError with the fix when reasoning-gym is missing
        if self.dataset not in offered:
            raise ValueError(f"{name}: no dataset {self.dataset!r} among reasoning-gym's datasets whose grading is "
                             f"safe on a peer's text: {', '.join(offered)}")
        import reasoning_gym  # an optional dependency, 0.9 s to import: only for this task

        config = dict(options or {})
        self.seed, self.size = config.pop("seed", 0), config.pop("size", DEFAULT_SIZE)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (self.seed, self.size)) or self.size < 1:
            raise ValueError(f"{name}: task.options seed and size are whole numbers, size at least 1")
        self.config = config
        try:
            self._train = reasoning_gym.create_dataset(self.dataset, seed=self.seed, size=self.size, **config)
            self._eval = reasoning_gym.create_dataset(self.dataset, seed=self.seed + self.size, size=self.size, **config)
        except Exception as err:  # the dataset's own config checks: TypeError, AssertionError, ValueError, ...
            raise ValueError(f"{name}: its config {config} is refused by reasoning-gym: {err}") from None
        self.exact_only = uses_default_scorer(type(self._train))  # see the module's doc
        self.version = importlib.metadata.version("reasoning-gym")
        self.answer_format = answer_format
        self.strict_format = strict_format or answer_format == "think_answer"
        self.system_prompt = FORMAT_INSTRUCTIONS[answer_format] if system_prompt is None else system_prompt
        first = [self.train_problem(i) for i in range(min(DIGEST_PROBLEMS, self.size))]
        self.problems_digest = fingerprint_of(*(f"{p.question}\x1e{p.answer}" for p in first))

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(
            self.name, SCHEME, f"reasoning-gym={self.version}", json.dumps(self.config, sort_keys=True, default=str),
            str(self.seed), str(self.size), *grading_parts(self.answer_format, "numeric", self.strict_format, True),
            self.system_prompt, str(EVAL_PERMILLE), self.problems_digest, f"exact_only={self.exact_only}",
        )

    @property
    def num_train(self) -> int:
        return self.size

    def train_problem(self, problem_id: int) -> GymProblem:
        if not 0 <= problem_id < self.size:
            raise ValueError(f"problem id {problem_id} out of range")
        for k in range(MAX_REDRAWS):  # a held-out question gives way to another index, the same on every node
            entry = self._train[(problem_id + k) % self.size]
            if not _is_held_out(entry["question"]):
                return GymProblem(problem_id, entry["question"], str(entry["answer"]), entry)
        raise ValueError(f"{self.name}: no training question near id {problem_id} outside the held-out tenth")

    def eval_problems(self, count: int) -> list[GymProblem]:
        problems: list[GymProblem] = []
        seen: set[str] = set()
        for index in range(min(self.size, count * 200)):
            if len(problems) == count:
                break
            entry = self._eval[index]
            if _is_held_out(entry["question"]) and entry["question"] not in seen:
                seen.add(entry["question"])
                problems.append(GymProblem(len(problems), entry["question"], str(entry["answer"]), entry))
        if len(problems) < count:
            raise ValueError(f"{self.name}: only {len(problems)} held-out problems found for its config; ask for fewer")
        return problems

    def reward(self, completion: str, problem: Problem) -> float:
        """The dataset's score of the answer this node extracts (0 when none is well formed)."""
        answer = extract_answer(completion, self.answer_format, self.strict_format, max_chars=MAX_ANSWER_CHARS)
        if answer is None or not isinstance(problem, GymProblem):
            return 0.0
        if self.exact_only:
            return 1.0 if answer == str(problem.entry["answer"]) else 0.0
        try:
            score = float(self._train.score_answer(answer, problem.entry))
        except Exception:  # a scorer that chokes on odd text ('((((', '1e999999'): no reward, no crash
            return 0.0
        return min(1.0, max(0.0, score)) if math.isfinite(score) else 0.0
