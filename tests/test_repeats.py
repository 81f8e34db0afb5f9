"""A peer that picks its completions rather than sampling them: repeats against its own log-probs
(swarmnode.screening.repeats), and what screening, the ledger and a checkpoint do with it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from swarmnode.learn.sample import Group, Sample
from swarmnode.loop.intake import Intake
from swarmnode.loop.ledger import PeerLedger
from swarmnode.protocol.wire import Completion
from swarmnode.screening.repeats import RepeatEvidence, repeat_odds
from swarmnode.screening.screen import screen
from swarmnode.screening.screener import Screener
from swarmnode.settings.config import ConfigError, LossSettings, TrustSettings, load_config
from swarmnode.tasks.base import Problem

ODDS = TrustSettings().repeat_odds


def _group(source: str, completions: list[tuple[list[int], float]], advantages: list[float] | None = None) -> Group:
    """A group of (tokens, claimed log-prob of the whole completion) pairs; the claim is spread
    over the tokens, as a sampler's per-token log-probs add up."""
    advantages = advantages or [0.0] * len(completions)
    samples = [
        Sample([1], np.array(tokens, np.int32), np.full(len(tokens), logprob / len(tokens), np.float32), advantage,
               source=source)
        for (tokens, logprob), advantage in zip(completions, advantages, strict=True)
    ]
    return Group(source, Problem(0, "1+1", "2"), [1], samples)


def _sent(group: Group) -> list[Completion]:
    """The group as its sender delivered it: its tokens and claimed log-probs."""
    return [Completion(s.tokens, s.logprobs) for s in group.samples]


def _observe(evidence: RepeatEvidence, group: Group) -> None:
    evidence.observe(group.source, _sent(group))


def _crowd_group(source: str = "crowd") -> Group:
    """The model-less crowd's group: the right answer four times and a near miss four times,
    each claimed (truthfully, by the public base model) at 5 %."""
    right, near = ([7, 2, 9], math.log(0.05)), ([7, 3, 9], math.log(0.05))
    return _group(source, [right] * 4 + [near] * 4, [0.5] * 4 + [-0.5] * 4)


def _sampled_groups(rng: np.random.Generator, count: int, size: int = 8) -> list[Group]:
    """Groups an honest sampler draws from distributions over a few completions, some of them
    peaked (repeats are then common, and claimed likely), with the claims it would report."""
    groups = []
    for _ in range(count):
        support = int(rng.integers(2, 12))
        probs = rng.dirichlet(np.full(support, float(rng.choice([0.1, 0.5, 2.0]))))
        drawn = rng.choice(support, size=size, p=probs)
        groups.append(_group("honest", [([int(k), 100 + int(k)], math.log(probs[k])) for k in drawn]))
    return groups


def test_a_group_that_repeats_nothing_proves_nothing():
    assert repeat_odds(_sent(_group("p", [([1], -9.0), ([2], -9.0), ([3], -9.0)]))) == 1.0


def test_repeats_are_judged_by_the_sender_s_own_claims():
    assert repeat_odds(_sent(_group("p", [([5, 6], math.log(0.9))] * 8))) > 0.3, "a confident sampler repeats itself"
    assert repeat_odds(_sent(_group("p", [([5, 6], math.log(0.001))] * 4 + [([k], -1.0) for k in range(4)]))) < 1e-6
    assert repeat_odds(_sent(_crowd_group())) < 0.2, "no single crowd group proves much ..."


def test_an_honest_sampler_s_odds_are_odds():
    """Under the sender's own claims the odds are a valid p-value: at most a share q of honest
    groups have odds below q (the slack makes them conservative)."""
    groups = _sampled_groups(np.random.default_rng(0), 4000)
    repeating = np.mean([len({s.tokens.tobytes() for s in g.samples}) < len(g.samples) for g in groups])
    assert repeating > 0.5, "most of these groups do repeat completions"
    odds = np.array([repeat_odds(_sent(g)) for g in groups])
    for q in (0.01, 0.05, 0.2):
        assert (odds < q).mean() <= q


def test_a_picking_crowd_is_found_within_a_batch_and_an_honest_sampler_never():
    crowd = RepeatEvidence(ODDS)
    found = next(n for n in range(1, 200) if _observe(crowd, _crowd_group()) or crowd.picking("crowd"))
    assert found <= 16, "... but a batch of them does"
    honest = RepeatEvidence(ODDS)
    for group in _sampled_groups(np.random.default_rng(1), 5000):
        _observe(honest, group)
        assert not honest.picking("honest")
    # a crowd that turns to sampling leaves the bound again: each group that repeats nothing takes log 2 off
    left = next(n for n in range(1, 400) if _observe(crowd, _group("crowd", [([k], -2.0) for k in range(8)]))
                or not crowd.picking("crowd"))
    assert left < 400


