"""Screening peers' samples: the likelihood gate, balanced advantages, the weight budget, and the
one strike they give (swarmnode.screening)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.learn.alignment import SpanBatch, Spans
from swarmnode.learn.loss import group_advantages, importance_weights, objective_terms
from swarmnode.learn.sample import Group, Sample
from swarmnode.screening.budget import WeightBudget
from swarmnode.screening.gate import (
    ANCHOR_FOLLOW,
    GATE_MIN_OWN,
    Anchor,
    AnchorBar,
    gate_bar,
    least_likely_window,
    own_near_bar,
)
from swarmnode.screening.screen import Screening, balanced_advantages, loss_weight, screen
from swarmnode.screening.screener import Screener
from swarmnode.settings.config import LossSettings, TrustSettings, load_config
from swarmnode.settings.registry import OBJECTIVES
from swarmnode.tasks.base import Problem

LOSS = LossSettings()
TRUST = TrustSettings()


def _sample(source: str, logprobs: np.ndarray, advantage: float = 0.0, prompt: int = 1) -> Sample:
    return Sample([prompt], np.zeros(len(logprobs), np.int32), np.asarray(logprobs, np.float32), advantage, source=source)


def _grouped(samples: list[Sample]) -> list[Group]:
    """Samples in groups: consecutive ones of one sender and prompt."""
    groups: list[Group] = []
    for sample in samples:
        if not groups or (groups[-1].source, groups[-1].prompt_ids) != (sample.source, sample.prompt_ids):
            groups.append(Group(sample.source, Problem(0, "1+1", "2"), sample.prompt_ids))
        groups[-1].samples.append(sample)
    return groups


class _Flat:
    """A screening read per sample, in the order the samples went in."""

    def __init__(self, result: Screening) -> None:
        samples = result.samples
        self.keep = [s.verdict.kept for s in samples]
        self.below_bar_flags = [s.verdict.below_bar for s in samples]
        self.near_bar_flags = [s.verdict.near_bar for s in samples]
        self.weight_scale = [s.verdict.weight_scale for s in samples]
        self.advantages = [s.advantage for s in samples]
        self.verdicts = result.peers
        self.gated, self.below_bar = result.gated, result.below_bar


def _screen_samples(samples, theta, own, trust, loss, anchor=None) -> _Flat:
    return _Flat(screen(_grouped(samples), theta, own, trust, loss, anchor))


def _screen(peers, advantages, gen, theta, own, trust, loss):
    """screen() on peers' samples made of parallel lists: senders, advantages, reported log-probs."""
    samples = [_sample(peer, g, a) for peer, a, g in zip(peers, advantages, gen)]
    return _screen_samples(samples, theta, [_sample("", o) for o in own], trust, loss)


