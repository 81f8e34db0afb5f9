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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from swarmnode.learn.agreement import StepAgreement
from swarmnode.learn.sample import OWN, Group, Sample, samples_of
from swarmnode.loop.checkpoints import NodeCheckpoints
from swarmnode.loop.evaluation import Evaluator
from swarmnode.loop.intake import Intake, Taken
from swarmnode.loop.ledger import PeerLedger
from swarmnode.loop.report import NodeReport
from swarmnode.loop.round_costs import RoundTimes
from swarmnode.loop.scoring import score_group
from swarmnode.model.batching import OutOfMemory
from swarmnode.model.policy import Policy, StepResult
from swarmnode.ops.hub import HubPublisher
from swarmnode.ops.lines import EvalRecord, HalvedRecord, RoundRecord, StartRecord
from swarmnode.ops.metrics import LiveView, MetricsLog, read_evals
from swarmnode.ops.reporting import Reporters
from swarmnode.protocol import wire
from swarmnode.protocol.batches import assigned_prompt_ids, batch_split
from swarmnode.protocol.prompts import build_prompt
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
    """One swarm participant's round loop. `produce` and `consume` are split so tests can run
    nodes in step. What it reports of itself (`report`: heartbeat status, /health, /metrics)
    and its checkpoints (`checkpoints`: when, what meta.json keeps, resuming) have homes of
    their own."""

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
        report: NodeReport,
        checkpoints: NodeCheckpoints,
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
        self.view = view
        self.reporters = reporters  # report.to: TensorBoard ...
        self.publisher = publisher  # hub.repo_id: pushes the checkpoint's model to the Hub
        self.run_dir = Path(config.node.run_dir)
        self.report = report  # what it tells others of itself
        self.checkpoints = checkpoints
        self.next_round = 0
        self.resumed_at: str | None = None  # when the checkpoint resumed from was written
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
        self.report.published += batch.num_completions
        for problem, prompt, group in zip(problems, prompts, groups):
            state.own_groups.append(
                score_group(self.task, self.policy, OWN, problem, prompt, group, self.config.loss.advantage_std)
            )
        return state

    def consume(self, round_: int, state: RoundState) -> RoundRecord:
        """Gather peers' groups, screen them, take an optimiser step on everything (with
        `node.on_top_step` own, far peers' groups on top in a second step), log it."""
        offered = self.intake.collect(round_, state.timings["generate_s"], state.timings)
        own = samples_of(state.own_groups)
        taken = self.intake.take(round_, offered, own, state.timings)
        t = time.perf_counter()
        measure = self.config.node.weight_by_agreement
        separate = taken.on_top if self.config.node.on_top_step == "own" else []
        batch = own + (taken.in_batch if separate else taken.kept)
        result = self.policy.train_step(batch, self.config.loss, self.config.rollout.temperature, measure)
        self.intake.screener.agreement.observe(result.agreement)
        if separate:
            after = self.policy.train_step(separate, self.config.loss, self.config.rollout.temperature)
            result = replace(result, stats=result.stats.merged(after.stats))
        state.timings["train_s"] = time.perf_counter() - t
        self.intake.costs.note(self._times(state, own, taken))
        state.timings["sync_s"] = self.generator.sync_weights()
        self.report.trained(sample.source for sample in taken.kept)
        return self._record(round_, state, own, taken, result)

    def _times(self, state: RoundState, own: list[Sample], taken: Taken) -> RoundTimes:
        """What this round's work took, for pricing far groups on top and measured (loop.round_costs)."""
        own_tokens = sum(len(sample.tokens) for sample in own)
        return RoundTimes(
            generate_s=state.timings["generate_s"],
            whole_batch=len(state.own_groups) == self.config.rollout.prompts_per_round,
            train_s=state.timings["train_s"],
            own_tokens=own_tokens,
            trained_tokens=own_tokens + sum(len(sample.tokens) for sample in taken.kept),
            on_top_groups=taken.on_top_groups,
            on_top_screen_s=taken.on_top_screen_s,
            on_top_tokens=taken.on_top_tokens,
            measured_groups=taken.measured_groups,
            measure_s=taken.measure_s,
        )

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
            picked=taken.picked,
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
            reward_lead=self.intake.share.lead,
            peer_usefulness=float(np.mean(taken.usefulness)) if taken.usefulness else None,
            gradient_cosines=_cosines(result.agreement),
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
        return self.evaluator.accuracy()

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoints.directory

    def save(self, last_round: int, wait: bool = True) -> bool:
        """Checkpoint the state after `last_round` (swarmnode.loop.checkpoints); False when the
        disk refused it."""
        saved = self.checkpoints.save(last_round, wait)
        if saved:
            self.next_round = last_round + 1
        return saved

    def maybe_resume(self) -> bool:
        """Continue from the run dir's checkpoint when there is one (and resume is on)."""
        resumed = self.checkpoints.resume()
        if resumed is None:
            return False
        self.next_round, self.resumed_at = resumed.next_round, resumed.written_at
        self.generator.sync_weights()
        self.report.resumed(read_evals(self.metrics.path), self.next_round)
        return True

    def run(self, rounds: int | None = None) -> dict[str, Any]:
        """Run this node's rounds up to `rounds` (its own count, earlier runs of a resumed one
        included); checkpoint on the way and on Ctrl-C."""
        total = self.config.node.rounds if rounds is None else rounds
        cfg = self.config.node
        summary: dict[str, Any] = {"eval_before": None, "eval_after": None}
        self.metrics.write(StartRecord(next_round=self.next_round, peer_id=self.peer_id).to_json())
        self.checkpoints.started()
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
                self.membership.announce(self.report.status(round_))
                record = self.run_round(round_)
                last_done = round_
                self.report.round_done(record)
                self.metrics.write(record.to_json())
                self._write_halvings(round_)
                self.reporters.round(record)
                self.view.round(record, total)
                if cfg.eval_every and (round_ + 1) % cfg.eval_every == 0 and round_ + 1 < total:
                    during = self._evaluate_all(round_, "during")
                    self.view.note(f"eval after round {round_ + 1}: {during.eval_acc:.3f} on {during.eval_size} held-out problems")
                push_due = self.publisher is not None and self.publisher.due(round_)
                saved = (self.checkpoints.due(round_) or push_due) and self.save(round_, wait=push_due)
                if push_due and saved:  # a push reads the files just written
                    self.publisher.push(self.checkpoint_dir / "model", self.report.card_facts(round_ + 1))
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
        self.membership.announce(self.report.status(last_done + 1))
        self.view.note(f"eval after training: {after.eval_acc:.3f} on {after.eval_size} held-out problems")
        if last_done >= 0:
            if self.save(last_done) and self.publisher:
                self.view.note(f"pushing the model to the Hub: {self.publisher.repo_id}")
                self.publisher.push(self.checkpoint_dir / "model", self.report.card_facts(last_done + 1), wait=True)
        return summary

    def _evaluate_all(self, last_round: int, phase: str) -> EvalRecord:
        """Held-out (and OOD) accuracy, logged as an eval line of metrics.jsonl."""
        record = EvalRecord(round=last_round, phase=phase, eval_acc=self.evaluate(), ood_acc=self.evaluator.ood_accuracy(),
                            eval_size=self.evaluator.eval_size)
        self.report.evaluated(record)
        self.metrics.write(record.to_json())
        self._write_halvings(last_round)
        self.reporters.eval(record)
        return record

    def _wait_for_peers(self) -> None:
        wanted = self.config.swarm.min_peers
        if not wanted or not self.config.swarm.enabled:  # alone (--solo) there is nobody to wait for
            return
        self.membership.announce(self.report.status(self.next_round))
        timeout = self.config.swarm.wait_for_peers_s
        self.view.note(f"waiting up to {timeout:.0f} s for {wanted} peer(s) of run {self.run_id}")
        live = self.membership.wait_for_peers(wanted, timeout)
        self.intake.waits.answered_at_start(live)
        if live < wanted:
            log.warning("only %d of %d peers showed up within %.0f s; starting anyway", live, wanted, timeout)

    def close(self) -> None:
        """Close what the node opened itself: finish a checkpoint being written, the metrics file."""
        try:
            self.checkpoints.wait()
        except Exception as err:  # the run is over; say so, lose nothing else
            log.warning("the last checkpoint could not be written: %s", err)
        self.metrics.close()


def _cosines(agreement: StepAgreement | None) -> dict[str, float] | None:
    """A step's measured cosines for the round's record: our halves' under "own", then each peer's."""
    if agreement is None:
        return None
    own = {} if agreement.own_halves is None else {"own": round(agreement.own_halves, 4)}
    return own | {peer: round(found, 4) for peer, found in agreement.peers.items()}
