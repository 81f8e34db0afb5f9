"""Tasks: verifiable problems and the rewards this node computes itself."""

from __future__ import annotations

from collections.abc import Callable

from swarmnode.settings.config import TaskSettings
from swarmnode.settings.registry import TASKS
from swarmnode.tasks.arithmetic import ArithmeticTask
from swarmnode.tasks.base import Problem, Task
from swarmnode.tasks.gsm8k import GSM8K_SOURCE, GSM8KTask
from swarmnode.tasks.gym import ReasoningGymTask, is_gym_task
from swarmnode.tasks.math500 import Math500Eval
from swarmnode.tasks.plugins import make_plugin_task

__all__ = ["ArithmeticTask", "GSM8KTask", "Math500Eval", "Problem", "Task", "data_source", "make_task"]

DEFAULT_SOURCES = {"gsm8k": GSM8K_SOURCE}  # a task that reads data, where it reads it without --data


def data_source(settings: TaskSettings) -> str | None:
    """Where the task reads its data: --data, else its default (None: it makes its own problems)."""
    return settings.data or DEFAULT_SOURCES.get(settings.name)


def _arithmetic(settings: TaskSettings) -> Task:
    return ArithmeticTask(
        max_operand=settings.max_operand,
        operations=settings.operations,
        answer_format=settings.answer_format,
        strict_format=settings.strict_format,
        strict_numbers=settings.strict_numbers,
        system_prompt=settings.system_prompt,
        grader=settings.grader,
    )


def _gsm8k(settings: TaskSettings) -> Task:
    return GSM8KTask(
        source=data_source(settings) or GSM8K_SOURCE,
        answer_format=settings.answer_format,
        strict_format=settings.strict_format,
        strict_numbers=settings.strict_numbers,
        system_prompt=settings.system_prompt,
        grader=settings.grader,
    )


# One constructor per registered task name.
_MAKERS: dict[str, Callable[[TaskSettings], Task]] = {"arithmetic": _arithmetic, "gsm8k": _gsm8k}
if set(_MAKERS) != set(TASKS.names):
    raise RuntimeError(f"task registry and constructors differ: {set(TASKS.names) ^ set(_MAKERS)}")


def _gym(settings: TaskSettings) -> Task:
    return ReasoningGymTask(settings.name, settings.options, settings.answer_format, settings.strict_format,
                            settings.system_prompt)


def make_task(settings: TaskSettings) -> Task:
    """The task the settings name: built in, a reasoning-gym dataset (rg:<dataset>) or a plug-in's."""
    if settings.name in _MAKERS:
        return _MAKERS[TASKS.get(settings.name).name](settings)
    if is_gym_task(settings.name):
        return _gym(settings)
    return make_plugin_task(settings)
