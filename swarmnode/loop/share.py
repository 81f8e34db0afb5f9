"""How much of its own batch a node generates: more in place of far peers' groups.

With `node.own_share` below 1 a node generates that share of its batch and peers' groups fill
the rest. That pays while peers' samples teach the node what its own would have; a far peer's
taught a member nothing step for step, while the member's own batch was halved to make room for
them (docs/figures.md, "What a peer's samples are worth"). With `node.adapt_share_nats` set, the
node measures each peer's *gap*: how many nats a token less likely that peer's samples are under
this node's model than its own samples are (a running mean a peer). A peer whose gap reaches
the setting is far: its groups take no room in the step, and the node generates in their place
the part of the peers' share that far peers' groups made up among the groups offered in the last
round, from `own_share` up to the whole batch (alone). With `node.far_room` near it generates
nothing more: near peers' groups fill what they can of that room and the rest stays empty, a
smaller step whose price is only its training. With `node.far_room` top it generates in their
place and still screens and trains on the far peers' groups, on top of the batch, up to the
room they left and to what a tenth of a round pays for (swarmnode.loop.round_costs): beside a
larger peer a member's own samples were worth more to that peer while the member trained on the
peer's (docs/figures.md, the size pair under the lead rule), and a far peer's samples cost little
where they do not take the member's own batch's place.

A peer can also be far by what its samples score: with `node.far_reward_lead` set, a peer whose
samples' mean reward under our own grading leads our own samples' by that much (a running mean a
peer, from a prior of no lead) is far as well. On the bench a peer's samples taught a member
nothing wherever they scored above the member's own, and were worth 0.01-0.07 wherever they
scored at or below them, whatever the peer's distance (docs/figures.md).

With `node.far_reward_trail` set, a peer whose samples trail our own by that much is far too:
beside three smaller peers a member generated a quarter of its batch and trained on peers'
samples scoring 0.18 below its own for the rest, and ended about 0.02 below alone whatever else
was tried (docs/figures.md, "A far peer on top"); under `node.far_room` top such a peer's groups
still come, on top of the member's own whole batch instead of in its place. `node.far_room`
top-scored does so only for a peer far by what its samples score and not by likelihood: under
the group baseline a peer whose samples are unlikely under our model cost a member on top (the
specialist beside a small generalist); since a stronger peer's groups are taken against our own
mean reward (`loss.peer_baseline` lower) it no longer does, and on a task where alone still
climbs a smaller peer far by likelihood, on top, put the larger member ahead (docs/figures.md,
"A far peer on top by default").

One group of each far peer a round is still measured under our model (not trained on, unless
it came on top under `node.far_room` top, which measures it as well), so a peer that comes near
is taken again: once its gap falls below half the setting. One group is a
noisy measure, and with a single threshold a far peer's gap dipped under it in a tenth to a fifth
of rounds, each costing a round with half a batch of far samples (the band damps that).

By default a node that shares its batch runs all three: the gap at 1.0 nats, the lead and the
trail at 0.1, with `node.far_room` top. With `own` in its place (the default until 2026-12-04)
every member of every bench setting was non-inferior to itself alone at the same modelled time,
where without the rules a small generalist beside a specialist ended 0.04 below alone, but the
size pair left each other out and trained nearly alone; with top-scored (the default from
2026-12-04 to 2026-12-05), with `loss.peer_baseline` lower, the size pair, the family pair and the
swarms got there sooner too, every member non-inferior, at generation 0.93 and 0.7
(docs/figures.md, "The swarms bounded at 0.7, and a stronger peer on top by default"); with top
the size pair is ahead at the end where alone still climbs as well (docs/figures.md, "A far peer
on top by default"). A node that generates its whole batch (`own_share` 1, its default) is
untouched by them.

The measures are the node's own (its model's log-probs, its own grading): nothing a peer claims
enters them, and they only move the share between `own_share` and 1, so the worst a crowd of far
identities can do with them is make this node generate its whole batch, as alone (under
`node.far_room` top, with at most the peers' share at `own_share` of far groups on top, screened:
what the same crowd would have had without the rule).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from swarmnode.settings.config import Config

SMOOTHING = 0.2  # weight of the newest round in a peer's running gap: a few rounds, not one batch
RETURN_FRACTION = 0.5  # a far peer is near again once its gap falls below this part of the setting
MAX_PEERS_MEASURED = 1024  # gaps kept, least recently measured forgotten first: identities are free


@dataclass
class Measured:
    """One round's evidence on peers' samples, by sender: per-token log-probs under our model
    (with the likelihood gap on) and rewards as we graded them."""

    logprobs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    rewards: dict[str, list[float]] = field(default_factory=dict)


class AdaptiveShare:
    """The share of the batch this node generates, from each peer's running likelihood gap and
    reward lead."""

    def __init__(self, config: Config) -> None:
        self.floor = config.node.own_share
        self.far_gap = config.node.adapt_share_nats  # 0: off
        self.generate_far_room = config.node.far_room != "near"  # else near peers' groups only, or nothing
        self.far_room = config.node.far_room  # top, top-scored: far peers' groups trained on beyond the batch
        self.lead_bar = config.node.far_reward_lead  # 0: off
        self.trail_bar = config.node.far_reward_trail  # 0: off
        self.gaps: dict[str, float] = {}  # peer -> nats a token, smoothed over rounds
        self.leads: dict[str, float] = {}  # peer -> its samples' mean reward over our own's, smoothed from 0
        self.far: set[str] = set()  # peers whose gap, lead or trail reached its setting and has not fallen back
        self.far_by_gap: set[str] = set()  # of those, the peers whose gap reached it and has not fallen back
        self.far_part = 0.0  # of the peers' groups offered in the last round, the part from far peers
        self.measured_last: list[str] = []  # peers measured in the last round, for its record

    @property
    def enabled(self) -> bool:
        return (self.far_gap > 0 or self.lead_bar > 0 or self.trail_bar > 0) and self.floor < 1.0

    @property
    def gap(self) -> float | None:
        """The largest running gap among the peers measured in the last round (the farthest peer
        seen now, not the farthest ever), for the round's record; None when none was measured."""
        gaps = [self.gaps[peer] for peer in self.measured_last if peer in self.gaps]
        return max(gaps) if gaps else None

    @property
    def lead(self) -> float | None:
        """The largest running reward lead among the peers measured in the last round, for its record."""
        leads = [self.leads[peer] for peer in self.measured_last if peer in self.leads]
        return max(leads) if leads else None

    @property
    def measures_gap(self) -> bool:
        """Whether peers' samples must be measured under our model (the likelihood gap is on)."""
        return self.enabled and self.far_gap > 0

    def is_far(self, peer_id: str) -> bool:
        """Whether the peer's groups take no room: its running gap, lead or trail reached its
        setting and none has fallen below the band since. A peer not measured yet is near (its
        first groups are screened like anyone's)."""
        return self.enabled and peer_id in self.far

    def comes_on_top(self, peer_id: str) -> bool:
        """Whether a far peer's groups come on top of the batch (`node.far_room` top, or
        top-scored for a peer far only by what its samples score, not by likelihood)."""
        return self.far_room == "top" or (self.far_room == "top-scored" and peer_id not in self.far_by_gap)

    def far_peers(self) -> set[str]:
        """The peers whose groups take no room now (none when the rule is off)."""
        return set(self.far) if self.enabled else set()

    def current(self) -> float:
        """own_share, raised by the part of the peers' share that far peers' groups filled
        (`node.far_room` own or top; with near, own_share: that part is left to near peers' groups)."""
        if not self.enabled or not self.generate_far_room:
            return self.floor
        return self.floor + (1.0 - self.floor) * self.far_part

    def offered(self, senders: Iterable[str]) -> None:
        """The sender of each peer group that would fill the peers' share at `own_share`, in the
        order the share takes them: the next round generates in place of the far ones' part.
        Only that room counts, so a peer that offers more groups, or a useless one whose groups
        come last, does not move the share by offering. No offer leaves the share where it was."""
        senders = list(senders)
        if self.enabled and senders:
            self.far_part = sum(self.is_far(peer) for peer in senders) / len(senders)

    def observe(self, own_logprobs: Sequence[np.ndarray], peers: Mapping[str, Sequence[np.ndarray]],
                own_rewards: Sequence[float] = (), peer_rewards: Mapping[str, Sequence[float]] | None = None) -> None:
        """One round's evidence: per-token log-probs under our model, untruncated, of our own
        samples and of each peer's samples measured this round, and their rewards as we graded
        them. A round without our own samples, or a peer without finite ones, changes nothing
        for that measure."""
        own = _token_mean(own_logprobs)
        own_reward = _mean(own_rewards)
        peer_rewards = peer_rewards or {}
        self.measured_last = []
        for peer in dict.fromkeys([*peers, *peer_rewards]):
            theirs = _token_mean(peers.get(peer, ()))
            their_reward = _mean(peer_rewards.get(peer, ()))
            moved = False
            if own is not None and theirs is not None:
                found, before = own - theirs, self.gaps.pop(peer, None)  # popped: to the end, most recent
                self.gaps[peer] = found if before is None else smoothed(before, found)
                moved = True
            if own_reward is not None and their_reward is not None:
                # from a prior of no lead: one round's mean reward is a few dozen samples, noisy by
                # about 0.1, and a copy's first round must not make it far
                before = self.leads.pop(peer, 0.0)
                self.leads[peer] = smoothed(before, their_reward - own_reward)
                moved = True
            if moved:
                self.measured_last.append(peer)
                self._classify(peer)
        self._forget_beyond_bound()

    def _forget_beyond_bound(self) -> None:
        """The least recently measured peers beyond MAX_PEERS_MEASURED: measured afresh if they offer again."""
        for measures in (self.gaps, self.leads):
            while len(measures) > MAX_PEERS_MEASURED:
                forgotten = next(iter(measures))
                self.gaps.pop(forgotten, None)
                self.leads.pop(forgotten, None)
                self.far.discard(forgotten)
                self.far_by_gap.discard(forgotten)

    def _beyond(self, peer: str, fraction: float) -> tuple[bool, bool, bool]:
        """Whether the peer's gap, its lead and its trail reach `fraction` of their settings (a
        measure that is off or not measured yet reaches nothing)."""
        gap, lead = self.gaps.get(peer), self.leads.get(peer)
        return (self.far_gap > 0 and gap is not None and gap >= fraction * self.far_gap,
                self.lead_bar > 0 and lead is not None and lead >= fraction * self.lead_bar,
                self.trail_bar > 0 and lead is not None and -lead >= fraction * self.trail_bar)

    def _classify(self, peer: str) -> None:
        """Far once any measure reaches its setting; near again once all are below the band. Far
        by likelihood the same way, by the gap alone."""
        reached, in_band = self._beyond(peer, 1.0), self._beyond(peer, RETURN_FRACTION)
        if any(reached):
            self.far.add(peer)
        elif not any(in_band):
            self.far.discard(peer)
        if reached[0]:
            self.far_by_gap.add(peer)
        elif not in_band[0]:
            self.far_by_gap.discard(peer)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a resumed node keeps (swarmnode.loop.checkpoints): each peer's running gap and
        reward lead, and the far part of the last offer. Which peers are far follows from those,
        except inside the band, so the far ones are kept by name, and those far by likelihood."""
        return {"likelihood_gaps": dict(self.gaps), "reward_leads": dict(self.leads), "far_peers": sorted(self.far),
                "far_by_gap": sorted(self.far_by_gap), "far_part": self.far_part}

    def restore(self, state: dict[str, Any]) -> None:
        """A checkpoint's gaps and leads; one written before gaps were kept a peer (a single
        pooled `likelihood_gap`) is measured afresh; one written before the band is classed by
        its measures; one written before far by likelihood was kept apart takes a far peer whose
        gap is in the band for far by likelihood."""
        self.gaps = _finite_by_peer(state.get("likelihood_gaps"))
        self.leads = _finite_by_peer(state.get("reward_leads"))
        listed = _names(state.get("far_peers")) or set()
        listed_by_gap = _names(state.get("far_by_gap"))
        self.far, self.far_by_gap = set(), set()
        for peer in dict.fromkeys([*self.gaps, *self.leads]):
            if peer in listed:  # inside the band it stays far, and far by likelihood if it was
                in_band = self._beyond(peer, RETURN_FRACTION)
                if any(in_band):
                    self.far.add(peer)
                if in_band[0] and (listed_by_gap is None or peer in listed_by_gap):
                    self.far_by_gap.add(peer)
            else:
                self._classify(peer)
        self._forget_beyond_bound()
        part = state.get("far_part", 0.0)
        self.far_part = float(part) if is_number(part) and 0.0 <= part <= 1.0 else 0.0


def _names(listed: Any) -> set[str] | None:
    """The peer names of a checkpoint's list (anything else in it left out); None where there is no list."""
    return {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else None


def smoothed(before: float, found: float) -> float:
    """A peer's running measure after one more round's finding (SMOOTHING the newest's weight)."""
    return (1 - SMOOTHING) * before + SMOOTHING * found


def _finite_by_peer(value: object) -> dict[str, float]:
    """A checkpoint's {peer: number}, without what is not one (or not finite)."""
    items = value.items() if isinstance(value, dict) else ()
    return {str(p): float(v) for p, v in items if is_number(v) and np.isfinite(v)}


def _mean(values: Sequence[float]) -> float | None:
    mean = float(np.mean(values)) if len(values) else None
    return mean if mean is not None and np.isfinite(mean) else None


def is_number(value: object) -> bool:
    """A checkpoint's int or float (a bool is neither, though Python calls it an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _token_mean(logprobs: Sequence[np.ndarray]) -> float | None:
    tokens = sum(len(x) for x in logprobs)
    if not tokens:
        return None
    mean = float(sum(float(np.sum(x)) for x in logprobs) / tokens)
    return mean if np.isfinite(mean) else None
