"""The adaptive share (node.adapt_share_nats): a far peer's groups take no room and a node
generates their part of the batch itself; far by how much less likely that peer's samples are
under the node's model than its own, measured by the node."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.stats import binom

from swarmnode.assemble import assemble
from swarmnode.loop.intake import SCREEN_PASSES
from swarmnode.loop.ledger import USELESS_AFTER
from swarmnode.loop.pool import PROBATION_EVERY, OfferedGroup
from swarmnode.loop.share import AdaptiveShare
from swarmnode.protocol.batches import batch_split
from swarmnode.settings.config import load_config
from swarmnode.swarm.base import is_useless
from tests.test_intake import FAR_RULES_OFF, _config, _groups, _scored_intake


def _share(own_share: float, nats: float) -> AdaptiveShare:
    """The likelihood gap alone: the reward lead and trail (on by default) off."""
    return AdaptiveShare(load_config(None, [f"node.own_share={own_share}", *FAR_RULES_OFF, f"node.adapt_share_nats={nats}"]))


def _own(logprob: float, samples: int = 4, tokens: int = 3, reward: float = 0.5) -> list[SimpleNamespace]:
    return [SimpleNamespace(logprobs=np.full(tokens, logprob), reward=reward) for _ in range(samples)]


def test_a_far_peer_s_part_of_the_offer_goes_to_our_own_generation():
    share = _share(0.25, 1.0)
    assert share.current() == 0.25, "no evidence yet: the configured share"
    share.observe([np.full(4, -1.0)], {"near": [np.full(4, -1.5)], "far": [np.full(4, -2.0)]})
    assert share.gaps == {"near": pytest.approx(0.5), "far": pytest.approx(1.0)}
    assert share.is_far("far") and not share.is_far("near") and not share.is_far("unmeasured")
    assert share.gap == pytest.approx(1.0), "the record carries the farthest peer's gap measured"
    share.offered(["near", "far", "far", "near"])  # far peers made up half of what was offered
    assert share.current() == pytest.approx(0.25 + 0.75 * 0.5)
    share.offered([])
    assert share.current() == pytest.approx(0.625), "no offer: the share stays"
    share.offered(["far"] * 3)
    assert share.current() == 1.0, "only far peers: the whole batch is ours, as alone"
    share.offered(["near"])
    assert share.current() == 0.25, "near peers only: never below own_share, back to it at once"


def test_the_record_carries_the_farthest_gap_among_the_peers_measured_that_round():
    """A peer measured once long ago, far, does not stand in every later round's record."""
    share = _share(0.5, 1.0)
    share.observe([np.full(2, -1.0)], {"gone": [np.full(2, -4.0)], "near": [np.full(2, -1.5)]})
    assert share.gap == pytest.approx(3.0)
    share.observe([np.full(2, -1.0)], {"near": [np.full(2, -1.5)]})
    assert share.gap == pytest.approx(0.5), "only the peer measured this round"
    share.observe([np.full(2, -1.0)], {})
    assert share.gap is None and share.gaps["gone"] == pytest.approx(3.0), "none measured; the gaps are kept"


def test_each_peer_s_gap_is_token_weighted_smoothed_and_ignores_empty_or_broken_rounds():
    share = _share(0.5, 1.0)
    share.observe([np.full(1, -1.0), np.full(3, -3.0)], {"p": [np.full(2, -3.0)]})  # own mean -2.5 a token
    assert share.gaps["p"] == pytest.approx(0.5)
    share.observe([np.full(2, -1.0)], {"p": [np.full(2, -2.0)], "q": [np.full(1, -1.0)]})  # p's gap 1 this round
    assert share.gaps["p"] == pytest.approx(0.8 * 0.5 + 0.2 * 1.0) and share.gaps["q"] == pytest.approx(0.0)
    before = dict(share.gaps)
    share.observe([], {"p": [np.full(2, -9.0)]})
    share.observe([np.full(2, -1.0)], {"p": []})
    share.observe([np.full(2, -1.0)], {"p": [np.array([np.nan, -1.0])]})
    assert share.gaps == before, "a round without own samples, the peer's or a finite mean changes nothing"


def test_off_and_on_top_never_adapt():
    assert not _share(0.5, 0.0).enabled and not _share(1.0, 2.0).enabled
    for share in (_share(0.5, 0.0), _share(1.0, 2.0)):
        share.observe([np.full(2, -1.0)], {"p": [np.full(2, -9.0)]})
        share.offered(["p"])
        assert not share.is_far("p") and share.current() == share.floor


def test_by_default_a_sharing_node_puts_far_peers_on_top_and_an_on_top_node_is_untouched():
    """The defaults (docs/figures.md, "Far peers left out by default", "A far peer on top by default"):
    with own_share below 1 a peer is far by its likelihood gap, its lead or its trail, the node
    generates its room, and its groups come on top; at own_share 1 nothing adapts."""
    sharing = AdaptiveShare(load_config(None, ["node.own_share=0.5"]))
    assert sharing.enabled and sharing.measures_gap and sharing.generate_far_room and sharing.far_room == "top"
    for _ in range(2):
        sharing.observe([np.full(2, -1.0)],
                        {"unlikely": [np.full(2, -2.5)], "strong": [np.full(2, -1.2)], "weak": [np.full(2, -1.2)],
                         "copy": [np.full(2, -1.0)]},
                        [0.5], {"unlikely": [0.5], "strong": [0.8], "weak": [0.2], "copy": [0.5]})
    assert sharing.far == {"unlikely", "strong", "weak"}, "1.5 nats a token; a lead and a trail of 0.108"
    assert [sharing.comes_on_top(peer) for peer in ("unlikely", "strong", "weak")] == [True, True, True], \
        "far by likelihood or by score: on top"
    sharing.offered(["copy", "strong"])
    assert sharing.current() == pytest.approx(0.75), "the far half of the offered room is generated by the node"
    on_top = AdaptiveShare(load_config(None, []))
    assert on_top.floor == 1.0 and not on_top.enabled, "the node's default (own_share 1): peers only ever on top"