def _own(count: int = 16, level: float = -0.5, length: int = 12, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [level + 0.1 * rng.standard_normal(length) for _ in range(count)]


def test_a_short_unlikely_phrase_is_not_averaged_away():
    likely = np.full(200, -0.3)
    injected = likely.copy()
    injected[100:108] = -12.0  # 8 unlikely tokens in 200
    assert injected.mean() > -1.0  # the whole-completion mean barely moves ...
    assert least_likely_window(injected, 8) == pytest.approx(-12.0)  # ... the worst window does
    assert least_likely_window(likely, 8) == pytest.approx(-0.3)
    assert least_likely_window(np.array([-1.0, -3.0]), 8) == pytest.approx(-2.0)  # shorter than a window
    assert least_likely_window(np.array([]), 8) == 0.0


def test_the_bar_comes_from_our_own_samples():
    own = _own()
    scores = [least_likely_window(lp, TRUST.gate_window) for lp in own]
    assert gate_bar(own, TRUST) == pytest.approx(np.quantile(scores, TRUST.gate_quantile) - TRUST.gate_margin)
    assert gate_bar(own[: GATE_MIN_OWN - 1], TRUST) is None  # too few to set a bar: no gate


def test_samples_our_model_finds_implausible_are_gated():
    own = _own()
    honest = _own(8, seed=1)
    poisoned = [lp.copy() for lp in _own(8, seed=2)]
    for lp in poisoned[:4]:
        lp[:6] = -10.0  # half of its samples carry text our model would never write
    peers = ["honest"] * 8 + ["evil"] * 8
    theta = honest + poisoned
    result = _screen(peers, [1.0] * 16, theta, theta, own, TRUST, LOSS)  # log-probs reported truthfully
    assert result.keep == [True] * 8 + [False] * 4 + [True] * 4
    assert result.gated == 4
    assert (result.verdicts["evil"].samples, result.verdicts["evil"].gated) == (8, 4)
    assert result.verdicts["honest"].gated == 0


def test_failing_the_gate_drops_samples_but_is_never_a_strike():
    """A peer with another model honestly writes text ours finds unlikely: its samples leave
    the batch, the peer stays (a ban would end the collaboration the swarm is for)."""
    own = _own()
    unlike = [np.full(12, -8.0) for _ in range(8)]  # every sample far below the bar
    result = _screen(["other-model"] * 8, [0.5] * 8, unlike, unlike, own, TRUST, LOSS)
    assert result.keep == [False] * 8
    assert result.verdicts["other-model"].gated == 8
    assert result.verdicts["other-model"].strikes == []


def test_only_samples_with_a_positive_advantage_are_gated():
    """Poison is learned only through a positive advantage; an unlikely sample that scores at
    or below its group's mean stays (it pushes its text down, or moves nothing)."""
    own = _own()
    likely, unlikely = _own(1, seed=5)[0], np.full(12, -8.0)
    theta = [likely, unlikely, unlikely]  # the right answer likely, the others not
    result = _screen(["p"] * 3, [0.75, 0.0, -0.25], theta, theta, own, TRUST, LOSS)
    assert result.keep == [True, True, True]
    assert (result.gated, result.below_bar) == (0, 2)
    everything = _screen(["p"] * 3, [0.75, 0.0, -0.25], theta, theta, own, TrustSettings(gate_scope="all"), LOSS)
    assert everything.keep == [True, False, False]
    # its right answer unlikely too: gated, and the wrong one, balanced to nothing, goes with it
    unlikely_all = [unlikely] * 3
    result = _screen(["p"] * 3, [0.75, 0.0, -0.25], unlikely_all, unlikely_all, own, TRUST, LOSS)
    assert result.keep == [False, True, False] and result.gated == 2, "the wrong one left because of the gate"


def test_a_group_whose_unlikely_samples_are_negative_keeps_zero_mean_advantages():
    """The gate runs after a group's advantages were computed; gating its wrong answers would
    leave the kept advantages summing above zero (wrong answers under-penalised: a biased
    gradient). Under the default scope such a group is left untouched."""
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    advantages = group_advantages(rewards).tolist()
    own = _own()
    likely, unlikely = np.full(12, -0.5), np.full(12, -8.0)
    theta = [likely] * 5 + [unlikely] * 3  # the unlikely ones are three of the wrong answers
    kept = _screen(["p"] * 8, advantages, theta, theta, own, TRUST, LOSS).keep
    assert kept == [True] * 8
    assert sum(a for a, k in zip(advantages, kept) if k) == pytest.approx(0.0, abs=1e-6)
    old_rule = _screen(["p"] * 8, advantages, theta, theta, own, TrustSettings(gate_scope="all"), LOSS).keep
    assert sum(a for a, k in zip(advantages, old_rule) if k) > 0.5  # the bias the default removes


def test_the_gate_can_be_turned_off():
    own = _own()
    theta = [np.full(12, -10.0)]
    off = TrustSettings(likelihood_gate=False)
    assert _screen(["p"], [1.0], theta, theta, own, off, LOSS).keep == [True]
    assert _screen(["p"], [1.0], theta, theta, own, TRUST, LOSS).keep == [False]


def test_a_falsified_low_log_prob_buys_no_weight():
    """Reporting log pi_gen = -20 would give every token the cap C; the budget scales it back
    to a mean of 1, and the claim is a strike."""
    own = _own()
    theta = _own(8, seed=3)
    liar = _screen(["liar"] * 8, [1.0] * 8, [np.full(12, -20.0)] * 8, theta, own, TRUST, LOSS)
    verdict = liar.verdicts["liar"]
    assert verdict.weight_mean == pytest.approx(LOSS.trunc_c)
    assert verdict.weight_scale == pytest.approx(1 / LOSS.trunc_c)
    assert liar.weight_scale == [pytest.approx(1 / LOSS.trunc_c)] * 8
    assert "mean importance weight of 2.00" in verdict.strikes[0]
    truthful = _screen(["peer"] * 8, [1.0] * 8, theta, theta, own, TRUST, LOSS)
    assert truthful.weight_scale == [1.0] * 8 and truthful.verdicts["peer"].strikes == []
    unbudgeted = _screen(["liar"] * 8, [1.0] * 8, [np.full(12, -20.0)] * 8, theta, own, TrustSettings(weight_budget=False), LOSS)
    assert unbudgeted.weight_scale == [1.0] * 8  # off: the weights stand (the strike still counts)
    assert unbudgeted.verdicts["liar"].strikes


def test_by_span_a_low_log_prob_buys_no_weight_either_but_is_no_proof():
    """A peer of another tokenizer reports log-probs per span of its own segmentation, whose
    probability is only a lower bound on its text's: a high weight there is held to the budget
    like any other, but proves no lie, so it is no strike."""
    own, theta = _own(), _own(8, seed=3)
    by_span = [
        replace(_sample("other", np.zeros(12), 1.0), logprobs=None, spans=Spans(np.arange(12) // 3, np.full(4, -20.0, np.float32)))
        for _ in range(8)
    ]
    result = _screen_samples(by_span, theta, [_sample("", o) for o in own], TRUST, LOSS)
    verdict = result.verdicts["other"]
    assert verdict.weight_mean == pytest.approx(LOSS.trunc_c) and result.weight_scale == [pytest.approx(1 / LOSS.trunc_c)] * 8
    assert verdict.strikes == []


@settings(max_examples=60, deadline=None)
@given(
    reported=st.lists(st.floats(-30, 0, allow_nan=False), min_size=1, max_size=40),
    objective=st.sampled_from(["tis", "f-tis", "vis", "f-vis", "nois"]),
)
def test_whatever_a_peer_reports_its_mean_weight_is_at_most_one(reported, objective):
    loss = LossSettings(objective=objective)
    theta = np.linspace(-3.0, -0.1, len(reported))
    gen = np.array(reported)
    result = _screen(["p"], [1.0], [gen], [theta], _own(), TrustSettings(likelihood_gate=False), loss)
    log_w = torch.tensor(theta - gen, dtype=torch.float32).clamp(-loss.log_ratio_clamp, loss.log_ratio_clamp)
    raw = {"nois": torch.ones_like(log_w), "vis": log_w.exp(), "f-vis": log_w.exp()}.get(
        objective, log_w.exp().clamp(max=loss.trunc_c)
    )
    assert float((raw * result.weight_scale[0]).mean()) <= 1.0 + 1e-5


def test_the_weight_scale_multiplies_a_sequence_s_weights():
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    gen = torch.full((2, 3), -1.5)
    mask = torch.ones(2, 3, dtype=torch.bool)
    advantages = torch.tensor([1.0, 1.0])
    full = objective_terms(logp, gen, mask, advantages, LOSS)
    halved = objective_terms(logp, gen, mask, advantages, LOSS, weight_scale=torch.tensor([1.0, 0.5]))
    assert float(halved.loss_sum.detach()) == pytest.approx(0.75 * float(full.loss_sum.detach()))


def test_wrong_answers_whose_right_ones_were_gated_push_nothing_down():
    """A group whose right answers carry text we would not write loses them to the gate; its
    wrong answers must not then push down what every answer of the group shares."""
    own = _own()
    likely, unlikely = _own(1, seed=3)[0], np.full(12, -10.0)
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    advantages = group_advantages(rewards, False).tolist()
    theta = [unlikely] * 2 + [likely] * 6  # two of the three right answers are unlikely
    samples = [_sample("p", lp, a, prompt=7) for lp, a in zip(theta, advantages)]
    result = _screen_samples(samples, theta, [_sample("", o) for o in own], TRUST, LOSS)
    assert result.keep == [False, False] + [True] * 6
    kept = [a for a, k in zip(result.advantages, result.keep) if k]
    assert sum(kept) == pytest.approx(0.0, abs=1e-6), "the kept advantages of the group balance"
    assert kept[0] == pytest.approx(advantages[2]), "the kept right answer keeps its advantage"
    assert all(a < 0 for a in kept[1:]), "wrong answers still count against, in proportion"
    all_gated = _screen_samples(samples, [unlikely] * 3 + [likely] * 5, [_sample("", o) for o in own], TRUST, LOSS)
    assert all_gated.keep == [False] * 8, "no right answer left: its wrong ones teach nothing and take no room"
    # a second group of another prompt, with nothing gated, is left as it was
    other = [_sample("p", likely, a, prompt=8) for a in advantages]
    result = _screen_samples(samples + other, theta + [likely] * 8, [_sample("", o) for o in own], TRUST, LOSS)
    assert result.advantages[8:] == pytest.approx(advantages)


BALANCED = TrustSettings(balance_by_weight=True)


def test_balance_by_weight_shrinks_wrong_answers_that_outweigh_the_right_one():
    """A far peer's right answer, which our model would not write, weighs little in the loss;
    its wrong answers close to our policy weigh up to C. Counted by weight, they shrink until
    they no longer outweigh it; off (the default) the group is left as it was."""
    own = _own()
    advantages = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0])).tolist()  # 0.75, -0.25 x3
    theta = [np.full(12, -1.2)] + [np.full(12, -0.5)] * 3
    gen = [np.full(12, -0.2)] + [np.full(12, -1.0)] * 3  # weights e^-1 and e^0.5
    samples = [_sample("p", g, a) for g, a in zip(gen, advantages)]
    own_samples = [_sample("", o) for o in own]
    off = _screen_samples(samples, theta, own_samples, TRUST, LOSS)
    assert off.keep == [True] * 4 and off.advantages == pytest.approx(advantages)
    on = _screen_samples(samples, theta, own_samples, BALANCED, LOSS)
    assert on.keep == [True] * 4
    assert on.advantages[0] == pytest.approx(advantages[0]), "a right answer keeps its advantage"
    weights = [loss_weight(sample, t, LOSS) for sample, t in zip(samples, theta)]
    assert weights == pytest.approx([np.exp(-1.0)] + [np.exp(0.5)] * 3, rel=1e-5)
    assert sum(a * w for a, w in zip(on.advantages, weights)) == pytest.approx(0.0, abs=1e-6)
    assert all(a < 0 for a in on.advantages[1:]), "wrong answers still count against, in proportion"


