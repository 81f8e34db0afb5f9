"""Tasks from other packages: an organiser ships a task as a package, with no change here.

A package declares its task in the entry point group `swarmnode.tasks`; the entry point's name
is the task's name (`--task <name>`), and it points to a callable that takes this node's
`TaskSettings` and returns a task (swarmnode.tasks.base.Task; `task.options` carries its own
settings). In the package's pyproject.toml:

    [project.entry-points."swarmnode.tasks"]
    my-task = "my_package.tasks:make_task"

The run id covers the plug-in's name, its distribution and version, `task.options` and its
task's own fingerprint, so nodes running another version of a plug-in, or other options, are
another run. A task that reads `task.data` declares it too, pointing to where it reads without
it (None: `task.data` must be given):

    [project.entry-points."swarmnode.task_data"]
    my-task = "my_package.tasks:DEFAULT_DATA"

swarmnode's own tasks are declared the same way in its pyproject.toml (arithmetic, gsm8k), and
made as they are: their fingerprints are not widened.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib.metadata import EntryPoint
from typing import Any

from swarmnode.settings.config import TaskSettings
from swarmnode.tasks.base import Task, fingerprint_of


class PluginTask:
    """A plug-in's task, its fingerprint widened by the plug-in's name and version; every other
    attribute is the plug-in task's own."""

    def __init__(self, inner: Task, plugin: str, distribution: str, options: dict[str, Any]) -> None:
        self._inner = inner
        self._plugin = plugin
        self._distribution = distribution
        self._options = json.dumps(options, sort_keys=True, default=str)

    @property
    def fingerprint(self) -> str:
        return fingerprint_of("plugin", self._plugin, self._distribution, self._options, self._inner.fingerprint)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def make_plugin_task(settings: TaskSettings, point: EntryPoint) -> Task:
    """The task of the installed plug-in `settings.name`, whose entry point is `point`;
    ValueError when its factory fails."""
    dist = point.dist
    distribution = f"{dist.name}=={dist.version}" if dist is not None else point.value
    try:
        factory: Callable[[TaskSettings], Task] = point.load()
        task = factory(settings)
    except Exception as err:  # a third party's code: whatever it raises is its task failing to load
        raise ValueError(f"task plug-in {settings.name!r} ({distribution}) failed to load: "
                         f"{type(err).__name__}: {err}") from err
    for member in ("fingerprint", "num_train", "train_problem", "eval_problems", "reward", "system_prompt"):
        if not hasattr(task, member):
            raise ValueError(f"task plug-in {settings.name!r} ({distribution}) gave a task without {member!r}")
    return PluginTask(task, settings.name, distribution, settings.options)