def test_the_split_follows_the_share_and_a_share_of_one_leaves_peers_no_room():
    config = load_config(None, ["rollout.prompts_per_round=16", "node.own_share=0.5", "node.max_peer_groups=16"])
    assert batch_split(config) == (8, 8)
    assert batch_split(config, 0.75) == (12, 4)
    assert batch_split(config, 1.0) == (16, 0), "adapted up to all of it: alone, not on top"
    on_top = load_config(None, ["rollout.prompts_per_round=16", "node.own_share=1.0"])
    assert batch_split(on_top, 1.0) == (16, 16)


def _measuring_intake(tmp_path, peer_logprob: dict[str, float], *sets: str, rewards: dict[int, list[float]] | None = None):
    """An intake (one group of room) whose model gives each peer's tokens `peer_logprob[peer]`,
    and whose groups score `rewards[prompt_id]` (informative by default); what it measured, by
    sender, goes to `.measured`."""
    rewards = rewards or {i: [0.0, 1.0, 0.0, 1.0] for i in range(3)}
    intake = _scored_intake(tmp_path, rewards, "node.adapt_share_nats=1.0", *sets)
    intake.measured = []
    def theta(samples):
        intake.measured += [s.source for s in samples]
        return [np.full(3, peer_logprob[s.source]) for s in samples]
    intake._theta = theta
    return intake


def test_a_far_peer_takes_no_room_yet_one_group_of_it_is_measured_and_a_near_one_fills_the_share(tmp_path):
    """Peer f's tokens are 2 nats less likely than our own (far at 1), n's as likely: once f's gap
    is known its groups are left out, one of them measured and used up, n's group is taken, and the
    next round generates the far part of the offer itself (far_room own: under top its groups
    would come on top of that part)."""
    intake = _measuring_intake(tmp_path, {"f": -3.0, "n": -1.0}, "node.far_room=own")
    taken = intake.take(0, _groups("f", 0, 1), own=_own(-1.0), timings={})
    assert len(taken.kept) == 4 and intake.share.gaps["f"] == pytest.approx(2.0), "unmeasured: screened like anyone"
    intake.measured.clear()
    offered = _groups("f", 1, 2) + _groups("n", 1, 2)
    intake.pool.add("f", 1, offered[:2], 1)
    taken = intake.take(1, offered, own=_own(-1.0), timings={})
    assert {s.source for s in taken.kept} == {"n"} and len(taken.kept) == 4, "the near peer fills the room"
    assert intake.measured.count("f") == 4, "one group of the far peer measured (4 samples), not trained on"
    assert [g.prompt_id for g in intake.pool.offers(1)["f"]] == [1], "the measured group was used up"
    assert intake.share.current() == 1.0, "the one group of room at own_share was the far peer's: alone next round"
    behind = _groups("n", 2, 1) + _groups("f", 2, 5)  # as pool.fair_queue orders a proven peer before the rest
    intake.take(2, behind, own=_own(-1.0), timings={})
    assert intake.share.current() == 0.5, "far groups behind the room count for nothing, however many are offered"


def test_with_far_room_near_a_far_peer_s_room_goes_to_near_peers_or_stays_empty(tmp_path):
    """node.far_room=near: no generation in a far peer's place. Near groups fill the room as far
    as they go and the step is smaller by the rest; the share never leaves own_share."""
    intake = _measuring_intake(tmp_path, {"f": -3.0, "n": -1.0}, "node.far_room=near")
    intake.take(0, _groups("f", 0, 1), own=_own(-1.0), timings={})
    assert intake.share.is_far("f") and intake.share.current() == 0.5, "far, and still our half of the batch"
    offered = _groups("f", 1, 2) + _groups("n", 1, 2)
    taken = intake.take(1, offered, own=_own(-1.0), timings={})
    assert {s.source for s in taken.kept} == {"n"} and len(taken.kept) == 4, "the near peer's group takes the room"
    assert intake.share.current() == 0.5 and batch_split(intake.config, intake.share.current()) == (1, 1)
    taken = intake.take(2, _groups("f", 2, 3), own=_own(-1.0), timings={})
    assert taken.kept == [] and intake.share.current() == 0.5, "only far groups: the room stays empty"


@pytest.mark.parametrize("far_room, trained_on_top", [("own", False), ("top", True), ("top-scored", False)])
def test_with_far_room_top_a_far_peer_s_groups_come_on_top_of_our_whole_batch_up_to_its_room(tmp_path, far_room,
                                                                                              trained_on_top):
    """node.far_room=top: the node generates in a far peer's place as under own, and its groups
    are still screened and trained on, beyond the batch but no more than the room they left
    (one group here), however many it offers; under own, or top-scored for a peer far by
    likelihood, only one group is measured, not kept."""
    intake = _measuring_intake(tmp_path, {"f": -3.0, "n": -1.0}, f"node.far_room={far_room}")
    intake.take(0, _groups("f", 0, 1), own=_own(-1.0), timings={})
    taken = intake.take(1, _groups("f", 1, 2) + _groups("n", 1, 2), own=_own(-1.0), timings={})
    assert intake.share.is_far("f") and {s.source for s in taken.kept} == {"n"}, "far: the near group takes the room"
    assert intake.share.current() == 1.0, "the room at own_share was the far peer's: our whole batch next round"
    intake.measured.clear()
    taken = intake.take(2, _groups("f", 2, 5) + _groups("n", 2, 2), own=_own(-1.0), timings={})
    assert [s.source for s in taken.kept] == (["f"] * 4 if trained_on_top else []), "one far group on top, or none"
    assert intake.measured.count("f") == 4, "one far group measured either way: on top it is not probed again"


