"""The round loop: choose prompts, generate, publish, gather, score, train, log, checkpoint.

Each node counts its own rounds: nothing a peer claims or sends changes how many rounds it
trains, which prompts it gets, or when it stops. Peers' verified groups wait in a pool and are
taken while fresh (swarmnode.loop.intake); a round waits for them at most a share of its own time.

It knows the other parts only through small interfaces (Task, Generator, Policy, and the
swarm's RolloutExchange and Membership), so the same loop runs alone, with in-memory peers in
one process, or over hivemind. swarmnode.assemble builds its parts and hands them over.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from swarmnode.learn.sample import OWN, Group, Sample, samples_of
from swarmnode.loop.evaluation import Evaluator
from swarmnode.loop.intake import Intake, Taken
from swarmnode.loop.ledger import PeerLedger
from swarmnode.loop.scoring import score_group
from swarmnode.model.batching import OutOfMemory
from swarmnode.model.checkpoint import DISK_ERRORS, CheckpointWriter, checkpoint_present, load_checkpoint
from swarmnode.model.policy import Policy, StepResult
from swarmnode.ops.hub import CardFacts, HubPublisher
from swarmnode.ops.lines import EvalRecord, HalvedRecord, RoundRecord, StartRecord
from swarmnode.ops.metrics import LiveView, MetricsLog, read_evals
from swarmnode.ops.reporting import Reporters
from swarmnode.protocol import wire
from swarmnode.protocol.batches import assigned_prompt_ids, batch_split
from swarmnode.protocol.prompts import build_prompt
from swarmnode.protocol.records import EVAL_HISTORY, MAX_USED_NAMED, NodeStatus, claimed_use_of
from swarmnode.rollout.base import Generator
from swarmnode.settings.config import Config
from swarmnode.swarm.base import SwarmLink
from swarmnode.tasks.base import Task

log = logging.getLogger(__name__)

LINGER_S = 10.0  # the longest a finishing node keeps serving its last batch to peers


@dataclass
class RoundState:
    own_groups: list[Group] = field(default_factory=list)
    payload_bytes: int = 0
    payload_tokens: int = 0
    timings: dict[str, float] = field(default_factory=dict)


class Node:
    """One swarm participant. `produce` and `consume` are split so tests can run nodes in step."""

    def __init__(
        self,
        config: Config,
        policy: Policy,
        generator: Generator,
        task: Task,
        *,
        run_id: str,
        link: SwarmLink,
        ledger: PeerLedger,
        intake: Intake,
        evaluator: Evaluator,
        metrics: MetricsLog,
        checkpoints: CheckpointWriter,
        view: LiveView,
        reporters: Reporters,
        publisher: HubPublisher | None = None,
    ) -> None:
        """Every part comes from the composition root (swarmnode.assemble.compose_node), which
        also closes the link, the generator and the reporters."""
        self.config = config
        self.policy = policy
        self.generator = generator
        self.task = task
        self.run_id = run_id
        self.exchange, self.membership = link.exchange, link.membership
        self.peer_id = self.exchange.peer_id
        self.ledger = ledger
        self.intake = intake
        self.evaluator = evaluator
        self.metrics = metrics
        self.checkpoints = checkpoints  # off the round's path where memory allows
        self.view = view
        self.reporters = reporters  # report.to: TensorBoard ...
        self.publisher = publisher  # hub.repo_id: pushes the checkpoint's model to the Hub
        self.run_dir = Path(config.node.run_dir)
        self.learned_from: set[str] = set()  # peers whose samples this node trained on
        self.used_by_peer: Counter[str] = Counter()  # peer -> its completions this node trained on (our own count)
        self.published = 0  # rollouts (completions) this node published
        self.consumed = 0  # peers' rollouts this node trained on
        self.last_eval: float | None = None
        self.eval_before: float | None = None  # held-out accuracy before the first round
        self.evals: deque[float] = deque(maxlen=EVAL_HISTORY)  # the last held-out accuracies, for heartbeats
        self.last_record: RoundRecord | None = None
        self.started_at = time.time()
        self.last_progress = time.monotonic()  # a round or an eval finished; read by /health
        self.next_round = 0
        self.resumed_at: str | None = None  # when the checkpoint resumed from was written
        self._saved_at = time.monotonic()  # the last checkpoint, or the start
        self.between_rounds: list[Callable[[], None]] = []  # called before each round (assemble.run: the core share)

    # -- one round -------------------------------------------------------------------------

    def produce(self, round_: int) -> RoundState:
        """Generate this round's groups, score them, encode and publish them."""
        state = RoundState()
        started = time.perf_counter()
        own_groups, _ = batch_split(self.config, self.intake.share.current())
        ids = assigned_prompt_ids(self.config.node.seed, self.peer_id, round_, own_groups, self.task.num_train)
        problems = [self.task.train_problem(i) for i in ids]
        prompts = [build_prompt(self.task, p, self.policy) for p in problems]
        groups = self.generator.generate(prompts, self.config.rollout.group_size)
        state.timings["generate_s"] = time.perf_counter() - started
        batch = wire.RolloutBatch(
            run_id=self.run_id,
            peer_id=self.peer_id,
            round=round_,
            tokenizer_digest=self.intake.families.own.digest,
            tokenizer_hub=self.intake.families.own_hub,
            groups=[wire.CompletionGroup.of(p.id, g) for p, g in zip(problems, groups)],
        )
        t = time.perf_counter()
        payload = wire.encode(batch)
        state.timings["encode_s"] = time.perf_counter() - t
        state.payload_bytes, state.payload_tokens = len(payload), batch.num_tokens
        t = time.perf_counter()
        self.exchange.publish(round_, payload, batch.num_tokens)
        state.timings["publish_s"] = time.perf_counter() - t
        self.published += batch.num_completions
        for problem, prompt, group in zip(problems, prompts, groups):
            state.own_groups.append(
                score_group(self.task, self.policy, OWN, problem, prompt, group, self.config.loss.advantage_std)
            )
        return state

    def consume(self, round_: int, state: RoundState) -> RoundRecord:
        """Gather peers' groups, screen them, take one optimiser step on everything, log it."""
        offered = self.intake.collect(round_, state.timings["generate_s"], state.timings)
        own = samples_of(state.own_groups)
        taken = self.intake.take(round_, offered, own, state.timings)
        t = time.perf_counter()
        result = self.policy.train_step(own + taken.kept, self.config.loss, self.config.rollout.temperature)
        state.timings["train_s"] = time.perf_counter() - t
        state.timings["sync_s"] = self.generator.sync_weights()
        self.consumed += len(taken.kept)
        self.used_by_peer.update(sample.source for sample in taken.kept)
        return self._record(round_, state, own, taken, result)

    def _record(
        self, round_: int, state: RoundState, own: list[Sample], taken: Taken, result: StepResult
    ) -> RoundRecord:
        own_rewards = [sample.reward for sample in own]
        peer_rewards = [sample.reward for sample in taken.kept]
        s = result.stats
        return RoundRecord(
            round=round_,
            peer_id=self.peer_id,
            reward_mean=float(np.mean(own_rewards)) if own_rewards else 0.0,
            peer_reward_mean=float(np.mean(peer_rewards)) if peer_rewards else None,
            own_samples=len(own_rewards),
            peer_samples=len(peer_rewards),
            peers=len(taken.peers),
            gated=taken.gated,
            below_bar=taken.below_bar,
            peer_weight_scale=taken.min_weight_scale,
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
            peer_age_s=float(np.mean(taken.ages_s)) if taken.ages_s else None,
            peer_lag=float(np.mean(taken.lags)) if taken.lags else None,
            tokens_per_s=state.payload_tokens / max(state.timings["generate_s"], 1e-9),
            uninformative=taken.uninformative,
            likelihood_gap=self.intake.share.gap,
            peer_usefulness=float(np.mean(taken.usefulness)) if taken.usefulness else None,
            samples_by_peer=dict(Counter(sample.source for sample in taken.kept)),
            timings=state.timings,
        )

    def _write_halvings(self, last_round: int) -> None:
        """A `halved` line for each batch size an out-of-memory error halved since the last
        call (in a round or an evaluation), with its value now."""
        for batch in (self.policy.micro_batch, *self.generator.adaptive):
            for setting, value in batch.take_halving().items():
                self.metrics.write(HalvedRecord(last_round, setting, value).to_json())

    def run_round(self, round_: int) -> RoundRecord:
        started = time.perf_counter()
        state = self.produce(round_)
        record = self.consume(round_, state)
        record.timings["round_s"] = time.perf_counter() - started
        self.intake.waits.note_round(record.timings["round_s"] - record.timings.get("gather_s", 0.0))
        return record

    @property
    def rejected(self) -> Counter[str]:
        return self.ledger.counts

    # -- evaluation, checkpoints, the whole run ----------------------------------------------

    def evaluate(self) -> float:
        """Greedy pass@1 on the task's held-out problems."""
        accuracy = self.evaluator.accuracy()
        self.last_progress = time.monotonic()
        return accuracy

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoints.directory

    def save(self, last_round: int, wait: bool = True) -> bool:
        """Checkpoint the state after `last_round`; with `wait` False the files are written
        while the next rounds run (a kill before they are renamed into place keeps the last)."""
        meta = {
            "run_id": self.run_id, "peer_id": self.peer_id, "time": round(time.time(), 3),
            # a resumed node keeps the anchored gate's bar and the order its peers earned
            **self.intake.screener.checkpoint_state(),
            "seniority": self.ledger.seniority(),
            "likelihood_gap": self.intake.share.gap,  # and the share of its batch it generates
        }
        self._saved_at = time.monotonic()
        try:
            self.checkpoints.wait()  # the write before this one, in the background
        except DISK_ERRORS as err:
            self._not_saved(err)
        try:
            self.checkpoints.save(last_round, meta, wait=wait)
        except DISK_ERRORS as err:  # a full or failing disk: the last checkpoint written stays, training goes on
            self._not_saved(err)
            return False
        self.next_round = last_round + 1
        return True

    def _not_saved(self, err: Exception) -> None:
        detail = err.strerror if isinstance(err, OSError) and err.strerror else str(err)[:200]
        self.view.say(
            f"warning: a checkpoint could not be written in {self.checkpoint_dir} ({detail}); "
            "training goes on and the last checkpoint written stays: free space on that disk, or stop and "
            "start again with another --run-dir"
        )

    def _checkpoint_due(self, round_: int) -> bool:
        """Every `node.checkpoint_every` rounds, and whenever `node.checkpoint_every_s` passed
        since the last one (slow rounds on a big model lose minutes, not hours, to a kill)."""
        cfg = self.config.node
        by_rounds = bool(cfg.checkpoint_every) and (round_ + 1) % cfg.checkpoint_every == 0
        by_time = bool(cfg.checkpoint_every_s) and time.monotonic() - self._saved_at >= cfg.checkpoint_every_s
        return by_rounds or by_time

    def maybe_resume(self) -> bool:
        """Continue from the run dir's checkpoint when there is one (and resume is on)."""
        if not (self.config.node.resume and checkpoint_present(self.checkpoint_dir)):
            return False
        meta = load_checkpoint(self.policy, self.checkpoint_dir)
        saved = meta.get("time")
        self.resumed_at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(saved)) if saved else "unknown time"
        if meta.get("run_id") != self.run_id:
            raise ValueError(
                f"{self.checkpoint_dir} belongs to run {meta.get('run_id')}, not {self.run_id}: "
                "the settings changed; use a new --run-dir or set node.resume=false"
            )
        self.next_round = int(meta["round"]) + 1
        self.intake.screener.restore(meta)
        self.ledger.restore_seniority(meta.get("seniority") or {})
        self.intake.share.resume(meta.get("likelihood_gap"))
        self.generator.sync_weights()
        earlier = read_evals(self.metrics.path)
        self.evals.extend(e.eval_acc for e in earlier if e.round < self.next_round)
        self.eval_before = next((e.eval_acc for e in earlier if e.phase == "before"), None)
        return True

    def run(self, rounds: int | None = None) -> dict[str, Any]:
        """Run this node's rounds up to `rounds` (its own count, earlier runs of a resumed one
        included); checkpoint on the way and on Ctrl-C."""
        total = self.config.node.rounds if rounds is None else rounds
        cfg = self.config.node
        summary: dict[str, Any] = {"eval_before": None, "eval_after": None}
        self.metrics.write(StartRecord(next_round=self.next_round, peer_id=self.peer_id).to_json())
        self._saved_at = time.monotonic()
        if self.next_round == 0:
            before = self._evaluate_all(-1, "before")
            summary["eval_before"], summary["ood_before"] = before.eval_acc, before.ood_acc
            self.view.note(f"eval before training: {before.eval_acc:.3f} on {before.eval_size} held-out problems")
        self._wait_for_peers()
        round_ = self.next_round
        last_done = self.next_round - 1
        try:
            while round_ < total:
                for hook in self.between_rounds:
                    hook()
                self.membership.announce(self.status(round_))
                record = self.run_round(round_)
                last_done = round_
                self.last_record = record
                self.last_progress = time.monotonic()
                self.learned_from.update(record.samples_by_peer)
                self.metrics.write(record.to_json())
                self._write_halvings(round_)
                self.reporters.round(record)
                self.view.round(record, total)
                if cfg.eval_every and (round_ + 1) % cfg.eval_every == 0 and round_ + 1 < total:
                    during = self._evaluate_all(round_, "during")
                    self.view.note(f"eval after round {round_ + 1}: {during.eval_acc:.3f} on {during.eval_size} held-out problems")
                push_due = self.publisher is not None and self.publisher.due(round_)
                saved = (self._checkpoint_due(round_) or push_due) and self.save(round_, wait=push_due)
                if push_due and saved:  # a push reads the files just written
                    self.publisher.push(self.checkpoint_dir / "model", self.card_facts(round_ + 1))
                round_ += 1
        except KeyboardInterrupt:
            if last_done >= 0:
                self.view.say(
                    f"stopping: checkpoint of round {last_done + 1} in {self.checkpoint_dir}; the same command resumes"
                )
                self.save(last_done)
            else:
                self.view.say("stopping before the first round finished: nothing to checkpoint")
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
        self.view.note(f"eval after training: {after.eval_acc:.3f} on {after.eval_size} held-out problems")
        if last_done >= 0:
            if self.save(last_done) and self.publisher:
                self.view.note(f"pushing the model to the Hub: {self.publisher.repo_id}")
                self.publisher.push(self.checkpoint_dir / "model", self.card_facts(last_done + 1), wait=True)
        return summary

    def card_facts(self, rounds_done: int) -> CardFacts:
        """What the Hub's model card says of this node's run so far."""
        return CardFacts(
            model=self.policy.name, lora_rank=self.policy.lora_rank, run_id=self.run_id, peer_id=self.peer_id,
            task=self.config.task.name, objective=self.config.loss.objective, rounds_done=rounds_done,
            eval_before=self.eval_before, eval_last=self.last_eval, peers_learned_from=len(self.learned_from),
        )

    def _evaluate_all(self, last_round: int, phase: str) -> EvalRecord:
        """Held-out (and OOD) accuracy, logged as an eval line of metrics.jsonl."""
        record = EvalRecord(round=last_round, phase=phase, eval_acc=self.evaluate(), ood_acc=self.evaluator.ood_accuracy(),
                            eval_size=self.evaluator.eval_size)
        self.last_eval = record.eval_acc
        self.evals.append(record.eval_acc)
        if phase == "before":
            self.eval_before = record.eval_acc
        self.metrics.write(record.to_json())
        self._write_halvings(last_round)
        self.reporters.eval(record)
        return record

    def _wait_for_peers(self) -> None:
        wanted = self.config.swarm.min_peers
        if not wanted or not self.config.swarm.enabled:  # alone (--solo) there is nobody to wait for
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

    def snapshot(self) -> dict[str, Any]:
        """What /metrics reports (swarmnode.ops.exporter): the last round, the last evaluation and
        the running totals."""
        claimed, claimants = claimed_use_of(self.peer_id, list(self.membership.live_peers().values()), self.published)
        return {
            "last_round": self.last_record, "eval_acc": self.last_eval,
            "published": self.published, "consumed": self.consumed, "rejected": self.ledger.total,
            "claimed_used": claimed, "claimants": claimants,
            "info": {"peer_id": self.peer_id, "model": self.policy.name, "run_id": self.run_id},
        }

    def status(self, round_: int) -> NodeStatus:
        """What this node's heartbeat tells `swarmnode status`."""
        last = self.last_record
        return NodeStatus(
            round=round_,
            model=self.policy.name,
            tokenizer=self.policy.fingerprint,
            params=self.policy.num_params,
            lora=self.policy.lora_rank or 0,
            backend=self.generator.name,
            device=str(self.policy.device),
            reward=last.reward_mean if last else None,
            eval_acc=self.last_eval,
            evals=list(self.evals),
            tokens_per_s=round(last.tokens_per_s, 1) if last else 0.0,
            published=self.published,
            consumed=self.consumed,
            filtered_frac=last.filtered_frac if last else None,
            rejected=self.ledger.total,
            used=dict(self.used_by_peer.most_common(MAX_USED_NAMED)),
        )

    def close(self) -> None:
        """Close what the node opened itself: finish a checkpoint being written, the metrics file."""
        try:
            self.checkpoints.wait()
        except Exception as err:  # the run is over; say so, lose nothing else
            log.warning("the last checkpoint could not be written: %s", err)
        self.metrics.close()
