"""A node's screening of its peers' samples, round by round: the one place that decides which
peer samples train, with what advantage and weight, which samples count as useful for their
sender's standing, and which log-probs are a strike.

A round opens with our own samples (`Screener.open_round`): they set the gate's bars, and the
anchored bar moves once. Each pass of the round then screens a chunk of peers' groups
(`ScreeningRound.screen`) with one forward pass of our model (and of the reference) over their
tokens and returns a `Pass`: the groups judged, the samples that train, the strikes (at most one
a peer a round, however many passes) and each peer's screened and useful counts, which the
intake writes to the ledger. Each group a peer delivers adds to its evidence of picking rather
than sampling (`Screener.delivered`, swarmnode.screening.repeats); a peer beyond the bound has
its groups left out. With neither the gate nor the budget on, every sample passes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from swarmnode.learn.sample import Group, Sample, samples_of
from swarmnode.model.policy import Policy
from swarmnode.protocol.wire import Completion
from swarmnode.screening.agreement import AgreementWeights
from swarmnode.screening.gate import Anchor, AnchorBar, own_near_bar
from swarmnode.screening.repeats import RepeatEvidence
from swarmnode.screening.screen import Screening, passed, screen
from swarmnode.screening.usefulness import UsefulnessWeights, is_useful
from swarmnode.settings.config import Config


@dataclass
class Pass:
    """What one pass of screening decided."""

    screening: Screening
    kept: list[Sample]  # what trains: kept, from a peer that taught us, informative where asked
    strikes: dict[str, str] = field(default_factory=dict)  # peer -> why, new this round
    standing: dict[str, tuple[int, int]] = field(default_factory=dict)  # peer -> (screened, useful)
    uninformative: int = 0  # kept samples left out for advantage 0 (node.skip_uninformative)
    usefulness: list[float] = field(default_factory=list)  # per kept sample: its peer's factor (node.weight_by_usefulness)
    theta: list[np.ndarray] | None = None  # our model's log-probs of every sample screened, when computed
    picking: frozenset[str] = frozenset()  # peers whose groups were left out as picked (screening.repeats)


class Screener:
    """Screening over a run: the anchored bar and each peer's usefulness persist across rounds."""

    def __init__(self, config: Config, policy: Policy) -> None:
        self.config = config
        self.policy = policy
        self.anchor_bar = AnchorBar(config.trust.anchor_slack)
        self.usefulness = UsefulnessWeights(config.node.weight_by_usefulness)
        self.agreement = AgreementWeights(config.node.weight_by_agreement)
        self.repeats = RepeatEvidence(config.trust.repeat_odds)

    @property
    def screens(self) -> bool:
        """Whether anything judges peers' samples (otherwise they pass as they are)."""
        return self.config.trust.likelihood_gate or self.config.trust.weight_budget

    def delivered(self, peer: str, groups: list[list[Completion]]) -> None:
        """A peer's verified groups as they arrive, in its own tokens and claims: evidence of
        picking (screening.repeats) needs no model, so every group counts, screened or not."""
        for group in groups:
            self.repeats.observe(peer, group)

    def forget(self, peer: str) -> None:
        """The peer was forgotten (loop.ledger.forget_silent): its weights start afresh. Its
        evidence of picking stays (bounded on its own: screening.repeats), a defence a fresh
        name would not escape by returning under an old one."""
        self.usefulness.forget(peer)
        self.agreement.forget(peer)

    def picking(self, peer: str) -> bool:
        """Whether the peer's groups are left out as picked, not sampled (screening.repeats)."""
        return self.screens and self.repeats.picking(peer)

    def open_round(self, own: list[Sample], peers_coming: bool) -> ScreeningRound:
        """This round's screening, its bars set by our own samples. The anchored bar is measured
        in the first round, peers or not (its start is the run's start), then in rounds with
        peers' samples to screen, when our own samples' usefulness is observed too."""
        anchor = self._own_anchor(own) if self.anchor_bar.start is None or peers_coming else None
        if peers_coming:  # judged by the bars the peers' samples meet this round
            self.usefulness.observe_own(own, own_near_bar(own, self.config.trust, anchor))
        return ScreeningRound(self, own, anchor.bar if anchor else None)

    def _own_anchor(self, own: list[Sample]) -> Anchor | None:
        """This round's bar of the anchored gate, moved by our own samples as the reference
        scores them, with those scores; None when the gate is not anchored or has no bar yet."""
        trust = self.config.trust
        if not (own and trust.likelihood_gate and trust.anchor and self.policy.has_reference):
            return None  # without own samples there is no bar this round, anchored or not
        reference = self.logprobs(own, reference=True)
        bar = self.anchor_bar.update(reference, trust)
        return Anchor(reference, bar) if bar is not None else None

    def logprobs(self, samples: list[Sample], reference: bool = False) -> list[np.ndarray]:
        """Per-token log-probs of `samples` under our model now, or under the reference."""
        score = self.policy.reference_logprobs if reference else self.policy.token_logprobs
        return score([s.prompt_ids for s in samples], [s.tokens for s in samples], self.config.rollout.temperature)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a resumed node keeps (swarmnode.loop.checkpoints): the anchored bar and each
        peer's evidence of picking."""
        return {"anchor_bar": {"start": self.anchor_bar.start, "value": self.anchor_bar.value},
                **self.repeats.checkpoint_state()}

    def restore(self, state: dict[str, Any]) -> None:
        bar = state.get("anchor_bar") or {}
        self.anchor_bar.resume(bar.get("start"), bar.get("value"))
        self.repeats.restore(state)