def test_with_far_room_top_near_groups_fill_the_share_and_far_ones_only_the_room_generated_in_their_place(tmp_path):
    """Two groups of room at own_share: with half of the offered room far, the node generates one
    group more and takes one near group in the share and one far group on top."""
    intake = _measuring_intake(tmp_path, {"f": -3.0, "n": -1.0}, "node.far_room=top", "rollout.prompts_per_round=4")
    intake.take(0, _groups("n", 0, 1) + _groups("f", 0, 1), own=_own(-1.0), timings={})
    assert intake.share.is_far("f") and not intake.share.is_far("n")
    interleaved = [g for pair in zip(_groups("n", 1, 3), _groups("f", 1, 3)) for g in pair]
    taken = intake.take(1, interleaved, own=_own(-1.0), timings={})
    assert [s.source for s in taken.kept] == ["n"] * 8, "the far part was not known yet: near groups fill the share"
    assert intake.share.current() == 0.75 and batch_split(intake.config, 0.75) == (3, 1)
    interleaved = [g for pair in zip(_groups("n", 2, 3), _groups("f", 2, 3)) for g in pair]
    taken = intake.take(2, interleaved, own=_own(-1.0), timings={})
    assert sorted(s.source for s in taken.kept) == ["f"] * 4 + ["n"] * 4, "one near group in the share, one far on top"
    assert [s.source for s in taken.in_batch] == ["n"] * 4 and [s.source for s in taken.on_top] == ["f"] * 4, \
        "the node can tell the samples on top from those in the share (node.on_top_step)"


@pytest.mark.parametrize("u_screened", [USELESS_AFTER, 8], ids=["useless", "on-trial"])
def test_with_far_room_top_a_useless_far_peer_s_group_comes_on_top_only_after_proven_far_peers(tmp_path, u_screened):
    """A probation round puts a useless (or on-trial) peer's group first; far, it takes no
    probation turn, and the room on top goes to a proven far peer's group before it."""
    intake = _measuring_intake(tmp_path, {"f": -3.0, "u": -3.0}, "node.far_room=top")
    intake.ledger.screened("f", 8, 4, 0)
    intake.ledger.screened("u", u_screened, 0, 0)
    intake.share.gaps, intake.share.far, intake.share.far_part = {"f": 2.0, "u": 2.0}, {"f", "u"}, 1.0
    opened, open_round = [], intake.screener.open_round
    intake.screener.open_round = lambda own, peers_coming: opened.append(peers_coming) or open_round(own, peers_coming)
    taken = intake.take(0, _groups("u", 0, 1) + _groups("f", 0, 1), own=_own(-1.0), timings={})
    assert [s.source for s in taken.kept] == ["f"] * 4, "the proven far peer's group on top, the useless one probed"
    assert opened == [True], "no room in the share, yet peers' samples come: the round's bars (the anchor) are set"


@pytest.mark.parametrize("n_screened", [USELESS_AFTER, 8], ids=["useless", "on-trial"])
def test_a_useless_near_peer_is_probed_every_round_where_a_proven_far_peer_made_the_share_whole(tmp_path, n_screened):
    """The shut-out of docs/figures.md ("A near peer shut out"): early on nothing teaches, so a
    near peer's first groups leave it useless, while a far peer screened on top every round is
    proven by its first informative sample. Its groups then come first and fill the room, which
    reads all far: the node generates its whole batch, and with no room there was no probation,
    so the near peer was never screened again. Now a useless near peer is probed on top every
    round while the share is whole (the far peer never is), and once it teaches it takes room.
    So is one on trial (one dull group screened: loop.ledger.USELESS_AFTER), a newcomer still,
    for such a node gives no newcomer turns."""
    intake = _measuring_intake(tmp_path, {"f": -3.0, "n": -1.0}, "node.far_room=top")
    intake.ledger.screened("f", 8, 4, 0)
    intake.ledger.screened("n", n_screened, 0, 0)
    assert is_useless(intake.ledger.standing("n")) == (n_screened >= USELESS_AFTER) != intake.ledger.on_trial("n")
    intake.share.gaps, intake.share.far, intake.share.far_part = {"f": 2.0, "n": 0.0}, {"f"}, 1.0
    assert batch_split(intake.config, intake.share.current())[1] == 0, "the whole batch is ours: no room"
    for peer in ("f", "n"):
        intake.pool.add(peer, 1, _groups(peer, 1, 2, arrived=time.monotonic()), our_round=1)
    queue = intake.collect(1, generate_s=1.0, timings={})  # round 1: not a PROBATION_EVERY-th round
    assert queue[0].peer_id == "n", "the near peer's group first, on probation"
    taken = intake.take(1, queue, own=_own(-1.0), timings={})
    assert {s.source for s in taken.kept} == {"n", "f"}, "the probed group kept, the far one on top"
    assert intake.ledger.standing("n") > 0, "it taught: proven"
    assert intake.share.current() < 1.0, "a near group in the room: the next round leaves room for peers"
    intake.share.far = {"f", "n"}
    intake.ledger.screened("n", 8, 0, 2, picking=True)  # useless again (found picking)
    intake.pool.add("n", 2, _groups("n", 2, 2, arrived=time.monotonic()), our_round=2)
    assert all(g.peer_id != "n" or i > 0 for i, g in enumerate(intake.collect(2, generate_s=1.0, timings={}))), \
        "a far useless peer is never the one probed"