def test_balance_by_weight_counts_a_sample_the_filter_drops_as_nothing():
    """A wrong answer far from our policy is dropped by F-TIS's filter; it pushes nothing down,
    so it takes no part in the balance. Under the soft filter it counts its share."""
    own_samples = [_sample("", o) for o in _own()]
    advantages = group_advantages(torch.tensor([1.0, 0.0, 0.0])).tolist()  # 2/3, -1/3, -1/3
    theta = [np.full(12, -0.5), np.full(12, -10.0), np.full(12, -0.5)]
    gen = [np.full(12, -0.5), np.full(12, -0.1), np.full(12, -0.5)]  # the far one: k3 ~ e^9.9
    samples = [_sample("p", g, a) for g, a in zip(gen, advantages)]
    assert loss_weight(samples[1], theta[1], LOSS) == 0.0
    on = _screen_samples(samples, theta, own_samples, BALANCED, LOSS)
    assert on.advantages == pytest.approx(advantages), "what the filter keeps balances already"
    soft = LossSettings(filter_shape="soft")
    assert 0.0 < loss_weight(samples[1], theta[1], soft) < 0.01
    # its right answer gated: its wrong one goes with it, filtered or not (it would take room)
    theta[0] = np.full(12, -10.0)
    gated = _screen_samples(samples[:2], theta[:2], own_samples, BALANCED, LOSS)
    assert gated.keep == [False] * 2 and gated.gated == 2


