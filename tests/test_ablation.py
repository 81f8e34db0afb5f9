"""The ablation's bookkeeping (swarmnode/lab/ablation.py): batch composition, seeds, paired errors."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from swarmnode.lab.ablation import (
    ALONE,
    SETTINGS,
    BudgetClock,
    ConditionRun,
    CostModel,
    Gain,
    Member,
    MemberRun,
    Setting,
    Shape,
    alone_shape,
    area_gains,
    budget_gains,
    control_judged,
    control_limit_se,
    control_mismatch,
    control_warnings,
    counterpart_round,
    diagnostics,
    eval_rounds,
    expected_samples,
    matched_rounds,
    member_config,
    paired_gains,
    parse_condition,
    pooled_gain,
    rate_scaled,
    round_at_budget,
    run_condition,
    running_lead,
)
from swarmnode.lab.fingerprint import records_digest
from swarmnode.loop.round_costs import RoundCosts
from swarmnode.loop.share import SMOOTHING
from swarmnode.ops.lines import RoundRecord
from tests.test_intake import FAR_RULES_OFF

# The gate and the far-peer rules (on by default with a shared batch) would make peers' counts vary.
FAST = Shape(rounds=3, prompts_per_round=4, group_size=4, max_new_tokens=6, eval_size=8, eval_points=1,
             overrides=("trust.likelihood_gate=false", *FAR_RULES_OFF))
SAME = SETTINGS["same"]


@pytest.mark.parametrize(
    "condition,accounting,own,peers",
    [(ALONE, "shared", 16, 0), ("f-tis", "shared", 8, 8), ("nois", "on-top", 16, 16)],
)
def test_each_member_trains_on_the_batch_its_accounting_promises(condition, accounting, own, peers):
    run = run_condition(SAME, condition, accounting, seed=0, shape=FAST)
    assert expected_samples(condition, accounting, 2, FAST) == (own, peers)
    assert [m.label for m in run.members] == ["tiny", "tiny-b"]
    for member in run.members:
        assert len(member.rounds) == FAST.rounds
        assert [(r.own_samples, r.peer_samples) for r in member.rounds] == [(own, peers)] * FAST.rounds
        assert [point[0] for point in member.curve] == [0, *eval_rounds(FAST)]
        assert member.curve[-1][1] == member.tokens_generated > 0


def test_a_shared_batch_halves_the_generation_of_two_members():
    alone = run_condition(SAME, ALONE, "shared", seed=0, shape=FAST)
    shared = run_condition(SAME, "f-tis", "shared", seed=0, shape=FAST)
    gain = next(g for g in paired_gains([alone, shared]) if g.condition == "f-tis" and g.label == "tiny")
    assert 0.3 < gain.tokens_share < 0.7
    assert gain.before == alone.members[0].before, "same seed, same model: the same starting accuracy"


def test_an_unknown_objective_fails_before_any_training():
    with pytest.raises(ValueError, match="ppo"):
        run_condition(SAME, "ppo", "shared", seed=0, shape=FAST)


def _member(label: str, after: float, tokens: int = 100) -> MemberRun:
    record = RoundRecord(
        round=0, peer_id=label, reward_mean=0.5, peer_reward_mean=None, own_samples=8, peer_samples=8, peers=1,
        gated=0, below_bar=0, peer_weight_scale=None, filtered=0, filtered_frac=0.0, weight_mean=1.0, weight_max=2.0,
        truncated_frac=0.0, divergence_mean=0.5, loss=0.0, grad_norm=0.0, wire_bytes=0, wire_tokens=tokens,
        rejected=0, peer_age_s=None, peer_lag=None, tokens_per_s=0.0,
    )
    return MemberRun(label, before=0.5, after=after, rounds=[record])


def test_gains_are_paired_by_seed_with_the_standard_error_over_seeds():
    runs = []
    for seed, (alone_a, alone_b, pair_a, pair_b) in enumerate([(0.50, 0.70, 0.55, 0.70), (0.60, 0.80, 0.62, 0.74),
                                                               (0.40, 0.60, 0.49, 0.66)]):
        runs.append(ConditionRun(ALONE, "shared", seed, [_member("a", alone_a), _member("b", alone_b)]))
        runs.append(ConditionRun("f-tis", "shared", seed, [_member("a", pair_a, 50), _member("b", pair_b, 50)]))
    gains = {(g.label, g.condition): g for g in paired_gains(runs)}
    a = gains[("a", "f-tis")]
    diffs = [0.05, 0.02, 0.09]
    assert a.gain == pytest.approx(sum(diffs) / 3)
    mean = sum(diffs) / 3
    assert a.se == pytest.approx(math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2 / 3))
    assert a.seeds == 3 and a.tokens_share == pytest.approx(0.5) and a.after == pytest.approx((0.55 + 0.62 + 0.49) / 3)
    b = gains[("b", "f-tis")]
    assert b.gain == pytest.approx((0.0 - 0.06 + 0.06) / 3)
    assert gains[("a", ALONE)].gain == 0.0
    against_b_alone = {g.label: g for g in paired_gains(runs, baseline="f-tis")}
    assert against_b_alone["a"].gain == 0.0 and paired_gains(runs, baseline="vis") == []
    one_seed = paired_gains(runs[:2])
    assert all(math.isnan(g.se) for g in one_seed)
    rows = diagnostics(runs)
    assert rows[("f-tis", "a")]["weight_max"] == 2.0 and rows[("f-tis", "a")]["peer_samples"] == 8


def test_the_peers_reward_lead_is_kept_as_the_rule_keeps_it_and_skips_rounds_without_peers():
    rounds = []
    for own, theirs in [(0.5, 0.7), (0.5, None), (0.25, 0.75)]:
        record = _member("a", 0.5).rounds[0]
        record.reward_mean, record.peer_reward_mean = own, theirs
        rounds.append(record)
    first = SMOOTHING * 0.2  # from a prior of no lead
    assert running_lead(rounds) == pytest.approx([first, (1 - SMOOTHING) * first + SMOOTHING * 0.5])
    runs = [ConditionRun("f-tis", "shared", seed, [MemberRun("a", 0.5, 0.5, rounds=rounds)]) for seed in (0, 1)]
    assert diagnostics(runs)[("f-tis", "a")]["reward_lead"] == pytest.approx(statistics.median(running_lead(rounds)))
    assert math.isnan(diagnostics([ConditionRun(ALONE, "shared", 0, [_member("a", 0.5)])])[(ALONE, "a")]["reward_lead"])


def test_a_seed_whose_run_ended_before_alone_s_round_count_is_left_out_and_counted():
    """Step-matched, a time-matched run whose rounds cost more than alone's ends before alone's
    round count: that seed has no point to compare, and the gain says how many it left out."""
    record = _member("a", 0.5).rounds[0]
    runs = []
    for seed, rounds_together in enumerate([2, 1, 2]):
        runs.append(ConditionRun(ALONE, "shared", seed, [MemberRun("a", 0.5, 0.6, rounds=[record, record])]))
        runs.append(ConditionRun("f-tis", "shared", seed,
                                 [MemberRun("a", 0.5, 0.7, rounds=[record] * rounds_together, time_matched_at=rounds_together)]))
    step = next(g for g in paired_gains(runs, match="step") if g.condition == "f-tis")
    assert (step.seeds, step.unevaluated) == (2, 1) and step.gain == pytest.approx(0.1)
    time = next(g for g in paired_gains(runs, match="time") if g.condition == "f-tis")
    assert (time.seeds, time.unevaluated) == (3, 0)


def test_a_row_that_leaves_out_every_seed_is_kept_with_no_seeds():
    """A row whose every run ended before alone's round count is still a row, so a table says it
    is missing instead of dropping it without a word."""
    record = _member("a", 0.5).rounds[0]
    runs = []
    for seed in range(2):
        runs.append(ConditionRun(ALONE, "shared", seed, [MemberRun("a", 0.5, 0.6, rounds=[record, record])]))
        runs.append(ConditionRun("f-tis", "shared", seed, [MemberRun("a", 0.5, 0.7, rounds=[record], time_matched_at=1)]))
    step = next(g for g in paired_gains(runs, match="step") if g.condition == "f-tis")
    assert (step.seeds, step.unevaluated) == (0, 2) and math.isnan(step.gain)
    assert not step.verdict.non_inferior and control_warnings([step]) == []


def test_a_condition_without_its_alone_run_is_left_out():
    runs = [ConditionRun(ALONE, "shared", 0, [_member("a", 0.5)]), ConditionRun("nois", "shared", 1, [_member("a", 0.6)])]
    assert [(g.label, g.condition) for g in paired_gains(runs)] == [("a", ALONE)]


def test_a_condition_is_an_objective_with_optional_settings():
    assert parse_condition("f-tis") == ("f-tis", ())
    assert parse_condition("f-tis:loss.filter_g=5:loss.trunc_c=4") == ("f-tis", ("loss.filter_g=5", "loss.trunc_c=4"))
    assert parse_condition(ALONE) == ("nois", ())
    with pytest.raises(ValueError, match="ppo"):
        parse_condition("ppo:loss.filter_g=5")
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        parse_condition("f-tis:loss.filter_g")
    with pytest.raises(ValueError, match="alone takes no settings"):
        parse_condition("alone:loss.filter_g=5")


def test_a_condition_s_settings_win_over_the_shape_s_and_the_member_s(tmp_path):
    objective, overrides = parse_condition("f-tis:loss.filter_g=7:train.lr=2e-4")
    member = Member("lora", ("model.lora.rank=16", "train.lr=3e-4"))
    config = member_config(tmp_path, member, FAST, 0, objective, 0.5, 8, overrides)
    assert (config.loss.objective, config.loss.filter_g, config.train.lr) == ("f-tis", 7.0, 2e-4)
    assert config.model.lora.rank == 16 and config.trust.likelihood_gate is False  # the member's, the shape's


def test_a_scaled_rate_scales_each_member_from_its_own_rate_and_keeps_the_rest(tmp_path):
    shape = dataclasses.replace(FAST, overrides=(*FAST.overrides, "train.lr=5e-5"))  # a member's own setting wins
    setting = Setting("lora", "tiny and tiny LoRA", (Member("tiny"), Member("tiny-lora", ("model.lora.rank=16", "train.lr=3e-4"))))
    scaled = rate_scaled(setting, shape, 0.0625)
    configs = [member_config(tmp_path, m, shape, 0, "f-tis", 0.5, 8) for m in scaled.members]
    assert [c.train.lr for c in configs] == pytest.approx([5e-5 * 0.0625, 3e-4 * 0.0625])
    assert (scaled.name, [m.label for m in scaled.members]) == ("lora", ["tiny", "tiny-lora"])
    assert configs[1].model.lora.rank == 16 and configs[0].model.lora.rank == 0
    assert rate_scaled(setting, shape, 1.0) is setting  # unscaled: the same runs, the same run files


def _gain(label: str, condition: str, gain: float, se: float, seeds: int = 5) -> Gain:
    return Gain(label, condition, 0.5, 0.5 + gain, gain, se, seeds, 0.5)


def test_the_control_warns_only_outside_the_t_interval_of_its_seeds():
    """At 5 seeds the 95 % line is t(4) = 2.78 SE, at 30 about 2.05: a gain of 2.5 SE is off
    with 30 seeds and within the noise of 5; one seed cannot be judged."""
    assert control_limit_se(5) == pytest.approx(2.776, abs=1e-3)
    assert control_limit_se(30) == pytest.approx(2.045, abs=1e-3)
    gains = [_gain("tiny", ALONE, 0.0, 0.0), _gain("tiny", "nois", -0.030, 0.010), _gain("tiny-b", "nois", -0.025, 0.010),
             _gain("tiny", "f-tis", 0.05, float("nan")), _gain("tiny", "vis", -0.025, 0.010, seeds=30)]
    warnings = control_warnings(gains)
    assert len(warnings) == 2
    assert "tiny under nois gains -0.030" in warnings[0] and "2.78 SE" in warnings[0]
    assert "tiny under vis gains -0.025" in warnings[1] and "2.05 SE" in warnings[1]
    assert control_judged("shared", "step")
    assert not control_judged("on-top", "step") and not control_judged("shared", "time"), "a copy is worth something there"


def test_time_matching_trains_the_rounds_that_fit_alone_s_modelled_time():
    """With generation 94 % of a round alone: a member that generates half its batch and trains
    on a full one costs 0.47 + 0.06 of a round alone; one that generates all of it and trains on
    twice the samples costs 0.94 + 0.12."""
    shape = Shape(rounds=200, match="time", gen_share=0.94)
    assert matched_rounds("f-tis", "shared", 2, shape) == round(200 / 0.53) == 377
    assert matched_rounds("f-tis", "on-top", 2, shape) == round(200 / 1.06) == 189
    assert matched_rounds("f-tis", "shared", 4, shape) == round(200 / (0.94 / 4 + 0.06))
    assert matched_rounds(ALONE, "shared", 2, shape) == 200
    assert matched_rounds("f-tis", "shared", 2, Shape(rounds=200)) == 200, "step-matched: the same rounds"
    assert matched_rounds("f-tis", "shared", 2, Shape(rounds=200, match="time", gen_share=0.0)) == 200
    assert CostModel(0.94).round_cost(50, 200, 100, 100) == pytest.approx(0.47 + 0.12)


def test_an_alone_run_is_the_same_at_every_generation_share_so_one_is_kept_for_all():
    """Alone trains its rounds whatever the cost model says (each costs one round alone), so
    the run kept at the default share is the run a table at another `--gen-share` would make;
    the share still sets how long a member together trains."""
    shape = dataclasses.replace(FAST, match="time", gen_share=0.5)
    at_half = run_condition(SAME, ALONE, "shared", 0, shape)
    at_default = run_condition(SAME, ALONE, "shared", 0, alone_shape(shape))
    assert alone_shape(shape).gen_share == Shape().gen_share != shape.gen_share
    assert alone_shape(shape) == dataclasses.replace(shape, gen_share=Shape().gen_share), "nothing else changes"
    assert records_digest([dataclasses.asdict(at_half)]) == records_digest([dataclasses.asdict(at_default)])
    assert matched_rounds(ALONE, "shared", 1, shape) == matched_rounds(ALONE, "shared", 1, alone_shape(shape)) == 3
    assert matched_rounds("f-tis", "shared", 2, shape) != matched_rounds("f-tis", "shared", 2, alone_shape(shape))


def test_each_member_prices_groups_on_top_at_the_bench_s_generation_share_not_its_clock(monkeypatch):
    """The bench prices rounds by its cost model, so a member's bound on groups on top
    (loop.round_costs) takes the model's share, not what the CPU's clock says."""
    priced_at, on_top_groups = [], RoundCosts.on_top_groups
    def recording(costs, batch_groups, *args):
        priced_at.append(costs.pinned)
        return on_top_groups(costs, batch_groups, *args)
    monkeypatch.setattr(RoundCosts, "on_top_groups", recording)
    run_condition(SAME, "f-tis", "shared", 0, dataclasses.replace(FAST, gen_share=0.5))
    assert len(priced_at) >= 2 * FAST.rounds and set(priced_at) == {0.5}, "every member's every round"


def test_a_time_matched_run_is_judged_at_the_step_matched_round_and_at_its_end():
    shape = Shape(**{**FAST.__dict__, "match": "time"})
    alone = run_condition(SAME, ALONE, "shared", seed=0, shape=shape)
    together = run_condition(SAME, "f-tis", "shared", seed=0, shape=shape)
    rounds = matched_rounds("f-tis", "shared", 2, shape)
    assert rounds > FAST.rounds
    for member in together.members:
        assert len(member.rounds) == rounds
        assert FAST.rounds in [done for done, _, _ in member.curve] and member.curve[-1][0] == rounds
    tiny = together.members[0]
    step = {g.label: g for g in paired_gains([alone, together], match="step") if g.condition == "f-tis"}["tiny"]
    time = {g.label: g for g in paired_gains([alone, together], match="time") if g.condition == "f-tis"}["tiny"]
    assert step.after == tiny.accuracy_at(FAST.rounds) and time.after == tiny.after
    assert step.time_share == pytest.approx(0.53, abs=0.05), "half the generation, the same samples trained"
    assert time.time_share == pytest.approx(1.0, abs=0.12), "the budget of alone's rounds, spent"
    assert alone.members[0].modelled_time(alone.members[0], CostModel()) == pytest.approx(FAST.rounds)


def test_on_top_a_time_matched_run_is_judged_before_its_end_and_a_missing_point_is_no_number():
    """On top a round costs more than one alone: the time-matched point comes before the
    step-matched one, and both are evaluated; a round never evaluated gives nan, not the end."""
    shape = Shape(**{**FAST.__dict__, "rounds": 10, "match": "time"})
    matched = matched_rounds("f-tis", "on-top", 2, shape)
    assert matched < shape.rounds
    alone = run_condition(SAME, ALONE, "on-top", seed=0, shape=shape)
    together = run_condition(SAME, "f-tis", "on-top", seed=0, shape=shape)
    tiny = together.members[0]
    assert len(tiny.rounds) == shape.rounds and {matched, shape.rounds} <= {done for done, _, _ in tiny.curve}
    time = {g.label: g for g in paired_gains([alone, together], match="time") if g.condition == "f-tis"}["tiny"]
    assert time.after == tiny.accuracy_at(matched) and time.time_share == pytest.approx(1.0, abs=0.2)
    assert math.isnan(tiny.accuracy_at(1))


def test_a_time_matched_run_is_evaluated_where_it_meets_each_of_alone_s_points():
    """Shared, 187 rounds cost what 100 alone do: alone is evaluated at 20 .. 100, so the run
    at 37, 75, 112, 150 and 187; on top, 53 rounds cost 100, so it meets them at 11 .. 53."""
    shape = Shape(rounds=100, eval_points=4, match="time")
    assert eval_rounds(shape) == [20, 40, 60, 80, 100]
    assert {37, 75, 112, 150, 187} <= set(eval_rounds(shape, 187))
    assert {counterpart_round(r, 53, 100) for r in eval_rounds(shape)} == {11, 21, 32, 42, 53}
    assert {11, 21, 32, 42, 53, 100} <= set(eval_rounds(shape, 53))
    assert counterpart_round(1, 10, 100) == 1, "never round 0: the run has not trained there"


def _curved(label: str, curve: list[tuple[int, float]], rounds: int, matched: int | None = None) -> MemberRun:
    member = _member(label, curve[-1][1])
    return MemberRun(label, before=0.4, after=curve[-1][1], curve=[(done, 0, acc) for done, acc in curve],
                     rounds=member.rounds * rounds, time_matched_at=matched)


def _two_seeds_time_matched() -> list[ConditionRun]:
    """Alone 20 rounds (points 10, 20) and f-tis time-matched in 40 (points 20, 40), two seeds;
    nois step-matched."""
    return [
        ConditionRun(ALONE, "shared", 0, [_curved("a", [(10, 0.50), (20, 0.60)], 20)]),
        ConditionRun(ALONE, "shared", 1, [_curved("a", [(10, 0.40), (20, 0.70)], 20)]),
        ConditionRun("f-tis", "shared", 0, [_curved("a", [(20, 0.58), (40, 0.62)], 40, matched=40)]),
        ConditionRun("f-tis", "shared", 1, [_curved("a", [(20, 0.46), (40, 0.66)], 40, matched=40)]),
        ConditionRun("nois", "shared", 0, [_curved("a", [(10, 0.9), (20, 0.9)], 20)]),
    ]


def test_time_matched_gains_are_paired_at_each_budget_of_alone_s_curve():
    """Alone trains 20 rounds (points 10, 20); together 40 in that time (points 20, 40): the
    budget of 10 rounds alone meets round 20 together, that of 20 meets 40. A seed whose run
    missed a point is left out of that budget only; a step-matched run has no budgets."""
    runs = _two_seeds_time_matched()
    gains = {(g.condition, g.alone_rounds): g for g in budget_gains(runs)}
    assert set(gains) == {("f-tis", 10), ("f-tis", 20)}
    early, late = gains[("f-tis", 10)], gains[("f-tis", 20)]
    assert (early.rounds, late.rounds) == (20, 40)
    assert early.gain == pytest.approx((0.08 + 0.06) / 2) and early.se == pytest.approx(0.01)
    assert late.gain == pytest.approx((0.02 - 0.04) / 2) and late.seeds == 2
    runs[3].members[0].curve = [(40, 0, 0.66)]  # seed 1 never evaluated at round 20
    gains = {(g.condition, g.alone_rounds): g for g in budget_gains(runs)}
    assert gains[("f-tis", 10)].seeds == 1 and gains[("f-tis", 10)].gain == pytest.approx(0.08)
    assert gains[("f-tis", 20)].seeds == 2


def test_the_budget_gain_is_each_seed_s_mean_over_alone_s_points_judged_over_seeds():
    """Seed 0 gains 0.08 and 0.02 at alone's two points, seed 1 0.06 and -0.04: budget gains 0.05
    and 0.01, mean 0.03, SE 0.02. A step-matched run has no budget gain."""
    runs = _two_seeds_time_matched()
    (area,) = area_gains(runs)
    assert (area.label, area.condition, area.budgets) == ("a", "f-tis", 2)
    assert area.verdict.mean == pytest.approx(0.03) and area.verdict.se == pytest.approx(0.02)
    assert area.verdict.seeds == 2


def _round(own: int, peers: int) -> RoundRecord:
    return dataclasses.replace(_member("a", 0.5).rounds[0], own_samples=own, peer_samples=peers)


def test_a_member_whose_cost_varies_is_priced_as_it_runs_and_meets_alone_where_it_spent_its_budgets():
    """Generation 90 % of a round alone (16 samples generated and trained): a round that generates
    half and trains on the whole batch costs 0.55 of one alone, a round alone's whole batch 1.
    Budgets of 1 and 2 rounds alone: two half rounds spend 1.1 (nearer 1 than the next, 1.65),
    then whole rounds reach 2.1 at the third."""
    clock = BudgetClock([1, 2], CostModel(0.9), full=16)
    assert [clock.tick(_round(8, 8), 1), clock.tick(_round(8, 8), 2)] == [False, True]
    assert clock.crossed == {1: 2} and not clock.done
    assert clock.tick(_round(16, 0), 3) and clock.crossed == {1: 2, 2: 3} and clock.done
    member = MemberRun("a", 0.4, 0.6, curve=[(0, 0, 0.4), (2, 0, 0.5), (3, 0, 0.6)], time_matched_at=3,
                       budget_rounds=clock.crossed)
    assert [round_at_budget(member, b, 2) for b in (1, 2)] == [2, 3], "priced as it ran"
    fixed = MemberRun("a", 0.4, 0.6, time_matched_at=4)
    assert [round_at_budget(fixed, b, 2) for b in (1, 2)] == [2, 4], "a constant cost: its counterpart rounds"


def test_the_round_kept_for_a_budget_is_the_one_nearest_it_not_the_first_past_it():
    """A round that generates 15 of 16 and trains on 16 costs 0.944 of one alone: 0.06 short of a
    budget of 1 round, where the next such round would end 0.89 past it, so the first is kept."""
    clock = BudgetClock([1, 2], CostModel(0.9), full=16)
    assert clock.tick(_round(15, 1), 1) and clock.crossed == {1: 1}, "short of the budget, yet nearest it"
    assert clock.tick(_round(15, 1), 2) and clock.crossed == {1: 1, 2: 2}
    late = BudgetClock([1], CostModel(0.9), full=16)
    assert not late.tick(_round(8, 0), 1), "0.5 spent: the next such round ends at 1, nearer"


def test_a_time_matched_member_that_goes_alone_stops_where_it_spent_alone_s_time():
    """tiny and the addition specialist with an adaptive share: each finds the other's samples
    over half a nat a token less likely than its own, so from its third round on it generates its
    whole batch; it spends alone's 3 rounds' time in 4 rounds (0.535 + 0.535 + 1 + 1), not in
    the 6 that a fixed half share takes, is evaluated there and judged there."""
    shape = Shape(rounds=3, prompts_per_round=4, group_size=4, max_new_tokens=6, eval_size=8, eval_points=1,
                  overrides=("trust.likelihood_gate=false", *FAR_RULES_OFF, "node.adapt_share_nats=0.5",
                             "node.far_room=own"), match="time")
    expertise = SETTINGS["expertise"]
    run = run_condition(expertise, "f-tis", "shared", seed=0, shape=shape)
    alone = run_condition(expertise, ALONE, "shared", seed=0, shape=shape)
    assert matched_rounds("f-tis", "shared", 2, shape) == 6
    gains = {g.label: g for g in paired_gains([alone, run], match="time")}
    for member in run.members:
        assert [r.own_samples for r in member.rounds] == [8, 8, 16, 16], "half the batch, measured far, then all of it"
        assert member.budget_rounds == {2: 3, 3: 4} and member.time_matched_at == 4
        assert {3, 4} <= {done for done, _, _ in member.curve}
        assert 0.9 < gains[member.label].time_share < 1.2, "judged after alone's modelled time, not the 6 rounds planned"


def test_the_control_s_pooled_gain_averages_its_members_per_seed():
    """Two members, two seeds: gains (+0.1, -0.1) and (+0.3, +0.1) pool to 0.0 and 0.2 a seed."""
    runs = [
        ConditionRun(ALONE, "shared", 0, [_curved("a", [(20, 0.5)], 20), _curved("b", [(20, 0.7)], 20)]),
        ConditionRun(ALONE, "shared", 1, [_curved("a", [(20, 0.4)], 20), _curved("b", [(20, 0.6)], 20)]),
        ConditionRun("f-tis", "shared", 0, [_curved("a", [(20, 0.6)], 20), _curved("b", [(20, 0.6)], 20)]),
        ConditionRun("f-tis", "shared", 1, [_curved("a", [(20, 0.7)], 20), _curved("b", [(20, 0.7)], 20)]),
    ]
    pooled = pooled_gain(runs, "f-tis")
    assert pooled.mean == pytest.approx(0.1) and pooled.se == pytest.approx(0.1) and pooled.seeds == 2
    assert pooled_gain(runs, "nois") is None


def test_the_pooled_gain_against_an_objective_reads_both_where_alone_s_rounds_or_time_end():
    """On top, two members a seed: alone trains 20 rounds, f-tis and lower 20 as well but spend
    alone's time at round 18. Against f-tis, step-matched pools the members' differences at round
    20 (seed 0: +0.02 and +0.04, seed 1: +0.02 and 0.00: +0.03 and +0.01 a seed), time-matched at
    round 18 on both sides (+0.01 and -0.01 a seed), never lower's 18 against f-tis's 20 (-0.09 and
    -0.11)."""
    def seeded(seed: int, fits: tuple[float, float], lower: tuple[float, float]) -> list[ConditionRun]:
        def members(accuracies: tuple[float, float], late: float) -> list[MemberRun]:
            return [_curved(label, [(18, acc), (20, acc + late)], 20, matched=18) for label, acc in zip("ab", accuracies)]
        return [
            ConditionRun(ALONE, "on-top", seed, [_curved("a", [(20, 0.5)], 20), _curved("b", [(20, 0.5)], 20)]),
            ConditionRun("f-tis", "on-top", seed, members(fits, 0.10)),
            ConditionRun("lower", "on-top", seed, members(lower, 0.12)),
        ]

    runs = seeded(0, (0.60, 0.60), (0.60, 0.62)) + seeded(1, (0.60, 0.62), (0.60, 0.60))
    step = pooled_gain(runs, "lower", "step", baseline="f-tis")
    time = pooled_gain(runs, "lower", "time", baseline="f-tis")
    assert step.seeds == time.seeds == 2
    assert step.mean == pytest.approx(0.02) and step.se == pytest.approx(0.01)
    assert time.mean == pytest.approx(0.0) and time.se == pytest.approx(0.01)
    assert pooled_gain(runs, "lower", "time").mean == pytest.approx((0.11 + 0.10) / 2), "lower at 18, alone at its end"
    assert pooled_gain(runs, "lower", baseline="nois") is None


def test_against_a_time_matched_nois_run_step_means_alone_s_round_count_on_both_sides():
    """Alone trains 20 rounds, nois and f-tis 40 in that time (evaluated at 20 on the way).
    Step-matched against nois compares both at round 20, time-matched at their ends; a seed
    never evaluated at round 20 is left out rather than turned into a nan that breaks the mean."""
    def seeded(seed: int, fits: float, nois: float, f_20: bool = True) -> list[ConditionRun]:
        return [
            ConditionRun(ALONE, "shared", seed, [_curved("a", [(10, 0.5), (20, 0.6)], 20)]),
            ConditionRun("nois", "shared", seed, [_curved("a", [(20, nois), (40, nois + 0.1)], 40, matched=40)]),
            ConditionRun("f-tis", "shared", seed, [_curved("a", [(20, fits), (40, fits + 0.2)] if f_20 else [(40, fits + 0.2)], 40, matched=40)]),
        ]

    runs = seeded(0, 0.60, 0.50) + seeded(1, 0.70, 0.50) + seeded(2, 0.90, 0.50, f_20=False)
    step = {g.condition: g for g in paired_gains(runs, baseline="nois", match="step")}
    time = {g.condition: g for g in paired_gains(runs, baseline="nois", match="time")}
    assert step["f-tis"].gain == pytest.approx(0.15) and step["f-tis"].seeds == 2, "0.10 and 0.20 at round 20"
    assert time["f-tis"].gain == pytest.approx((0.2 + 0.3 + 0.5) / 3) and time["f-tis"].seeds == 3
    assert step[ALONE].gain == pytest.approx(0.10), "alone at 20 against nois at 20"


def test_time_matched_against_an_objective_whose_rounds_cost_more_both_sides_are_taken_where_alone_s_time_ends():
    """On top, a round costs more than alone's: the runs train alone's 20 rounds and spend alone's
    time at round 18. Time-matched against f-tis, both are read at round 18, not the candidate at
    18 and f-tis at 20 (which would credit f-tis with two rounds it had no time for)."""
    runs = [
        ConditionRun(ALONE, "on-top", 0, [_curved("a", [(20, 0.60)], 20)]),
        ConditionRun("f-tis", "on-top", 0, [_curved("a", [(18, 0.62), (20, 0.70)], 20, matched=18)]),
        ConditionRun("nois", "on-top", 0, [_curved("a", [(18, 0.63), (20, 0.64)], 20, matched=18)]),
    ]
    time = {g.condition: g for g in paired_gains(runs, baseline="f-tis", match="time")}
    assert time["nois"].gain == pytest.approx(0.01)


@pytest.mark.parametrize("scale", ["0", "-1", "nan", "half"])
def test_the_bench_refuses_a_rate_scale_that_is_not_above_zero_before_training(scale, tmp_path):
    bench = Path(__file__).resolve().parents[1] / "bench" / "ablation.py"
    done = subprocess.run([sys.executable, str(bench), "--lr-scale", scale, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--lr-scale" in done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written or trained


def _saved_control(setting: Setting, accounting: str, shape: Shape) -> dict:
    """A control's file as the bench's `save` writes it (JSON: tuples become lists)."""
    return json.loads(json.dumps({"setting": dataclasses.asdict(setting), "accounting": accounting,
                                  "shape": dataclasses.asdict(shape), "runs": []}))


def test_a_control_from_a_file_must_be_the_control_of_this_shape_rate_and_accounting():
    control = SETTINGS["same"]
    shape = dataclasses.replace(FAST, match="time", gen_share=0.7)
    assert control_mismatch(_saved_control(control, "shared", shape), control, "shared", shape) == []
    at_093 = _saved_control(control, "shared", dataclasses.replace(shape, gen_share=0.93))
    assert [d.split()[0] for d in control_mismatch(at_093, control, "shared", shape)] == ["gen_share"]
    slower = dataclasses.replace(shape, overrides=(*shape.overrides, "train.lr=6.25e-6"))
    assert [d.split()[0] for d in control_mismatch(_saved_control(control, "shared", shape), control, "shared", slower)] == ["overrides"]
    assert [d.split()[0] for d in control_mismatch(_saved_control(control, "on-top", shape), control, "shared", shape)] == ["accounting"]
    scaled = rate_scaled(control, shape, 0.0625)
    assert [d.split()[0] for d in control_mismatch(_saved_control(control, "shared", shape), scaled, "shared", shape)] == ["members"]


def test_a_control_written_before_a_shape_field_existed_ran_at_its_default():
    old = _saved_control(SETTINGS["same"], "shared", FAST)
    del old["shape"]["gen_share"], old["shape"]["match"]
    assert control_mismatch(old, SETTINGS["same"], "shared", FAST) == []
    assert control_mismatch(old, SETTINGS["same"], "shared", dataclasses.replace(FAST, match="time")) != []


def test_a_control_trained_under_other_defaults_is_no_yardstick():
    """A default that changed (the far-peer rules, 2026-12-03) changes what `f-tis` ran: a control
    file recording other defaults is refused; one written before files recorded them is read."""
    saved = {**_saved_control(SETTINGS["same"], "shared", FAST), "defaults": "a" * 64}
    assert control_mismatch(saved, SETTINGS["same"], "shared", FAST, "a" * 64) == []
    differ = control_mismatch(saved, SETTINGS["same"], "shared", FAST, "b" * 64)
    assert differ == [f"defaults {'a' * 16} (here {'b' * 16}: a default changed since it ran)"]
    assert control_mismatch(_saved_control(SETTINGS["same"], "shared", FAST), SETTINGS["same"], "shared", FAST,
                            "b" * 64) == []


def test_the_bench_refuses_a_control_of_another_shape_before_training(tmp_path):
    control = tmp_path / "control.json"
    control.write_text(json.dumps(_saved_control(SETTINGS["same"], "shared", Shape(rounds=100, eval_size=200, match="time"))))
    bench = Path(__file__).resolve().parents[1] / "bench" / "ablation.py"
    done = subprocess.run([sys.executable, str(bench), "--setting", "expertise", "--objectives", "f-tis", "--match", "time",
                           "--rounds", "100", "--eval-size", "200", "--gen-share", "0.7", "--control-from", str(control),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "not this table's control" in done.stderr and "gen_share 0.93 (here 0.7)" in done.stderr
    assert not (tmp_path / "out" / "runs").exists()  # refused before any run was trained


LARGE_COPIES = Setting("custom", "copies", (Member("tiny-large", ("model.name=tiny-large",)),
                                            Member("tiny-large-b", ("model.name=tiny-large",))))


@pytest.mark.parametrize(("setting", "header"), [
    (SETTINGS["same"], "control (same: two copies of tiny"),
    (LARGE_COPIES, "control (tiny-large, tiny-large-b, read as copies of one model)"),
])
def test_a_saved_control_is_read_back_with_its_equivalence(tmp_path, setting, header):
    """`--from` a control's file (or `--control-from` it) prints its step-matched verdicts, pooled,
    under the name of the members it ran, not always the `same` setting's."""
    def member(label: str, before: float, after: float) -> dict:
        return dataclasses.asdict(MemberRun(label, before, after, [(0, 0, before), (FAST.rounds, 100, after)]))

    first, second = (m.label for m in setting.members)
    runs = [dataclasses.asdict(ConditionRun(condition, "shared", seed, []))
            | {"members": [member(first, 0.4, 0.6 + shift), member(second, 0.4, 0.61 - shift)]}
            for seed, shift in enumerate((0.0, 0.01, -0.01)) for condition in (ALONE, "f-tis")]
    saved = tmp_path / "same.json"
    saved.write_text(json.dumps(_saved_control(setting, "shared", FAST) | {"runs": runs}))
    bench = Path(__file__).resolve().parents[1] / "bench" / "ablation.py"
    done = subprocess.run([sys.executable, str(bench), "--from", str(saved), "--control-from", str(saved),
                           "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "pooled       f-tis                  +0.000 (0.000), 3 seed(s)" in done.stdout
    assert header in done.stdout
