"""An ablation's own alone runs say whether its shape still climbs at the end."""

from __future__ import annotations

import pytest

from swarmnode.lab.ablation import ALONE, ConditionRun, MemberRun
from swarmnode.lab.alone_climb import accuracy_at, alone_climbs


def curve(*accuracies: float) -> list[tuple[int, int, float]]:
    """Evaluations every 20 rounds from 0 (the ablation's default five points a run)."""
    return [(20 * index, 1000 * index, accuracy) for index, accuracy in enumerate(accuracies)]


def test_accuracy_is_read_at_an_evaluation_or_between_the_two_around_it():
    points = curve(0.0, 0.1, 0.2, 0.4, 0.5, 0.6)
    assert accuracy_at(points, 40) == pytest.approx(0.2)
    assert accuracy_at(points, 50) == pytest.approx(0.3)  # half-way between 0.2 at 40 and 0.4 at 60
    assert accuracy_at(points, 100) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="round 120"):
        accuracy_at(points, 120)


def test_alone_runs_that_climb_late_qualify_and_levelled_ones_do_not():
    late = [curve(0.01, 0.01, 0.02, 0.02 + d, 0.03 + d, 0.05 + d) for d in (0.0, 0.005, 0.01, 0.002)]
    flat = [curve(0.40, 0.55, 0.60, 0.61 + d, 0.61, 0.61 + d) for d in (0.0, 0.005, 0.01, 0.002)]
    runs = [ConditionRun(ALONE, "shared", seed, [MemberRun("late", rising[0][2], rising[-1][2], rising),
                                                MemberRun("flat", levelled[0][2], levelled[-1][2], levelled)])
            for seed, (rising, levelled) in enumerate(zip(late, flat))]
    # a swarm's run is not alone's: it must not enter the verdict
    runs.append(ConditionRun("f-tis", "shared", 0, [MemberRun("late", 0.0, 0.0, curve(0.9, 0, 0, 0, 0, 0.0))]))
    climbs = {climb.label: climb for climb in alone_climbs(runs, 100)}
    assert list(climbs) == ["late", "flat"] and climbs["late"].gain.seeds == 4
    assert climbs["late"].qualifies and climbs["late"].last_half.ahead
    assert not climbs["flat"].qualifies and climbs["flat"].beyond_third.mean < 0