def test_balance_by_weight_takes_a_sample_s_weight_as_the_loss_does():
    """loss_weight is the loss's mean weight of a sequence (objective_terms), none where its
    filter drops it: per token, by span, clipped for vis."""
    rng = np.random.default_rng(4)
    for objective in ("f-tis", "tis", "vis", "f-vis", "nois"):
        loss = LossSettings(objective=objective)
        for advantage in (0.5, -0.5):
            for far in (False, True):
                theta = rng.normal(-1.0, 0.5, 10).astype(np.float32)
                gen = (theta + (6.0 if far else rng.normal(0.0, 0.5, 10))).astype(np.float32)
                sample = _sample("p", gen, advantage)
                terms = objective_terms(torch.from_numpy(theta)[None], torch.from_numpy(gen)[None],
                                        torch.ones(1, 10, dtype=torch.bool), torch.tensor([advantage]), loss)
                expected = 0.0 if bool(terms.filtered[0]) else terms.weight_sum / terms.tokens
                assert loss_weight(sample, theta, loss) == pytest.approx(expected, rel=1e-5, abs=1e-7)
    spans = Spans(np.array([0, 0, 1, 2, 2, 2]), np.array([-1.0, -0.5, -2.5], np.float32))
    theta = np.array([-0.3, -0.4, -0.9, -0.2, -0.1, -0.6], np.float32)
    sample = Sample([1], np.zeros(6, np.int32), None, -0.5, source="p", spans=spans)
    terms = objective_terms(torch.from_numpy(theta)[None], torch.zeros(1, 6), torch.ones(1, 6, dtype=torch.bool),
                            torch.tensor([-0.5]), LOSS, spans=SpanBatch.of([spans], 6))
    assert not bool(terms.filtered[0])
    assert loss_weight(sample, theta, LOSS) == pytest.approx(terms.weight_sum / terms.tokens, rel=1e-5)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-1, 1), st.floats(0, 2), st.booleans()), min_size=1, max_size=12))
