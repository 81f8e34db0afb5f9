"""Peers' verified groups waiting for a place in a batch, and the order peers share it in.

Identities are free, so nothing here counts them: the peers' share of a batch is handed out
in turns, peers with a record of useful samples first, a share of the turns kept for
newcomers (one a batch while newcomers teach nothing: new names cost nothing, so a crowd
that renews its names would hold every newcomer turn; those there before that crowd first),
and peers found useless last. Among the useful, seniority counts: the answers of a public
task are public, so a crowd of identities with no model can look useful, and taking turns as
equals they took an honest peer's place by numbers (3 of them, 3/4 of it). So peers that
first taught this node at about the same time form a cohort, and each cohort keeps 3 of every
4 turns over all younger ones together, until both are ESTABLISHED_ROUNDS old: a crowd
arriving later shares one turn in four, however many it is. Groups are used once and only
while fresh; a slower peer's batch is spread over the rounds until its next one is due.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TypeVar

from swarmnode.protocol.wire import Completion
from swarmnode.swarm.base import is_proven, is_useless

NEWCOMER_EVERY = 4  # every 4th turn of the peers' share goes to a peer without a useful record
IDLE_NEWCOMER_TURNS = 1  # newcomer turns a share gives among proven peers' while newcomers teach nothing
PROBATION_EVERY = 4  # every 4th round, one useless (or on trial) peer's group comes first, on top of the share
SPACING_WEIGHT = 0.5  # how far one longer gap between a peer's batches moves its measured spacing
HOLD_ROUNDS = 16  # an unused batch younger than this (our rounds) stands in for its sender's next: holding()
ROUND_WINDOW = 8  # our last rounds whose longest the pool expects the next to take (holding by max_age_s)
COHORT_ROUNDS = 16  # peers that first taught us within this many of our rounds of each other share a cohort
YOUNGER_EVERY = 4  # every 4th turn of a cohort goes to all younger cohorts together
ESTABLISHED_ROUNDS = 256  # a peer that first taught us this many rounds ago joins the oldest cohort

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class OfferedGroup:
    """One group of a peer's verified batch, not yet scored: what the peers' share picks from."""

    peer_id: str
    round: int  # the sender's round
    prompt_id: int
    completions: list[Completion]  # with the log-probs its sender reported
    arrived: float = 0.0  # time.monotonic() when this node accepted it
    family: str = ""  # the digest of its sender's tokenizer when not ours ("": ours; swarmnode.model.families)


class PeerPool:
    """Peers' verified groups waiting for a place in a batch. Each is used once; a peer's
    rounds are accepted only in increasing order; groups leave when stale by the sender's
    rounds (`staleness` behind its newest) or by our clock (`max_age_s` after arrival).
    Nothing a peer claims moves this node: it takes what is fresh when it trains.

    A slower peer's batch is paced over the rounds until its next one is due (its batches'
    spacing in our rounds, measured), so a fast node learns from it in most rounds rather than
    all at once and then not at all; a peer as fast as us is offered all it holds."""

    def __init__(self) -> None:
        self._held: dict[str, list[OfferedGroup]] = {}
        self._newest: dict[str, int] = {}  # peer -> newest round accepted
        self._arrived_in: dict[str, int] = {}  # peer -> our round its newest batch arrived in
        self._spacing: dict[str, float] = {}  # peer -> our rounds between its batches (moving mean)
        self._expired_at: float | None = None  # our clock at the last expire (once a round)
        self._rounds_s: deque[float] = deque(maxlen=ROUND_WINDOW)  # our clock between expires: our last rounds
        self._leaving: frozenset[str] = frozenset()  # peers all of whose groups leave at the next expire

    def add(self, peer_id: str, round_: int, groups: list[OfferedGroup], our_round: int) -> bool:
        """Hold a verified batch's groups, accepted in our round `our_round`; False (and
        nothing held) for a round not newer than the peer's newest (a replay, or a restarted
        peer repeating rounds)."""
        if round_ <= self._newest.get(peer_id, -1):
            return False
        if peer_id in self._arrived_in:
            # a shorter gap counts at once, a longer one by SPACING_WEIGHT: a peer that paused
            # (started after us, restarted, was unreachable a while) is not paced as slow for
            # rounds after it is back, while its batches go stale unused
            gap = max(1, our_round - self._arrived_in[peer_id])
            previous = self._spacing.get(peer_id, gap)
            self._spacing[peer_id] = gap if gap < previous else previous + SPACING_WEIGHT * (gap - previous)
        self._newest[peer_id] = round_
        self._arrived_in[peer_id] = our_round
        self._held.setdefault(peer_id, []).extend(groups)
        self._leaving = self._leaving - {peer_id}  # its new groups stay past the next expire
        return True

    def expire(self, now: float, max_age_s: float, staleness: int,
               our_round: int = 0, newcomers: Collection[str] = ()) -> None:
        """Drop groups stale by their sender's rounds or too old by our clock, and every group of
        a newcomer (`newcomers`: peers without a standing) whose newest batch arrived
        HOLD_ROUNDS or more of our rounds (`our_round` now) ago: a name a crowd abandoned
        leaves the newcomers' draw then, instead of keeping a ticket in it until `max_age_s`,
        which is many rounds where rounds are short.

        Notes the peers all of whose groups leave at the next expire: a newcomer whose batch
        is then HOLD_ROUNDS old, and anyone whose groups all pass `max_age_s` by then if our
        next round is no longer than the longest of our last ROUND_WINDOW. Their hold ends now
        (`holding`), a round before their groups leave: over hivemind the newer batch asked for
        now is fetched in the background of this round and handed out at the next gather, so
        a live newcomer keeps a ticket throughout. A round longer than those (a pause to
        evaluate or checkpoint) can still leave such a peer one round without groups; one that
        long makes the next ROUND_WINDOW holds end early, which costs a download sooner."""
        if self._expired_at is not None and 0.0 < now - self._expired_at < math.inf:
            self._rounds_s.append(now - self._expired_at)
        self._expired_at = now
        next_round_s = max(self._rounds_s, default=0.0)
        for peer, groups in list(self._held.items()):
            newest = self._newest[peer]
            if peer in newcomers and self._age(peer, our_round) >= HOLD_ROUNDS:
                del self._held[peer]
                continue
            fresh = [g for g in groups if now - g.arrived <= max_age_s and g.round >= newest - staleness]
            if fresh:
                self._held[peer] = fresh
            else:
                del self._held[peer]
        self._leaving = frozenset(
            peer for peer, groups in self._held.items()
            if (peer in newcomers and self._age(peer, our_round) + 1 >= HOLD_ROUNDS)
            or all(now + next_round_s - g.arrived > max_age_s for g in groups)
        )

    def drop(self, peer_id: str) -> None:
        """Forget a peer's held groups (it was banned)."""
        self._held.pop(peer_id, None)

    def forget(self, peer_id: str) -> None:
        """Forget all the pool knows of a peer (the ledger forgot it: loop.ledger.forget_silent):
        should it come back, its batches are taken and paced as a new peer's."""
        for kept in (self._held, self._newest, self._arrived_in, self._spacing):
            kept.pop(peer_id, None)

    def take(self, groups: list[OfferedGroup]) -> None:
        """These groups were used: never offer them again."""
        used = {id(g) for g in groups}
        for peer in {g.peer_id for g in groups}:
            rest = [g for g in self._held.get(peer, []) if id(g) not in used]
            if rest:
                self._held[peer] = rest
            else:
                self._held.pop(peer, None)

    def offers(self, our_round: int) -> dict[str, list[OfferedGroup]]:
        """What each peer offers this round, its newest round first: all it holds, or for a
        peer slower than us the share that spreads its batch over the rounds until its next."""
        offers = {}
        for peer, groups in self._held.items():
            due_in = self._spacing.get(peer, 1.0) - self._age(peer, our_round)
            count = math.ceil(len(groups) / max(1.0, due_in))
            offers[peer] = sorted(groups, key=lambda g: -g.round)[:count]
        return offers

    def _age(self, peer: str, our_round: int) -> int:
        """Our rounds since the peer's newest batch arrived (0 for one we never took)."""
        return our_round - self._arrived_in.get(peer, our_round)

    def lag(self, group: OfferedGroup) -> int:
        """How many of its sender's rounds the group is behind the sender's newest we hold."""
        return self._newest.get(group.peer_id, group.round) - group.round

    def holding(self, our_round: int) -> frozenset[str]:
        """Peers with unused groups here from a batch that arrived fewer than HOLD_ROUNDS of our
        rounds ago, less those the last `expire` found all of whose groups leave at the next
        (a newcomer's at HOLD_ROUNDS, anyone's by `max_age_s`): their hold ends a round before
        the groups leave, so that over hivemind the newer batch comes in time to take their
        place. The exchange does not ask a held peer for a newer batch unless its samples
        proved useful: the newer one would wait behind this one, and a useless peer's groups
        only fill what others leave. So a crowd of useless identities costs a download each
        per HOLD_ROUNDS rounds (a round fewer for a newcomer; where rounds are long, per
        `max_age_s` less a round), not two a poll, and a peer screened on probation is judged
        on a batch at most that old. A newer batch of a peer whose hold ended early (`add`)
        holds it again at once."""
        return frozenset(
            peer for peer in self._held
            if self._age(peer, our_round) < HOLD_ROUNDS and peer not in self._leaving
        )

    @property
    def peers(self) -> set[str]:
        return set(self._held)

    def __len__(self) -> int:
        return sum(len(groups) for groups in self._held.values())