class ScreeningRound:
    """One round's screening: its bars, and the peers struck so far this round."""

    def __init__(self, screener: Screener, own: list[Sample], anchor_bar: float | None) -> None:
        self.screener = screener
        self.own = own
        self.anchor_bar = anchor_bar
        self.struck: set[str] = set()

    def screen(self, groups: list[Group]) -> Pass:
        """Judge peers' scored `groups` by our own model: which samples train (the gate drops
        only unlikely samples with a positive advantage), with what advantage and how much
        their weights count; which peers' log-probs are a strike (one a round: failing the
        gate is none); how many of each peer's samples were useful."""
        screener = self.screener
        samples = samples_of(groups)
        theta = None
        picking: frozenset[str] = frozenset()
        if not samples or not screener.screens:
            screening = passed(groups)
        else:
            theta = screener.logprobs(samples)
            anchor = Anchor(screener.logprobs(samples, reference=True), self.anchor_bar) if self.anchor_bar is not None else None
            picking = frozenset(g.source for g in groups if screener.picking(g.source))
            screening = screen(groups, theta, self.own, screener.config.trust, screener.config.loss, anchor, picking)
        result = Pass(screening, kept=[], theta=theta, picking=picking)
        for peer, found in screening.peers.items():
            if found.strikes and peer not in self.struck:  # one batch, one strike, however many passes
                self.struck.add(peer)
                result.strikes[peer] = found.strikes[0]
        result.standing = standing_counts(screening.groups)
        for peer, (count, useful) in result.standing.items():
            screener.usefulness.observe_peer(peer, count, useful)
        self._keep(screening.samples, result)
        return result

    def _keep(self, judged: list[Sample], result: Pass) -> None:
        """The judged samples that train: kept, scaled by their peer's usefulness (a peer that
        never taught us takes no room) and gradient agreement and, with `node.skip_uninformative`,
        with a non-zero advantage (one with advantage 0 would only dilute the step)."""
        usefulness, agreement = self.screener.usefulness, self.screener.agreement
        factors = {s.source: usefulness.factor(s.source) * agreement.factor(s.source) for s in judged}
        kept = [s.scaled(factors[s.source]) for s in judged if s.verdict.kept and factors[s.source] > 0]
        if self.screener.config.node.skip_uninformative:
            informative = [s for s in kept if s.advantage != 0]
            result.uninformative = len(kept) - len(informative)
            kept = informative
        result.kept = kept
        if usefulness.enabled or agreement.enabled:
            result.usefulness = [factors[s.source] for s in kept]


def standing_counts(groups: list[Group]) -> dict[str, tuple[int, int]]:
    """Per peer: its samples screened (those that could not be put into our tokens count,
    and taught nothing) and how many of them were useful."""
    offered: Counter[str] = Counter()
    useful: Counter[str] = Counter()
    for group in groups:
        offered[group.source] += group.untranslated
        for sample in group.samples:
            offered[sample.source] += 1
            useful[sample.source] += is_useful(sample)
    return {peer: (count, useful[peer]) for peer, count in offered.items() if count}
