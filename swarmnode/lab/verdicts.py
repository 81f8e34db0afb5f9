"""Verdicts on a gain paired over seeds, by margins rather than by standard errors.

A line drawn at k standard errors fails a perfect control more often the fewer the seeds (37 %
of comparisons beyond 1 SE at five seeds) and gets harder to pass as seeds are added; a margin
gets easier to show with more seeds, as evidence should. A mean over n paired seeds over its
standard error follows Student's t with n - 1 degrees of freedom, so:

- non-inferior: the one-sided 95 % lower bound of the mean gain is at least -NON_INFERIORITY_MARGIN;
- ahead: that lower bound is above 0;
- equivalent (what a control must be): the two-sided 90 % interval lies inside +-EQUIVALENCE_MARGIN.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy.stats import nct
from scipy.stats import t as student_t

NON_INFERIORITY_MARGIN = 0.03  # accuracy a member may lose and still be called no worse off
EQUIVALENCE_MARGIN = 0.02  # how close to 0 a control's interval must stay
LOWER_BOUND_LEVEL = 0.95  # one-sided
EQUIVALENCE_LEVEL = 0.90  # two-sided: its bounds are the one-sided 95 % bounds either way


@dataclass(frozen=True)
class Verdict:
    """A mean gain over paired seeds and what it shows."""

    mean: float
    se: float  # nan with one seed
    seeds: int

    @property
    def _t(self) -> float:
        return float(student_t.ppf(LOWER_BOUND_LEVEL, self.seeds - 1)) if self.seeds > 1 else math.inf

    @property
    def lower(self) -> float:
        """One-sided 95 % lower bound of the mean gain (-inf with one seed)."""
        return self.mean - self._t * self.se if self.seeds > 1 else -math.inf

    @property
    def interval(self) -> tuple[float, float]:
        """Two-sided 90 % interval of the mean gain (unbounded with one seed)."""
        half = float(student_t.ppf(0.5 + EQUIVALENCE_LEVEL / 2, self.seeds - 1)) * self.se if self.seeds > 1 else math.inf
        return self.mean - half, self.mean + half

    @property
    def non_inferior(self) -> bool:
        return self.lower >= -NON_INFERIORITY_MARGIN

    @property
    def ahead(self) -> bool:
        return self.lower > 0

    @property
    def equivalent(self) -> bool:
        low, high = self.interval
        return -EQUIVALENCE_MARGIN < low and high < EQUIVALENCE_MARGIN

    def against_margin(self) -> str:
        """'mean (SE), bound lower: non-inferior' (or 'not shown non-inferior'), as the attack
        benches print what a crowd costs a node."""
        shown = "non-inferior" if self.non_inferior else "not shown non-inferior"
        return f"{self.mean:+.3f} ({self.se:.3f}), bound {self.lower:+.3f}: {shown}"

    def word(self) -> str:
        """'ahead', 'non-inferior' or 'not shown' (the data cannot rule out a loss beyond the margin)."""
        return "ahead" if self.ahead else "non-inferior" if self.non_inferior else "not shown"


def verdict(gains: list[float]) -> Verdict:
    """The verdict on gains paired by seed (one value a seed)."""
    if not gains:
        raise ValueError("no gains to judge")
    se = statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else math.nan
    return Verdict(statistics.mean(gains), se, len(gains))



def still_climbing(before: list[float], half: list[float], after: list[float]) -> Verdict:
    """Per seed, what the last half of a run alone adds beyond a third of its whole gain: where
    that is ahead (its lower bound above 0), alone is still climbing at the end, shown over the
    seeds rather than read off their mean curve, whose end point spreads 0.05-0.085 a seed."""
    if not len(before) == len(half) == len(after):
        raise ValueError("one before, half-way and after accuracy a seed")
    return verdict([(a - h) - (a - b) / 3 for b, h, a in zip(before, half, after)])


def climbing_by_a_third(before: list[float], half: list[float], after: list[float]) -> bool:
    """Alone still climbing at the end, as target 3 asks: a gain over the run shown above 0, and its
    last half adding beyond a third of it. Without the first, a curve that dips and comes back to
    where it started (a gain of nothing, a third of which any recovery beats) would qualify."""
    gained = verdict([a - b for b, a in zip(before, after)])
    return gained.ahead and still_climbing(before, half, after).ahead


def still_rising(half: list[float], after: list[float]) -> Verdict:
    """Per seed, what the last half of a run alone adds: where that is ahead, alone still had room
    at the end. A weaker bar than still_climbing's third, which asks a curve rising as a power of
    the rounds for an exponent of 0.585 or more, steeper than any shape measured here at its rate."""
    if len(half) != len(after):
        raise ValueError("one half-way and after accuracy a seed")
    return verdict([a - h for h, a in zip(half, after)])


def non_inferior_power(true_gain: float, sd: float, seeds: int) -> float:
    """The chance that a member whose mean gain is truly `true_gain`, spread `sd` a seed, is
    shown non-inferior at `seeds` seeds: the lower bound clears the margin where (mean + margin)
    over its SE, a noncentral t, passes the bound's quantile."""
    if seeds < 2 or sd <= 0:
        raise ValueError("power needs two seeds or more and a positive spread")
    centre = (true_gain + NON_INFERIORITY_MARGIN) / (sd / math.sqrt(seeds))
    return float(nct.sf(student_t.ppf(LOWER_BOUND_LEVEL, seeds - 1), seeds - 1, centre))
