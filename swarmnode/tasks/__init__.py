"""Tasks: verifiable problems and the rewards this node computes itself.

A named task is found by its entry point (group `swarmnode.tasks`): swarmnode's own
(arithmetic, gsm8k, declared in its pyproject.toml) and other packages' plug-ins alike;
`rg:<dataset>` names a reasoning-gym dataset.
"""

from __future__ import annotations

from collections.abc import Callable

from swarmnode.settings.config import TaskSettings
from swarmnode.settings.registry import PLUGIN_GROUP, data_entry_point, is_builtin_task, task_entry_point
from swarmnode.tasks.arithmetic import ArithmeticTask
from swarmnode.tasks.base import Problem, Task
from swarmnode.tasks.gsm8k import GSM8KTask
from swarmnode.tasks.gym import ReasoningGymTask, is_gym_task
from swarmnode.tasks.math500 import Math500Eval
from swarmnode.tasks.plugins import make_plugin_task

__all__ = ["ArithmeticTask", "GSM8KTask", "Math500Eval", "Problem", "Task", "data_source", "make_task"]


def data_source(settings: TaskSettings) -> str | None:
    """Where the task reads its data: --data, else where its package says it reads without it
    (entry point group `swarmnode.task_data`; None: it makes its own problems)."""
    if settings.data:
        return settings.data
    point = data_entry_point(settings.name)
    return None if point is None else point.load()


def _gym(settings: TaskSettings) -> Task:
    return ReasoningGymTask(settings.name, settings.options, settings.answer_format, settings.strict_format,
                            settings.system_prompt)


def make_task(settings: TaskSettings) -> Task:
    """The task the settings name: a reasoning-gym dataset (rg:<dataset>), or a task's entry
    point: swarmnode's own made by its factory as it is, a plug-in's as a PluginTask (whose
    fingerprint covers the package: swarmnode.tasks.plugins)."""
    if is_gym_task(settings.name):
        return _gym(settings)
    point = task_entry_point(settings.name)
    if point is None:
        raise ValueError(f"unknown task {settings.name!r}: no task of that name is installed "
                         f"(entry point group {PLUGIN_GROUP!r})")
    if is_builtin_task(settings.name):  # as it is: a built-in task's fingerprint is the run id's
        factory: Callable[[TaskSettings], Task] = point.load()
        return factory(settings)
    return make_plugin_task(settings, point)