def test_a_near_peer_on_trial_takes_no_room_on_top_outside_probation_rounds(tmp_path):
    """With room in the share, a peer on trial first in the queue (no proven peer) takes a
    newcomer's turn in the share, not a probation group on top of it."""
    intake = _measuring_intake(tmp_path, {"n": -1.0, "m": -1.0})
    for peer in ("n", "m"):
        intake.ledger.screened(peer, 8, 0, 0)
    _, budget = batch_split(intake.config, intake.share.current())
    group_size = intake.config.rollout.group_size
    assert budget > 0
    taken = intake.take(1, _groups("n", 1, budget + 2), own=_own(-1.0), timings={})
    assert len(taken.kept) == budget * group_size, "the share, nothing on top"
    taken = intake.take(PROBATION_EVERY, _groups("m", 1, budget + 2), own=_own(-1.0), timings={})
    assert len(taken.kept) == (budget + 1) * group_size, "a probation round: one group on top"


def _crowded_round(intake, round_: int, whole: bool, standing: dict[str, float], far: set[str]) -> list[OfferedGroup]:
    """Round `round_` of a node beside `standing`'s peers, `far` of them far by likelihood (gap 2):
    the share whole (far peers fill what it reads) or not, each peer offering two groups, the
    crowd's (c*, u) all alike, so they teach nothing, the others' informative; the queue collected."""
    intake.ledger.standing = standing.get
    intake.share.gaps = {peer: 2.0 if peer in far else 0.0 for peer in standing}
    intake.share.far, intake.share.far_part = set(far), 1.0 if whole else 0.0
    intake.pool.expire(float("inf"), 0.0, 0)  # the last round's offers gone: this round offers afresh
    now = time.monotonic()
    for peer in standing:
        prompt = 1 if peer.startswith(("c", "u")) else 0
        intake.pool.add(peer, round_, [OfferedGroup(peer, round_, prompt, [], now) for _ in range(2)], our_round=round_)
    return intake.collect(round_, generate_s=1.0, timings={})


def test_a_crowd_of_useless_near_identities_gets_a_bounded_probation_turn_whatever_its_size(tmp_path):
    """The every-round probation of a node whose share far peers made whole is a turn identities
    could crowd: k useless near ones (c*) beside an honest near peer (n) that early luck left
    useless, a proven far peer (f) and a useless far one (u). What the crowd gets is bounded:
    - the turn is one group a round, and screening takes at most SCREEN_PASSES near groups a
      round (a group that teaches nothing is replaced by the next), whatever k;
    - it is picked at random among the k + 1 useless near peers, so the honest one is screened
      about one round in k + 1 (every round with no crowd; never, before this rule);
    - a far peer is never the one probed, and with room in the share probation comes only
      every PROBATION_EVERY-th round, as before."""
    rounds = 300
    for k in (0, 5, 20):
        crowd = [f"c{i}" for i in range(k)]
        near = ["n", *crowd]
        standing = {"f": 0.5, "u": 0.0, **dict.fromkeys(near, 0.0)}
        intake = _measuring_intake(tmp_path / f"k{k}", dict.fromkeys(standing, -1.0) | {"f": -3.0, "u": -3.0},
                                   "node.far_room=top", "node.skip_uninformative=true",
                                   rewards={0: [0.0, 1.0, 0.0, 1.0], 1: [1.0] * 4})
        screened: list[str] = []
        use_up = intake.pool.take
        intake.pool.take = lambda chunk, seen=screened, use_up=use_up: seen.extend(g.peer_id for g in chunk) or use_up(chunk)
        probed: Counter[str] = Counter()
        for round_ in range(1, rounds + 1):
            queue = _crowded_round(intake, round_, whole=True, standing=standing, far={"f", "u"})
            assert queue[0].peer_id in near and queue[1].peer_id == "f", f"k={k}: one near group probed, then the far one"
            probed[queue[0].peer_id] += 1
            screened.clear()
            intake.take(round_, queue, own=_own(-1.0), timings={})
            near_screened = [peer for peer in screened if peer in near]
            assert 1 <= len(near_screened) <= SCREEN_PASSES, f"k={k}: {len(near_screened)} near groups screened"
            if queue[0].peer_id == "n":
                assert near_screened == ["n"], "the honest group teaches: it fills the turn, nothing more is screened"
        assert probed["u"] == 0 and sum(probed.values()) == rounds
        low, high = binom.ppf(1e-4, rounds, 1 / (k + 1)), binom.isf(1e-4, rounds, 1 / (k + 1))
        assert low <= probed["n"] <= high, f"k={k}: the honest peer probed {probed['n']} of {rounds} rounds"
        assert set(probed) == set(near), f"k={k}: every useless near peer takes the turn at some point"
        later = range(rounds + 1, rounds + 13)  # a peer's rounds only go forward
        room = [_crowded_round(intake, round_, whole=False, standing=standing, far={"f", "u"})[0].peer_id in near
                for round_ in later]
        assert room == [round_ % PROBATION_EVERY == 0 for round_ in later], "room in the share: every 4th round"


def test_with_truncated_sampling_our_own_samples_are_measured_again_untruncated(tmp_path):
    """Under top-p the generator's log-probs are renormalised over the nucleus, higher than the
    model's: a copy whose samples are as likely as ours would look far by that much. Untruncated,
    our own samples are measured as peers' are; without truncation the generator's are used."""
    for sets, measured_again in ((("rollout.top_p=0.9",), True), (("rollout.top_k=5",), True), ((), False)):
        intake = _measuring_intake(tmp_path, {"copy": -2.0, "self": -2.0}, *sets)
        own = [SimpleNamespace(logprobs=np.full(3, -0.5), source="self", reward=0.5) for _ in range(4)]  # as renormalised
        intake.take(0, _groups("copy", 0, 1), own=own, timings={})
        assert ("self" in intake.measured) == measured_again, sets
        assert intake.share.gaps["copy"] == pytest.approx(0.0 if measured_again else 1.5), sets


