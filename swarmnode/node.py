"""The round loop: choose prompts, generate, publish, gather, score, train, log, checkpoint.

It knows the other parts only through small interfaces (Task, Generator, Policy, Exchange),
so the same loop runs alone, with in-memory peers in one process, or over the swarm.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from swarmnode import wire
from swarmnode.checkpoint import load_checkpoint, save_checkpoint
from swarmnode.config import Config
from swarmnode.exchange import Exchange, NoExchange, PeerLedger
from swarmnode.loss import group_advantages
from swarmnode.metrics import LiveView, MetricsLog
from swarmnode.policy import Policy, TrainSample
from swarmnode.rollout.base import Completion, Generator
from swarmnode.tasks.base import Problem, Task, fingerprint_of

log = logging.getLogger(__name__)


def run_id_for(config: Config, task: Task, policy: Policy) -> str:
    """Hash of everything that must match for two nodes' samples to be usable together."""
    r = config.rollout
    return fingerprint_of(
        "swarmnode-run-v1",
        task.fingerprint,
        policy.fingerprint,
        str(policy.use_chat_template),
        str(r.group_size),
        str(r.prompts_per_round),
        str(r.max_new_tokens),
        repr(r.temperature),
        str(r.top_k),
        repr(r.top_p),
        str(config.node.seed),
    )


def assigned_prompt_ids(seed: int, peer_id: str, round_: int, count: int, num_train: int) -> list[int]:
    """The prompts a peer must use in a round: fixed by (seed, peer, round), no cherry-picking."""
    rng = random.Random(f"{seed}:{peer_id}:{round_}")
    return rng.sample(range(num_train), min(count, num_train))


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


