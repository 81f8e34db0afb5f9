"""The peers' share of a batch: taken in turns, useful peers first, screened before it counts."""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from swarmnode.assemble import assemble
from swarmnode.lab.poison import poisoning_link
from swarmnode.learn.sample import Group, Sample, Verdict
from swarmnode.loop import ledger as ledger_module
from swarmnode.loop.intake import Intake
from swarmnode.loop.ledger import FIRST_ROUNDS, SILENT_ROUNDS, USELESS_AFTER, PeerLedger
from swarmnode.loop.pool import (
    ESTABLISHED_ROUNDS,
    HOLD_ROUNDS,
    PROBATION_EVERY,
    OfferedGroup,
    PeerPool,
    cohorts,
    fair_queue,
)
from swarmnode.loop.scoring import score_group
from swarmnode.model.policy import Policy
from swarmnode.protocol.wire import Completion
from swarmnode.screening.screener import Screener, standing_counts
from swarmnode.screening.usefulness import UsefulnessWeights
from swarmnode.settings.config import load_config
from swarmnode.swarm.base import GatherWait
from swarmnode.swarm.local import InMemoryHub
from swarmnode.tasks.base import Problem


def _offers(**counts: int) -> dict[str, list[str]]:
    return {peer: [f"{peer}{i}" for i in range(count)] for peer, count in counts.items()}


def test_peers_take_turns_whatever_they_offer_and_whatever_their_ids():
    queue = fair_queue(_offers(aaa=6, zzz=2), {"aaa": 0.5, "zzz": 0.5}, random.Random(0))
    assert sorted(queue[:4]) == ["aaa0", "aaa1", "zzz0", "zzz1"], "one group a turn: offering more buys no turns"
    assert queue[4:] == ["aaa2", "aaa3", "aaa4", "aaa5"]
    firsts = {fair_queue(_offers(aaa=1, zzz=1), {}, random.Random(seed))[0] for seed in range(20)}
    assert firsts == {"aaa0", "zzz0"}, "ties are broken at random, not by peer id"


def test_useful_peers_first_newcomers_every_fourth_turn_useless_last():
    offers = _offers(good=8, better=8, new=8, junk=8)
    standing = {"good": 0.3, "better": 0.6, "new": None, "junk": 0.0}
    queue = fair_queue(offers, standing, random.Random(0))
    assert len(queue) == 32 and sorted(queue) == sorted(g for groups in offers.values() for g in groups)
    assert queue[:3] == ["better0", "good0", "better1"]
    assert [queue[i] for i in (3, 7, 11)] == ["new0", "new1", "new2"]
    assert not any(g.startswith("junk") for g in queue[:24]) and queue[24:] == [f"junk{i}" for i in range(8)]
    assert fair_queue(_offers(new=2, junk=1), {"junk": 0.0}, random.Random(0)) == ["new0", "new1", "junk0"]


def test_a_crowd_arriving_later_shares_one_turn_in_four_however_many_it_is():
    """Identities are free and a public task's answers make any of them look useful: the peer
    that taught us first keeps 3 turns in 4 over a crowd that came later, whatever its size."""
    for size in (3, 16, 64):
        crowd = {f"c{k}_": 8 for k in range(size)}
        offers = _offers(honest=16, **crowd)
        standing = {"honest": 0.3, **{peer: 0.9 for peer in crowd}}  # the crowd looks *more* useful
        seniority = {"honest": 5, **{peer: 25 + k for k, peer in enumerate(crowd)}}
        queue = fair_queue(offers, standing, random.Random(0), seniority=seniority, round_=60)
        share = sum(g.startswith("honest") for g in queue[:16])
        assert share == 12, f"{size} identities: honest keeps 12 of the first 16 turns, not {share}"
        equals = fair_queue(offers, standing, random.Random(0))  # without seniority: turns as equals
        assert sum(g.startswith("honest") for g in equals[:16]) <= 16 // (size + 1) + 1


def test_cohorts_peers_of_one_time_are_equals_and_the_established_merge():
    seniority = {"a": 0, "b": 10, "c": 30, "d": 200}
    assert cohorts(seniority, ["a", "b", "c", "d", "new"], 100) == [["a", "b"], ["c"], ["d", "new"]]
    assert cohorts(seniority, ["a", "b", "c", "d"], 100 + ESTABLISHED_ROUNDS) == [["a", "b", "c"], ["d"]]
    assert cohorts(seniority, ["a", "b", "c", "d"], 200 + ESTABLISHED_ROUNDS) == [["a", "b", "c", "d"]]
    offers = _offers(a=8, b=8)
    together = fair_queue(offers, {"a": 0.5, "b": 0.5}, random.Random(0), seniority={"a": 0, "b": 10}, round_=20)
    assert sorted(together[:8]) == sorted([f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)])
    older_first = fair_queue(offers, {"a": 0.5, "b": 0.5}, random.Random(0), seniority={"a": 0, "b": 40}, round_=60)
    assert older_first[:8] == ["a0", "a1", "a2", "b0", "a3", "a4", "a5", "b1"]
    assert older_first[8:] == ["a6", "a7", "b2", "b3", "b4", "b5", "b6", "b7"], "a younger cohort takes what is left"


def test_a_useless_peer_gets_one_probation_turn_in_probation_rounds():
    """A peer whose first screened group taught nothing is not shut out for good behind a peer
    that fills the share each round: in a probation round one useless peer's group takes the
    newcomer turn no newcomer takes; a crowd of useless identities still gets only that one."""
    offers = _offers(good=8, **{f"junk{k}_": 8 for k in range(16)})
    standing = {"good": 0.5, **{f"junk{k}_": 0.0 for k in range(16)}}
    plain = fair_queue(offers, standing, random.Random(0))
    assert plain[:8] == [f"good{i}" for i in range(8)], "no probation: useless peers only fill what is left"
    probed = fair_queue(offers, standing, random.Random(0), probation=True)
    assert sorted(probed) == sorted(plain), "every group once"
    assert probed[0].startswith("junk") and probed[1:9] == plain[:8], "one useless group, first, on top of the share"
    picked = {fair_queue(offers, standing, random.Random(seed), probation=True)[0][:-1] for seed in range(40)}
    assert len(picked) > 8, "the useless peer on probation is picked at random, not by id"
    with_newcomers = fair_queue(_offers(good=4, new=2, junk=2), {"good": 0.5, "junk": 0.0}, random.Random(0), probation=True)
    assert with_newcomers == ["junk0", "good0", "good1", "good2", "new0", "good3", "new1", "junk1"], "newcomers keep their turns"
    only_far_junk = {f"junk{k}_" for k in range(15)}  # every useless peer but junk15_ is far (loop.share)
    for seed in range(10):
        near_probed = fair_queue(offers, standing, random.Random(seed), probation=True, not_on_probation=only_far_junk)
        assert near_probed[0] == "junk15_0" and sorted(near_probed) == sorted(plain), "the near one is probed, every group once"
    all_far = fair_queue(offers, standing, random.Random(0), probation=True, not_on_probation=set(standing))
    assert all_far[:8] == plain[:8], "no useless peer may be probed: no probation turn"


