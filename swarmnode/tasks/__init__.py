"""Tasks: verifiable problems and the rewards this node computes itself."""

from __future__ import annotations

from swarmnode.config import TaskSettings
from swarmnode.tasks.arithmetic import ArithmeticTask
from swarmnode.tasks.base import Problem, Task
from swarmnode.tasks.gsm8k import GSM8KTask
from swarmnode.tasks.math500 import Math500Eval

__all__ = ["ArithmeticTask", "GSM8KTask", "Math500Eval", "Problem", "Task", "make_task"]


def make_task(settings: TaskSettings) -> Task:
    """The task the settings name."""
    if settings.name == "arithmetic":
        return ArithmeticTask(
            max_operand=settings.max_operand,
            operations=settings.operations,
            answer_format=settings.answer_format,
            system_prompt=settings.system_prompt,
        )
    if settings.name == "gsm8k":
        return GSM8KTask(
            source=settings.data or "hf:openai/gsm8k",
            answer_format=settings.answer_format,
            system_prompt=settings.system_prompt,
        )
    raise ValueError(f"unknown task {settings.name!r}")