class Node:
    """One swarm participant. `produce` and `consume` are split so tests can run nodes in step."""

    def __init__(
        self,
        config: Config,
        policy: Policy,
        generator: Generator,
        task: Task,
        exchange: Exchange | None = None,
        peer_id: str | None = None,
        view: LiveView | None = None,
        ood_eval: Any = None,
        ledger: PeerLedger | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.generator = generator
        self.task = task
        self.exchange = exchange or NoExchange()
        self.peer_id = (
            peer_id
            or self.exchange.peer_id
            or config.node.peer_id
            or f"local-{fingerprint_of(str(config.node.run_dir))[:8]}"
        )
        self.view = view or LiveView(quiet=True)
        self.run_id = run_id_for(config, task, policy)
        self.run_dir = Path(config.node.run_dir)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.objective = config.loss.objective_config()
        w = config.wire
        self.limits = wire.WireLimits(
            max_bytes=w.max_bytes,
            max_groups=w.max_groups,
            max_completions_per_group=w.max_completions_per_group,
            max_tokens_per_completion=w.max_tokens_per_completion,
            max_total_tokens=w.max_total_tokens,
            vocab_size=policy.vocab_size,
        )
        self.ledger = ledger or PeerLedger(config.swarm.max_rejects)
        self.published = 0  # rollouts (completions) this node published
        self.consumed = 0  # peers' rollouts this node trained on
        self.last_eval: float | None = None
        self.last_record: dict[str, Any] = {}
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
        ids = assigned_prompt_ids(
            self.config.node.seed,
            self.peer_id,
            round_,
            self.config.rollout.prompts_per_round,
            self.task.num_train,
        )
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

    def consume(self, round_: int, state: RoundState) -> dict[str, Any]:
        """Gather peers' groups, take one optimiser step on everything, log the round."""
        t = time.perf_counter()
        received = self.exchange.gather(round_, self.config.node.staleness, self.config.node.gather_timeout_s)
        state.timings["gather_s"] = time.perf_counter() - t
        t = time.perf_counter()
        peer_groups = self._accept(received, round_)
        state.timings["decode_score_s"] = time.perf_counter() - t
        groups = state.own_groups + peer_groups
        samples = []
        for group in groups:
            advantages = group_advantages(torch.tensor(group.rewards))
            for (tokens, logprobs), advantage in zip(group.completions, advantages.tolist()):
                samples.append(TrainSample(group.prompt_ids, tokens, logprobs, advantage, group.own))
        t = time.perf_counter()
        result = self.policy.train_step(samples, self.objective, self.config.rollout.temperature)
        state.timings["train_s"] = time.perf_counter() - t
        state.timings["sync_s"] = self.generator.sync_weights()
        own_rewards = [r for g in state.own_groups for r in g.rewards]
        peer_rewards = [r for g in peer_groups for r in g.rewards]
        self.consumed += len(peer_rewards)
        s = result.stats
        record: dict[str, Any] = {
            "round": round_,
            "peer_id": self.peer_id,
            "reward_mean": float(np.mean(own_rewards)) if own_rewards else 0.0,
            "peer_reward_mean": float(np.mean(peer_rewards)) if peer_rewards else None,
            "own_samples": len(own_rewards),
            "peer_samples": len(peer_rewards),
            "peers": len({g.peer_id for g in peer_groups}),
            "filtered": s.filtered,
            "filtered_frac": s.filtered_frac,
            "weight_mean": s.weight_mean,
            "weight_max": s.weight_max,
            "truncated_frac": s.truncated_frac,
            "divergence_mean": s.divergence_mean,
            "loss": result.loss,
            "grad_norm": result.grad_norm,
            "wire_bytes": state.payload_bytes,
            "wire_tokens": state.payload_tokens,
            "rejected": self.ledger.total,
            "tokens_per_s": state.payload_tokens / max(state.timings["generate_s"], 1e-9),
            **{k: round(v, 4) for k, v in state.timings.items()},
        }
        return record

    def run_round(self, round_: int) -> dict[str, Any]:
        started = time.perf_counter()
        state = self.produce(round_)
        record = self.consume(round_, state)
        record["round_s"] = time.perf_counter() - started
        return record

    # -- peers' data -----------------------------------------------------------------------

    def _accept(self, received: list, round_: int) -> list[ScoredGroup]:
        """Decode strictly, check the batch belongs to this run and round, score it ourselves."""
        accepted: list[ScoredGroup] = []
        budget = self.config.node.max_peer_groups
        for item in received:
            if self.ledger.is_banned(item.peer_id):
                continue
            try:
                batch = wire.decode(item.payload, self.limits)
                self._check_batch(batch, item)
            except wire.WireError as err:
                self._reject(item.peer_id, str(err))
                continue
            for group in batch.groups[: min(self.config.node.peer_quota, budget)]:
                problem = self.task.train_problem(group.prompt_id)
                prompt = self.policy.encode_prompt(self.task.system_prompt, problem.question)
                accepted.append(self._score(item.peer_id, problem, prompt, group.completions()))
                budget -= 1
            if budget <= 0:
                break
        return accepted

    def _check_batch(self, batch: wire.RolloutBatch, item: Any) -> None:
        if batch.run_id != self.run_id:
            raise wire.WireError(f"run id {batch.run_id} is not this run ({self.run_id})")
        if batch.peer_id != item.peer_id:
            raise wire.WireError(f"claims to be {batch.peer_id} but came from {item.peer_id}")
        if batch.round != item.round:
            raise wire.WireError(f"round {batch.round} published as round {item.round}")
        if batch.tokenizer_fingerprint != self.policy.fingerprint:
            raise wire.WireError("tokenizer differs from ours")
        expected = assigned_prompt_ids(
            self.config.node.seed,
            batch.peer_id,
            batch.round,
            self.config.rollout.prompts_per_round,
            self.task.num_train,
        )
        if sorted(g.prompt_id for g in batch.groups) != sorted(expected):
            raise wire.WireError("prompt ids differ from the peer's assignment for that round")
        if any(len(g.lengths) != self.config.rollout.group_size for g in batch.groups):
            raise wire.WireError("group size differs from this run's")

    @property
    def rejected(self) -> Counter[str]:
        return self.ledger.counts

    def _reject(self, peer_id: str, reason: str) -> None:
        self.ledger.reject(peer_id, reason)

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
        """Run until round `rounds` (the swarm's clock); checkpoint on the way and on Ctrl-C."""
        total = self.config.node.rounds if rounds is None else rounds
        cfg = self.config.node
        summary: dict[str, Any] = {"eval_before": None, "eval_after": None}
        if self.next_round == 0:
            summary["eval_before"] = self.last_eval = self.evaluate()
            summary["ood_before"] = self._ood()
            self.metrics.write(
                {"round": -1, "eval_acc": summary["eval_before"], "ood_acc": summary["ood_before"], "initial": True}
            )
            self.view.note(f"eval before training: {summary['eval_before']:.3f}")
        self._wait_for_peers()
        round_ = self._catch_up(self.next_round)
        last_done = self.next_round - 1
        try:
            while round_ < total:
                self.exchange.update_status(self.status_fields(round_))
                record = self.run_round(round_)
                last_done = round_
                if cfg.eval_every and (round_ + 1) % cfg.eval_every == 0 and round_ + 1 < total:
                    record["eval_acc"] = self.last_eval = self.evaluate()
                    record["ood_acc"] = self._ood()
                self.last_record = record
                self.last_progress = time.monotonic()
                self.metrics.write(record)
                self.view.round(record, total)
                if cfg.checkpoint_every and (round_ + 1) % cfg.checkpoint_every == 0:
                    self.save(round_)
                round_ = self._catch_up(round_ + 1)
        except KeyboardInterrupt:
            self.view.note("interrupted: writing a checkpoint before exiting")
            if last_done >= 0:
                self.save(last_done)
            raise
        summary["eval_after"] = self.last_eval = self.evaluate()
        summary["ood_after"] = self._ood()
        self.metrics.write({"round": last_done, "eval_acc": summary["eval_after"], "final": True})
        self.exchange.update_status(self.status_fields(last_done + 1))
        self.view.note(f"eval after training: {summary['eval_after']:.3f}")
        if last_done >= 0:
            self.save(last_done)
        return summary

    def _wait_for_peers(self) -> None:
        wanted = self.config.swarm.min_peers
        if not wanted:
            return
        self.exchange.update_status(self.status_fields(self.next_round))
        timeout = self.config.swarm.wait_for_peers_s
        self.view.note(f"waiting up to {timeout:.0f} s for {wanted} peer(s) of run {self.run_id}")
        live = self.exchange.wait_for_peers(wanted, timeout)
        if live < wanted:
            log.warning("only %d of %d peers showed up within %.0f s; starting anyway", live, wanted, timeout)

    def _catch_up(self, round_: int) -> int:
        """Jump ahead when the swarm is more than `staleness` rounds ahead (e.g. after a restart),
        since peers ignore batches that old."""
        swarm = self.exchange.swarm_round()
        if swarm is not None and swarm - round_ > self.config.node.staleness:
            self.view.note(f"the swarm is at round {swarm}: catching up from round {round_}")
            return swarm
        return round_

    def health(self) -> dict[str, Any]:
        """What /health reports: alive while rounds keep finishing."""
        quiet_s = time.monotonic() - self.last_progress
        return {
            "alive": quiet_s < self.config.node.stall_after_s,
            "peer_id": self.peer_id,
            "round": self.last_record.get("round"),
            "since_progress_s": round(quiet_s, 1),
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    def status_fields(self, round_: int) -> dict[str, Any]:
        """What this node's heartbeat tells `swarmnode status`."""
        last = self.last_record
        return {
            "round": round_,
            "model": self.policy.name,
            "params": self.policy.num_params,
            "lora": self.policy.lora_rank or 0,
            "backend": self.generator.name,
            "device": str(self.policy.device),
            "reward": last.get("reward_mean"),
            "eval_acc": self.last_eval,
            "tokens_per_s": round(last.get("tokens_per_s", 0.0), 1),
            "published": self.published,
            "consumed": self.consumed,
            "filter_rate": last.get("filtered_frac"),
            "rejected": self.ledger.total,
        }

    def close(self) -> None:
        self.metrics.close()
        self.exchange.close()
        self.generator.close()


def _to_wire_group(prompt_id: int, completions: list[Completion]) -> wire.CompletionGroup:
    return wire.CompletionGroup(
        prompt_id=prompt_id,
        lengths=np.array([len(c.tokens) for c in completions], dtype=np.int64),
        tokens=np.concatenate([c.tokens for c in completions]).astype(np.int32),
        logprobs=np.concatenate([c.logprobs for c in completions]).astype(np.float32),
    )