def test_a_peer_on_trial_takes_newcomer_turns_and_may_take_the_probation_turn():
    """A peer on trial stands None (a newcomer) and keeps its newcomer turns; in a probation
    round it is among those the turn is drawn from, its group then first and not again later."""
    offers = _offers(good=4, trial=2, junk=2)
    standing = {"good": 0.5, "junk": 0.0}  # "trial": None, as the ledger reports one on trial
    plain = fair_queue(offers, standing, random.Random(0), on_trial={"trial"})
    assert plain == ["good0", "good1", "good2", "trial0", "good3", "trial1", "junk0", "junk1"], "newcomer turns"
    drawn = Counter()
    for seed in range(40):
        probed = fair_queue(offers, standing, random.Random(seed), probation=True, on_trial={"trial"})
        assert sorted(probed) == sorted(plain), "every group once"
        drawn[probed[0][:-1]] += 1
    assert set(drawn) == {"trial", "junk"}, "drawn among the useless and those on trial"
    assert fair_queue(offers, standing, random.Random(0), probation=True, on_trial={"trial"},
                      not_on_probation={"trial", "junk"})[:4] == plain[:4], "a far one is never the one"


def test_newcomers_judged_as_one_get_one_turn_while_none_of_them_teaches():
    """Names are free: a crowd that renews its names every few rounds is never screened enough,
    name by name, to be judged, and held every newcomer turn (docs/security.md, "A crowd that
    churns"). So near newcomers are judged as one: once USELESS_AFTER more of their samples
    screened, whoever sent them, taught nothing than taught, the share gives them one turn
    among the proven peers' (newcomers still fill what those leave), until they teach again."""
    ledger = PeerLedger()
    ledger.screened("good", 8, 8, 0)
    names = [f"name{k}" for k in range(USELESS_AFTER // 8)]
    for k, name in enumerate(names[:-1]):
        ledger.screened(name, 8, 0, k)  # each name one group: on trial, never judged
    ledger.screened("good", 8, 0, 4)  # a proven peer's lapse is not the newcomers'
    ledger.screened("picker", 8, 0, 4, picking=True)  # useless at once, for its own reason
    ledger.unreadable("stranger", 4)  # ... and this one for want of its tokenizer
    ledger.screened("far", 8, 0, 4, near=False)  # a far peer's groups take no newcomer turn
    ledger.screened(names[-1], 7, 0, 5)
    assert not ledger.newcomers_idle(), "31 of the near newcomers' samples taught nothing"
    ledger.screened(names[-1], 1, 0, 5)
    assert ledger.newcomers_idle() and all(ledger.standing(name) is None for name in names), "every name on trial still"
    ledger.screened("crowd-teaching", 8, 8, 6)  # a group with right and wrong answers: every sample teaches
    assert not ledger.newcomers_idle(), "newcomers taught: their turns come back"
    ledger.screened("crowd-idle", 8, 0, 7)
    assert ledger.newcomers_idle(), "counted to USELESS_AFTER at most: one idle group more and it is spent"

    offers = _offers(good=16, **{name: 2 for name in names})
    standing = {"good": 0.5}
    plain = fair_queue(offers, standing, random.Random(0))
    assert sum(not g.startswith("good") for g in plain[:16]) == 4, "every 4th turn a newcomer's"
    thrifty = fair_queue(offers, standing, random.Random(0), newcomer_most=1)
    assert sorted(thrifty) == sorted(plain), "every group once"
    assert [g for g in thrifty[:17] if not g.startswith("good")] == [thrifty[3]], "one newcomer turn among the proven's"
    assert all(g.startswith("name") for g in thrifty[17:]), "newcomers fill what the proven peer leaves"


def test_a_peer_there_before_the_newcomers_idled_is_heard_before_names_made_since():
    """A crowd renewing its names floods the newcomers' one turn with new names; a peer whose
    first batch came before the newcomers first idled (there from the start) takes the newcomer
    turns before every name that came since, a lull included, and a far newcomer (its groups
    take no room) after it."""
    ledger = PeerLedger()
    for peer in ("good", "early", "far-early"):
        ledger.delivered(peer)
    ledger.screened("good", 8, 8, 0)
    for k in range(USELESS_AFTER // 8):
        ledger.screened(f"spent{k}", 8, 0, 1)
    assert ledger.newcomers_idle()
    fresh = [f"fresh{k}" for k in range(30)]
    for peer in fresh:
        ledger.delivered(peer)
    ledger.screened("taught", 8, 8, 2)  # an honest newcomer teaches: the newcomers are idle no more
    assert not ledger.newcomers_idle()
    ledger.delivered("in-a-lull")
    assert not ledger.came_since_idle("early") and all(ledger.came_since_idle(p) for p in [*fresh, "in-a-lull"]), (
        "the set that came before the newcomers first idled is fixed then")
    offers = _offers(good=16, early=1, **{"far-early": 1}, **{peer: 1 for peer in fresh})
    came_late = {peer for peer in offers if ledger.came_since_idle(peer)}
    for seed in range(10):
        queue = fair_queue(offers, {"good": 0.5}, random.Random(seed), newcomer_most=1,
                           not_on_probation={"far-early"}, came_late=came_late)
        assert queue[3] == "early0", "the newcomer turn: the peer there before the flood"
        assert queue.index("far-early0") > 16 and sorted(queue) == sorted(g for gs in offers.values() for g in gs)
    drawn = {fair_queue(offers, {"good": 0.5}, random.Random(seed), newcomer_most=1)[3] for seed in range(10)}
    assert drawn != {"early0"}, "without it the turn is drawn over every name"


def test_a_node_gives_newcomers_one_turn_while_they_teach_nothing(tmp_path):
    """The intake asks the ledger, round by round: while the newcomers taught nothing, one
    newcomer group among the proven peer's in the share; once one taught, every 4th turn."""
    config = _config(tmp_path, "a", "rollout.prompts_per_round=16", "node.own_share=0.5")
    ledger = PeerLedger()
    crowd = [f"name{k}" for k in range(8)]
    for peer in ("good", *crowd):
        ledger.delivered(peer)
    ledger.screened("good", 8, 8, 0)
    for k, name in enumerate(crowd[:USELESS_AFTER // 8]):
        ledger.screened(name, 8, 0, k)
    intake = Intake(config, None, None, "run", _RecordingExchange(), _Live(["good", *crowd]), ledger)
    for peer in ("good", *crowd):
        intake.pool.add(peer, 0, _groups(peer, 0, 8, arrived=time.monotonic()), our_round=0)
    share = [group.peer_id for group in intake.collect(1, generate_s=1.2, timings={})[:8]]
    assert share.count("good") == 7, share
    ledger.screened("honest-new", 8, 8, 1)  # a newcomer teaches (its groups not here yet)
    share = [group.peer_id for group in intake.collect(2, generate_s=1.2, timings={})[:8]]
    assert share.count("good") == 6, share


def test_a_node_hears_the_peer_there_before_the_flood_first(tmp_path):
    """The intake asks the ledger who came before the newcomers first idled: beside 30 names
    made since, the one newcomer turn of the share goes to the peer that was there."""
    config = _config(tmp_path, "a", "rollout.prompts_per_round=16", "node.own_share=0.5")
    ledger = PeerLedger()
    for peer in ("good", "there"):
        ledger.delivered(peer)
    ledger.screened("good", 8, 8, 0)
    for k in range(USELESS_AFTER // 8):
        ledger.screened(f"spent{k}", 8, 0, 0)
    crowd = [f"name{k}" for k in range(30)]
    for peer in crowd:
        ledger.delivered(peer)
    intake = Intake(config, None, None, "run", _RecordingExchange(), _Live(["good", "there", *crowd]), ledger)
    for peer in ("good", "there", *crowd):
        intake.pool.add(peer, 0, _groups(peer, 0, 8 if peer == "good" else 1, arrived=time.monotonic()), our_round=0)
    for round_ in (1, 2, 3):
        share = [group.peer_id for group in intake.collect(round_, generate_s=1.2, timings={})[:8]]
        assert share.count("there") == 1 and share.count("good") == 7, share


def test_a_node_lets_newcomers_batches_go_after_hold_rounds_and_keeps_the_others(tmp_path):
    """The intake asks the ledger who is a newcomer: one never screened and one on trial lose
    their unused groups once their batch is HOLD_ROUNDS of our rounds old (their hold ended a
    round before); a proven peer and a useless one keep theirs (until stale or max_age_s)."""
    config = _config(tmp_path, "a", "rollout.prompts_per_round=16", "node.own_share=0.5")
    ledger = PeerLedger()
    peers = ("good", "useless", "on-trial", "never")
    for peer in peers:
        ledger.delivered(peer)
    ledger.screened("good", 8, 8, 0)
    ledger.screened("useless", USELESS_AFTER, 0, 0)
    ledger.screened("on-trial", 8, 0, 0)
    assert ledger.on_trial("on-trial") and ledger.standing("never") is None
    intake = Intake(config, None, None, "run", _RecordingExchange(), _Live(list(peers)), ledger)
    for peer in peers:
        intake.pool.add(peer, 0, _groups(peer, 0, 1, arrived=time.monotonic()), our_round=0)
    intake.collect(HOLD_ROUNDS - 1, generate_s=1.2, timings={})
    assert intake.pool.peers == set(peers)
    assert intake.pool.holding(HOLD_ROUNDS - 1) == {"good", "useless"}, "newcomers asked for their next"
    intake.collect(HOLD_ROUNDS, generate_s=1.2, timings={})
    assert intake.pool.peers == {"good", "useless"}


def _groups(peer: str, round_: int, count: int, arrived: float = 0.0) -> list[OfferedGroup]:
    return [OfferedGroup(peer, round_, i, [], arrived) for i in range(count)]


def test_the_pool_keeps_rounds_forward_and_fresh_and_uses_each_group_once():
    pool = PeerPool()
    assert pool.add("p", 5, _groups("p", 5, 2), our_round=0)
    assert not pool.add("p", 5, _groups("p", 5, 2), our_round=0), "a replay"
    assert not pool.add("p", 3, _groups("p", 3, 2), our_round=1), "an older round (a restarted peer)"
    assert pool.add("p", 6, _groups("p", 6, 2), our_round=1)
    assert [g.round for g in pool.offers(1)["p"]] == [6, 6, 5, 5], "newest first"
    assert pool.add("p", 8, _groups("p", 8, 1), our_round=2)
    pool.expire(now=0.0, max_age_s=60, staleness=1)
    assert sorted({g.round for g in pool.offers(2)["p"]}) == [8], "more than 1 of its rounds behind: gone"
    pool.add("q", 0, _groups("q", 0, 3, arrived=0.0), our_round=2)
    pool.expire(now=100.0, max_age_s=60, staleness=5)
    assert pool.peers == set(), "older than max_age_s by our clock: gone"
    pool.add("r", 0, _groups("r", 0, 2), our_round=3)
    offered = pool.offers(3)["r"]
    pool.take(offered[:1])
    assert pool.offers(3)["r"] == offered[1:] and len(pool) == 1


def test_the_pool_holds_a_peer_while_a_recent_batch_of_it_is_unused():
    """A batch of unused groups younger than HOLD_ROUNDS stands in for its sender's next: the
    exchange need not fetch a useless peer's next batch, and a peer screened on probation is
    judged on a batch at most HOLD_ROUNDS old."""
    pool = PeerPool()
    pool.add("p", 0, _groups("p", 0, 2), our_round=10)
    pool.add("q", 0, _groups("q", 0, 1), our_round=10)
    pool.take(pool.offers(11)["q"])
    assert pool.holding(11) == {"p"}, "q's groups are used up: ask it for more"
    assert pool.holding(10 + HOLD_ROUNDS - 1) == {"p"}
    assert pool.holding(10 + HOLD_ROUNDS) == set(), "too old to stand in for the next: ask again"


def test_a_newcomer_s_batch_leaves_the_pool_when_it_no_longer_stands_in_for_its_next():
    """A newcomer's unused groups leave once its newest batch is HOLD_ROUNDS of our rounds old,
    however young by our clock: a name a crowd abandoned drops out of the newcomers' draw (a
    live one was asked for a newer batch a round before: holding). A peer with a standing
    keeps its groups until they are stale."""
    now = time.monotonic()
    pool = PeerPool()
    pool.add("new", 0, _groups("new", 0, 2, arrived=now), our_round=10)
    pool.add("known", 0, _groups("known", 0, 2, arrived=now), our_round=10)
    gone = 10 + HOLD_ROUNDS
    pool.expire(now, max_age_s=300, staleness=1, our_round=gone - 1, newcomers={"new"})
    assert pool.peers == {"new", "known"}, "its newer batch is asked for, not here yet: kept"
    assert "new" not in pool.holding(gone - 1)
    pool.expire(now, max_age_s=300, staleness=1, our_round=gone, newcomers={"new"})
    assert pool.peers == {"known"}, "a newcomer's batch as old as HOLD_ROUNDS: gone"
    assert pool.add("new", 1, _groups("new", 1, 2, arrived=now), our_round=gone)
    assert [g.round for g in pool.offers(gone)["new"]] == [1], "its newer batch is offered (paced)"


@pytest.mark.parametrize(
    "rounds_s", [[1.0], [45.0], [30.0, 60.0, 45.0, 40.0]], ids=["short-rounds", "gpu-rounds", "uneven-gpu-rounds"]
)
def test_a_live_newcomer_fetched_as_over_hivemind_always_holds_groups(rounds_s):
    """Over hivemind a peer is asked for a newer batch in the background of the round its hold
    ends, and the batch is handed out at the next round's gather. A live newcomer never
    screened (every round's groups unused) keeps groups in the pool in every round, in the
    intake's order (expire, holding: what the exchange leaves out, gather): where rounds are
    short its groups leave by HOLD_ROUNDS, where they are a GPU's by max_age_s (300 s, 5-10
    rounds of 30-60 s), and either way its hold ends a round before."""
    pool = PeerPool()
    pool.add("new", 0, _groups("new", 0, 2, arrived=0.0), our_round=0)
    asked_in: int | None = None
    sent = 0
    now = 0.0
    for round_ in range(1, 4 * HOLD_ROUNDS):
        now += rounds_s[round_ % len(rounds_s)]
        pool.expire(now, max_age_s=300, staleness=64, our_round=round_, newcomers={"new"})
        if asked_in is not None and asked_in < round_:  # fetched since: handed out at this gather
            sent += 1
            assert pool.add("new", sent, _groups("new", sent, 2, arrived=now), our_round=round_)
            asked_in = None
        if "new" not in pool.holding(round_) and asked_in is None:
            asked_in = round_
        assert "new" in pool.peers, f"no groups in round {round_}"
    assert sent >= 3


def test_a_newcomer_s_groups_stay_for_the_round_its_hold_ends_and_no_longer():
    """The round a newcomer's hold ends its groups are still offered (its newer batch is on
    its way); the next round they are gone."""
    pool = PeerPool()
    pool.add("new", 0, _groups("new", 0, 2, arrived=0.0), our_round=0)
    round_ = 1
    while "new" in pool.holding(round_):
        round_ += 1
        pool.expire(0.0, max_age_s=300, staleness=1, our_round=round_, newcomers={"new"})
    assert round_ == HOLD_ROUNDS - 1 and pool.peers == {"new"}
    pool.expire(0.0, max_age_s=300, staleness=1, our_round=round_ + 1, newcomers={"new"})
    assert pool.peers == set()


def test_a_newer_batch_arriving_the_round_a_hold_ends_is_held_at_once():
    """A hold that ended because the groups leave at the next expire holds again as soon as a
    newer batch of the peer arrives (that round's gather): its new groups stay."""
    pool = PeerPool()
    pool.add("new", 0, _groups("new", 0, 2), our_round=0)
    pool.expire(0.0, max_age_s=300, staleness=1, our_round=HOLD_ROUNDS - 1, newcomers={"new"})
    assert "new" not in pool.holding(HOLD_ROUNDS - 1)
    pool.add("new", 1, _groups("new", 1, 2), our_round=HOLD_ROUNDS - 1)
    assert pool.holding(HOLD_ROUNDS - 1) == {"new"}


def test_a_peer_with_a_young_group_stays_held_whatever_its_old_ones():
    """The hold ends by max_age_s only when every group of the peer would leave by the next
    round: one young group still stands in for its next batch."""
    pool = PeerPool()
    pool.add("p", 0, _groups("p", 0, 1, arrived=0.0), our_round=0)
    pool.add("p", 1, _groups("p", 1, 1, arrived=80.0), our_round=1)
    pool.expire(60.0, max_age_s=100, staleness=64, our_round=2)
    pool.expire(90.0, max_age_s=100, staleness=64, our_round=3)
    assert pool.holding(3) == {"p"} and len(pool.offers(3)["p"]) == 2


def test_a_peer_s_hold_ends_a_round_before_max_age_s_takes_its_groups():
    """The pool measures our round by its clock between expires: a peer all of whose groups
    pass max_age_s before the next expire is no longer held (its newer batch is asked for),
    while those groups are still offered this round."""
    pool = PeerPool()
    pool.add("p", 0, _groups("p", 0, 2, arrived=0.0), our_round=0)
    pool.add("q", 0, _groups("q", 0, 2, arrived=50.0), our_round=1)
    for round_, now in ((1, 30.0), (2, 60.0)):
        pool.expire(now, max_age_s=100, staleness=64, our_round=round_)
        assert pool.holding(round_) == {"p", "q"}, now
    pool.expire(90.0, max_age_s=100, staleness=64, our_round=3)
    assert pool.holding(3) == {"q"}, "p's groups pass max_age_s before the next round's expire"
    assert pool.peers == {"p", "q"} and len(pool.offers(3)["p"]) == 2, "still offered this round"
    pool.expire(120.0, max_age_s=100, staleness=64, our_round=4)
    assert pool.peers == {"q"} and pool.holding(4) == {"q"}


def test_a_slower_peer_s_batch_is_spread_over_the_rounds_until_its_next():
    pool = PeerPool()
    pool.add("slow", 0, _groups("slow", 0, 6), our_round=0)
    assert len(pool.offers(0)["slow"]) == 6, "its spacing is not known yet: all of it"
    pool.take(pool.offers(0)["slow"])
    pool.add("slow", 1, _groups("slow", 1, 6), our_round=3)  # it delivers every third round of ours
    taken = []
    for our_round in (3, 4, 5):
        offer = pool.offers(our_round).get("slow", [])
        taken.append(len(offer))
        pool.take(offer)
    assert taken == [2, 2, 2], "6 groups over the 3 rounds until its next batch"
    fast = PeerPool()
    fast.add("fast", 0, _groups("fast", 0, 6), 0)
    fast.add("fast", 1, _groups("fast", 1, 6), 1)
    assert len(fast.offers(1)["fast"]) == 12, "a peer as fast as us: everything it holds"


def test_a_peer_back_from_a_pause_is_paced_by_its_pace_now():
    """One long gap between a peer's batches (it started after us, or was away) does not make
    it look slow once its batches come every third round again: its batch is spread over
    three rounds, not over the thirty-odd the mean of 65 and 3 would say."""
    pool = PeerPool()
    now = time.monotonic()
    for round_, ours in ((0, 0), (1, 65), (2, 68)):
        pool.add("p", round_, _groups("p", round_, 6, arrived=now), ours)
    pool.expire(now, max_age_s=300, staleness=0)  # only its newest batch is fresh
    assert len(pool.offers(68)["p"]) == 2, "6 groups over the 3 rounds until its next batch"
    pool.add("p", 3, _groups("p", 3, 6, arrived=now), 80)  # a longer gap moves the pace half way
    pool.expire(now, max_age_s=300, staleness=0)
    assert len(pool.offers(80)["p"]) == 1, "paced over 7.5 rounds: one of its 6 groups now"


def test_standing_follows_the_share_of_useful_samples():
    ledger = PeerLedger()
    assert ledger.standing("p") is None, "never screened: a newcomer"
    ledger.screened("p", 8, 0, 0)
    assert ledger.standing("p") is None, "one group that taught nothing: a newcomer still"
    ledger.screened("p", USELESS_AFTER - 8, 0, 1)
    assert ledger.standing("p") == 0.0, "USELESS_AFTER samples screened, none useful: useless"
    ledger.screened("q", 8, 4, 0)
    assert ledger.standing("q") == 0.5
    ledger.screened("q", 8, 8, 1)
    assert 0.5 < ledger.standing("q") < 1.0


def test_a_peer_found_picking_or_unreadable_is_useless_at_once():
    """Only an unlucky sampler waits for USELESS_AFTER samples: a peer found picking its
    completions, or sending batches this node cannot read, taught nothing for a reason that
    more of its samples would not change."""
    ledger = PeerLedger()
    ledger.screened("picker", 8, 0, 0, picking=True)
    ledger.unreadable("stranger", 0)
    ledger.screened("unlucky", 8, 0, 0)
    assert ledger.standing("picker") == 0.0 and ledger.standing("stranger") == 0.0
    assert ledger.standing("unlucky") is None
    ledger.screened("stranger", 8, 0, 1)  # its tokenizer learned: its next batch is read, all alike
    assert ledger.standing("stranger") is None and ledger.on_trial("stranger"), "read: judged as anyone's"
    ledger.screened("stranger", 8, 8, 2)  # ... and then one that teaches
    assert ledger.standing("stranger") > 0 and ledger.seniority() == {"stranger": 2}


def _config_of(*sets: str):
    return load_config(None, list(sets))


def test_samples_near_a_bar_earn_their_sender_no_standing():
    """Kept and trained on, but passing the gate by a hair (trust.near_bar): not useful."""
    completion = Completion(np.array([5], dtype=np.int32), np.array([-1.0], dtype=np.float32))
    groups = [
        Group(peer, Problem(0, "1+1", "2"), [1], [
            Sample.of([1], completion, advantage, peer).judged(Verdict(near_bar=near), advantage)
            for advantage, near in zip((0.5, -0.5), nears)
        ])
        for peer, nears in (("walker", (True, True)), ("honest", (False, True)))
    ]
    assert standing_counts(groups) == {"walker": (2, 0), "honest": (2, 1)}
    # through a round's screening (nothing else judging here) into the ledger, as the intake writes it
    screener = Screener(_config_of("trust.likelihood_gate=false", "trust.weight_budget=false",
                                   "node.weight_by_usefulness=true"), None)
    done = screener.open_round([], peers_coming=True).screen(groups)
    ledger = PeerLedger()
    Intake._record(SimpleNamespace(ledger=ledger, share=SimpleNamespace(is_far=lambda peer: False)), 0, done)
    assert ledger.standing("walker") is None and ledger.standing("honest") == 0.5, "no standing earned: a newcomer still"
    assert screener.usefulness.usefulness == {"walker": 0.0, "honest": 0.1}, "usefulness counts by the same rule, from 0"


class _RecordingExchange:
    """Stands in for the exchange: records how long each gather was allowed to wait, for whom,
    and whose groups the node said it held (at each gather, and after each take: `holds`)."""

    peer_id = "me"

    def __init__(self) -> None:
        self.waits: list[tuple[float, set[str]]] = []
        self.held: list[frozenset[str]] = []
        self.holds: list[frozenset[str]] = []

    def hold(self, held: frozenset[str]) -> None:
        self.holds.append(held)

    def gather(self, wait: GatherWait) -> list:
        self.waits.append((wait.timeout_s, set(wait.wait_for)))
        self.held.append(wait.held)
        return []

    def tokenizers(self) -> list:
        return []


class _Live:
    def __init__(self, peers: list[str]) -> None:
        self.peers = peers

    def live_peers(self) -> list[str]:
        return self.peers


def test_a_node_that_takes_no_peer_groups_takes_no_probation_group_either(tmp_path):
    config = _config(tmp_path, "a", "node.max_peer_groups=0")
    ledger = PeerLedger()
    ledger.screened("junk", USELESS_AFTER, 0, 0)
    intake = Intake(config, None, None, "run", _RecordingExchange(), _Live(["junk"]), ledger)
    taken = intake.take(0, _groups("junk", 0, 1), own=[], timings={})
    assert taken.kept == [] and taken.peers == set(), "nothing scored, nothing taken"


@pytest.mark.parametrize("junk_screened", [8, USELESS_AFTER], ids=["on-trial", "useless"])
def test_useless_groups_in_the_pool_do_not_stop_the_wait_for_a_proven_peer(tmp_path, junk_screened):
    """A crowd's useless groups fill no share, so they must not stand in for it either: with
    the pool full of them and nothing of the proven peer's, the round still waits its bounded
    share for that peer; with the proven peer's groups there, it does not wait. Groups of
    identities on trial (too few screened to judge) have taught nothing either."""
    config = _config(tmp_path, "a", "rollout.prompts_per_round=8", "node.own_share=0.5")
    ledger = PeerLedger()
    for peer in ("good", *(f"junk{k}" for k in range(4))):
        ledger.delivered(peer)
        ledger.screened(peer, junk_screened, junk_screened if peer == "good" else 0, 0)
    exchange = _RecordingExchange()
    intake = Intake(config, None, None, "run", exchange, _Live(["good", *(f"junk{k}" for k in range(4))]), ledger)
    for k in range(4):
        intake.pool.add(f"junk{k}", 0, _groups(f"junk{k}", 0, 16, arrived=time.monotonic()), our_round=0)
    assert {group.peer_id for group in intake.collect(1, generate_s=1.2, timings={})} == {f"junk{k}" for k in range(4)}
    assert exchange.waits[-1] == (0.25 * 1.2, {"good"}), "64 useless groups held: still short, so wait for the proven peer"
    assert exchange.held[-1] == {f"junk{k}" for k in range(4)}, "told whose groups wait here: no more of theirs"
    intake.pool.add("good", 0, _groups("good", 0, 4, arrived=time.monotonic()), our_round=2)
    firsts = [group.peer_id for group in intake.collect(2, generate_s=1.2, timings={})[:5]]
    assert firsts.count("good") == 4 and firsts[:3] == ["good"] * 3, "proven first (beside a newcomer turn in four)"
    assert exchange.waits[-1][0] == 0.0, "the proven peer's groups fill the share: no wait"


def test_a_far_peer_is_not_waited_for(tmp_path):
    """A far peer's groups take no room (node.adapt_share_nats), so waiting for its next batch
    buys no room in the share: a short round waits for the near proven peer only (under
    far_room own here; under top its groups come on top if they are there, unwaited for)."""
    config = _config(tmp_path, "a", "rollout.prompts_per_round=8", "node.own_share=0.5", "node.adapt_share_nats=1.0",
                     "node.far_room=own")
    ledger = PeerLedger()
    for peer in ("near", "far"):
        ledger.delivered(peer)
        ledger.screened(peer, 8, 8, 0)
    exchange = _RecordingExchange()
    intake = Intake(config, None, None, "run", exchange, _Live(["near", "far"]), ledger)
    intake.collect(1, generate_s=1.2, timings={})
    assert exchange.waits[-1] == (0.25 * 1.2, {"near", "far"}), "neither measured yet: both waited for"
    intake.share.observe([np.full(2, -1.0)], {"far": [np.full(2, -3.0)], "near": [np.full(2, -1.0)]})
    intake.collect(2, generate_s=1.2, timings={})
    assert exchange.waits[-1] == (0.25 * 1.2, {"near"})


def _scored_intake(tmp_path, rewards: dict[int, list[float]], *sets: str) -> Intake:
    """An Intake whose peers' groups score `rewards[prompt_id]` and pass screening (gate and
    budget off): what `take` keeps is down to the room each sample takes."""
    config = _config(tmp_path, "a", "rollout.prompts_per_round=2", "node.own_share=0.5", "rollout.group_size=4",
                     "trust.likelihood_gate=false", "trust.weight_budget=false", *sets)
    intake = Intake(config, None, None, "run", _RecordingExchange(), _Live([]), PeerLedger())
    problem = Problem(0, "1+1", "2")
    completion = Completion(np.array([5], dtype=np.int32), np.array([-1.0], dtype=np.float32))

    def score(group: OfferedGroup) -> Group:
        values = iter(rewards[group.prompt_id])
        task = SimpleNamespace(reward=lambda text, problem: next(values))
        return score_group(task, SimpleNamespace(decode=str), group.peer_id, problem, [1], [completion] * 4, False)

    intake._score = score
    return intake


def test_zero_advantage_samples_take_no_room_yet_count_in_their_group_s_mean(tmp_path):
    """A group all right teaches nothing: it is screened and used up, but the peers' share (one
    group here) goes to the next group; a sample whose reward is its group's mean is left out
    while the others keep the advantages taken with it in the mean."""
    rewards = {0: [1.0] * 4, 1: [0.0, 0.5, 1.0, 0.5]}
    intake = _scored_intake(tmp_path, rewards, "node.skip_uninformative=true")
    offered = _groups("p", 0, 2)
    taken = intake.take(0, offered, own=[], timings={})
    assert sorted(sample.advantage for sample in taken.kept) == [-0.5, 0.5]
    assert taken.uninformative == 6, "four of the all-right group, two at their group's mean"

    diluted = _scored_intake(tmp_path, rewards).take(0, _groups("p", 0, 2), own=[], timings={})
    assert [sample.advantage for sample in diluted.kept] == [0.0] * 4, "the default: the first group fills the share"
    assert diluted.uninformative == 0


def test_after_the_take_the_exchange_hears_whose_groups_are_still_held(tmp_path):
    """The gather was told whom the pool held before the round's take; once the take used a
    peer's groups up, the exchange hears it is held no more (so a peer not proven useful is
    fetched from again while the node trains), and a peer with groups left stays held."""
    intake = _scored_intake(tmp_path, {0: [0.0, 0.5, 1.0, 0.5]})
    for peer in ("used", "left"):
        intake.pool.add(peer, 0, _groups(peer, 0, 1), our_round=0)
    assert intake.pool.holding(0) == {"used", "left"}
    intake.take(0, intake.pool.offers(0)["used"], own=[], timings={})
    assert intake.exchange.holds == [frozenset({"left"})]


def _graded_intake(tmp_path, monkeypatch, *sets: str) -> Intake:
    """An Intake that scores peers' groups through its own `_score`: a completion [1] is right,
    [0] wrong; room for two groups, which pass screening (gate and budget off)."""
    monkeypatch.setattr("swarmnode.loop.intake.build_prompt", lambda task, problem, policy: [1])
    config = _config(tmp_path, "a", "rollout.prompts_per_round=4", "node.own_share=0.5", "rollout.group_size=4",
                     "trust.likelihood_gate=false", "trust.weight_budget=false", *sets)
    task = SimpleNamespace(train_problem=lambda prompt_id: Problem(prompt_id, "1+1", "2"),
                           reward=lambda text, problem: float(text == "1"))
    policy = SimpleNamespace(decode=lambda tokens: str(int(tokens[0])))
    return Intake(config, policy, task, "run", _RecordingExchange(), _Live([]), PeerLedger())


def _answers(*right: int) -> list[Completion]:
    return [Completion(np.array([r], dtype=np.int32), np.array([-1.0], dtype=np.float32)) for r in right]


def test_a_peer_s_group_is_taken_against_our_own_reward_under_peer_baseline(tmp_path, monkeypatch):
    """A group a peer got all right teaches nothing against its own mean; against the mean
    reward of our own samples that round (own) it counts, and a group below our own pushes down
    on net. Under lower only a group scoring above our own is taken against it. With no own
    samples that round, each group keeps its own mean."""
    own = [Sample.of([1], _answers(0)[0], 0.0, reward=reward) for reward in (0.0, 1.0, 0.0, 1.0)]  # mean 0.5
    offered = [OfferedGroup("p", 0, 0, _answers(1, 1, 1, 1)), OfferedGroup("p", 0, 1, _answers(0, 0, 0, 1))]
    expected = {
        "group": [0.0] * 4 + [-0.25, -0.25, -0.25, 0.75],
        "own": [0.5] * 4 + [-0.5, -0.5, -0.5, 0.5],
        "lower": [0.5] * 4 + [-0.25, -0.25, -0.25, 0.75],
    }
    for rule, advantages in expected.items():
        taken = _graded_intake(tmp_path, monkeypatch, f"loss.peer_baseline={rule}").take(0, offered, own, timings={})
        assert [sample.advantage for sample in taken.kept] == advantages, rule
        alone = _graded_intake(tmp_path, monkeypatch, f"loss.peer_baseline={rule}").take(0, offered, [], timings={})
        assert [sample.advantage for sample in alone.kept] == expected["group"], rule


def test_a_peer_baseline_other_than_the_group_s_mean_refuses_std_division(tmp_path):
    """An all-right group has no spread to divide by: the setting says which to change. `lower` is
    the default, so GRPO's division alone is refused, and allowed with the group's mean."""
    for sets in (["loss.peer_baseline=lower"], ["loss.peer_baseline=own"], []):
        with pytest.raises(ValueError, match="set loss.peer_baseline group"):
            _config(tmp_path, "a", *sets, "loss.advantage_std=true")
    assert _config(tmp_path, "a", "loss.peer_baseline=group", "loss.advantage_std=true").loss.advantage_std


def _own(advantages: list[float]) -> list[Sample]:
    completion = Completion(np.array([5], dtype=np.int32), np.array([-1.0], dtype=np.float32))
    return [Sample.of([1], completion, advantage) for advantage in advantages]


def test_completions_that_cannot_be_put_into_our_tokens_taught_nothing(tmp_path):
    """A peer of another tokenizer whose every completion fails to translate (a lone piece of a
    character, say) trains nothing, and its standing counts them as screened, none useful."""
    intake = _scored_intake(tmp_path, {0: [1.0] * 4})
    intake._score = lambda group: Group(group.peer_id, Problem(0, "1+1", "2"), [1], untranslated=4)
    taken = intake.take(0, _groups("p", 0, 1), own=[], timings={})
    record = intake.ledger.peers["p"]
    assert taken.kept == [] and record.screened == 4 and record.standing == 0.0 and record.taught_since is None


def test_with_weight_by_usefulness_a_peer_counts_what_it_taught_over_what_ours_teach(tmp_path):
    """Our own samples all teach (advantage != 0). Each round the same three peers send a group
    that all teaches, one that teaches in half its samples and one that teaches nothing: their
    factors start at 0 and grow toward 1, 0.5 (in every sample kept, even the useful ones) and
    0, whose samples take no room at all. Off, every sample counts 1."""
    rewards = {0: [0.0, 1.0, 0.0, 1.0], 1: [0.0, 0.5, 1.0, 0.5], 2: [1.0] * 4}
    own = _own([0.5, -0.5] * 4)

    def rounds(count: int, *sets: str) -> list[dict[str, set[float]]]:
        intake = _scored_intake(tmp_path, rewards, "rollout.prompts_per_round=6", *sets)
        seen = []
        for round_ in range(count):
            offered = [OfferedGroup(peer, round_, prompt, [], 0.0) for peer, prompt in (("all", 0), ("half", 1), ("none", 2))]
            found: dict[str, set[float]] = {}
            for sample in intake.take(round_, offered, own=own, timings={}).kept:
                found.setdefault(sample.source, set()).add(round(sample.weight_scale, 6))
            seen.append(found)
        return seen

    weighted = rounds(20, "node.weight_by_usefulness=true")
    assert weighted[0] == {"all": {0.2}, "half": {0.1}}, "a fifth of the way from 0; 'none' takes no room"
    assert weighted[-1] == {"all": {round(1 - 0.8**20, 6)}, "half": {round(0.5 * (1 - 0.8**20), 6)}}
    assert rounds(1) == [{"all": {1.0}, "half": {1.0}, "none": {1.0}}]


def test_a_peer_s_factor_rises_with_useful_samples_and_falls_with_useless_ones():
    weights = UsefulnessWeights(enabled=True)
    weights.observe_own(_own([0.5, 0.0, -0.5, 0.0]), [False] * 4)  # half of ours teach
    assert weights.factor("p") == 0.0, "never screened: nothing shown yet"
    factors = []
    for useful in [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0]:  # of 8
        weights.observe_peer("p", 8, useful)
        factors.append(weights.factor("p"))
    rising, falling = factors[:10], factors[9:]
    assert rising == sorted(rising) and rising[0] == pytest.approx(0.2) and rising[-1] > 0.85, "toward 0.5 / 0.5"
    assert falling == sorted(falling, reverse=True) and falling[-1] < 0.5
    assert all(0.0 <= f <= 1.0 for f in factors), "never above a sample of our own"
    weights.observe_own(_own([0.5, -0.5, 0.5, 0.5]), [True] * 4)  # they would, but sit at the gate's bar
    assert weights.own_share == pytest.approx(0.4), "our share moves as a peer's does, by a peer's rule"
    nothing_of_ours = UsefulnessWeights(enabled=True)
    nothing_of_ours.observe_own(_own([0.0] * 8), [False] * 8)
    nothing_of_ours.observe_peer("p", 8, 1)
    assert nothing_of_ours.factor("p") == 1.0, "when our own groups teach nothing, any useful peer counts fully"
    assert UsefulnessWeights(enabled=False).factor("anyone") == 1.0


def test_identities_gain_no_weight_by_number_nor_by_a_new_name():
    """A crowd of identities whose batches teach nothing counts 0 however many they are and
    however long they keep at it; a peer that takes a new name after a poor record starts
    below where its old name stands after the same batch."""
    weights = UsefulnessWeights(enabled=True)
    weights.observe_own(_own([0.5, -0.5]), [False] * 2)
    for _ in range(20):
        for k in range(64):
            weights.observe_peer(f"sybil{k}", 16, 0)
    assert {weights.factor(f"sybil{k}") for k in range(64)} == {0.0}
    for _ in range(5):
        weights.observe_peer("poor", 8, 2)
    weights.observe_peer("poor", 8, 8)
    weights.observe_peer("renamed", 8, 8)
    assert 0.0 < weights.factor("renamed") < weights.factor("poor")


# The far-peer rules (swarmnode.loop.share, on by default with own_share below 1) off, so a test
# of something else keeps its peers near; a test of a rule names it after these.
FAR_RULES_OFF = ("node.adapt_share_nats=0", "node.far_reward_lead=0", "node.far_reward_trail=0")


def _config(tmp_path, name, *sets):
    return load_config(None, [
        f"node.run_dir={tmp_path / name}", "model.device=cpu", "task.system_prompt=''", "rollout.backend=hf",
        "rollout.group_size=8", "rollout.max_new_tokens=10", "train.lr=1e-4", "node.eval_size=8",
        "node.checkpoint_every=0", "node.gather_timeout_s=5", "swarm.enabled=false", *FAR_RULES_OFF, *sets,
    ])


@pytest.mark.slow
def test_crowding_identities_with_many_useless_groups_lose_the_batch_to_the_honest_peer(tmp_path):
    """Four identities each offer 16 valid groups of wrong answers (no advantage, nothing to
    learn) next to one honest peer offering 4: once the honest peer has shown a useful group
    (its first may all be right or all wrong, and a peer found useless is screened again on
    probation), its groups fill the peers' share, whatever the crowd's ids or volume, but for
    one crowd group on probation every PROBATION_EVERY-th round."""
    hub = InMemoryHub()
    honest_sets = ["rollout.prompts_per_round=8", "node.own_share=0.5"]
    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(assemble(_config(tmp_path, name, *honest_sets), join=lambda run, standing, n=name: hub.join(n, run, standing)))
            for name in ("honest-a", "honest-b")
        ]
        crowd = []
        for i in range(4):
            name = f"0000-crowd-{i}"  # ids that sort first
            config = _config(tmp_path, name, "rollout.prompts_per_round=16")
            policy = Policy.load(config.model, config.train, seed=config.node.seed)
            crowd.append(stack.enter_context(assemble(
                config, policy=policy,
                join=lambda run, standing, n=name, c=config, p=policy: poisoning_link(hub.join(n, run, standing), "wrong", c, nodes[0].task, p),
            )))
        taken: list[list[str]] = []
        take = nodes[0].intake.take

        def recording(round_, offered, own, timings):
            result = take(round_, offered, own, timings)
            taken.append([sample.source for sample in result.kept])
            return result

        nodes[0].intake.take = recording
        # the round after which the honest peer first stood as useful and every crowd identity
        # had been screened once: a newcomer's first turn (every fourth, fair_queue) is its due
        proven_after = None
        crowd_ids = [f"0000-crowd-{i}" for i in range(4)]
        for round_ in range(16):
            states = [node.produce(round_) for node in nodes]
            for junk in crowd:
                junk.produce(round_)
            for node, state in zip(nodes, states):
                node.consume(round_, state)
            ledger = nodes[0].ledger
            known = all(ledger.standing(junk) is not None for junk in crowd_ids)
            if proven_after is None and (ledger.standing("honest-b") or 0) > 0 and known:
                proven_after = round_
            if proven_after is not None and round_ == proven_after + 2:
                break
    assert proven_after is not None and proven_after < 14, "the honest peer is found useful (probation screens it again)"
    assert all(len(samples) >= 32 for samples in taken), "the peers' share is filled every round"
    honest = [samples.count("honest-b") for samples in taken]
    # once proven, the honest peer fills the share; one crowd group gets in on top, on
    # probation, every PROBATION_EVERY-th round
    group_size = nodes[0].config.rollout.group_size
    after = (proven_after + 1, proven_after + 2)
    assert [honest[r] for r in after] == [32, 32], honest
    assert [len(taken[r]) for r in after] == [32 + (group_size if r % PROBATION_EVERY == 0 else 0) for r in after]
    ledger = nodes[0].ledger
    assert ledger.standing("honest-b") > 0
    assert all(ledger.standing(f"0000-crowd-{i}") in (None, 0.0) for i in range(4))
    assert ledger.total == 0, "wrong answers are no lie"


def test_seniority_survives_a_restart_through_the_checkpoint_s_record():
    ledger = PeerLedger()
    ledger.screened("honest", 8, 4, 3)
    ledger.screened("honest", 8, 8, 9)  # first useful in round 3: that stays
    ledger.screened("later", 8, 0, 5)  # nothing useful yet: no seniority
    assert ledger.seniority() == {"honest": 3}
    restored = PeerLedger()
    restored.restore_seniority({**ledger.seniority(), "bad": "x", 7: 1})  # a damaged record is skipped
    assert restored.seniority() == {"honest": 3}
    assert restored.standing("honest") is None and not restored.known("honest"), "only its seniority comes back"


def test_the_ledger_forgets_silent_names_that_never_taught_and_keeps_its_counts():
    """Names are free: one that never taught and did nothing here for SILENT_ROUNDS of our
    rounds is forgotten, strikes and all, and comes back as a fresh name would; one seen since,
    one whose groups are still held, and one that taught are kept; the run's count of bad
    batches keeps every strike."""
    ledger = PeerLedger()
    ledger.advance(0)
    for peer in ("gone", "held", "teacher", "liar", "later"):
        ledger.delivered(peer)
    ledger.screened("teacher", 8, 4, 0)
    ledger.screened("gone", 8, 0, 0)
    for _ in range(ledger.max_rejects):
        ledger.reject("liar", "bad bytes")
    assert ledger.is_banned("liar") and ledger.total == ledger.max_rejects
    ledger.advance(SILENT_ROUNDS - 1)
    ledger.delivered("later")
    assert ledger.forget_silent(keep={"held"}) == [], "silent for fewer than SILENT_ROUNDS"
    ledger.advance(SILENT_ROUNDS)
    assert sorted(ledger.forget_silent(keep={"held"})) == ["gone", "liar"]
    assert set(ledger.peers) == {"held", "teacher", "later"} and ledger.seniority() == {"teacher": 0}
    assert not ledger.is_banned("liar") and ledger.standing("gone") is None, "back as fresh names"
    assert ledger.total == ledger.max_rejects, "the run's count of bad batches keeps them"
    assert not ledger.known("gone") and "gone" not in ledger.expected()


def test_past_its_bound_the_ledger_forgets_the_silent_teachers_that_taught_last(monkeypatch):
    monkeypatch.setattr(ledger_module, "MAX_SILENT_TAUGHT", 2)
    ledger = PeerLedger()
    for round_, peer in enumerate(("oldest", "old", "young", "youngest")):
        ledger.advance(round_)
        ledger.screened(peer, 8, 8, round_)
    ledger.advance(3 + SILENT_ROUNDS)
    assert sorted(ledger.forget_silent()) == ["young", "youngest"]
    assert ledger.seniority() == {"oldest": 0, "old": 1}, "the peers that taught first keep their place"


def test_a_resumed_node_does_not_take_its_restored_peers_for_silent(monkeypatch):
    """Seniority restored from a checkpoint counts as seen in the resumed run's first round:
    the peers that taught keep their place until they are silent for SILENT_ROUNDS of it."""
    monkeypatch.setattr(ledger_module, "MAX_SILENT_TAUGHT", 1)
    ledger = PeerLedger()
    ledger.restore_seniority({"oldest": 3, "younger": 5})
    ledger.advance(1000)
    assert ledger.forget_silent() == [] and ledger.seniority() == {"oldest": 3, "younger": 5}
    ledger.advance(1000 + SILENT_ROUNDS)
    assert ledger.forget_silent() == ["younger"], "past the bound, the one that taught last"


def test_the_peers_heard_first_are_those_of_the_first_rounds_even_while_newcomers_teach():
    """Names whose samples never move the newcomers' count (unreadable, far) cannot keep
    joining the peers heard first: after FIRST_ROUNDS of this node's rounds a new name came
    late, idle or not."""
    ledger = PeerLedger()
    ledger.advance(100)
    ledger.delivered("there")
    ledger.advance(100 + FIRST_ROUNDS - 1)
    ledger.delivered("soon")
    ledger.advance(100 + FIRST_ROUNDS)
    ledger.delivered("later")
    assert not ledger.newcomers_idle()
    assert [ledger.came_since_idle(p) for p in ("there", "soon", "later")] == [False, False, True]


def test_a_node_forgets_a_crowd_s_one_batch_names_everywhere_and_keeps_a_held_one(tmp_path):
    """A crowd that sends each name's batch once: the intake forgets the names whose groups
    were used, in the ledger, the pool and the screener, SILENT_ROUNDS after; a name whose
    groups the pool still holds stays, and a forgotten name's old round is taken again as a
    new peer's."""
    config = _config(tmp_path, "a", "rollout.prompts_per_round=16", "node.own_share=0.5")
    ledger = PeerLedger()
    intake = Intake(config, None, None, "run", _RecordingExchange(), _Live([]), ledger)
    ledger.advance(0)
    for k in range(6):
        ledger.delivered(f"name{k}")
        intake.pool.add(f"name{k}", 4, _groups(f"name{k}", 4, 1, arrived=time.monotonic()), our_round=0)
        intake.screener.usefulness.usefulness[f"name{k}"] = 0.0
    intake.pool.take([group for k, groups in intake.pool.offers(0).items() if k != "name5" for group in groups])
    intake.forget_silent(SILENT_ROUNDS - 1)
    assert len(ledger.peers) == 6
    intake.forget_silent(SILENT_ROUNDS)
    assert set(ledger.peers) == {"name5"} and intake.pool.peers == {"name5"}
    assert set(intake.screener.usefulness.usefulness) == {"name5"}
    assert intake.pool.add("name0", 3, _groups("name0", 3, 1), our_round=SILENT_ROUNDS), "a new peer to the pool"
    assert not intake.pool.add("name5", 3, _groups("name5", 3, 1), our_round=SILENT_ROUNDS), "still kept: rounds forward"


def test_every_group_s_untranslated_completions_count_against_its_sender():
    """Two groups of one peer, each with completions that could not be put into our tokens:
    all of them count as screened and useless, not only the last group's."""
    completion = Completion(np.array([5], dtype=np.int32), np.array([-1.0], dtype=np.float32))
    groups = [
        Group("p", Problem(0, "1+1", "2"), [1], [Sample.of([1], completion, 0.5, "p")], untranslated=3),
        Group("p", Problem(1, "1+2", "3"), [2], [], untranslated=4),
    ]
    assert standing_counts(groups) == {"p": (8, 1)}
