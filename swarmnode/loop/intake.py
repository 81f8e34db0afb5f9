"""Peers' batches on their way from the exchange into a training batch.

Each round: collect what peers published into the pool (waiting a bounded time when the pool
cannot fill the peers' share), check every batch strictly, then fill the peers' share in the
pool's fair order: each group taken is scored by our task (swarmnode.loop.scoring) and screened
by our own model (swarmnode.screening). This is the only place that writes verdicts about peers'
content to the ledger: bad batches, screening's strikes, and how useful each peer's samples were.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from swarmnode.learn.sample import Group, Sample, samples_of
from swarmnode.loop.ledger import PeerLedger
from swarmnode.loop.pool import IDLE_NEWCOMER_TURNS, PROBATION_EVERY, OfferedGroup, PeerPool, fair_queue
from swarmnode.loop.round_costs import RoundCosts
from swarmnode.loop.scoring import score_group
from swarmnode.loop.share import AdaptiveShare, Measured
from swarmnode.loop.waiting import WaitRule
from swarmnode.model.families import Families, Family, UnknownFamily
from swarmnode.model.hub_tokenizers import HubTokenizers
from swarmnode.model.policy import Policy
from swarmnode.ops.preflight import hub_offline
from swarmnode.protocol import wire
from swarmnode.protocol.batches import batch_split, check_batch
from swarmnode.protocol.prompts import build_prompt
from swarmnode.protocol.records import short_peer
from swarmnode.screening.screener import Pass, Screener, ScreeningRound
from swarmnode.settings.config import Config
from swarmnode.swarm.base import Membership, Received, RolloutExchange, is_useless
from swarmnode.tasks.base import Task

SCREEN_PASSES = 3  # rounds of score-and-screen to fill the peers' share when the gate drops samples


log = logging.getLogger(__name__)
UNREAD_NAMED = 8  # tokenizers this node names in its log when it cannot read them; later ones go unnamed

@dataclass
class Taken:
    """The peers' samples a round trains on, and what screening and the pool said of them."""

    passes: list[Pass] = field(default_factory=list)  # screening's, one per chunk of groups screened
    peers: set[str] = field(default_factory=set)  # whose groups were taken
    ages_s: list[float] = field(default_factory=list)  # per group taken: seconds since it arrived
    lags: list[int] = field(default_factory=list)  # per group taken: its sender's rounds since
    on_top_groups: int = 0  # far peers' groups screened on top of the batch (node.far_room top)
    on_top_screen_s: float = 0.0  # seconds scoring and screening them
    on_top_tokens: int = 0  # completion tokens of their samples kept
    on_top_from: int | None = None  # the first of `passes` that screened groups on top
    measured_groups: int = 0  # far peers' groups measured and not trained on (loop.share)
    measure_s: float = 0.0  # seconds measuring them

    @property
    def kept(self) -> list[Sample]:
        return [sample for done in self.passes for sample in done.kept]

    @property
    def in_batch(self) -> list[Sample]:
        """The samples kept that fill the batch's room (all of `kept` but those on top)."""
        return [sample for done in self.passes[: self.on_top_from] for sample in done.kept]

    @property
    def on_top(self) -> list[Sample]:
        """The samples kept from far peers' groups screened on top of the batch."""
        if self.on_top_from is None:
            return []
        return [sample for done in self.passes[self.on_top_from :] for sample in done.kept]

    @property
    def gated(self) -> int:
        return sum(done.screening.gated for done in self.passes)

    @property
    def picked(self) -> int:
        return sum(done.screening.picked for done in self.passes)

    @property
    def below_bar(self) -> int:
        return sum(done.screening.below_bar for done in self.passes)

    @property
    def uninformative(self) -> int:
        return sum(done.uninformative for done in self.passes)

    @property
    def usefulness(self) -> list[float]:
        return [factor for done in self.passes for factor in done.usefulness]

    @property
    def min_weight_scale(self) -> float | None:
        return min((p.weight_scale for done in self.passes for p in done.screening.peers.values()), default=None)


