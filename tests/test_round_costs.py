"""What far groups on top cost a node's round (swarmnode.loop.round_costs): timed, pinned, kept."""

from __future__ import annotations

import math

import pytest

from swarmnode.loop.round_costs import ON_TOP_COST, RoundCosts, RoundTimes
from swarmnode.sizing.cost import FORWARD_OF_STEP, GEN_SHARE, CostModel

# a round alone: 7 s generating, 3 s training on 3,000 own tokens (1 ms a token): 10 s
ALONE = RoundTimes(generate_s=7.0, whole_batch=True, train_s=3.0, own_tokens=3000, trained_tokens=3000)
# four far groups on top, 800 tokens kept, 0.4 s screening them; the step 4,000 tokens in 4 s
ON_TOP = RoundTimes(generate_s=7.0, whole_batch=True, train_s=4.0, own_tokens=3000, trained_tokens=4000,
                    on_top_groups=4, on_top_screen_s=0.4, on_top_tokens=800)


def _timed(*rounds: RoundTimes) -> RoundCosts:
    costs = RoundCosts()
    for times in (ALONE, *rounds):  # the first round is warm-up
        costs.note(times)
    return costs


def test_until_its_work_is_timed_the_cost_model_s_share_prices_groups_on_top():
    costs = RoundCosts()
    costs.note(ALONE)
    assert costs.alone_round_s is None, "the first round is warm-up"
    assert costs.on_top_groups(16) == math.floor(ON_TOP_COST / (1 - GEN_SHARE) * 16) == 22


def test_a_tenth_of_a_round_alone_pays_for_the_groups_its_timings_price():
    """A round alone 10 s; a group on top 0.1 s screening and 0.2 s of the step (200 tokens at
    1 ms): 0.3 s, so a tenth of a round (1 s) pays for three."""
    costs = _timed(ALONE, ON_TOP)
    assert costs.alone_round_s == pytest.approx(10.0)
    assert costs.on_top_group_s == pytest.approx(0.3)
    assert costs.on_top_groups(16) == 3


def test_longer_completions_on_top_buy_fewer_groups_and_the_means_run():
    """A peer's groups twice as long cost twice the step: the running cost a group moves a
    fifth of the way a round, and fewer groups come."""
    longer = RoundTimes(generate_s=7.0, whole_batch=True, train_s=4.6, own_tokens=3000, trained_tokens=4600,
                        on_top_groups=4, on_top_screen_s=0.4, on_top_tokens=1600)
    costs = _timed(ALONE, ON_TOP, longer)
    assert costs.on_top_group_s == pytest.approx(0.8 * 0.3 + 0.2 * 0.5)
    assert costs.on_top_groups(16) == 2
    for _ in range(30):
        costs.note(longer)
    assert costs.on_top_group_s == pytest.approx(0.5, abs=1e-3) and costs.on_top_groups(16) == 2


def test_a_round_alone_is_timed_only_where_the_whole_batch_was_generated():
    """Generation at a share of the batch runs at another speed on a GPU: those rounds say
    nothing of a round alone, though their groups on top are priced."""
    half = RoundTimes(generate_s=2.0, whole_batch=False, train_s=4.0, own_tokens=1500, trained_tokens=4000,
                      on_top_groups=4, on_top_screen_s=0.4, on_top_tokens=800)
    costs = _timed(half)
    assert costs.alone_round_s is None and costs.on_top_group_s == pytest.approx(0.3)


@pytest.mark.parametrize("broken", [
    RoundTimes(generate_s=7.0, whole_batch=True, train_s=0.0, own_tokens=3000, trained_tokens=3000),
    RoundTimes(generate_s=7.0, whole_batch=True, train_s=float("nan"), own_tokens=3000, trained_tokens=3000),
    RoundTimes(generate_s=-1.0, whole_batch=True, train_s=3.0, own_tokens=3000, trained_tokens=3000),
    RoundTimes(generate_s=7.0, whole_batch=True, train_s=3.0, own_tokens=0, trained_tokens=0),
])
def test_a_round_without_a_usable_timing_changes_nothing(broken):
    costs = _timed(broken)
    assert costs.alone_round_s is None and costs.on_top_groups(16) == 22


