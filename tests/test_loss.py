import math

import numpy as np
import pytest
import torch

from swarmnode.learn.alignment import SpanBatch, Spans
from swarmnode.learn.loss import group_advantages, objective_terms, sequence_divergence, soft_filter_weights
from swarmnode.settings.config import LossSettings
from swarmnode.settings.registry import OBJECTIVES


def test_group_advantages_are_centred_and_standardised_only_when_asked():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert torch.allclose(group_advantages(rewards), torch.tensor([0.75, -0.25, -0.25, -0.25]))  # the authors'
    scaled = group_advantages(rewards, scale_by_std=True)  # GRPO's
    assert torch.allclose(scaled, (rewards - 0.25) / (rewards.std(unbiased=False) + 1e-4))
    assert torch.allclose(group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), True), torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-3)
    assert torch.all(group_advantages(torch.tensor([1.0, 1.0, 1.0]), True) == 0)


def _case(gen_offset=0.0):
    torch.manual_seed(0)
    theta = (-torch.rand(3, 4) * 2).requires_grad_()
    gen = theta.detach() + gen_offset
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5, -0.5])
    return theta, gen, mask, adv


def test_on_policy_samples_make_all_objectives_agree():
    grads, losses = [], []
    for name in OBJECTIVES.names:
        theta, gen, mask, adv = _case()
        terms = objective_terms(theta, gen, mask, adv, LossSettings(objective=name))
        terms.loss_sum.backward()
        losses.append(float(terms.loss_sum.detach()))
        grads.append(theta.grad.clone())
        assert terms.filtered.sum() == 0
        assert terms.weight_max == pytest.approx(1.0)
    for loss, grad in zip(losses[1:], grads[1:]):
        assert loss == pytest.approx(losses[0])
        assert torch.allclose(grad, grads[0])


def test_hand_computed_value_and_gradient():
    # Per-sequence token mean of A*R with R = 1: loss = -sum_i A_i; d/dlogp = -A_i * w / |a_i|.
    theta, gen, mask, adv = _case()
    terms = objective_terms(theta, gen, mask, adv, LossSettings(objective="nois"))
    assert float(terms.loss_sum.detach()) == pytest.approx(-(1.0 - 0.5 - 0.5))
    terms.loss_sum.backward()
    expected = -(adv[:, None] / mask.sum(-1, keepdim=True)) * mask
    assert torch.allclose(theta.grad, expected)


def test_truncation_caps_weight_at_c_and_raw_vis_does_not():
    theta, gen, mask, adv = _case(gen_offset=-2.0)  # pi_theta / pi_gen = e^2 ~ 7.39 everywhere
    tis = objective_terms(theta, gen, mask, adv, LossSettings(objective="tis", trunc_c=2.0))
    vis = objective_terms(theta, gen, mask, adv, LossSettings(objective="vis", vis_clip=False))
    assert tis.weight_max == pytest.approx(2.0)
    assert tis.truncated_tokens == tis.tokens == int(mask.sum())
    assert vis.weight_max == pytest.approx(math.exp(2.0), rel=1e-5)
    tis.loss_sum.backward()
    expected = -(2.0 * adv[:, None] / mask.sum(-1, keepdim=True)) * mask
    assert torch.allclose(theta.grad, expected, atol=1e-6)


@pytest.mark.parametrize("offset", [-2.0, 0.5])
def test_clipped_vis_drops_tokens_whose_ratio_left_the_range_in_the_advantages_direction(offset):
    """Ratio e^2: the positive-advantage sequence (0) is clipped, the negative ones keep the
    raw weight; ratio e^-0.5 < 1 - eps: the other way round."""
    theta, gen, mask, adv = _case(gen_offset=offset)
    terms = objective_terms(theta, gen, mask, adv, LossSettings(objective="vis"))  # vis_clip by default
    terms.loss_sum.backward()
    ratio = math.exp(-offset)
    binds = adv > 0 if ratio > 1 else adv < 0
    lengths = mask.sum(-1, keepdim=True)
    expected = torch.where(binds[:, None], 0.0, -(ratio * adv[:, None] / lengths)) * mask
    assert torch.allclose(theta.grad, expected, atol=1e-6)
    assert terms.truncated_tokens == int(mask[binds].sum())
    assert terms.weight_max == pytest.approx(ratio, rel=1e-5)


