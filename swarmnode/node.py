"""The round loop: choose prompts, generate, publish, gather, score, train, log, checkpoint.

Each node counts its own rounds: nothing a peer claims or sends changes how many rounds it
trains, which prompts it gets, or when it stops. Peers' verified groups wait in a pool and are
taken while fresh (swarmnode.intake); a round waits for them at most a share of its own time.

It knows the other parts only through small interfaces (Task, Generator, Policy, and the
swarm's RolloutExchange and Membership), so the same loop runs alone, with in-memory peers in
one process, or over hivemind. swarmnode.assemble builds it; tests may build it by hand.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from swarmnode import wire
from swarmnode.checkpoint import load_checkpoint, save_checkpoint
from swarmnode.config import Config
from swarmnode.intake import OfferedGroup, PeerPool, assigned_prompt_ids, batch_split, check_batch, fair_queue
from swarmnode.loss import group_advantages
from swarmnode.metrics import LiveView, MetricsLog
from swarmnode.policy import OutOfMemory, Policy, StepResult, TrainSample
from swarmnode.records import EvalRecord, NodeStatus, RoundRecord, run_id
from swarmnode.rollout.base import Completion, Generator
from swarmnode.swarm.base import Received, SwarmLink
from swarmnode.swarm.ledger import PeerLedger
from swarmnode.swarm.local import solo_link
from swarmnode.tasks.base import Problem, Task, fingerprint_of
from swarmnode.trust import Screening, screen

log = logging.getLogger(__name__)

LINGER_S = 10.0  # the longest a finishing node keeps serving its last batch to peers
OWN_ROUND_HISTORY = 16  # recent own round times behind the wait for peers
SCREEN_PASSES = 3  # rounds of score-and-screen to fill the peers' share when the gate drops samples


def run_id_for(config: Config, task: Task, policy: Policy) -> str:
    """The run id of a node with this config, task and policy (see records.run_id)."""
    return run_id(config, task.fingerprint, policy.fingerprint, policy.use_chat_template)


def solo_peer_id(config: Config) -> str:
    """A node without a swarm: the configured id, else one derived from its run dir."""
    return config.node.peer_id or f"local-{fingerprint_of(str(config.node.run_dir))[:8]}"


@dataclass
class ScoredGroup:
    """One generator's completions for one prompt, scored by this node."""

    peer_id: str
    problem: Problem
    prompt_ids: list[int]
    completions: list[tuple[np.ndarray, np.ndarray]]
    rewards: list[float]

    @property
    def own(self) -> bool:
        return self.peer_id == ""


@dataclass
class RoundState:
    own_groups: list[ScoredGroup] = field(default_factory=list)
    payload_bytes: int = 0
    payload_tokens: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    peer_ages_s: list[float] = field(default_factory=list)  # per peers' group taken: seconds since it arrived
    peer_lags: list[int] = field(default_factory=list)  # per peers' group taken: its sender's rounds since


SourcedSample = tuple[TrainSample, float, str]  # a sample, its reward, who generated it ("" = us)


