"""Verdicts by margins (swarmnode/lab/verdicts.py): the bounds of Student's t over paired seeds."""

import math

import numpy as np
import pytest

from swarmnode.lab.verdicts import (
    Verdict,
    climbing_by_a_third,
    non_inferior_power,
    still_climbing,
    still_rising,
    verdict,
)


def test_the_bounds_use_student_s_t_with_one_degree_of_freedom_fewer_than_seeds():
    ten = Verdict(mean=0.0, se=0.01, seeds=10)
    assert ten.lower == pytest.approx(-1.833 * 0.01, abs=1e-5), "one-sided 95 % at 10 seeds"
    assert ten.interval == pytest.approx((-0.01833, 0.01833), abs=1e-5), "two-sided 90 %: the same quantile"
    assert Verdict(0.0, 0.01, 5).lower == pytest.approx(-2.132 * 0.01, abs=1e-5)


@pytest.mark.parametrize("mean,se,seeds,word,equivalent", [
    (0.010, 0.004, 10, "ahead", True),          # lower +0.0027; interval [+0.003, +0.017]
    (-0.010, 0.010, 10, "non-inferior", False),  # lower -0.028
    (-0.010, 0.012, 10, "not shown", False),     # lower -0.032: a loss past the margin is not ruled out
    (0.000, 0.010, 10, "non-inferior", True),    # interval +-0.0183
    (0.000, 0.011, 10, "non-inferior", False),   # interval +-0.0202
    (0.000, 0.011, 20, "non-inferior", True),    # the same SE at 20 seeds: +-0.0190, inside
])
def test_each_verdict_follows_its_margin(mean, se, seeds, word, equivalent):
    judged = Verdict(mean, se, seeds)
    assert judged.word() == word
    assert judged.equivalent is equivalent


def test_one_seed_shows_nothing_and_no_gains_are_an_error():
    one = verdict([0.5])
    assert math.isnan(one.se) and one.lower == -math.inf and one.word() == "not shown" and not one.equivalent
    with pytest.raises(ValueError):
        verdict([])


def test_a_verdict_on_gains_is_the_mean_and_standard_error_over_seeds():
    judged = verdict([0.01, 0.03, 0.02, 0.02])
    assert judged.mean == pytest.approx(0.02) and judged.seeds == 4
    assert judged.se == pytest.approx(0.0040825, abs=1e-6)


def test_the_power_of_non_inferiority_matches_the_verdict_on_simulated_seeds():
    """A member exactly as good as alone, its gains spread 0.05 a seed: how often the bench's own
    verdict calls it non-inferior, over many simulated tables, is what the formula says."""
    rng = np.random.default_rng(0)
    for seeds in (10, 20):
        tables = rng.normal(0.0, 0.05, size=(4000, seeds))
        shown = np.mean([verdict(list(gains)).non_inferior for gains in tables])
        assert shown == pytest.approx(non_inferior_power(0.0, 0.05, seeds), abs=0.025), seeds
    assert non_inferior_power(0.0, 0.05, 10) < 0.6 < non_inferior_power(0.0, 0.05, 20), "ten seeds are too few"
    assert non_inferior_power(-0.05, 0.05, 30) < 0.05, "a real loss beyond the margin is rarely passed"
    with pytest.raises(ValueError):
        non_inferior_power(0.0, 0.05, 1)


def test_still_climbing_is_what_the_last_half_adds_beyond_a_third_of_the_gain_over_seeds():
    # gains of 0.12 whose last halves add 0.06 and 0.05 (beyond a third: +0.02, +0.01): ahead
    climbing = still_climbing([0.4, 0.4], [0.46, 0.47], [0.52, 0.52])
    assert climbing.mean == pytest.approx(0.015) and climbing.seeds == 2
    assert still_climbing([0.4] * 3, [0.46, 0.47, 0.465], [0.52, 0.52, 0.52]).ahead
    levelled = still_climbing([0.4] * 3, [0.51, 0.50, 0.52], [0.52, 0.52, 0.53])  # a tenth of the gain late
    assert levelled.mean < 0 and not levelled.ahead
    with pytest.raises(ValueError, match="a seed"):
        still_climbing([0.4], [0.5, 0.5], [0.6])


def test_a_curve_that_dips_and_comes_back_is_not_climbing_by_a_third():
    # 0.13 -> 0.11 -> 0.13: the last half beats a third of a gain of nothing, which proves no climb
    dipped = ([0.13, 0.12, 0.14], [0.11, 0.10, 0.12], [0.13, 0.12, 0.135])
    assert still_climbing(*dipped).ahead and not climbing_by_a_third(*dipped)
    assert climbing_by_a_third([0.4] * 3, [0.46, 0.47, 0.465], [0.52, 0.52, 0.52])
    assert not climbing_by_a_third([0.4] * 3, [0.51, 0.50, 0.52], [0.52, 0.52, 0.53])  # levelled off


def test_still_rising_is_what_the_last_half_adds_over_seeds_whatever_the_first_half_gained():
    # last halves adding 0.01-0.02 after a first half of 0.10: a tenth of the gain, and still rising
    rising = still_rising([0.50, 0.51, 0.50], [0.52, 0.52, 0.51])
    assert rising.mean == pytest.approx(0.0133, abs=1e-4) and rising.ahead
    assert not still_climbing([0.4] * 3, [0.50, 0.51, 0.50], [0.52, 0.52, 0.51]).ahead
    levelled = still_rising([0.52, 0.50, 0.51], [0.51, 0.52, 0.51])
    assert not levelled.ahead
    with pytest.raises(ValueError, match="a seed"):
        still_rising([0.5, 0.5], [0.6])


def test_against_the_margin_reads_mean_se_bound_and_whether_it_is_non_inferior():
    shown = verdict([0.01, -0.01, 0.0, 0.02])
    assert shown.against_margin() == f"{shown.mean:+.3f} ({shown.se:.3f}), bound {shown.lower:+.3f}: non-inferior"
    lost = verdict([-0.10, -0.02, -0.06])
    assert lost.against_margin().endswith(f"bound {lost.lower:+.3f}: not shown non-inferior")