def test_a_far_peer_that_comes_near_is_taken_again(tmp_path):
    """Under far_room own a far peer's groups are only measured, so being taken is being near."""
    logprob = {"f": -4.0}
    intake = _measuring_intake(tmp_path, logprob, "node.far_room=own")
    intake.take(0, _groups("f", 0, 1), own=_own(-1.0), timings={})
    assert intake.share.is_far("f")
    logprob["f"] = -1.0  # its samples now as likely as ours: the running gap falls each round it is measured
    for round_ in range(1, 30):
        taken = intake.take(round_, _groups("f", round_, 1), own=_own(-1.0), timings={})
        if taken.kept:
            break
    assert taken.kept and not intake.share.is_far("f"), f"taken again after {round_} rounds"
    assert intake.share.gaps["f"] < 0.5 and round_ >= 9, "not at 1 (5 rounds) but under the band (9 or more)"


def test_a_node_generates_as_its_share_says_and_keeps_the_gaps_across_a_restart(tmp_path):
    sets = ["rollout.prompts_per_round=4", "node.own_share=0.5", "node.adapt_share_nats=1.0", "rollout.group_size=2"]
    with contextlib.ExitStack() as stack:
        node = stack.enter_context(assemble(_config(tmp_path, "a", *sets)))
        assert len(node.produce(0).own_groups) == 2
        node.intake.share.observe([np.full(2, -1.0)], {"far": [np.full(2, -4.0)]})
        node.intake.share.offered(["far"])
        state = node.produce(1)
        assert len(state.own_groups) == 4, "only a far peer offered: the whole batch is ours"
        record = node.consume(1, state)
        assert record.own_samples == 4 * 2, "4 groups of 2"
        assert record.likelihood_gap is None, "no peer measured this round: the gap kept is not this round's"
        node.save(1)
    with assemble(_config(tmp_path, "a", *sets)) as resumed:
        assert resumed.intake.share.gaps == {"far": 3.0} and resumed.intake.share.current() == 1.0
        assert resumed.intake.share.is_far("far")


def test_a_far_peer_stays_far_until_its_gap_falls_below_half_the_setting():
    """A single threshold let one noisy probe group bring a far peer back for a round; inside the
    band (half the setting up to the setting) a peer keeps the side it was on, also across a restart."""
    share = _share(0.5, 1.0)
    def gap_of(peer: str, gap: float) -> None:
        share.gaps.pop(peer, None)  # first measure: the running gap is the round's
        share.observe([np.full(2, -1.0)], {peer: [np.full(2, -1.0 - gap)]})
    gap_of("p", 1.2)
    gap_of("q", 0.7)
    assert share.is_far("p") and not share.is_far("q"), "first measures: far only at the setting"
    gap_of("p", 0.7)
    gap_of("q", 0.9)
    assert share.is_far("p") and not share.is_far("q"), "inside the band each keeps its side"
    resumed = _share(0.5, 1.0)
    resumed.restore(share.checkpoint_state())
    assert resumed.is_far("p") and not resumed.is_far("q"), "the side inside the band survives a restart"
    gap_of("p", 0.49)
    assert not share.is_far("p"), "below half the setting: near again"
    gap_of("p", 0.99)
    assert not share.is_far("p")


def test_a_checkpoint_with_the_old_pooled_gap_is_measured_afresh():
    share = _share(0.5, 1.0)
    share.restore({"likelihood_gap": 3.0})
    assert share.gaps == {} and share.current() == 0.5
    share.restore({"likelihood_gaps": {"p": "x", "q": float("nan"), "r": 2.0}, "far_part": 7})
    assert share.gaps == {"r": 2.0} and share.far_part == 0.0, "what is not a finite gap or a part in [0, 1] is dropped"
    assert share.is_far("r"), "a checkpoint from before the band is classed by its gaps"


@pytest.mark.parametrize("far_room, on_top", [("own", 0), ("top", 2)])
def test_far_identities_cost_no_more_scoring_than_the_share_and_one_probe_and_each_is_measured_in_turn(
        tmp_path, far_room, on_top):
    """Every far peer's probe was scored every round, so a crowd of far identities grew the
    node's compute without bound: now at most the peers' share at own_share (two groups here),
    under top as groups on top, less those on top but at least one."""
    peers = [f"f{i}" for i in range(5)]
    intake = _measuring_intake(tmp_path, dict.fromkeys(peers, -4.0), f"node.far_room={far_room}",
                               "rollout.prompts_per_round=4")
    intake.share.observe([np.full(2, -1.0)], {peer: [np.full(2, -4.0)] for peer in peers})
    measured = set()
    for round_ in range(5):
        intake.measured.clear()
        offered = [g for peer in peers for g in _groups(peer, round_, 1)]
        kept = intake.take(round_, offered, own=_own(-1.0), timings={}).kept
        topped = on_top if round_ else 0  # the room is generated from the round after they were found far
        assert len(kept) == 4 * topped, "on top only up to the room generated in their place"
        probes = max(1, 2 - topped)
        assert len(intake.measured) == 4 * (topped + probes), "the share's worth scored, and one probe at least"
        measured.update(intake.measured)
    assert sorted(measured) == peers, "each far peer measured in turn"


def test_the_gaps_kept_are_bounded_and_a_broken_checkpoint_restores_to_nothing_worse(monkeypatch):
    monkeypatch.setattr("swarmnode.loop.share.MAX_PEERS_MEASURED", 3)
    share = _share(0.5, 1.0)
    for peer in ("a", "b", "c", "d"):
        share.observe([np.full(2, -1.0)], {peer: [np.full(2, -3.0)]})
    assert list(share.gaps) == ["b", "c", "d"] and share.far == {"b", "c", "d"}, "the least recently measured forgotten"
    for broken in ({"likelihood_gaps": ["p"]}, {"likelihood_gaps": {"p": True}, "far_part": True}):
        share.restore(broken)
        assert share.gaps == {} and share.far_part == 0.0
    share.restore({"likelihood_gaps": {"p": 0.2, "q": 0.7}, "far_peers": ["p", "q", "x"]})
    assert share.far == {"q"}, "listed far only while its gap is inside the band"


