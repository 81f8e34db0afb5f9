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

import math
import statistics
from dataclasses import dataclass
from typing import Any

from scipy.stats import ttest_1samp, ttest_ind

from swarmnode.lab.ablation import Gain


@dataclass(frozen=True)
class Difference:
    """A mean difference, its standard error, and Student's t on it: two-sided p and 95 % interval."""

    mean: float
    se: float
    p: float
    interval: tuple[float, float]
    seeds: int


def _from_test(mean: float, result: Any, seeds: int) -> Difference:  # result: scipy's TtestResult
    interval = result.confidence_interval(0.95)
    se = mean / result.statistic if result.statistic else math.nan
    return Difference(mean, abs(float(se)), float(result.pvalue), (float(interval.low), float(interval.high)), seeds)


def seed_differences(here: Gain, there: Gain, seeds: range | None = None) -> dict[int, float]:
    """Per seed both gains have (and in `seeds`, where given): the gain there minus the gain here."""
    mine = dict(here.by_seed)
    return {seed: gain - mine[seed] for seed, gain in there.by_seed
            if seed in mine and (seeds is None or seed in seeds)}


def paired(differences: dict[int, float]) -> Difference:
    """The mean of per-seed differences against 0, with n - 1 degrees of freedom."""
    if len(differences) < 2:
        raise ValueError("two seeds or more that both tables ran")
    values = list(differences.values())
    return _from_test(statistics.mean(values), ttest_1samp(values, 0.0), len(values))


def welch(first: list[float], second: list[float]) -> Difference:
    """The second draw's mean minus the first's, unpaired and of unequal spread (Welch)."""
    if len(first) < 2 or len(second) < 2:
        raise ValueError("two draws of two seeds or more")
    mean = statistics.mean(second) - statistics.mean(first)
    return _from_test(mean, ttest_ind(second, first, equal_var=False), len(first) + len(second))
