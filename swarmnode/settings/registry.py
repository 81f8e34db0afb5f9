"""The named choices of a node, one list per kind: objectives, divergence estimators,
generation backends; and the tasks, found by their entry points.

The config validates against these lists, the CLI help prints them, the code that carries a
choice out looks it up here (an unknown name is an error, never a silent fallback), and a test
holds docs/configuration.md's table to them. No torch, so loading a config stays cheap.

Tasks are declared where packages declare them: as entry points in the group
`swarmnode.tasks`, swarmnode's own (arithmetic, gsm8k) in its pyproject.toml as a plug-in's
are in theirs. A task that reads `task.data` says so in the group `swarmnode.task_data`,
pointing to where it reads without it. Only package metadata is read here: no task module is
imported, so the settings stay below the tasks.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from typing import Any, Generic, Literal, TypeVar


@dataclass(frozen=True)
class Choice:
    """One named option and a line saying what it does."""

    name: str
    help: str


@dataclass(frozen=True)
class ObjectiveChoice(Choice):
    """An objective: how peers' samples are weighted, and whether the divergence filter runs."""

    weighting: Literal["none", "vanilla", "truncated"] = "truncated"
    filtered: bool = False


C = TypeVar("C", bound=Choice)


class Registry(Generic[C]):
    """An ordered set of choices of one kind."""

    def __init__(self, kind: str, choices: list[C]) -> None:
        self.kind = kind
        self._choices = {choice.name: choice for choice in choices}
        if len(self._choices) != len(choices):
            raise ValueError(f"duplicate {kind} names")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._choices)

    def get(self, name: str) -> C:
        """The choice called `name`; ValueError naming the valid ones otherwise."""
        try:
            return self._choices[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; choose from {', '.join(self.names)}") from None

    def literal(self) -> Any:
        """A typing.Literal of the names, for pydantic fields."""
        return Literal[self.names]  # type: ignore[valid-type]

    def cli_help(self) -> str:
        """'a | b | c', as the CLI and the README write a set of choices."""
        return " | ".join(self.names)

    def __iter__(self):  # noqa: ANN204
        return iter(self._choices.values())


OBJECTIVES: Registry[ObjectiveChoice] = Registry(
    "objective",
    [
        ObjectiveChoice("nois", "no importance sampling: every sample is treated as on-policy", "none", False),
        ObjectiveChoice("vis", "vanilla importance sampling, weight pi_theta / pi_gen", "vanilla", False),
        ObjectiveChoice("tis", "truncated importance sampling, weight min(pi_theta / pi_gen, C)", "truncated", False),
        ObjectiveChoice("f-nois", "nois, dropping negative-advantage samples that diverge more than g", "none", True),
        ObjectiveChoice("f-vis", "vis with the divergence filter", "vanilla", True),
        ObjectiveChoice("f-tis", "tis with the divergence filter (the paper's F-TIS)", "truncated", True),
    ],
)

DIVERGENCES: Registry[Choice] = Registry(
    "divergence estimator",
    [
        Choice("k3-mean", "mean over the completion of exp(d) - d - 1, d = log pi_gen - log pi_theta"),
        Choice("k3-sum", "the same k3 summed over the completion"),
        Choice("k1-mean", "mean of d: a KL(pi_gen || pi_theta) estimate"),
    ],
)

GYM_PREFIX = "rg:"  # a reasoning-gym dataset as a task: rg:<dataset> (swarmnode.tasks.gym)
GYM_DATASET = re.compile(r"[a-z][a-z0-9_]{0,63}")  # what a reasoning-gym dataset's name looks like
PLUGIN_GROUP = "swarmnode.tasks"  # a task: its name -> a factory taking TaskSettings (swarmnode.tasks.plugins)
DATA_GROUP = "swarmnode.task_data"  # a task that reads task.data -> where it reads without it (None: nowhere)
OWN_DISTRIBUTION = "swarmnode"  # whose tasks are built in: made as they are, not as plug-ins


@functools.cache
def _own_points(group: str) -> dict[str, EntryPoint]:
    """swarmnode's own entry points of a group, by name (its metadata does not change while it runs)."""
    try:
        points = distribution(OWN_DISTRIBUTION).entry_points.select(group=group)
    except PackageNotFoundError:  # run from a checkout that was never installed
        return {}
    return {point.name: point for point in sorted(points, key=lambda point: point.name)}


def _is_own(point: EntryPoint) -> bool:
    return point.dist is not None and point.dist.name.replace("_", "-").lower() == OWN_DISTRIBUTION


def builtin_tasks() -> tuple[str, ...]:
    """The names of swarmnode's own tasks, sorted: its entry points in `swarmnode.tasks`."""
    return tuple(_own_points(PLUGIN_GROUP))


def is_builtin_task(name: str) -> bool:
    return name in _own_points(PLUGIN_GROUP)


def plugin_entry_points() -> dict[str, EntryPoint]:
    """Installed task plug-ins (other packages' tasks) by name (package metadata only: nothing is
    imported). A plug-in never takes a built-in task's name."""
    own = _own_points(PLUGIN_GROUP)
    return {point.name: point for point in entry_points(group=PLUGIN_GROUP)
            if not _is_own(point) and point.name not in own}


def task_entry_point(name: str) -> EntryPoint | None:
    """The entry point of the task `name`, built in or a plug-in's; None when none is installed."""
    return _own_points(PLUGIN_GROUP).get(name) or plugin_entry_points().get(name)


def data_entry_point(name: str) -> EntryPoint | None:
    """Where the task `name` reads its data without task.data, as its package declares it in
    `swarmnode.task_data`; None for a task that declares none."""
    if is_builtin_task(name):
        return _own_points(DATA_GROUP).get(name)
    return next((point for point in entry_points(group=DATA_GROUP) if point.name == name and not _is_own(point)), None)


def data_tasks() -> tuple[str, ...]:
    """swarmnode's own tasks that read task.data."""
    return tuple(name for name in builtin_tasks() if name in _own_points(DATA_GROUP))


def makes_own_problems(name: str) -> bool:
    """A reasoning-gym dataset, or a built-in task that declares no data: task.data would be
    silently ignored. A plug-in's task is not judged (its package may read task.data)."""
    return name.startswith(GYM_PREFIX) or (is_builtin_task(name) and name not in _own_points(DATA_GROUP))


def check_task_name(name: str) -> str:
    """A built-in task, rg:<dataset> or an installed plug-in; ValueError naming the choices.
    Whether reasoning-gym has the dataset is preflight's to check (its import takes a second)."""
    if is_builtin_task(name):
        return name
    plugins = sorted(plugin_entry_points())
    if name in plugins:
        return name
    if name.startswith(GYM_PREFIX):
        if GYM_DATASET.fullmatch(name.removeprefix(GYM_PREFIX)):
            return name
        raise ValueError(f"{name!r}: a reasoning-gym task is rg:<dataset>, e.g. rg:chain_sum")
    builtin = " | ".join(builtin_tasks()) or (
        f"no built-in task (swarmnode's own are entry points of {OWN_DISTRIBUTION!r}: pip install -e .)"
    )
    raise ValueError(f"unknown task {name!r}; choose from {builtin}, {GYM_PREFIX}<dataset> (reasoning-gym)"
                     + (f", or an installed plug-in: {', '.join(plugins)}" if plugins else ", or an installed plug-in"))


BACKENDS: Registry[Choice] = Registry(
    "generation backend",
    [
        Choice("auto", "vLLM when it imports and the model is on a GPU, else hf"),
        Choice("hf", "Hugging Face generate on the trainer's own model"),
        Choice("vllm", "an in-process vLLM engine, weights reloaded after every step"),
    ],
)