def test_a_pinned_share_prices_by_the_cost_model_not_the_clock():
    costs = _timed(ALONE, ON_TOP)
    costs.pin(0.7)
    assert costs.on_top_groups(16) == 5
    assert CostModel(0.7).round_cost(16, 16 + 5, 16, 16) <= 1 + ON_TOP_COST < CostModel(0.7).round_cost(16, 16 + 6, 16, 16)
    costs.pin(1.0)
    assert costs.on_top_groups(16) >= 16, "generation is the whole round: training on top costs nothing"
    with pytest.raises(ValueError, match="generation's share"):
        costs.pin(1.5)


def test_a_resumed_node_prices_as_it_left_off_and_times_afresh_after_a_bad_checkpoint():
    costs = _timed(ALONE, ON_TOP)
    resumed = RoundCosts()
    resumed.restore(costs.checkpoint_state())
    assert resumed.on_top_groups(16) == 3
    for bad in ({}, {"alone_round_s": "x", "on_top_group_s": 0.3}, {"alone_round_s": 10.0, "on_top_group_s": float("inf")}):
        resumed.restore(bad)
        assert resumed.on_top_groups(16) == 22


def test_groups_measured_come_out_of_the_same_tenth_priced_as_a_forward_pass():
    """At generation 0.7 a group on top costs 0.3 / 16 of a round alone and a group measured a
    third of that: a tenth pays for 5.3 on top, so one measured beside them leaves five, two
    leave four, sixteen none, and five on top leave room to measure one. Grading alone, with no
    forward pass, costs the model nothing, also where the groups on top fill the tenth exactly."""
    costs = RoundCosts()
    costs.pin(0.7)
    group_on_top = (1 - 0.7) / 16
    assert [costs.on_top_groups(16, measured) for measured in (0, 1, 2)] == [5, 5, 4]
    assert costs.measured_groups(16, on_top=5) == 1 and costs.measured_groups(16, on_top=4) == 4
    for on_top in range(6):
        measured = costs.measured_groups(16, on_top)
        assert on_top * group_on_top + measured * FORWARD_OF_STEP * group_on_top <= ON_TOP_COST + 1e-12
    assert costs.on_top_groups(16, measured=16) == 0
    assert costs.on_top_groups(16, measured=16, forward=False) == 5
    assert costs.measured_groups(16, on_top=5, forward=False) == 16, "only the room bounds what grading costs nothing"
    assert costs.measured_groups(16, on_top=6) == 0
    costs.pin(0.84)  # a group on top 0.01 of a round: ten fill the tenth, to its rounding
    assert costs.on_top_groups(16) == 10 and costs.measured_groups(16, on_top=10, forward=False) == 16


def test_a_node_s_clock_prices_a_group_measured_once_it_measured_some():
    """A round alone 10 s and a group on top 0.3 s (as above): until a group measured is timed
    it is priced a third of a group on top (0.1 s), so measuring one leaves 0.9 s, three groups;
    timed at 0.3 s a group (a slow grader), measuring one leaves 0.7 s, two."""
    costs = _timed(ALONE, ON_TOP)
    assert costs.measured_group_s is None and costs.on_top_groups(16, measured=1) == 3
    assert costs.measured_groups(16, on_top=3) == 1
    costs.note(RoundTimes(generate_s=7.0, whole_batch=True, train_s=3.0, own_tokens=3000, trained_tokens=3000,
                          measured_groups=2, measure_s=0.4))
    assert costs.measured_group_s == pytest.approx(0.2)
    assert costs.on_top_groups(16, measured=1) == 2 and costs.measured_groups(16, on_top=2) == 2
    resumed = RoundCosts()
    resumed.restore(costs.checkpoint_state())
    assert resumed.measured_group_s == pytest.approx(0.2), "kept across a restart"
    for bad in ("x", -0.2, float("nan"), None):
        resumed.restore({**costs.checkpoint_state(), "measured_group_s": bad})
        assert resumed.measured_group_s is None and resumed.on_top_groups(16, measured=1) == 3, "timed afresh"


def test_a_sender_s_long_groups_price_a_group_measured_no_higher_than_a_group_on_top():
    """A group measured is run forward once; one on top is screened and trained besides. One far
    identity's groups 2 s to grade price a measured group at no more than a group on top (0.3 s),
    so setting its price aside cuts one group on top at most, not all three."""
    costs = _timed(ALONE, ON_TOP, RoundTimes(generate_s=7.0, whole_batch=True, train_s=3.0, own_tokens=3000,
                                             trained_tokens=3000, measured_groups=1, measure_s=2.0))
    assert costs.measured_group_s == pytest.approx(2.0)
    assert costs.on_top_groups(16, measured=1) == 2 and costs.measured_groups(16, on_top=2) == 1
