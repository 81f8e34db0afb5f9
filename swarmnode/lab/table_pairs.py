"""How two tables differ for a member they share, seed by seed.

Two tables of one shape read against the same alone runs (one run store) differ for a member
only in what it trained beside: its gain in the one minus its gain in the other, seed by seed,
is its accuracy there minus its accuracy here, alone's noise cancelled. That is how to ask
whether a member gains less beside another family (swarm5) than without it (swarm4), which two
tables' gains against alone, each carrying its own draw of alone, answer far less sharply.

Two draws of seeds are compared unpaired (Welch): whether the ten untuned seeds read differently
from the ten tuned on, beyond what ten seeds' spread allows.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

from scipy.stats import ttest_1samp, ttest_ind

from swarmnode.lab.ablation import ALONE, ConditionRun, Gain, Shape, run_from_json, setting_from_json

TABLE_KEYS = ("setting", "accounting", "shape", "runs")  # what an ablation.json holds that a comparison reads
DIGITS = 9  # accuracies lie on a grid of 1/eval_size: differences rounded here lose only float noise


@dataclass(frozen=True)
class Difference:
    """A mean difference and its standard error; with a spread, Student's t on it: two-sided p
    and 95 % interval (nan and the mean itself where every difference is the same)."""

    mean: float
    se: float
    p: float
    interval: tuple[float, float]


def _judged(mean: float, se: float, test: object) -> Difference:
    """`test` is scipy's TtestResult, consulted only where there is a spread to judge."""
    if se == 0:
        return Difference(mean, 0.0, math.nan, (mean, mean))
    interval = test.confidence_interval(0.95)  # type: ignore[attr-defined]
    return Difference(mean, se, float(test.pvalue), (float(interval.low), float(interval.high)))  # type: ignore[attr-defined]


def seed_differences(here: Gain, there: Gain, seeds: Collection[int] | None = None) -> dict[int, float]:
    """Per seed both gains have (and in `seeds`, where given): the gain there minus the gain here."""
    mine = dict(here.by_seed)
    return {seed: round(gain - mine[seed], DIGITS) for seed, gain in there.by_seed
            if seed in mine and (seeds is None or seed in seeds)}


def paired(differences: dict[int, float]) -> Difference:
    """The mean of per-seed differences against 0, with n - 1 degrees of freedom."""
    if len(differences) < 2:
        raise ValueError("two seeds or more that both tables ran")
    values = list(differences.values())
    se = statistics.stdev(values) / math.sqrt(len(values))
    return _judged(statistics.mean(values), se, ttest_1samp(values, 0.0))


def welch(first: list[float], second: list[float]) -> Difference:
    """The second draw's mean minus the first's, unpaired and of unequal spread (Welch)."""
    if len(first) < 2 or len(second) < 2:
        raise ValueError("two draws of two seeds or more")
    se = math.sqrt(statistics.variance(first) / len(first) + statistics.variance(second) / len(second))
    return _judged(statistics.mean(second) - statistics.mean(first), se, ttest_ind(second, first, equal_var=False))


def mismatch(here: dict, there: dict) -> list[str]:
    """What makes two saved tables (ablation.json) not the same members' runs of one shape: the
    shape (a field written before it existed at its default), the accounting, the defaults
    they ran under, or a shared member's own settings. Empty where they compare."""
    def shape(saved: dict) -> dict:
        return {key: list(value) if isinstance(value, tuple) else value
                for key, value in {**asdict(Shape()), **saved["shape"]}.items()}
    mine, theirs = shape(here), shape(there)
    differ = [f"{key} {theirs[key]} (here {mine[key]})" for key in mine if mine[key] != theirs[key]]
    if here["accounting"] != there["accounting"]:
        differ.append(f"accounting {there['accounting']} (here {here['accounting']})")
    if None not in (here.get("defaults"), there.get("defaults")) and here["defaults"] != there["defaults"]:
        differ.append(f"defaults {there['defaults'][:16]} (here {here['defaults'][:16]})")
    members = {m.label: m.overrides for m in setting_from_json(here["setting"]).members}
    for member in setting_from_json(there["setting"]).members:
        if member.label in members and members[member.label] != member.overrides:
            differ.append(f"{member.label}'s settings {list(member.overrides)} (here {list(members[member.label])})")
    return differ


def same_alone(here: list[ConditionRun], there: list[ConditionRun], keys: set[tuple[int, str]]) -> bool:
    """Whether every (seed, member) in `keys` has one alone run in both tables: the same curve,
    length and time-matched point, so alone's noise cancels from the difference."""
    def alone(runs: list[ConditionRun]) -> dict[tuple[int, str], tuple]:
        return {(r.seed, m.label): (m.curve, len(m.rounds), m.time_matched_at)
                for r in runs if r.condition == ALONE for m in r.members}
    mine, theirs = alone(here), alone(there)
    return bool(keys) and all(key in mine and key in theirs and mine[key] == theirs[key] for key in keys)


def read_table(path: Path) -> tuple[dict, list[ConditionRun]]:
    """A saved table's header and its runs; ValueError, saying why, where it is not one."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    if not isinstance(saved, dict) or any(key not in saved for key in TABLE_KEYS):
        raise ValueError(f"{path} is not an ablation.json (bench/ablation.py --out): it needs {', '.join(TABLE_KEYS)}")
    return saved, [run_from_json(r) for r in saved["runs"]]


def conditions_compared(here: list[ConditionRun], there: list[ConditionRun], asked: list[str] | None) -> tuple[str, str]:
    """The condition read in each table: the one both hold, or the one named for both, or the
    first's then the second's. ValueError, naming what each holds, where that is not one."""
    held_here = {r.condition for r in here} - {ALONE}
    held_there = {r.condition for r in there} - {ALONE}
    if asked:
        first, second = asked[0], asked[-1]
        for name, held, which in ((first, held_here, "first"), (second, held_there, "second")):
            if name not in held:
                raise ValueError(f"the {which} table has no {name}: it holds {sorted(held)}")
        return first, second
    shared = held_here & held_there
    if len(shared) != 1:
        raise ValueError(f"the first table holds {sorted(held_here)}, the second {sorted(held_there)}: "
                         "name one condition for both with --condition, or one for each")
    both = shared.pop()
    return both, both