def _lead_share(lead: float = 0.1, nats: float = 0.0) -> AdaptiveShare:
    return AdaptiveShare(load_config(None, ["node.own_share=0.5", *FAR_RULES_OFF, f"node.adapt_share_nats={nats}",
                                            f"node.far_reward_lead={lead}"]))


def test_a_peer_whose_samples_score_above_ours_is_far_from_a_prior_of_no_lead_and_comes_back_below_half():
    share = _lead_share(0.1)
    assert share.enabled and not share.measures_gap, "the reward lead alone needs no forward under our model"
    share.observe([], {}, [0.0, 0.0], {"strong": [0.3, 0.3], "copy": [0.0, 0.0]})
    assert share.leads == {"strong": pytest.approx(0.06), "copy": 0.0}, "one round moves the lead a fifth of the way"
    assert not share.is_far("strong"), "one round's lead of 0.3 is not enough: a copy's first round is noisy"
    share.observe([], {}, [0.0], {"strong": [0.3]})
    assert share.leads["strong"] == pytest.approx(0.108) and share.is_far("strong") and share.lead == pytest.approx(0.108)
    share.offered(["strong", "copy"])
    assert share.current() == pytest.approx(0.75), "its part of the offer is generated, as for a far gap"
    for _ in range(3):
        share.observe([], {}, [0.5], {"strong": [0.5]})
    assert share.leads["strong"] == pytest.approx(0.108 * 0.8 ** 3) and share.is_far("strong"), "inside the band"
    share.observe([], {}, [0.5], {"strong": [0.5]})
    assert share.leads["strong"] < 0.05 and not share.is_far("strong"), "below half the setting: near again"
    share.observe([], {}, [], {"strong": [1.0]})
    share.observe([], {}, [0.0], {"strong": [float("nan")]})
    assert share.leads["strong"] < 0.05, "no own samples, or no finite mean, changes nothing"


def test_either_measure_makes_a_peer_far_and_both_must_fall_for_it_to_come_back():
    share = _lead_share(0.1, nats=1.0)
    assert share.measures_gap
    share.observe([np.full(2, -1.0)], {"p": [np.full(2, -3.0)]}, [0.5], {"p": [0.5]})
    assert share.is_far("p") and share.leads["p"] == 0.0, "far by its gap alone"
    share.gaps["p"] = 0.1
    share.leads["p"] = 0.2
    share.observe([np.full(2, -1.0)], {"p": [np.full(2, -1.0)]}, [0.5], {"p": [0.5]})
    assert share.is_far("p"), "its gap fell, its lead (0.16) did not"
    share.leads["p"] = 0.0
    share.observe([np.full(2, -1.0)], {"p": [np.full(2, -1.0)]}, [0.5], {"p": [0.5]})
    assert not share.is_far("p")
    off = _share(0.5, 1.0)
    off.observe([np.full(2, -1.0)], {"p": [np.full(2, -1.0)]}, [0.0], {"p": [1.0]})
    assert not off.is_far("p") and off.leads["p"] == pytest.approx(0.2), "the lead is kept, but off it decides nothing"


def test_the_leads_survive_a_restart_and_a_broken_one_is_dropped():
    share = _lead_share(0.1)
    share.leads = {"p": 0.07, "q": 0.3, "r": 0.01}
    share.far = {"p"}
    resumed = _lead_share(0.1)
    resumed.restore(share.checkpoint_state())
    assert resumed.leads == share.leads and resumed.far == {"p", "q"}, "p inside the band stays far, q reaches it"
    resumed.restore({"reward_leads": {"p": "x", "q": float("inf"), "r": 0.2}})
    assert resumed.leads == {"r": 0.2} and resumed.far == {"r"}


@pytest.mark.parametrize("far_room, fifth_round", [("own", set()), ("top", {"s"}), ("top-scored", {"s"})])
def test_a_peer_scoring_above_us_takes_no_room_and_its_samples_are_never_measured_under_our_model(
        tmp_path, far_room, fifth_round):
    """Reward lead only: our grading of its groups makes it far, and no forward is spent. Peer s's
    groups score 0.75 as we grade them, n's 0.5, our own 0.5; under top (the default) or
    top-scored its group then comes on top of our whole batch, still unmeasured."""
    intake = _scored_intake(tmp_path, {0: [0.0, 1.0, 0.0, 1.0], 1: [1.0, 1.0, 1.0, 0.0]},
                            "node.adapt_share_nats=0", "node.far_reward_lead=0.1", f"node.far_room={far_room}")
    intake._theta = lambda samples: pytest.fail("measured under our model with the likelihood gap off")
    taken_from = []
    for round_ in range(5):  # s's lead 0.05, 0.09, 0.122: far after the third round
        offered = [OfferedGroup("s", round_, 1, [], 0.0), OfferedGroup("n", round_, 0, [], 0.0)]
        taken = intake.take(round_, offered, own=_own(-1.0, reward=0.5), timings={})
        taken_from.append({s.source for s in taken.kept})
    assert taken_from == [{"s"}] * 3 + [{"n"}, fifth_round], "far: n's group takes the room, then its part is ours"
    assert intake.share.current() == 1.0, "s was the room at own_share: the next round generates it"
    assert intake.share.is_far("s") and intake.share.leads["n"] == 0.0