def test_weights_below_c_are_untouched():
    theta, gen, mask, adv = _case(gen_offset=0.5)  # ratio e^-0.5
    tis = objective_terms(theta, gen, mask, adv, LossSettings(objective="tis"))
    assert tis.weight_max == pytest.approx(math.exp(-0.5), rel=1e-5)
    assert tis.truncated_tokens == 0


def test_filter_removes_exactly_negative_advantage_high_divergence_samples():
    theta, gen, mask, adv = _case()
    gen = gen.clone()
    gen[1] += 5.0  # sequence 1: A < 0, large divergence -> filtered
    gen[0] += 5.0  # sequence 0: A > 0, large divergence -> kept
    cfg = LossSettings(objective="f-tis", filter_g=50.0)
    terms = objective_terms(theta, gen, mask, adv, cfg)
    div = sequence_divergence(theta, gen, mask)
    assert div[1] > 50 and div[0] > 50 and div[2] < 1e-6
    assert terms.filtered.tolist() == [False, True, False]
    terms.loss_sum.backward()
    assert torch.all(theta.grad[1] == 0)
    assert torch.all(theta.grad[0] != 0) and torch.all(theta.grad[2][:3] != 0)
    unfiltered = objective_terms(theta, gen, mask, adv, LossSettings(objective="tis"))
    assert unfiltered.filtered.sum() == 0


def test_the_soft_filter_weights_far_negative_samples_down_instead_of_dropping_them():
    """g / (g + divergence) for a negative advantage: 1/2 at g, a third at 2g, 1 on-policy;
    positive advantages untouched. In the loss: sequence 1 (A < 0, far) keeps a gradient,
    scaled by its weight against the unfiltered objective; the others are unchanged."""
    weights = soft_filter_weights(torch.tensor([-1.0, -1.0, -1.0, 1.0]), torch.tensor([0.0, 50.0, 100.0, 100.0]), 50.0)
    assert torch.allclose(weights, torch.tensor([1.0, 0.5, 1 / 3, 1.0]))
    # k1 can be negative, g can be 0: never above 1, and 1 on-policy whatever g
    odd = soft_filter_weights(torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([-30.0, 0.0, 5.0]), 0.0)
    assert odd.tolist() == [1.0, 1.0, 0.0]
    assert soft_filter_weights(torch.tensor([-1.0]), torch.tensor([-30.0]), 10.0).tolist() == [1.0]

    theta, gen, mask, adv = _case()
    gen = gen.clone()
    gen[1] += 5.0
    soft = objective_terms(theta, gen, mask, adv, LossSettings(objective="f-tis", filter_shape="soft"))
    assert soft.filtered.sum() == 0
    soft.loss_sum.backward()
    soft_grad, theta.grad = theta.grad.clone(), None
    objective_terms(theta, gen, mask, adv, LossSettings(objective="tis")).loss_sum.backward()
    share = 50.0 / (50.0 + float(sequence_divergence(theta, gen, mask)[1]))
    assert 0 < share < 0.5
    assert torch.allclose(soft_grad[1], theta.grad[1] * share)
    assert torch.allclose(soft_grad[[0, 2]], theta.grad[[0, 2]])


def test_filtered_samples_still_count_in_group_statistics():
    # Advantages are computed before filtering, over the whole group.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = group_advantages(rewards)
    assert adv[0] > 0 and adv[1] < 0


