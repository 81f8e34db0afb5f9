"""The adaptive share (node.adapt_share_nats): a node generates more of its batch when peers'
samples are less likely under its model than its own, measured by itself."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from swarmnode.assemble import assemble
from swarmnode.loop.share import AdaptiveShare
from swarmnode.protocol.batches import batch_split
from swarmnode.settings.config import load_config
from tests.test_intake import _config, _groups, _scored_intake


def _share(own_share: float, nats: float) -> AdaptiveShare:
    return AdaptiveShare(load_config(None, [f"node.own_share={own_share}", f"node.adapt_share_nats={nats}"]))


def _own(logprob: float, samples: int = 4, tokens: int = 3) -> list[SimpleNamespace]:
    return [SimpleNamespace(logprobs=np.full(tokens, logprob)) for _ in range(samples)]


def test_the_share_rises_from_own_share_to_all_of_it_with_the_gap():
    share = _share(0.5, 2.0)
    assert share.current() == 0.5, "no evidence yet: the configured share"
    share.observe([np.full(4, -1.0)], [np.full(4, -2.0)])  # peers' tokens 1 nat less likely: halfway
    assert share.gap == pytest.approx(1.0) and share.current() == pytest.approx(0.75)
    share.gap = 5.0
    assert share.current() == 1.0, "capped at the whole batch"
    share.gap = -3.0
    assert share.current() == 0.5, "peers more likely than our own samples: never below own_share"


def test_the_gap_is_token_weighted_smoothed_and_ignores_empty_or_broken_rounds():
    share = _share(0.5, 1.0)
    share.observe([np.full(1, -1.0), np.full(3, -3.0)], [np.full(2, -3.0)])  # own mean -2.5 a token
    assert share.gap == pytest.approx(0.5)
    share.observe([np.full(2, -1.0)], [np.full(2, -2.0)])  # gap 1 this round
    assert share.gap == pytest.approx(0.8 * 0.5 + 0.2 * 1.0)
    before = share.gap
    share.observe([], [np.full(2, -9.0)])
    share.observe([np.full(2, -1.0)], [])
    share.observe([np.full(2, -1.0)], [np.array([np.nan, -1.0])])
    assert share.gap == before, "a round without own samples, peers' or a finite mean changes nothing"


def test_off_and_on_top_never_adapt():
    assert not _share(0.5, 0.0).enabled and not _share(1.0, 2.0).enabled
    on_top = _share(1.0, 2.0)
    on_top.gap = 10.0
    assert on_top.current() == 1.0


def test_the_split_follows_the_share_and_a_share_of_one_leaves_peers_no_room():
    config = load_config(None, ["rollout.prompts_per_round=16", "node.own_share=0.5", "node.max_peer_groups=16"])
    assert batch_split(config) == (8, 8)
    assert batch_split(config, 0.75) == (12, 4)
    assert batch_split(config, 1.0) == (16, 0), "adapted up to all of it: alone, not on top"
    on_top = load_config(None, ["rollout.prompts_per_round=16", "node.own_share=1.0"])
    assert batch_split(on_top, 1.0) == (16, 16)


@pytest.mark.parametrize("peer_logprob,budget_after", [(-1.0, 1), (-3.0, 0)])
def test_take_measures_the_gap_on_the_peers_samples_it_screened(tmp_path, peer_logprob, budget_after):
    """Peers' tokens as likely as our own leave the share alone; 2 nats less likely (the
    setting's full gap is 1) give the next round's batch wholly to our own groups."""
    intake = _scored_intake(tmp_path, {0: [0.0, 1.0, 0.0, 1.0]}, "node.adapt_share_nats=1.0")
    screened = []
    intake._theta = lambda samples: screened.extend(samples) or [np.full(3, peer_logprob) for _ in samples]
    taken = intake.take(0, _groups("p", 0, 1), own=_own(-1.0), timings={})
    assert len(taken.kept) == 4 and len(screened) == 4, "the peer's group was taken and its samples measured"
    assert intake.share.gap == pytest.approx(-1.0 - peer_logprob)
    assert batch_split(intake.config, intake.share.current())[1] == budget_after


def test_a_node_generates_as_its_share_says_and_keeps_the_gap_across_a_restart(tmp_path):
    sets = ["rollout.prompts_per_round=4", "node.own_share=0.5", "node.adapt_share_nats=1.0", "rollout.group_size=2"]
    with contextlib.ExitStack() as stack:
        node = stack.enter_context(assemble(_config(tmp_path, "a", *sets)))
        assert len(node.produce(0).own_groups) == 2
        node.intake.share.gap = 3.0
        state = node.produce(1)
        assert len(state.own_groups) == 4, "peers far off: the whole batch is ours"
        record = node.consume(1, state)
        assert record.own_samples == 4 * 2 and record.likelihood_gap == 3.0, "4 groups of 2"
        node.save(1)
    with assemble(_config(tmp_path, "a", *sets)) as resumed:
        assert resumed.intake.share.gap == 3.0
