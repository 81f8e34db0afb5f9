"""The named choices of a node, one list per kind: objectives, divergence estimators, tasks,
generation backends.

The config validates against these lists, the CLI help prints them, the code that carries a
choice out looks it up here (an unknown name is an error, never a silent fallback), and a test
holds docs/configuration.md's table to them. No torch, so loading a config stays cheap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
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

TASKS: Registry[Choice] = Registry(
    "task",
    [
        Choice("arithmetic", "built-in two-operand arithmetic, offline (the tiny default)"),
        Choice("gsm8k", "grade-school maths: a local directory or .jsonl, or hf:openai/gsm8k"),
    ],
)

GYM_PREFIX = "rg:"  # a reasoning-gym dataset as a task: rg:<dataset> (swarmnode.tasks.gym)
GYM_DATASET = re.compile(r"[a-z][a-z0-9_]{0,63}")  # what a reasoning-gym dataset's name looks like
PLUGIN_GROUP = "swarmnode.tasks"  # the entry point group of task plug-ins (swarmnode.tasks.plugins)


def plugin_entry_points() -> dict[str, EntryPoint]:
    """Installed task plug-ins by name (package metadata only: nothing is imported)."""
    return {point.name: point for point in entry_points(group=PLUGIN_GROUP)}


def check_task_name(name: str) -> str:
    """A built-in task, rg:<dataset> or an installed plug-in; ValueError naming the choices.
    Whether reasoning-gym has the dataset is preflight's to check (its import takes a second)."""
    if name in TASKS.names:
        return name
    plugins = sorted(plugin_entry_points())
    if name in plugins:
        return name
    if name.startswith(GYM_PREFIX):
        if GYM_DATASET.fullmatch(name.removeprefix(GYM_PREFIX)):
            return name
        raise ValueError(f"{name!r}: a reasoning-gym task is rg:<dataset>, e.g. rg:chain_sum")
    raise ValueError(f"unknown task {name!r}; choose from {TASKS.cli_help()}, {GYM_PREFIX}<dataset> (reasoning-gym)"
                     + (f", or an installed plug-in: {', '.join(plugins)}" if plugins else ", or an installed plug-in"))


BACKENDS: Registry[Choice] = Registry(
    "generation backend",
    [
        Choice("auto", "vLLM when it imports and the model is on a GPU, else hf"),
        Choice("hf", "Hugging Face generate on the trainer's own model"),
        Choice("vllm", "an in-process vLLM engine, weights reloaded after every step"),
    ],
)