def test_balancing_by_weight_never_grows_an_advantage_and_leaves_no_net_push_down(rows):
    """Whatever the weights and the gate left: positive advantages are untouched, negative ones
    only shrink, and the kept samples' weighted advantages never sum below zero."""
    samples = [_sample("p", np.zeros(2), a) for a, _, _ in rows]
    weights, keep = [w for _, w, _ in rows], [k for _, _, k in rows]
    balanced = balanced_advantages(samples, keep, weights)
    for (a, _, _), b in zip(rows, balanced):
        assert (b == a) if a >= 0 else (a <= b <= 0)
    assert sum(b * w for b, w, k in zip(balanced, weights, keep) if k) >= -1e-9


def test_the_anchored_gate_holds_what_our_model_learned_to_like():
    """A sample our drifted model now finds likely still fails when the reference does not."""
    own, likely = _own(), _own(1, seed=4)[0]
    sample = _sample("crowd", likely, advantage=0.5)
    anchored = Anchor(logprobs=[np.full(12, -10.0)], bar=-1.5)
    assert _screen_samples([sample], [likely], [_sample("", o) for o in own], TRUST, LOSS).keep == [True]
    result = _screen_samples([sample], [likely], [_sample("", o) for o in own], TRUST, LOSS, anchored)
    assert result.keep == [False] and result.below_bar_flags == [True]


def test_the_anchored_bar_follows_our_samples_slowly_and_never_falls_past_its_slack():
    trust = TrustSettings(anchor_slack=1.0)
    bar = AnchorBar(trust.anchor_slack)
    start = bar.update(_own(level=-0.5), trust)
    assert start == pytest.approx(gate_bar(_own(level=-0.5), trust))
    lower = _own(level=-3.0)  # our samples as the reference now sees them: far less likely
    moved = bar.update(lower, trust)
    assert start - 0.2 < moved < start, "one round moves the bar a little way"
    for _ in range(200):
        moved = bar.update(lower, trust)
    assert moved == pytest.approx(start - trust.anchor_slack), "never below start - slack"
    higher = bar.update(_own(level=-0.1), trust)
    assert higher > moved, "it follows back up"
    resumed = AnchorBar(trust.anchor_slack)
    resumed.resume(start, None)
    assert resumed.update(lower, trust) == pytest.approx(moved_once := start + ANCHOR_FOLLOW * (gate_bar(lower, trust) - start))
    assert moved_once < start