@pytest.mark.parametrize("estimator", ["k3-mean", "k3-sum", "k1-mean"])
def test_divergence_estimators(estimator):
    theta, gen, mask, _ = _case()
    assert torch.allclose(sequence_divergence(theta, gen, mask, estimator), torch.zeros(3), atol=1e-6)
    d = 1.0
    value = sequence_divergence(theta, gen + d, mask, estimator)
    per_token = {"k3-mean": math.exp(d) - d - 1, "k3-sum": math.exp(d) - d - 1, "k1-mean": d}[estimator]
    lengths = mask.sum(-1).float()
    expected = per_token * (lengths if estimator == "k3-sum" else torch.ones(3))
    assert torch.allclose(value, expected, rtol=1e-5)


def test_extreme_log_ratios_do_not_overflow():
    theta, gen, mask, adv = _case()
    for objective in OBJECTIVES.names:
        terms = objective_terms(theta, gen - 1e4, mask, adv, LossSettings(objective=objective))
        assert torch.isfinite(terms.loss_sum)
        assert math.isfinite(terms.weight_max)


def test_unknown_objective_is_a_clear_error():
    theta, gen, mask, adv = _case()
    with pytest.raises(ValueError, match="unknown objective"):
        objective_terms(theta, gen, mask, adv, LossSettings.model_construct(objective="ppo"))


def _token_spans(gen: torch.Tensor, mask: torch.Tensor) -> SpanBatch:
    lengths = mask.sum(-1).tolist()
    return SpanBatch.of([Spans.token_level(gen[b, :n].numpy()) for b, n in enumerate(lengths)], gen.shape[1])


@pytest.mark.parametrize("objective", OBJECTIVES.names)
@pytest.mark.parametrize("estimator", ["k3-mean", "k1-mean", "k3-sum"])
def test_spans_of_one_token_each_give_exactly_the_token_level_objective(objective, estimator):
    """A sample in our own tokens is its own spans: loss, gradient, weights, filter and
    divergence are the very same numbers with and without spans."""
    settings = LossSettings(objective=objective, divergence=estimator, filter_g=0.05)
    results = []
    for spans in (False, True):
        theta, gen, mask, adv = _case(gen_offset=0.4)
        gen[1, 0] -= 3.0  # one token far off, truncated
        terms = objective_terms(theta, gen, mask, adv, settings, spans=_token_spans(gen, mask) if spans else None)
        terms.loss_sum.backward()
        results.append((terms, theta.grad.clone()))
    (plain, plain_grad), (spanned, spanned_grad) = results
    assert torch.equal(plain.loss_sum.detach(), spanned.loss_sum.detach()) and torch.equal(plain_grad, spanned_grad)
    assert torch.equal(plain.divergence, spanned.divergence) and torch.equal(plain.filtered, spanned.filtered)
    assert (plain.weight_sum, plain.weight_max, plain.truncated_tokens) == (
        spanned.weight_sum, spanned.weight_max, spanned.truncated_tokens,
    )


def test_each_token_of_a_span_takes_the_span_s_weight_and_the_filter_counts_spans():
    """Two of our tokens in one span, whose sender put log-prob -1.0 on it where we put -0.5:
    both tokens get min(e^0.5, C), and the divergence is the k3 of that one span, not a token's."""
    theta = torch.tensor([[-0.2, -0.3, -0.7]], requires_grad=True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    spans = SpanBatch.of([Spans(np.array([0, 0, 1]), np.array([-1.0, -0.7], dtype=np.float32))], 3)
    settings = LossSettings(objective="f-tis", trunc_c=10.0)
    terms = objective_terms(theta, torch.full((1, 3), float("nan")), mask, torch.tensor([-1.0]), settings, spans=spans)
    assert terms.weight_sum == pytest.approx(2 * math.exp(0.5) + 1.0) and terms.weight_max == pytest.approx(math.exp(0.5))
    d = -1.0 + 0.5  # log pi_gen - log pi_theta of the first span; the second is on-policy
    assert float(terms.divergence[0]) == pytest.approx((math.expm1(d) - d) / 2)
    capped = objective_terms(theta, torch.zeros(1, 3), mask, torch.tensor([-1.0]), LossSettings(objective="f-tis", trunc_c=1.2), spans=spans)
    assert capped.truncated_tokens == 2, "the span's weight is truncated for both of its tokens"
