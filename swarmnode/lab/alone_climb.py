"""Is training alone still climbing at the end of an ablation's own runs?

Target 3 of the learning work is judged where alone has room at the end. bench/climb.py asks
that of a candidate shape with its own runs (named by the candidate, so other prompts); this asks
it of the alone runs a table was read against, so a table says itself whether its shape had room.
The ablation evaluates at a few points (every fifth of the run by default), so the half-way
accuracy is read between the two evaluations around the middle where none falls on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmnode.lab.ablation import ALONE, ConditionRun, by_member
from swarmnode.lab.verdicts import Verdict, climbing_by_a_third, still_climbing, still_rising, verdict


@dataclass(frozen=True)
class AloneClimb:
    """One member's alone runs over seeds: its gain, what the last half adds, and beyond a third."""

    label: str
    gain: Verdict
    last_half: Verdict  # still_rising: ahead where alone had room at the end
    beyond_third: Verdict  # still_climbing: what the last half adds beyond a third of the gain
    qualifies: bool  # climbing_by_a_third: the gain shown, and the last half beyond a third of it


def accuracy_at(curve: list[tuple[int, int, float]], rounds_done: float) -> float:
    """Held-out accuracy after `rounds_done` rounds, linear between the evaluations around it."""
    points = sorted((done, accuracy) for done, _, accuracy in curve)
    if not points or not points[0][0] <= rounds_done <= points[-1][0]:
        raise ValueError(f"no evaluations around round {rounds_done} (curve {points})")
    for (left, low), (right, high) in zip(points, points[1:]):
        if left <= rounds_done <= right:
            return low if right == left else low + (high - low) * (rounds_done - left) / (right - left)
    return points[0][1]  # a curve of one evaluation, at rounds_done itself


def alone_climbs(runs: list[ConditionRun], rounds: int) -> list[AloneClimb]:
    """Per member, in the order members first appear, its alone runs' climb over `rounds`
    (one value a seed, each run read at 0, rounds / 2 and rounds)."""
    found = []
    for (condition, label), seeded in by_member(runs).items():
        if condition != ALONE:
            continue
        before = [accuracy_at(member.curve, 0) for _, member in seeded]
        half = [accuracy_at(member.curve, rounds / 2) for _, member in seeded]
        after = [accuracy_at(member.curve, rounds) for _, member in seeded]
        found.append(AloneClimb(label, verdict([a - b for b, a in zip(before, after)]), still_rising(half, after),
                                still_climbing(before, half, after), climbing_by_a_third(before, half, after)))
    return found