def cohorts(seniority: Mapping[str, int], peers: list[str], round_: int) -> list[list[str]]:
    """`peers` (in their order) grouped by when they first taught us (`seniority`, our
    rounds), oldest cohort first: a cohort spans COHORT_ROUNDS from its oldest member, and
    every peer older than ESTABLISHED_ROUNDS is in the first. A peer without a record counts
    as taught now."""
    since = {p: min(seniority.get(p, round_), round_) for p in peers}
    established = [p for p in peers if round_ - since[p] >= ESTABLISHED_ROUNDS]
    rest = sorted((p for p in peers if p not in established), key=lambda p: since[p])  # stable: keeps order
    groups: list[list[str]] = [established] if established else []
    for peer in rest:
        if groups and groups[-1] is not established and since[peer] - since[groups[-1][0]] < COHORT_ROUNDS:
            groups[-1].append(peer)
        else:
            groups.append([peer])
    order = {peer: i for i, peer in enumerate(peers)}
    return [sorted(group, key=order.__getitem__) for group in groups]  # within a cohort, as given


def fair_queue(
    offers: Mapping[str, list[T]], standing: Mapping[str, float | None], rng: random.Random,
    newcomer_every: int = NEWCOMER_EVERY, probation: bool = False,
    seniority: Mapping[str, int] | None = None, round_: int = 0, not_on_probation: Collection[str] = (),
    on_trial: Collection[str] = (), newcomer_most: int | None = None, came_late: Collection[str] = (),
) -> list[T]:
    """The offered groups the peers' share of a batch may take, in the order it takes them.

    Peers take turns, one group a turn, so no peer takes the share by offering more, and no
    peer id by sorting first (ties are broken by `rng`). Peers whose samples have been useful
    go first, the most useful first, a cohort of older ones keeping 3 turns in 4 over younger
    ones (`cohorts`, by `seniority` at our round `round_`); every `newcomer_every`-th turn goes to a newcomer
    (standing None: never screened, or on trial) while one has groups left, so a new peer is
    heard at once; with `newcomer_most`, no more than that many of those turns (newcomers
    fill what proven peers leave either way). Newcomers in `came_late` (their first batch came
    after the newcomers first idled: loop.ledger.came_since_idle) and far ones (in
    `not_on_probation`, whose groups take no room) take their turns after the others: a crowd
    renewing its names while it floods cannot bury a near peer that was there before, those
    names are a set that only shrinks, and a far one cannot hold the turn for good. Peers
    found useless (`is_useless`) only fill what is left. With `probation`
    (the caller's every PROBATION_EVERY-th round), one group of one useless or `on_trial` peer
    (screened, nothing useful yet, too little to judge: loop.ledger.USELESS_AFTER) picked by
    `rng` comes first, for the caller to take on top of the share: an honest peer whose
    screened groups happened to teach nothing is screened again and can earn its way back even
    when useful peers fill the share, at the cost of one group every few rounds; and one on
    trial is screened where a node that takes no peer's group into its batch has no newcomer
    turn to give. A peer in `not_on_probation` (a far one, whose groups take no room:
    loop.share) is never the one."""
    peers = list(offers)
    rng.shuffle(peers)
    proven = sorted((p for p in peers if is_proven(standing.get(p))), key=lambda p: -(standing[p] or 0.0))
    after = set(came_late).union(not_on_probation)  # stable sort: rng's order within each part
    newcomers = sorted((p for p in peers if standing.get(p) is None), key=lambda p: p in after)
    useless = [p for p in peers if is_useless(standing.get(p))]
    proven_turns = _senior_first(offers, cohorts(seniority or {}, proven, round_))
    newcomer_turns = _turns(offers, newcomers)
    useless_turns = _turns(offers, useless)
    on_probation: list[T] = []
    on_trial_or_useless = set(useless).union(on_trial)
    eligible = [p for p in peers if p in on_trial_or_useless and p not in not_on_probation and offers[p]]
    if probation and eligible:
        on_probation = [offers[eligible[0]][0]]
        useless_turns = [group for group in useless_turns if group is not on_probation[0]]
        newcomer_turns = [group for group in newcomer_turns if group is not on_probation[0]]
    queue: list[T] = []
    given = 0  # newcomers' groups queued
    while proven_turns or newcomer_turns:
        newcomer_slot = (len(queue) + 1) % newcomer_every == 0 and (newcomer_most is None or given < newcomer_most)
        source = newcomer_turns if newcomer_slot and newcomer_turns else proven_turns or newcomer_turns
        given += source is newcomer_turns
        queue.append(source.pop(0))
    return on_probation + queue + useless_turns


def _senior_first(offers: Mapping[str, list[T]], groups: list[list[str]]) -> list[T]:
    """Round robin within each cohort; every YOUNGER_EVERY-th turn of the oldest goes to the
    younger cohorts together (in the same way among them), while they have groups."""
    if not groups:
        return []
    oldest, younger = _turns(offers, groups[0]), _senior_first(offers, groups[1:])
    queue: list[T] = []
    while oldest or younger:
        younger_slot = (len(queue) + 1) % YOUNGER_EVERY == 0
        queue.append((younger if younger_slot and younger else oldest or younger).pop(0))
    return queue


def _turns(offers: Mapping[str, list[T]], peers: list[str]) -> list[T]:
    """Round robin: each peer's first group, then each one's second, ..."""
    deepest = max((len(offers[p]) for p in peers), default=0)
    return [offers[p][i] for i in range(deepest) for p in peers if i < len(offers[p])]