class Intake:
    def __init__(
        self,
        config: Config,
        policy: Policy,
        task: Task,
        run_id: str,
        exchange: RolloutExchange,
        membership: Membership,
        ledger: PeerLedger,
    ) -> None:
        self.config = config
        self.policy = policy
        self.task = task
        self.run_id = run_id
        self.exchange = exchange
        self.membership = membership
        self.ledger = ledger
        self.pool = PeerPool()
        self.waits = WaitRule(config)
        self.screener = Screener(config, policy)
        self.share = AdaptiveShare(config)
        self.costs = RoundCosts()  # what groups on top cost this node's round (node.far_room top)
        self.unread: set[str] = set()  # tokenizers a peer sent that this node cannot read
        self._own_reward: float | None = None  # our own samples' mean reward this round (loss.peer_baseline)
        self.hub_tokenizers = HubTokenizers(offline=hub_offline())  # peers' tokenizers rebuilt from their hub ids

    @cached_property
    def families(self) -> Families:
        """The tokenizers this node reads peers' batches in: ours, and those it knows of."""
        families = Families(self.policy.tokenizer, self.policy.vocab_size, own_hub=self.policy.hub_name)
        if families.own_document is not None:
            self.exchange.offer_tokenizer(families.own.digest, families.own_document)
        return families

    # -- collecting ----------------------------------------------------------------------------

    def collect(self, round_: int, generate_s: float, timings: dict[str, float]) -> list[OfferedGroup]:
        """Bring peers' new batches into the pool, waiting as the wait rule says when the pool
        cannot fill the peers' share (swarmnode.loop.waiting); the pool's fresh groups in the
        order the share takes them."""
        t = time.perf_counter()
        node = self.config.node
        newcomers = {peer for peer in self.pool.peers if self.ledger.standing(peer) is None}
        self.pool.expire(time.monotonic(), node.max_age_s, node.staleness, round_, newcomers)
        self.forget_silent(round_)
        live = set(self.membership.live_peers())
        _, budget = batch_split(self.config, self.share.current())
        # Useless peers' groups only fill what the others leave (pool.fair_queue), far ones' take
        # no room (loop.share), and those of peers on trial have taught nothing yet, so none of
        # them makes the share full: a round still waits its bounded time for a proven peer
        offered = self.pool.offers(round_)
        short = sum(len(groups) for peer, groups in offered.items()
                    if not self._taught_nothing(peer) and not self.share.is_far(peer)) < budget
        wait = self.waits.plan(
            short=short, live=live, earned=self.ledger.expected(live) - self.share.far_peers(), pooled=self.pool.peers,
            ever_delivered=self.ledger.ever_delivered(), held=self.pool.holding(round_), generate_s=generate_s,
        )
        received = self.exchange.gather(wait)
        timings["gather_s"] = time.perf_counter() - t
        t = time.perf_counter()
        delivered = self._accept(received, round_)
        for peer in self.waits.settle(wait, delivered):
            self.ledger.missed(peer)
        timings["decode_s"] = time.perf_counter() - t
        offers = self.pool.offers(round_)
        rng = random.Random(f"{node.seed}:{self.exchange.peer_id}:{round_}:intake")
        standing = {peer: self.ledger.standing(peer) for peer in offers}
        return fair_queue(offers, standing, rng, probation=self._probation_round(round_, budget),
                          seniority=self.ledger.seniority(), round_=round_, not_on_probation=self.share.far_peers(),
                          on_trial={peer for peer in offers if self.ledger.on_trial(peer)},
                          newcomer_most=IDLE_NEWCOMER_TURNS if self.ledger.newcomers_idle() else None,
                          came_late={peer for peer in offers if self.ledger.came_since_idle(peer)})

    def forget_silent(self, round_: int) -> None:
        """Our round `round_` began: forget the names the ledger forgets (loop.ledger.forget_silent),
        here and in the pool and screener too, so what this node keeps per name stays bounded
        however many names a crowd makes. A peer whose groups the pool holds is kept."""
        self.ledger.advance(round_)
        for peer in self.ledger.forget_silent(keep=self.pool.peers):
            self.pool.forget(peer)
            self.screener.forget(peer)

    def _taught_nothing(self, peer: str) -> bool:
        """Screened, and none of its samples useful yet: useless, or on trial (loop.ledger)."""
        return is_useless(self.ledger.standing(peer)) or self.ledger.on_trial(peer)

    def _probation_round(self, round_: int, budget: int) -> bool:
        """Whether a useless (or on trial) near peer's group is screened on top this round:
        every PROBATION_EVERY-th round, and every round while the node's share adapted to its
        whole batch, where it takes no peer's group but on probation."""
        return (self.share.enabled and budget == 0) or round_ % PROBATION_EVERY == 0

    def _accept(self, received: list[Received], our_round: int) -> set[str]:
        """Decode strictly, check each batch belongs to this run and its sender's round, and
        hold its groups (at most `node.peer_quota`, in a random order of ours: a sender that
        pads written groups with sampled ones cannot choose which we take) in the pool, each
        adding to its sender's evidence of picking; returns who delivered."""
        delivered: set[str] = set()
        now = time.monotonic()
        fetched = self.exchange.tokenizers() + self.hub_tokenizers.ready()  # since the last round, hashes checked
        for digest, document in fetched:
            if self.families.learn(digest, document) is None:
                log.warning("a peer's tokenizer %s is not one this node can load: its batches stay unread", digest[:16])
        for item in received:
            if self.ledger.is_banned(item.peer_id):
                continue
            try:
                batch, family = self.verify(item)
            except UnknownFamily as unknown:
                self._note_unread(item.peer_id, unknown, round_=our_round)
                delivered.add(item.peer_id)  # it did deliver, a batch that teaches us nothing
                continue
            except wire.WireError as err:
                self.reject(item.peer_id, str(err))
                continue
            self.ledger.delivered(item.peer_id)
            delivered.add(item.peer_id)
            label = "" if self.families.is_own(family) else family.digest
            # in an order of our own: what a sender puts first is not what we take first
            order = random.Random(f"{self.config.node.seed}:{self.exchange.peer_id}:{item.peer_id}:{batch.round}:order")
            chosen = order.sample(batch.groups, min(len(batch.groups), self.config.node.peer_quota))
            groups = [OfferedGroup(item.peer_id, batch.round, g.prompt_id, g.completions(), now, label) for g in chosen]
            if self.pool.add(item.peer_id, batch.round, groups, our_round):
                self.screener.delivered(item.peer_id, [group.completions for group in groups])
                if self.screener.picking(item.peer_id):  # stands at 0 before any of its groups is screened
                    sent = sum(len(group.completions) for group in groups)
                    self.ledger.screened(item.peer_id, sent, 0, our_round, picking=True)
        return delivered

    def verify(self, item: Received) -> tuple[wire.RolloutBatch, Family]:
        """The batch, decoded and checked as one this node may train on, and the family of its
        tokenizer; WireError if not, UnknownFamily when it is in a tokenizer this node cannot
        read (yet)."""
        batch = wire.decode(item.payload, self.config.wire)
        family = self.families.get(batch.tokenizer_digest)
        # every check that holds whatever the tokenizer comes first: a lie there is a lie
        check_batch(batch, item.peer_id, item.round, self.config, self.run_id,
                    family.vocab_size if family else None, self.task.num_train)
        if family is None:
            raise UnknownFamily(batch.tokenizer_digest, batch.tokenizer_hub)
        return batch, family

    def _note_unread(self, peer_id: str, unknown: UnknownFamily, round_: int) -> None:
        """A batch in a tokenizer this node cannot read yet: no fault of the sender's, no
        strike, but it taught us nothing, so its sender's standing counts it as useless (no
        wait for it, its groups last). The sender is asked for its tokenizer's document (the
        exchange asks each digest once, from one peer at a time), so its next batches are
        read. The hub id the batch names is tried first (swarmnode.model.hub_tokenizers); the
        sender is asked when there is none, the hub is off, or it gave another document. Said
        once for the first UNREAD_NAMED tokenizers."""
        self.ledger.delivered(peer_id)
        self.ledger.unreadable(peer_id, round_)
        if unknown.digest not in self.families.unreadable and not self.hub_tokenizers.want(unknown.digest, unknown.hub):
            self.exchange.want_tokenizer(peer_id, unknown.digest)
        if len(self.unread) < UNREAD_NAMED and unknown.digest not in self.unread:
            self.unread.add(unknown.digest)
            log.info("peer %s sends batches in a tokenizer this node does not know yet (%s): asking it for it",
                     short_peer(peer_id), unknown.digest[:16])

    def reject(self, peer_id: str, reason: str) -> None:
        self.ledger.reject(peer_id, reason)
        if self.ledger.is_banned(peer_id):
            self.pool.drop(peer_id)

    # -- taking --------------------------------------------------------------------------------

    def take(self, round_: int, offered: list[OfferedGroup], own: list[Sample], timings: dict[str, float]) -> Taken:
        """Fill the peers' share of the batch from `offered`, in its order, with samples that
        pass screening (swarmnode.screening): a gated sample takes no room, nor (with
        `node.skip_uninformative`) one with advantage 0; the next groups are screened in their
        place (at most SCREEN_PASSES times), and a group on probation comes on top. Every group
        screened is used up; a picking peer's groups (screening.repeats) are not screened but
        on probation. Far peers' groups (loop.share) take no room; with `node.far_room` top they
        (top-scored: those far only by score) are screened on top, up to the room generated in
        their place and to what a tenth of a round pays for (loop.round_costs). Screening's strikes and
        each peer's useful samples go to the ledger."""
        _, budget = batch_split(self.config, self.share.current())
        group_size = self.config.rollout.group_size
        own_rewards = [sample.reward for sample in own]
        self._own_reward = sum(own_rewards) / len(own_rewards) if own_rewards else None
        # a useless peer's group on probation (or, in a probation round, one on trial: too little
        # screened to judge it) comes first (pool.fair_queue) and on top of the
        # share, so screening it again costs a proven peer nothing; no share, no probation, but
        # for a share that adapted to the whole batch (loop.share): there a near peer found
        # useless in the first rounds, when nothing teaches, stayed out for good, behind a
        # proven far peer whose groups made the room read as far (docs/figures.md, "A near
        # peer shut out")
        first = offered[0].peer_id if offered else None
        on_probation = (
            (budget > 0 or self.share.enabled) and first is not None
            and (is_useless(self.ledger.standing(first))
                 or (self._probation_round(round_, budget) and self.ledger.on_trial(first)))
            and not self.ledger.is_banned(first) and not self.share.is_far(first)
        )
        wanted = (budget + on_probation) * group_size
        taken = Taken()
        # a picking peer's groups would be left out whole: they are not screened (nor used up,
        # so the pool's hold keeps its next batches away), but on probation, where its evidence
        # may fall again
        queue = [g for i, g in enumerate(offered) if (on_probation and i == 0) or not self.screener.picking(g.peer_id)]
        _, room = batch_split(self.config, self.share.floor)  # the peers' share without the rule
        self.share.offered(g.peer_id for g in queue[:room])
        far = [g for g in queue if self.share.is_far(g.peer_id)]  # take no room (loop.share)
        queue = [g for g in queue if not self.share.is_far(g.peer_id)]
        # with far_room top (or top-scored, those far only by score), far peers' groups come on
        # top of the batch, up to the room this node generated in place of far peers (loop.share):
        # no more than far peers' groups would have filled (under top-scored, peers far by score
        # may fill what those far by likelihood left), and a useless far peer's group (first in a
        # probation round) after proven far peers' groups; and no more than ON_TOP_COST of a round
        # alone pays for, as this node timed its work (loop.round_costs), less one measured
        # group's price when a far peer none of whose groups comes on top is left to measure
        topping = [group for group in far if self.share.comes_on_top(group.peer_id)]
        batch_groups, forward = self.config.rollout.prompts_per_round, self.share.measures_gap
        most = min(room - budget, self.costs.on_top_groups(batch_groups, 0, forward))
        on_top = sorted(topping, key=lambda group: self._taught_nothing(group.peer_id))[:max(0, most)]
        if {group.peer_id for group in far} - {group.peer_id for group in on_top}:
            on_top = on_top[:max(0, self.costs.on_top_groups(batch_groups, 1, forward))]
        timings["score_s"] = timings["screen_s"] = 0.0
        screening = self.screener.open_round(own, peers_coming=(bool(queue) and wanted > 0) or bool(on_top))
        measured = Measured()  # peers' samples under our model and as we graded them (loop.share)
        for _ in range(SCREEN_PASSES):
            missing = wanted - len(taken.kept)
            if missing <= 0 or not queue:
                break
            count = -(-missing // group_size)
            chunk, queue = queue[:count], queue[count:]
            self._screen_chunk(round_, chunk, screening, taken, timings, measured)
        if on_top:
            t, before = time.perf_counter(), len(taken.passes)
            self._screen_chunk(round_, on_top, screening, taken, timings, measured)
            taken.on_top_groups, taken.on_top_screen_s = len(on_top), time.perf_counter() - t
            taken.on_top_from = before
            taken.on_top_tokens = sum(len(sample.tokens) for done in taken.passes[before:] for sample in done.kept)
            topped = {group.peer_id for group in on_top}
            far = [group for group in far if group.peer_id not in topped]  # measured already
        if self.share.enabled:
            t = time.perf_counter()
            left = self.costs.measured_groups(batch_groups, len(on_top), forward)
            taken.measured_groups = self._measure_far(far, measured, round_, min(room - len(on_top), left))
            taken.measure_s = time.perf_counter() - t
            own_logprobs = self._own_logprobs(own) if self.share.measures_gap else []
            self.share.observe(own_logprobs, measured.logprobs, own_rewards, measured.rewards)
        self.exchange.hold(self.pool.holding(round_))  # whom the exchange may fetch from while we train
        return taken

    def _screen_chunk(self, round_: int, chunk: list[OfferedGroup], screening: ScreeningRound, taken: Taken,
                      timings: dict[str, float], measured: Measured) -> None:
        """Use up, score and screen one chunk of peers' groups into `taken`, measuring them for
        the share (loop.share) and giving screening's strikes to the ledger."""
        self.pool.take(chunk)
        now = time.monotonic()
        taken.ages_s += [now - group.arrived for group in chunk]
        taken.lags += [self.pool.lag(group) for group in chunk]
        taken.peers.update(group.peer_id for group in chunk)
        t = time.perf_counter()
        groups = [self._score(group) for group in chunk]
        timings["score_s"] += time.perf_counter() - t
        t = time.perf_counter()
        done = screening.screen(groups)
        if self.share.enabled:
            self._measure(samples_of(groups), done.theta, measured)
        timings["screen_s"] += time.perf_counter() - t
        self._record(round_, done)
        taken.passes.append(done)

    def _measure(self, samples: list[Sample], theta: list[np.ndarray] | None, into: Measured) -> None:
        """Each sample's reward as we graded it and, with the likelihood gap on, its per-token
        log-probs under our model (screening's when it computed them), by sender."""
        for sample in samples:
            into.rewards.setdefault(sample.source, []).append(sample.reward)
        if not self.share.measures_gap:
            return
        for sample, logprobs in zip(samples, theta if theta is not None else self._theta(samples), strict=True):
            into.logprobs.setdefault(sample.source, []).append(logprobs)

    def _measure_far(self, far: list[OfferedGroup], into: Measured, round_: int,
                     most: int) -> int:
        """One group of each far peer, used up and measured under our model but not trained on,
        so that a peer that comes near is seen to; at most `most` groups a round but at least one
        (the peers' share at own_share less the far groups taken on top, and what those leave of
        the tenth of a round: loop.round_costs), taken in turn among far peers, so a crowd of far
        identities costs no more scoring than the share would. The groups measured."""
        first_of: dict[str, OfferedGroup] = {}
        for group in far:
            first_of.setdefault(group.peer_id, group)
        firsts = list(first_of.values())
        if not firsts:
            return 0
        turn = round_ % len(firsts)
        firsts = (firsts[turn:] + firsts[:turn])[:max(1, most)]
        self.pool.take(firsts)
        self._measure(samples_of([self._score(group) for group in firsts]), None, into)
        return len(firsts)

    def _record(self, round_: int, done: Pass) -> None:
        """Screening's strikes and each peer's useful samples, into the ledger."""
        for peer, reason in done.strikes.items():
            self.reject(peer, reason)
        for peer, (screened, useful) in done.standing.items():
            self.ledger.screened(peer, screened, useful, round_, picking=peer in done.picking,
                                 near=not self.share.is_far(peer))

    def _own_logprobs(self, own: list[Sample]) -> list[np.ndarray]:
        """Our samples' per-token log-probs under our model as peers' are measured: the
        generator's, unless top-k or top-p truncated its distribution; then they are renormalised
        over the kept tokens, higher than the model's, and would make every peer look farther by
        that much, so they are measured again (one forward over our own samples a round)."""
        rollout = self.config.rollout
        if rollout.top_k == 0 and rollout.top_p == 1.0:
            return [s.logprobs for s in own]
        return self._theta(own) if own else []

    def _theta(self, samples: list[Sample]) -> list[np.ndarray]:
        """Per-token log-probs of `samples` under our model now."""
        return self.policy.token_logprobs(
            [s.prompt_ids for s in samples], [s.tokens for s in samples], self.config.rollout.temperature
        )

    def _score(self, group: OfferedGroup) -> Group:
        problem = self.task.train_problem(group.prompt_id)
        prompt = build_prompt(self.task, problem, self.policy)
        sender = self.families.get(group.family) if group.family else None
        translation = (sender.tokenization, self.families.own.tokenization) if sender else None
        return score_group(self.task, self.policy, group.peer_id, problem, prompt, group.completions,
                           self.config.loss.advantage_std, translation, self.config.rollout.max_new_tokens,
                           self._own_reward, self.config.loss.peer_baseline)
