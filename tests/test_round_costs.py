"""What groups on top cost a node's round (swarmnode.loop.round_costs): timed, pinned, kept."""

from __future__ import annotations

import math

import pytest

from swarmnode.loop.round_costs import ON_TOP_COST, RoundCosts
from swarmnode.sizing.cost import GEN_SHARE, CostModel


def test_until_a_round_is_timed_the_cost_model_s_share_prices_groups_on_top():
    costs = RoundCosts()
    assert costs.gen_share == GEN_SHARE
    assert costs.on_top_groups(16) == math.floor(ON_TOP_COST / (1 - GEN_SHARE) * 16) == 22


def test_the_share_follows_this_node_s_timings_a_running_mean():
    """0.3 s a sequence and 0.1 s a sample: generation is 0.75 of a round alone, and a tenth of a
    round trains 0.4 of a batch more (6 of 16 groups). A slower trainer then pays for fewer."""
    costs = RoundCosts()
    costs.note(generate_s=9.6, generated=32, train_s=6.4, trained=64)
    assert costs.gen_share == pytest.approx(0.75)
    assert costs.on_top_groups(16) == 6
    for _ in range(30):
        costs.note(generate_s=9.6, generated=32, train_s=19.2, trained=64)  # 0.3 s a sample
    assert costs.gen_share == pytest.approx(0.5, abs=0.01) and costs.on_top_groups(16) == 3


@pytest.mark.parametrize("reading", [(0.0, 32, 1.0, 64), (1.0, 0, 1.0, 64), (1.0, 32, float("nan"), 64),
                                     (1.0, 32, -1.0, 64), (1.0, 32, 1.0, 0)])
def test_a_round_without_a_usable_timing_changes_nothing(reading):
    costs = RoundCosts()
    costs.note(*reading)
    assert costs.generate_s_per_sequence is None and costs.gen_share == GEN_SHARE


def test_a_pinned_share_overrides_the_clock_and_a_bad_one_is_refused():
    costs = RoundCosts()
    costs.note(generate_s=9.6, generated=32, train_s=6.4, trained=64)
    costs.pin(0.7)
    assert costs.gen_share == 0.7 and costs.on_top_groups(16) == 5
    assert CostModel(0.7).round_cost(16, 16 + 5, 16, 16) <= 1 + ON_TOP_COST, "what it takes costs at most a tenth"
    with pytest.raises(ValueError, match="generation's share"):
        costs.pin(1.0)


def test_a_resumed_node_prices_as_it_left_off_and_times_afresh_after_a_bad_checkpoint():
    costs = RoundCosts()
    costs.note(generate_s=9.6, generated=32, train_s=6.4, trained=64)
    resumed = RoundCosts()
    resumed.restore(costs.checkpoint_state())
    assert resumed.gen_share == pytest.approx(0.75)
    for bad in ({}, {"generate_s_per_sequence": "x", "train_s_per_sample": 0.1},
                {"generate_s_per_sequence": 0.3, "train_s_per_sample": float("inf")}):
        resumed.restore(bad)
        assert resumed.gen_share == GEN_SHARE