def test_the_evidence_is_kept_for_a_bounded_number_of_identities(monkeypatch):
    monkeypatch.setattr("swarmnode.screening.repeats.MAX_TRACKED", 10)
    evidence = RepeatEvidence(ODDS)
    for i in range(50):
        _observe(evidence, _crowd_group(f"junk{i}"))
    assert len(evidence.evidence) == 10


def test_a_picking_peer_s_groups_are_left_out_and_teach_it_nothing():
    own = [Sample([1], np.zeros(6, np.int32), np.full(6, -0.5, np.float32), 0.0) for _ in range(16)]
    groups = [_crowd_group(), _group("honest", [([k, 1], -0.5) for k in range(8)], [0.5, -0.5] * 4)]
    theta = [np.full(len(s.tokens), -0.5) for g in groups for s in g.samples]
    result = screen(groups, theta, own, TrustSettings(), LossSettings(), picking=frozenset({"crowd"}))
    crowd, honest = result.groups
    assert all(s.verdict.picked and not s.verdict.kept for s in crowd.samples)
    assert all(s.verdict.kept for s in honest.samples)
    assert result.picked == 8 and result.gated == 0 and result.peers["crowd"].picked == 8


def test_a_picking_peer_that_lies_about_its_log_probs_is_still_struck():
    own = [Sample([1], np.zeros(6, np.int32), np.full(6, -0.5, np.float32), 0.0) for _ in range(16)]
    liar = _group("liar", [([7, 2, 9], -60.0)] * 8, [0.5] * 8)  # -20 a token claimed: a mean weight of C
    theta = [np.full(3, -1.0) for _ in liar.samples]
    result = screen([liar], theta, own, TrustSettings(), LossSettings(), picking=frozenset({"liar"}))
    assert result.picked == 8 and result.peers["liar"].strikes, "left out, and the lie counts"


def test_a_round_s_screening_finds_the_crowd_and_the_ledger_takes_its_place(tmp_path):
    """Through the screener and the intake's record: the crowd's standing goes to 0 and its
    seniority with it, so a crowd there from the first round loses the older cohort's turns."""
    config = load_config(None, [f"node.run_dir={tmp_path}", "trust.likelihood_gate=false"])
    screener = Screener(config, None)
    screener.logprobs = lambda samples, reference=False: [s.logprobs for s in samples]  # our model agrees with theirs
    ledger = PeerLedger()
    ledger.screened("crowd", 8, 8, 0)  # it taught us first, in round 0
    assert ledger.seniority() == {"crowd": 0}
    for round_ in range(1, 40):
        screener.delivered("crowd", [_sent(_crowd_group())])
        done = screener.open_round([], peers_coming=True).screen([_crowd_group()])
        Intake._record(SimpleNamespace(ledger=ledger, share=SimpleNamespace(is_far=lambda peer: False)), round_, done)
        if done.picking:
            break
    assert done.picking == {"crowd"} and done.kept == []
    assert ledger.standing("crowd") == 0.0 and "crowd" not in ledger.seniority()
    ledger.screened("crowd", 8, 8, 50)  # should it teach again, it starts over
    assert ledger.seniority() == {"crowd": 50}
    resumed = Screener(config, None)
    resumed.restore(screener.checkpoint_state())
    assert resumed.repeats.picking("crowd"), "a restart keeps the evidence"


def test_the_check_can_be_turned_off():
    evidence = RepeatEvidence(0.0)
    for _ in range(100):
        _observe(evidence, _crowd_group())
    assert not evidence.picking("crowd") and evidence.evidence == {}


def test_one_token_completions_are_judged_like_any():
    assert repeat_odds(_sent(_group("p", [([3], math.log(0.01))] * 4 + [([9, 9], -0.1)] * 4))) < 1e-4


def test_a_repeat_odds_that_is_no_probability_is_a_clear_error(tmp_path):
    for value, said in (("1", "less than 1"), ("-0.1", "greater than or equal to 0"), ("often", "valid number")):
        with pytest.raises(ConfigError, match=f"trust.repeat_odds: .*{said}"):
            load_config(None, [f"node.run_dir={tmp_path}", f"trust.repeat_odds={value}"])