def test_a_peer_whose_samples_trail_ours_is_far_only_with_the_trail_on_and_comes_back_below_half():
    trail = AdaptiveShare(load_config(None, ["node.own_share=0.5", *FAR_RULES_OFF, "node.far_reward_trail=0.1"]))
    lead_only = _lead_share(0.1)
    assert trail.enabled and not trail.measures_gap, "the trail, like the lead, needs no forward under our model"
    for share in (trail, lead_only):
        for _ in range(2):
            share.observe([], {}, [0.5], {"weak": [0.2], "strong": [0.8]})
    assert trail.leads["weak"] == pytest.approx(-0.108) and trail.far == {"weak"}, "trailing by 0.108: far"
    assert lead_only.far == {"strong"}, "the lead alone never drops a peer that scores below us"
    for _ in range(4):
        trail.observe([], {}, [0.5], {"weak": [0.5]})
    assert -trail.leads["weak"] < 0.05 and not trail.is_far("weak"), "trailing by less than half: near again"


@pytest.mark.parametrize("far_room, fifth_round", [("own", set()), ("top", {"w"}), ("top-scored", {"w"})])
def test_a_peer_scoring_below_us_takes_no_room_and_under_top_comes_on_top(tmp_path, far_room, fifth_round):
    """Peer w's groups score 0.25 as we grade them, n's 0.5, our own 0.5: with the trail on, w's
    running trail passes 0.1 in the third round; then its room is ours, and under top its group
    comes on top of our whole batch instead of in its place (under top-scored too: w is far by
    score, not by likelihood)."""
    intake = _scored_intake(tmp_path, {0: [0.0, 1.0, 0.0, 1.0], 1: [0.0, 0.0, 0.0, 1.0]},
                            "node.far_reward_trail=0.1", f"node.far_room={far_room}")
    taken_from = []
    for round_ in range(5):
        offered = [OfferedGroup("w", round_, 1, [], 0.0), OfferedGroup("n", round_, 0, [], 0.0)]
        taken = intake.take(round_, offered, own=_own(-1.0, reward=0.5), timings={})
        taken_from.append({s.source for s in taken.kept})
    assert taken_from == [{"w"}] * 3 + [{"n"}, fifth_round]
    assert intake.share.current() == 1.0 and intake.share.is_far("w") and not intake.share.is_far("n")


def test_top_scored_puts_on_top_only_peers_far_by_score_and_keeps_far_by_likelihood_through_the_band():
    """Peer f is 2 nats a token less likely than our own, w as likely but scoring 0.5 below us,
    b both: all three are far; under top-scored only w comes on top. f stays far by likelihood
    inside the band (gap 0.7), also across a checkpoint, and is near again below it."""
    sets = ["node.own_share=0.5", *FAR_RULES_OFF, "node.adapt_share_nats=1.0", "node.far_reward_trail=0.1"]
    shares = {room: AdaptiveShare(load_config(None, [*sets, f"node.far_room={room}"])) for room in ("own", "top", "top-scored")}
    for share in shares.values():
        for _ in range(2):
            share.observe([np.full(2, -1.0)], {"f": [np.full(2, -3.0)], "w": [np.full(2, -1.0)], "b": [np.full(2, -3.0)]},
                          [0.5], {"f": [0.5], "w": [0.0], "b": [0.0]})
        assert share.far == {"f", "w", "b"}
    assert {p for p in "fwb" if shares["own"].comes_on_top(p)} == set()
    assert {p for p in "fwb" if shares["top"].comes_on_top(p)} == {"f", "w", "b"}
    scored = shares["top-scored"]
    assert {p for p in "fwb" if scored.comes_on_top(p)} == {"w"}, "far by likelihood: out, as under own"
    scored.gaps["f"] = 0.7
    scored._classify("f")
    assert scored.is_far("f") and not scored.comes_on_top("f"), "inside the band: still far by likelihood"
    restored = AdaptiveShare(load_config(None, [*sets, "node.far_room=top-scored"]))
    restored.restore(scored.checkpoint_state())
    assert restored.far_by_gap == {"f", "b"} and restored.comes_on_top("w") and not restored.comes_on_top("f")
    for _ in range(3):
        scored.observe([np.full(2, -1.0)], {"f": [np.full(2, -1.0)]}, [0.5], {"f": [0.5]})
    assert scored.gaps["f"] < 0.5 and not scored.is_far("f") and "f" not in scored.far_by_gap


def test_top_scored_far_by_likelihood_follows_the_gap_alone_across_a_restart_and_the_bound(monkeypatch):
    """A peer far by score whose gap sits inside the band without ever reaching the setting stays
    on top after a restart (a checkpoint written before far by likelihood was kept apart takes it
    for far by likelihood); a peer far by likelihood whose gap falls below the band while its
    trail stays inside it is far by score only, on top; a peer forgotten beyond the bound is
    neither."""
    sets = ["node.own_share=0.5", *FAR_RULES_OFF, "node.adapt_share_nats=1.0", "node.far_reward_trail=0.1",
            "node.far_room=top-scored"]
    share = AdaptiveShare(load_config(None, sets))
    share.gaps, share.leads = {"w": 0.7, "f": 2.0}, {"w": -0.3, "f": -0.3}
    for peer in ("w", "f"):
        share._classify(peer)
    assert share.far == {"w", "f"} and share.far_by_gap == {"f"} and share.comes_on_top("w")
    restored = AdaptiveShare(load_config(None, sets))
    restored.restore(share.checkpoint_state())
    assert restored.far_by_gap == {"f"} and restored.comes_on_top("w") and not restored.comes_on_top("f")
    older = {k: v for k, v in share.checkpoint_state().items() if k != "far_by_gap"}
    restored.restore(older)
    assert restored.far_by_gap == {"w", "f"}, "an older checkpoint: a far peer's gap in the band is far by likelihood"
    share.gaps["f"], share.leads["f"] = 0.3, -0.08  # gap below the band, trail still inside it
    share._classify("f")
    assert share.is_far("f") and "f" not in share.far_by_gap and share.comes_on_top("f")
    share.gaps["g"] = 2.0
    share._classify("g")
    assert "g" in share.far_by_gap
    monkeypatch.setattr("swarmnode.loop.share.MAX_PEERS_MEASURED", 1)
    share.observe([np.full(2, -1.0)], {"x": [np.full(2, -1.0)]}, [0.5], {"x": [0.5]})
    assert share.far == set() and share.far_by_gap == set(), "forgotten beyond the bound: measured afresh"