def test_a_sample_that_passes_a_bar_by_a_hair_is_kept_but_flagged_near_it():
    """Near-bar samples still train (an honest peer's unlikely right answers do), but earn their
    sender no standing: passing by a hair is how a patient attacker walks a gate."""
    own = [_sample("", o) for o in _own()]
    bar = gate_bar([s.logprobs for s in own], TRUST)
    hair, clear, under = (np.full(12, bar + d) for d in (0.5 * TRUST.near_bar, 2 * TRUST.near_bar, -0.5))
    samples = [_sample("p", x, advantage=0.5) for x in (hair, clear, under)]
    result = _screen_samples(samples, [hair, clear, under], own, TRUST, LOSS)
    assert result.keep == [True, True, False]
    assert result.near_bar_flags == [True, False, True] and result.below_bar_flags == [False, False, True]
    anchored = Anchor(logprobs=[np.zeros(12), np.full(12, -1.0), np.zeros(12)], bar=-1.0 - 0.5 * TRUST.near_bar)
    result = _screen_samples(samples, [clear, clear, clear], own, TRUST, LOSS, anchored)
    assert result.near_bar_flags == [False, True, False], "the anchored bar counts too"
    flat = _screen_samples(samples, [hair, clear, under], own, TrustSettings(near_bar=0.0), LOSS)
    assert flat.near_bar_flags == [False, False, True]


def test_our_own_samples_are_held_to_the_near_bar_rule_a_peer_s_samples_meet():
    """A copy of our model sends samples distributed as ours: judged by one rule, as many of
    ours as of its sit near a bar, so the copy's usefulness can equal our own share."""
    own = [_sample("", o) for o in _own()]
    bar = gate_bar([s.logprobs for s in own], TRUST)
    hair, clear = np.full(12, bar + 0.5 * TRUST.near_bar), np.full(12, bar + 2 * TRUST.near_bar)
    ours = own + [_sample("", hair), _sample("", clear)]
    copy = [_sample("copy", s.logprobs) for s in ours]
    by_screen = _screen_samples(copy, [s.logprobs for s in copy], ours, TRUST, LOSS).near_bar_flags
    assert own_near_bar(ours, TRUST) == by_screen
    assert by_screen[-2:] == [True, False] and not any(by_screen[:-2])
    reference = [np.zeros(12)] * len(ours)
    reference[0] = np.full(12, -1.0)
    anchored = Anchor(logprobs=reference, bar=-1.0 - 0.5 * TRUST.near_bar)
    assert own_near_bar(ours, TRUST, anchored)[0], "the anchored bar counts for ours too"
    assert own_near_bar(ours, TRUST, anchored) == _screen_samples(copy, [s.logprobs for s in copy], ours, TRUST, LOSS, anchored).near_bar_flags


def test_two_groups_of_one_sender_and_prompt_are_balanced_apart():
    """A group is a record, not a run of neighbours: two groups of the same peer for the same
    prompt (two of its rounds) side by side are balanced each by its own samples."""
    own, likely, unlikely = _own(), _own(1, seed=3)[0], np.full(12, -10.0)
    advantages = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), False).tolist()
    first = Group("p", Problem(0, "1+1", "2"), [7], [_sample("p", likely, a, prompt=7) for a in advantages])
    second = Group("p", Problem(0, "1+1", "2"), [7], [_sample("p", likely, a, prompt=7) for a in advantages])
    theta = [unlikely] + [likely] * 3 + [likely] * 4  # the first group's right answer is gated
    result = screen([first, second], theta, [_sample("", o) for o in own], TRUST, LOSS)
    assert [s.verdict.kept for s in result.groups[0].samples] == [False] * 4, "nothing right left: its wrong ones go"
    assert [s.advantage for s in result.groups[1].samples] == pytest.approx(advantages), "the other group untouched"


