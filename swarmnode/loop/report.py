"""What a node tells others about itself: its heartbeat's status, /health, /metrics and the
Hub's model card, from running totals the round loop keeps here.

Everything here is this node's own account. Peers read the status as a claim (`swarmnode
status` shows it apart from what it checked), and nothing a peer claims of its own use of our
completions changes anything but the count /metrics shows (`claimed_use_of`).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterable
from typing import Any

from swarmnode.loop.ledger import PeerLedger
from swarmnode.model.policy import Policy
from swarmnode.ops.hub import CardFacts
from swarmnode.ops.lines import EvalRecord, RoundRecord
from swarmnode.protocol.records import EVAL_HISTORY, MAX_USED_NAMED, NodeStatus, claimed_use_of
from swarmnode.settings.config import Config
from swarmnode.swarm.base import Membership


class NodeReport:
    """A node's running totals, and what it reports from them."""

    def __init__(
        self, config: Config, policy: Policy, backend: str, run_id: str, peer_id: str, ledger: PeerLedger,
        membership: Membership,
    ) -> None:
        self.config = config
        self.policy = policy
        self.backend = backend
        self.run_id = run_id
        self.peer_id = peer_id
        self.ledger = ledger
        self.membership = membership
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

    def trained(self, peers_used: Iterable[str]) -> None:
        """A step trained on these peers' samples (a peer once a sample)."""
        used = Counter(peers_used)
        self.consumed += sum(used.values())
        self.used_by_peer.update(used)

    def round_done(self, record: RoundRecord) -> None:
        self.last_record = record
        self.last_progress = time.monotonic()
        self.learned_from.update(record.samples_by_peer)

    def evaluated(self, record: EvalRecord) -> None:
        self.last_eval = record.eval_acc
        self.evals.append(record.eval_acc)
        if record.phase == "before":
            self.eval_before = record.eval_acc
        self.last_progress = time.monotonic()

    def resumed(self, earlier: list[EvalRecord], next_round: int) -> None:
        """The evaluations of the run before a resume (metrics.jsonl's) that its rounds reached."""
        self.evals.extend(e.eval_acc for e in earlier if e.round < next_round)
        self.eval_before = next((e.eval_acc for e in earlier if e.phase == "before"), None)

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
            backend=self.backend,
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

    def card_facts(self, rounds_done: int) -> CardFacts:
        """What the Hub's model card says of this node's run so far."""
        return CardFacts(
            model=self.policy.name, lora_rank=self.policy.lora_rank, run_id=self.run_id, peer_id=self.peer_id,
            task=self.config.task.name, objective=self.config.loss.objective, rounds_done=rounds_done,
            eval_before=self.eval_before, eval_last=self.last_eval, peers_learned_from=len(self.learned_from),
        )