@pytest.mark.parametrize("override, named", [
    ("node.far_room=sideways", "far_room"), ("node.far_reward_lead=-0.1", "far_reward_lead"),
    ("node.far_reward_lead=much", "far_reward_lead"), ("node.far_reward_trail=-0.1", "far_reward_trail"),
])
def test_a_bad_far_setting_is_a_clear_error_naming_it(override, named):
    with pytest.raises(ValueError, match=named):
        load_config(None, ["node.own_share=0.5", override])


@pytest.mark.parametrize("gen_share, groups_on_top", [(0.93, 2), (0.7, 1), (0.5, 0)])
def test_far_groups_on_top_are_no_more_than_a_tenth_of_a_round_pays_for(tmp_path, gen_share, groups_on_top):
    """Two groups of room left by a far peer, four groups a batch: at generation 0.93 of a round
    a tenth of it trains 5.7 groups more, so both come on top; at 0.7 it trains 1.3 (one), at
    0.5 0.8 (none, and the far peer is still measured, one group)."""
    intake = _measuring_intake(tmp_path, {"f": -3.0}, "node.far_room=top", "rollout.prompts_per_round=4")
    intake.share.gaps, intake.share.far, intake.share.far_part = {"f": 2.0}, {"f"}, 1.0
    intake.costs.pin(gen_share)
    taken = intake.take(0, _groups("f", 0, 4), own=_own(-1.0), timings={})
    assert [s.source for s in taken.kept] == ["f"] * 4 * groups_on_top
    assert intake.measured.count("f") == 4 * max(1, groups_on_top), "on top, or one group measured"


@pytest.mark.parametrize("gen_share, on_top, probed", [(0.7, 5, 1), (0.625, 3, 3)])
def test_far_peers_measured_beside_those_on_top_take_only_what_those_leave_of_the_tenth(tmp_path, gen_share, on_top,
                                                                                          probed):
    """Sixteen groups a batch, own_share 0.5: eight groups of room, all left by nine far
    identities offering a group each; a group measured costs a third of one on top. At
    generation 0.7 a tenth of a round alone pays for 5.3 groups on top: five come on top and one
    of the others is measured, where the room (three more) once put the round past its tenth. At
    0.625 it pays for 4.3, 3.9 once one measured group is set aside: three on top, and what they
    leave measures three (once four and four)."""
    peers = [f"f{i}" for i in range(9)]
    intake = _measuring_intake(tmp_path, dict.fromkeys(peers, -4.0), "node.far_room=top", "rollout.prompts_per_round=16",
                               "node.own_share=0.5", rewards={i: [0.0, 1.0, 0.0, 1.0] for i in range(16)})
    intake.share.gaps, intake.share.far, intake.share.far_part = dict.fromkeys(peers, 3.0), set(peers), 1.0
    intake.costs.pin(gen_share)
    offered = [OfferedGroup(peer, 0, i, [], 0.0) for i, peer in enumerate(peers)]
    taken = intake.take(0, offered, own=_own(-1.0), timings={})
    assert len(intake.measured) == 4 * (on_top + probed), "screened on top, and measured"
    assert (taken.on_top_groups, taken.measured_groups) == (on_top, probed)


def test_a_far_peer_is_measured_each_round_even_when_the_tenth_is_spent(tmp_path):
    """Five far identities, room for two on top: whatever the tenth leaves, one of the other
    three is measured, so a far peer that comes near is still seen to."""
    peers = [f"f{i}" for i in range(5)]
    intake = _measuring_intake(tmp_path, dict.fromkeys(peers, -4.0), "node.far_room=top", "rollout.prompts_per_round=4")
    intake.share.gaps, intake.share.far, intake.share.far_part = dict.fromkeys(peers, 3.0), set(peers), 1.0
    intake.costs.measured_groups = lambda *args, **kwargs: 0
    taken = intake.take(0, [g for peer in peers for g in _groups(peer, 0, 1)], own=_own(-1.0), timings={})
    assert taken.on_top_groups == 2 and taken.measured_groups == 1 and len(intake.measured) == 4 * 3


def test_the_bound_on_top_is_a_tenth_of_a_round_alone_whatever_the_share_generated_this_round(tmp_path):
    """Sixteen groups a batch, own_share 0.25, half the offered room far: the node generates ten
    groups, a near peer fills six, and six are left on top; at generation 0.7 a tenth of a round
    alone (sixteen groups) pays for five of them, not the three a tenth of ten would."""
    intake = _scored_intake(tmp_path, {i: [0.0, 1.0, 0.0, 1.0] for i in range(16)}, "node.adapt_share_nats=1.0",
                            "node.far_room=top", "rollout.prompts_per_round=16", "node.own_share=0.25")
    intake._theta = lambda samples: [np.full(3, -3.0 if s.source == "f" else -1.0) for s in samples]
    intake.share.gaps, intake.share.far, intake.share.far_part = {"f": 2.0, "n": 0.0}, {"f"}, 0.5
    intake.costs.pin(0.7)
    offered = _groups("n", 0, 8) + [OfferedGroup("f", 0, i, [], 0.0) for i in range(8, 16)]
    taken = intake.take(0, offered, own=_own(-1.0), timings={})
    assert [s.source for s in taken.kept].count("n") == 6 * 4 and [s.source for s in taken.kept].count("f") == 5 * 4
    assert (taken.on_top_groups, taken.on_top_tokens) == (5, 5 * 4), "what the round's price is taken from"
