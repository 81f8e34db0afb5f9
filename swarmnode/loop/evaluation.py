"""Held-out accuracy: greedy pass@1 on the task's eval split, and optionally an OOD set
(e.g. MATH-500) scored the same way but never trained on."""

from __future__ import annotations

from typing import Any

import numpy as np

from swarmnode.model.policy import Policy
from swarmnode.protocol.prompts import build_prompt
from swarmnode.rollout.base import Generator
from swarmnode.tasks.base import Problem, Task


class Evaluator:
    def __init__(self, task: Task, policy: Policy, generator: Generator, eval_size: int, ood: Any = None) -> None:
        """`ood`: an eval source with `eval_problems(n)` and `reward(text, problem)`, or None."""
        self.task = task
        self.policy = policy
        self.generator = generator
        self.eval_size = eval_size
        self.ood = ood
        self._problems: list[Problem] | None = None  # the task's eval problems, drawn once

    def accuracy(self) -> float:
        """Greedy pass@1 on the task's held-out problems."""
        return float(np.mean(self.scores()))

    def ood_accuracy(self) -> float | None:
        return float(np.mean(self.scores(self.ood))) if self.ood else None

    def scores(self, source: Any = None) -> list[float]:
        """Per-problem greedy rewards on held-out problems (for paired comparisons); `source`
        defaults to the task's own eval split."""
        source = source or self.task
        if source is self.task:
            if self._problems is None:
                self._problems = self.task.eval_problems(self.eval_size)
            problems = self._problems
        else:
            problems = source.eval_problems(self.eval_size)
        prompts = [build_prompt(self.task, p, self.policy) for p in problems]
        outputs = self.generator.greedy(prompts)
        return [source.reward(self.policy.decode(o.tokens), p) for o, p in zip(outputs, problems)]
