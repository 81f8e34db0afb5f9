"""The lines of a node's metrics.jsonl: rounds, evaluations, (re)starts and halved batches.

They stay with the node (nothing here crosses the wire). A round metric is declared once, as a
field of RoundRecord with its help text: the Prometheus gauges (swarmnode.ops.exporter) and
the reporters' scalars (swarmnode.ops.reporting) are read off these declarations.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, Literal

from swarmnode.protocol.records import RecordError


def metric(help: str, *, gauge: bool = False, report: bool = True) -> Any:
    """A RoundRecord field with its help text: `report` = a scalar for TensorBoard, W&B and
    trackio each round; `gauge` = the last round's value as a Prometheus gauge."""
    return field(metadata={"help": help, "gauge": gauge, "report": report})


@dataclass
class RoundRecord:
    """One training round of one node, as written to metrics.jsonl."""

    round: int = metric("the node's last finished round (its own count, from 0)", gauge=True, report=False)
    peer_id: str
    reward_mean: float = metric("mean reward of the node's own completions in the last round", gauge=True)
    peer_reward_mean: float | None = metric("mean reward of the peers' samples trained on in the last round")
    own_samples: int = metric("own samples trained on in the last round", gauge=True)
    peer_samples: int = metric("peers' samples trained on in the last round", gauge=True)
    peers: int = metric("peers whose samples were trained on in the last round", gauge=True)
    gated: int = metric(
        "peers' samples dropped by the likelihood gate in the last round (wrong answers whose group lost "
        "all its right ones to it included)", gauge=True,
    )
    below_bar: int  # peers' samples under a bar of the gate, gated or kept for a non-positive advantage
    peer_weight_scale: float | None  # smallest weight-budget factor given to a peer this round
    filtered: int
    filtered_frac: float = metric("share of samples F-TIS filtered in the last round", gauge=True)
    weight_mean: float = metric("mean importance weight in the last round", gauge=True)
    weight_max: float = metric("largest importance weight in the last round")
    truncated_frac: float = metric("share of importance weights truncated in the last round", gauge=True)
    divergence_mean: float = metric("mean divergence of the samples from the node's policy in the last round")
    loss: float = metric("the objective's value in the last step")
    grad_norm: float = metric("gradient norm of the last step, before clipping")
    wire_bytes: int
    wire_tokens: int
    rejected: int = metric("bad batches counted against peers so far")
    peer_age_s: float | None = metric("mean seconds the peers' groups trained on waited since they arrived")
    peer_lag: float | None = metric("mean rounds the peers' groups trained on were behind their sender's newest")
    tokens_per_s: float = metric("generation tokens a second in the last round", gauge=True)
    uninformative: int = 0  # peers' samples left out for advantage 0 (node.skip_uninformative); 0 in older lines
    picked: int = 0  # peers' samples left out as picked, not sampled (trust.repeat_odds); 0 in older lines
    likelihood_gap: float | None = None  # running gap (nats a token) of the farthest peer measured this round (adapt_share_nats)
    reward_lead: float | None = None  # running reward lead of the most leading peer measured this round (far_reward_lead)
    peer_usefulness: float | None = None  # mean factor of the peers' samples trained on (node.weight_by_usefulness or
    # node.weight_by_agreement; None when both are off)
    gradient_cosines: dict[str, float] | None = None  # node.weight_by_agreement: our halves' ("own") and each peer's
    samples_by_peer: dict[str, int] = field(default_factory=dict)  # peers' samples trained on, per peer
    timings: dict[str, float] = field(default_factory=dict)  # generate_s, train_s, ... round_s

    kind: Literal["round"] = "round"

    @property
    def priced(self) -> tuple[int, int]:
        """(tokens generated, samples trained): what the cost model prices a round by (sizing.cost)."""
        return self.wire_tokens, self.own_samples + self.peer_samples

    def to_json(self) -> dict[str, Any]:
        """The flat line: timings become top-level keys (generate_s, round_s ...)."""
        line = asdict(self)
        line.update({k: round(v, 4) for k, v in line.pop("timings").items()})
        return line

    @classmethod
    def from_json(cls, line: dict[str, Any]) -> RoundRecord:
        """A round line read back; the top-level `*_s` keys that are no field are its timings
        (or a `timings` map, as `dataclasses.asdict` writes one). RecordError for a line that
        lacks a field (a line of another version)."""
        names = {f.name for f in fields(cls)} - {"timings", "kind"}
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        missing = sorted(required - line.keys())
        if line.get("kind") != "round" or missing:
            raise RecordError(f"not a round line of this version (missing {', '.join(missing) or 'kind'})")
        timings = {k: v for k, v in line.items() if k.endswith("_s") and k not in names}
        if isinstance(line.get("timings"), dict):
            timings.update(line["timings"])
        return cls(**{n: line[n] for n in names if n in line}, timings=timings)


@dataclass
class EvalRecord:
    """Held-out accuracy at one point of the run: before training, on schedule, or after."""

    round: int = metric("the node's last finished round (its own count, from 0)", gauge=True, report=False)
    phase: Literal["before", "during", "after"]
    eval_acc: float
    ood_acc: float | None = None
    eval_size: int | None = None  # the held-out problems it was measured on (None: a line of an older node)

    kind: Literal["eval"] = "eval"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, line: dict[str, Any]) -> EvalRecord:
        """An eval line read back; RecordError for a line of another kind or version."""
        if line.get("kind") != "eval" or not all(k in line for k in ("round", "phase", "eval_acc")):
            raise RecordError("not an eval line of this version")
        return cls(round=line["round"], phase=line["phase"], eval_acc=line["eval_acc"], ood_acc=line.get("ood_acc"),
                   eval_size=line.get("eval_size"))


@dataclass
class HalvedRecord:
    """An out-of-memory error halved a batch size in this round: the node runs with `value`
    from now on, while the config (and what reporters were told) keeps what the user set."""

    round: int = metric("the node's last finished round (its own count, from 0)", gauge=True, report=False)
    setting: str  # e.g. train.micro_batch_size
    value: int

    kind: Literal["halved"] = "halved"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StartRecord:
    """A node (re)started on this run dir: after a resume, the rounds from `next_round` on
    are run again, and their earlier lines were dropped first (MetricsLog.forget_from)."""

    next_round: int  # 0 for a fresh start, else the round the checkpoint resumes at
    peer_id: str

    kind: Literal["start"] = "start"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def is_round(line: dict[str, Any]) -> bool:
    return line.get("kind") == "round"


def is_eval(line: dict[str, Any], phase: str | None = None) -> bool:
    return line.get("kind") == "eval" and (phase is None or line.get("phase") == phase)


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN or infinity: such values are written as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def round_metrics(kind: str) -> dict[str, str]:
    """RoundRecord fields declared as `kind` ('gauge' or 'report'), with their help texts."""
    declared: tuple[Field, ...] = fields(RoundRecord)
    return {f.name: f.metadata["help"] for f in declared if f.metadata.get(kind)}