def test_a_sample_carries_its_generator_s_log_probs_per_token_or_by_span_never_both():
    tokens = np.zeros(4, np.int32)
    spans = Spans(np.array([0, 0, 1, 1]), np.array([-1.0, -2.0], np.float32))
    assert Sample([1], tokens, None, 0.0, spans=spans).by_span
    assert not Sample([1], tokens, np.zeros(4, np.float32), 0.0).by_span
    for logprobs, by_span in ((np.zeros(4, np.float32), spans), (None, None)):
        with pytest.raises(ValueError, match="exactly one"):
            Sample([1], tokens, logprobs, 0.0, spans=by_span)


def test_the_budget_and_the_loss_take_their_weights_from_one_function():
    """importance_weights is the loss's weight (objective_terms' weight_sum) and the budget's;
    for vis the budget measures the ratio before vis_clip's clip (its behaviour so far)."""
    theta, gen = np.linspace(-3.0, -0.1, 12).astype(np.float32), np.full(12, -1.5, np.float32)
    for objective in ("tis", "f-tis", "vis", "nois"):
        loss = LossSettings(objective=objective)
        log_ratios = torch.from_numpy(theta - gen)
        weights, _ = importance_weights(log_ratios[None], loss, torch.tensor([1.0]))
        terms = objective_terms(torch.from_numpy(theta)[None], torch.from_numpy(gen)[None], torch.ones(1, 12, dtype=torch.bool),
                                torch.tensor([1.0]), loss)
        assert terms.weight_sum == pytest.approx(float(weights.sum()))
        budget = WeightBudget()
        budget.add(_sample("p", gen, 1.0), theta, loss, OBJECTIVES.get(objective).weighting)
        unclipped, _ = importance_weights(log_ratios, loss, weighting=OBJECTIVES.get(objective).weighting, clip_vis=False)
        assert budget.weight_mean == pytest.approx(float(unclipped.mean()))
    vis = LossSettings(objective="vis")
    clipped, _ = importance_weights(torch.from_numpy(theta - gen)[None], vis, torch.tensor([1.0]))
    raw, _ = importance_weights(torch.from_numpy(theta - gen), vis, clip_vis=False)
    assert float(clipped.sum()) < float(raw.sum()), "vis_clip zeroes the tokens whose ratio left the range"
    with pytest.raises(ValueError, match="advantages"):
        importance_weights(torch.from_numpy(theta - gen), LossSettings(objective="vis"))


class _Scorer:
    """A policy as screening uses it: every token of a peer's sample at log-prob -1 under ours."""

    has_reference = False

    def token_logprobs(self, prompts, completions, temperature):
        return [np.full(len(c), -1.0) for c in completions]


def test_a_lying_peer_is_struck_once_a_round_however_many_passes_screen_it():
    # its group repeats one completion four times: picked, were the repeat check on (tests/test_repeats.py)
    config = load_config(None, ["trust.likelihood_gate=false", "trust.repeat_odds=0"])
    screener = Screener(config, _Scorer())
    liar = [Group("liar", Problem(0, "1+1", "2"), [1], [_sample("liar", np.full(12, -20.0), 0.5)] * 4)]
    first = screener.open_round([], peers_coming=True)
    assert list(first.screen(liar).strikes) == ["liar"]
    assert first.screen(liar).strikes == {}, "a second pass of the same round: no second strike"
    assert list(screener.open_round([], peers_coming=True).screen(liar).strikes) == ["liar"], "the next round's batch"
    done = first.screen(liar)
    assert done.standing == {"liar": (4, 4)} and len(done.kept) == 4, "struck, yet its samples were kept, held to the budget"
    assert [s.weight_scale for s in done.kept] == [pytest.approx(1 / LOSS.trunc_c)] * 4


def test_with_neither_gate_nor_budget_every_sample_passes_as_it_is():
    config = load_config(None, ["trust.likelihood_gate=false", "trust.weight_budget=false"])
    liar = [Group("liar", Problem(0, "1+1", "2"), [1], [_sample("liar", np.full(12, -20.0), a) for a in (0.5, -0.5)])]
    done = Screener(config, _Scorer()).open_round([], peers_coming=True).screen(liar)
    assert done.theta is None and done.strikes == {} and done.screening.peers == {}
    assert [(s.advantage, s.weight_scale, s.verdict.kept) for s in done.kept] == [(0.5, 1.0, True), (-0.5, 1.0, True)]