class Node:
    """One swarm participant. `produce` and `consume` are split so tests can run nodes in step."""

    def __init__(
        self,
        config: Config,
        policy: Policy,
        generator: Generator,
        task: Task,
        link: SwarmLink | None = None,
        view: LiveView | None = None,
        ood_eval: Any = None,
        ledger: PeerLedger | None = None,
        run_id: str | None = None,
    ) -> None:
        """`link` None: a node alone. The caller closes the link and the generator. `run_id` is
        run_id_for(config, task, policy), passed in when the caller already computed it."""
        self.config = config
        self.policy = policy
        self.generator = generator
        self.task = task
        self.run_id = run_id or run_id_for(config, task, policy)
        link = link or solo_link(solo_peer_id(config), self.run_id)
        self.exchange, self.membership = link.exchange, link.membership
        self.peer_id = self.exchange.peer_id
        self.view = view or LiveView(quiet=True)
        self.run_dir = Path(config.node.run_dir)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.ledger = ledger or PeerLedger(config.swarm)
        self.pool = PeerPool()  # peers' verified groups, waiting for a place in a batch
        self._vain_waits = 0  # rounds in a row spent waiting for a first delivery in vain
        self._own_round_s: deque[float] = deque(maxlen=OWN_ROUND_HISTORY)  # recent rounds, waiting excluded
        self.published = 0  # rollouts (completions) this node published
        self.consumed = 0  # peers' rollouts this node trained on
        self.last_eval: float | None = None
        self.last_record: RoundRecord | None = None
        self.started_at = time.time()
        self.last_progress = time.monotonic()  # a round or an eval finished; read by /health
        self.next_round = 0
        self._eval_problems: list[Problem] | None = None
        self.ood_eval = ood_eval  # e.g. Math500Eval: scored like the task, never trained on

    # -- one round -------------------------------------------------------------------------

    def produce(self, round_: int) -> RoundState:
        """Generate this round's groups, score them, encode and publish them."""
        state = RoundState()
        started = time.perf_counter()
        own_groups, _ = batch_split(self.config)
        ids = assigned_prompt_ids(self.config.node.seed, self.peer_id, round_, own_groups, self.task.num_train)
        problems = [self.task.train_problem(i) for i in ids]
        prompts = [self.policy.encode_prompt(self.task.system_prompt, p.question) for p in problems]
        groups = self.generator.generate(prompts, self.config.rollout.group_size)
        state.timings["generate_s"] = time.perf_counter() - started
        batch = wire.RolloutBatch(
            run_id=self.run_id,
            peer_id=self.peer_id,
            round=round_,
            policy=replace(self.policy.info, backend=self.generator.name),
            tokenizer_fingerprint=self.policy.fingerprint,
            groups=[_to_wire_group(p.id, g) for p, g in zip(problems, groups)],
        )
        t = time.perf_counter()
        payload = wire.encode(batch)
        state.timings["encode_s"] = time.perf_counter() - t
        state.payload_bytes, state.payload_tokens = len(payload), batch.num_tokens
        t = time.perf_counter()
        self.exchange.publish(round_, payload, batch.num_tokens)
        state.timings["publish_s"] = time.perf_counter() - t
        self.published += sum(len(g.lengths) for g in batch.groups)
        for problem, prompt, group in zip(problems, prompts, groups):
            completions = [(c.tokens, c.logprobs) for c in group]
            state.own_groups.append(self._score("", problem, prompt, completions))
        return state

    def consume(self, round_: int, state: RoundState) -> RoundRecord:
        """Gather peers' groups, screen them, take one optimiser step on everything, log it."""
        offered = self._gather(round_, state)
        own = _train_samples(state.own_groups, self.config.loss.advantage_std)
        t = time.perf_counter()
        kept, screenings, peers = self._take_peers(offered, own, state)
        state.timings["screen_s"] = time.perf_counter() - t - state.timings.get("score_s", 0.0)
        t = time.perf_counter()
        result = self.policy.train_step(
            [sample for sample, _, _ in own + kept], self.config.loss, self.config.rollout.temperature
        )
        state.timings["train_s"] = time.perf_counter() - t
        state.timings["sync_s"] = self.generator.sync_weights()
        self.consumed += len(kept)
        return self._record(round_, state, own, kept, peers, screenings, result)

    def _gather(self, round_: int, state: RoundState) -> list[OfferedGroup]:
        """Collect peers' new batches into the pool, waiting a bounded time when the pool
        cannot fill the peers' share; returns the pool's fresh groups in the order the share
        takes them (swarmnode.intake.fair_queue). The ledger learns who delivered."""
        t = time.perf_counter()
        node = self.config.node
        self.pool.expire(time.monotonic(), node.max_age_s, node.staleness)
        live = set(self.membership.live_peers())
        _, budget = batch_split(self.config)
        short = sum(len(groups) for groups in self.pool.offers(round_).values()) < budget
        # Wait only when the pool cannot fill the peers' share, only for peers that delivered
        # before and hold nothing fresh here (and, before anyone ever delivered, for anyone
        # live, at most `swarm.max_missed` rounds in a row), and at most a share of our own
        # round time: nobody waits long for the slow, and silent identities cost little.
        waiting = self.ledger.expected(live) - self.pool.peers if short else set()
        anyone = (
            short and bool(live) and not self.ledger.ever_delivered
            and self._vain_waits < self.config.swarm.max_missed
        )
        timeout_s = self._wait_s(state) if waiting or anyone else 0.0
        received = self.exchange.gather(timeout_s, waiting, anyone)
        state.timings["gather_s"] = time.perf_counter() - t
        t = time.perf_counter()
        delivered = self._accept(received, round_)
        for peer in waiting - delivered:
            self.ledger.missed(peer)
        self._vain_waits = 0 if delivered or not anyone else self._vain_waits + 1
        state.timings["decode_s"] = time.perf_counter() - t
        offers = self.pool.offers(round_)
        rng = random.Random(f"{self.config.node.seed}:{self.peer_id}:{round_}:intake")
        return fair_queue(offers, {peer: self.ledger.standing(peer) for peer in offers}, rng)

    def _wait_s(self, state: RoundState) -> float:
        """The longest this round waits for peers: `node.wait_share` of our own recent round
        time (this round's generation before there is any), at most `node.gather_timeout_s`."""
        own_s = float(np.median(self._own_round_s)) if self._own_round_s else state.timings["generate_s"]
        return min(self.config.node.gather_timeout_s, self.config.node.wait_share * own_s)

    def _take_peers(
        self, offered: list[OfferedGroup], own: list[SourcedSample], state: RoundState
    ) -> tuple[list[SourcedSample], list[Screening], int]:
        """Fill the peers' share of the batch from `offered`, in its order, with samples that
        pass screening: a gated sample takes no room, the next groups are screened in its place
        (at most SCREEN_PASSES times). Returns the kept samples, each pass's screening and how
        many peers' groups were taken."""
        _, budget = batch_split(self.config)
        group_size = self.config.rollout.group_size
        wanted = budget * group_size
        kept: list[SourcedSample] = []
        screenings: list[Screening] = []
        struck: set[str] = set()
        peers: set[str] = set()
        queue = list(offered)
        state.timings["score_s"] = 0.0
        for _ in range(SCREEN_PASSES):
            missing = wanted - len(kept)
            if missing <= 0 or not queue:
                break
            count = -(-missing // group_size)
            chunk, queue = queue[:count], queue[count:]
            self.pool.take(chunk)
            now = time.monotonic()
            state.peer_ages_s += [now - group.arrived for group in chunk]
            state.peer_lags += [self.pool.lag(group) for group in chunk]
            t = time.perf_counter()
            scored = [self._score_offer(group) for group in chunk]
            state.timings["score_s"] += time.perf_counter() - t
            samples = _train_samples(scored, self.config.loss.advantage_std)
            screening = self._screen(own, samples, struck)
            taken = [sample for sample, keep in zip(samples, screening.keep) if keep]
            kept += taken
            screenings.append(screening)
            peers.update(group.peer_id for group in chunk)
            self._note_standing(samples, screening)
        return kept, screenings, len(peers)

    def _note_standing(self, samples: list[SourcedSample], screening: Screening) -> None:
        """Tell the ledger how many of each peer's screened samples were useful: kept, not
        under the gate's bar, and carrying a non-zero advantage (a group all right or all wrong
        teaches nothing)."""
        offered: Counter[str] = Counter()
        useful: Counter[str] = Counter()
        for (sample, _, peer), kept, unlikely in zip(samples, screening.keep, screening.below_bar_flags):
            offered[peer] += 1
            useful[peer] += int(kept and not unlikely and sample.advantage != 0)
        for peer, count in offered.items():
            self.ledger.screened(peer, count, useful[peer])

    def _record(
        self,
        round_: int,
        state: RoundState,
        own: list[SourcedSample],
        kept: list[SourcedSample],
        peers: int,
        screenings: list[Screening],
        result: StepResult,
    ) -> RoundRecord:
        own_rewards = [reward for _, reward, _ in own]
        peer_rewards = [reward for _, reward, _ in kept]
        s = result.stats
        return RoundRecord(
            round=round_,
            peer_id=self.peer_id,
            reward_mean=float(np.mean(own_rewards)) if own_rewards else 0.0,
            peer_reward_mean=float(np.mean(peer_rewards)) if peer_rewards else None,
            own_samples=len(own_rewards),
            peer_samples=len(peer_rewards),
            peers=peers,
            gated=sum(screening.gated for screening in screenings),
            below_bar=sum(screening.below_bar for screening in screenings),
            peer_weight_scale=min(
                (v.weight_scale for screening in screenings for v in screening.verdicts.values()), default=None
            ),
            filtered=s.filtered,
            filtered_frac=s.filtered_frac,
            weight_mean=s.weight_mean,
            weight_max=s.weight_max,
            truncated_frac=s.truncated_frac,
            divergence_mean=s.divergence_mean,
            loss=result.loss,
            grad_norm=result.grad_norm,
            wire_bytes=state.payload_bytes,
            wire_tokens=state.payload_tokens,
            rejected=self.ledger.total,
            peer_age_s=float(np.mean(state.peer_ages_s)) if state.peer_ages_s else None,
            peer_lag=float(np.mean(state.peer_lags)) if state.peer_lags else None,
            tokens_per_s=state.payload_tokens / max(state.timings["generate_s"], 1e-9),
            timings=state.timings,
        )

    def run_round(self, round_: int) -> RoundRecord:
        started = time.perf_counter()
        state = self.produce(round_)
        record = self.consume(round_, state)
        record.timings["round_s"] = time.perf_counter() - started
        self._own_round_s.append(record.timings["round_s"] - record.timings.get("gather_s", 0.0))
        return record

    # -- peers' data -----------------------------------------------------------------------

    def _screen(self, own: list[SourcedSample], peers: list[SourcedSample], struck: set[str]) -> Screening:
        """Judge peers' samples by our own model (swarmnode.trust): which to keep (the gate
        drops only unlikely samples with a positive advantage), how much their weights count; a
        peer whose log-probs claim more weight than an honest generator's gets a strike in the
        ledger (failing the gate is none: see swarmnode.trust)."""
        trust = self.config.trust
        if not peers or not (trust.likelihood_gate or trust.weight_budget):
            everyone = [True] * len(peers)
            return Screening(keep=everyone, below_bar_flags=[False] * len(peers), weight_scale=[1.0] * len(peers),
                             bar=None, verdicts={})
        theta = self.policy.token_logprobs(
            [sample.prompt_ids for sample, _, _ in peers],
            [sample.completion_ids for sample, _, _ in peers],
            self.config.rollout.temperature,
        )
        screening = screen(
            [peer for _, _, peer in peers],
            [sample.advantage for sample, _, _ in peers],
            [sample.gen_logprobs for sample, _, _ in peers],
            theta,
            [sample.gen_logprobs for sample, _, _ in own],
            trust,
            self.config.loss,
        )
        for (sample, _, _), scale in zip(peers, screening.weight_scale):
            sample.weight_scale = scale
        for peer, verdict in screening.verdicts.items():
            if verdict.strikes and peer not in struck:  # one batch, one strike, however many passes
                struck.add(peer)
                self._reject(peer, verdict.strikes[0])
        return screening

    def _accept(self, received: list[Received], our_round: int) -> set[str]:
        """Decode strictly, check each batch belongs to this run and its sender's round, and
        hold its groups (at most `node.peer_quota`) in the pool; returns who delivered."""
        delivered: set[str] = set()
        now = time.monotonic()
        for item in received:
            if self.ledger.is_banned(item.peer_id):
                continue
            try:
                batch = self._verify(item)
            except wire.WireError as err:
                self._reject(item.peer_id, str(err))
                continue
            self.ledger.delivered(item.peer_id)
            delivered.add(item.peer_id)
            groups = [
                OfferedGroup(item.peer_id, batch.round, g.prompt_id, g.completions(), now)
                for g in batch.groups[: self.config.node.peer_quota]
            ]
            self.pool.add(item.peer_id, batch.round, groups, our_round)
        return delivered

    def _verify(self, item: Received) -> wire.RolloutBatch:
        """The batch, decoded and checked as one this node may train on; WireError if not."""
        batch = wire.decode(item.payload, self.config.wire, self.policy.vocab_size)
        check_batch(batch, item.peer_id, item.round, self.config, self.run_id, self.policy.fingerprint,
                    self.task.num_train)
        return batch

    @property
    def rejected(self) -> Counter[str]:
        return self.ledger.counts

    def _reject(self, peer_id: str, reason: str) -> None:
        self.ledger.reject(peer_id, reason)
        if self.ledger.is_banned(peer_id):
            self.pool.drop(peer_id)

    def _score_offer(self, group: OfferedGroup) -> ScoredGroup:
        problem = self.task.train_problem(group.prompt_id)
        prompt = self.policy.encode_prompt(self.task.system_prompt, problem.question)
        return self._score(group.peer_id, problem, prompt, group.completions)

    def _score(
        self,
        peer_id: str,
        problem: Problem,
        prompt_ids: list[int],
        completions: list[tuple[np.ndarray, np.ndarray]],
    ) -> ScoredGroup:
        rewards = [self.task.reward(self.policy.decode(tokens), problem) for tokens, _ in completions]
        return ScoredGroup(peer_id, problem, prompt_ids, completions, rewards)

    # -- evaluation, checkpoints, the whole run ----------------------------------------------

    def evaluate(self) -> float:
        """Greedy pass@1 on the task's held-out problems."""
        return float(np.mean(self.evaluate_scores()))

    def evaluate_scores(self, source: Any = None) -> list[float]:
        """Per-problem greedy rewards on held-out problems (for paired comparisons).

        `source` defaults to the task's own eval split; pass `self.ood_eval` for OOD.
        """
        source = source or self.task
        if source is self.task and self._eval_problems is None:
            self._eval_problems = self.task.eval_problems(self.config.node.eval_size)
        problems = (
            self._eval_problems if source is self.task else source.eval_problems(self.config.node.eval_size)
        )
        prompts = [self.policy.encode_prompt(self.task.system_prompt, p.question) for p in problems]
        outputs = self.generator.greedy(prompts)
        self.last_progress = time.monotonic()
        return [source.reward(self.policy.decode(o.tokens), p) for o, p in zip(outputs, problems)]

    def _ood(self) -> float | None:
        return float(np.mean(self.evaluate_scores(self.ood_eval))) if self.ood_eval else None

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoint"

    def save(self, last_round: int) -> None:
        save_checkpoint(
            self.policy, self.checkpoint_dir, last_round, {"run_id": self.run_id, "peer_id": self.peer_id}
        )
        self.next_round = last_round + 1

    def maybe_resume(self) -> bool:
        """Continue from the run dir's checkpoint when there is one (and resume is on)."""
        if not (self.config.node.resume and (self.checkpoint_dir / "meta.json").exists()):
            return False
        meta = load_checkpoint(self.policy, self.checkpoint_dir)
        if meta.get("run_id") != self.run_id:
            raise ValueError(
                f"{self.checkpoint_dir} belongs to run {meta.get('run_id')}, not {self.run_id}: "
                "the settings changed; use a new --run-dir or set node.resume=false"
            )
        self.next_round = int(meta["round"]) + 1
        self.generator.sync_weights()
        return True

    def run(self, rounds: int | None = None) -> dict[str, Any]:
        """Run this node's rounds up to `rounds` (its own count, earlier runs of a resumed one
        included); checkpoint on the way and on Ctrl-C."""
        total = self.config.node.rounds if rounds is None else rounds
        cfg = self.config.node
        summary: dict[str, Any] = {"eval_before": None, "eval_after": None}
        if self.next_round == 0:
            before = self._evaluate_all(-1, "before")
            summary["eval_before"], summary["ood_before"] = before.eval_acc, before.ood_acc
            self.view.note(f"eval before training: {before.eval_acc:.3f}")
        self._wait_for_peers()
        round_ = self.next_round
        last_done = self.next_round - 1
        try:
            while round_ < total:
                self.membership.announce(self.status(round_))
                record = self.run_round(round_)
                last_done = round_
                self.last_record = record
                self.last_progress = time.monotonic()
                self.metrics.write(record.to_json())
                self.view.round(record, total)
                if cfg.eval_every and (round_ + 1) % cfg.eval_every == 0 and round_ + 1 < total:
                    self.view.note(f"eval after round {round_ + 1}: {self._evaluate_all(round_, 'during').eval_acc:.3f}")
                if cfg.checkpoint_every and (round_ + 1) % cfg.checkpoint_every == 0:
                    self.save(round_)
                round_ += 1
        except KeyboardInterrupt:
            self.view.note("interrupted: writing a checkpoint before exiting")
            if last_done >= 0:
                self.save(last_done)
            raise
        except OutOfMemory:
            if last_done >= 0:
                self.save(last_done)
            raise
        if last_done >= 0:  # peers still gathering our last batch get it before we go
            live = set(self.membership.live_peers())
            self.exchange.linger(last_done, self.ledger.expected(live), min(cfg.gather_timeout_s, LINGER_S))
        after = self._evaluate_all(last_done, "after")
        summary["eval_after"], summary["ood_after"] = after.eval_acc, after.ood_acc
        self.membership.announce(self.status(last_done + 1))
        self.view.note(f"eval after training: {after.eval_acc:.3f}")
        if last_done >= 0:
            self.save(last_done)
        return summary

    def _evaluate_all(self, last_round: int, phase: str) -> EvalRecord:
        """Held-out (and OOD) accuracy, logged as an eval line of metrics.jsonl."""
        record = EvalRecord(round=last_round, phase=phase, eval_acc=self.evaluate(), ood_acc=self._ood())
        self.last_eval = record.eval_acc
        self.metrics.write(record.to_json())
        return record

    def _wait_for_peers(self) -> None:
        wanted = self.config.swarm.min_peers
        if not wanted:
            return
        self.membership.announce(self.status(self.next_round))
        timeout = self.config.swarm.wait_for_peers_s
        self.view.note(f"waiting up to {timeout:.0f} s for {wanted} peer(s) of run {self.run_id}")
        live = self.membership.wait_for_peers(wanted, timeout)
        if live < wanted:
            log.warning("only %d of %d peers showed up within %.0f s; starting anyway", live, wanted, timeout)

    def health(self) -> dict[str, Any]:
        """What /health reports: alive while rounds keep finishing."""
        quiet_s = time.monotonic() - self.last_progress
        return {
            "alive": quiet_s < self.config.node.stall_after_s,
            "peer_id": self.peer_id,
            "round": self.last_record.round if self.last_record else None,
            "since_progress_s": round(quiet_s, 1),
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    def status(self, round_: int) -> NodeStatus:
        """What this node's heartbeat tells `swarmnode status`."""
        last = self.last_record
        return NodeStatus(
            round=round_,
            model=self.policy.name,
            params=self.policy.num_params,
            lora=self.policy.lora_rank or 0,
            backend=self.generator.name,
            device=str(self.policy.device),
            reward=last.reward_mean if last else None,
            eval_acc=self.last_eval,
            tokens_per_s=round(last.tokens_per_s, 1) if last else 0.0,
            published=self.published,
            consumed=self.consumed,
            filtered_frac=last.filtered_frac if last else None,
            rejected=self.ledger.total,
        )

    def close(self) -> None:
        """Close what the node opened itself (its metrics file)."""
        self.metrics.close()


def _train_samples(groups: list[ScoredGroup], scale_by_std: bool) -> list[SourcedSample]:
    """Every completion of the groups with its group-relative advantage."""
    samples: list[SourcedSample] = []
    for group in groups:
        advantages = group_advantages(torch.tensor(group.rewards), scale_by_std)
        for (tokens, logprobs), advantage, reward in zip(group.completions, advantages.tolist(), group.rewards):
            samples.append((TrainSample(group.prompt_ids, tokens, logprobs, advantage, group.own), reward, group.peer_id))
    return samples


def _to_wire_group(prompt_id: int, completions: list[Completion]) -> wire.CompletionGroup:
    return wire.CompletionGroup(
        prompt_id=prompt_id,
        lengths=np.array([len(c.tokens) for c in completions], dtype=np.int64),
        tokens=np.concatenate([c.tokens for c in completions]).astype(np.int32),
        logprobs=np.concatenate([c.logprobs for c in completions]).astype(np.float32),
    )
