"""The records nodes write and read, typed in one place, and every version tag.

- version tags: the wire format, the run-id scheme, the DHT namespace, the payload protocol and
  the checkpoint format. All but the checkpoint's go into the run id, so nodes that cannot read
  each other's data are simply in different runs: they ignore each other, nobody is banned.
- `NodeStatus` is what a node says about itself; `Heartbeat` is that plus what the swarm layer
  adds, as stored in the DHT and shown by `swarmnode status`. Heartbeats come from peers, so
  parsing one is strict about types and ignores fields a newer version may add.
- `RoundRecord` and `EvalRecord` are the two kinds of line in metrics.jsonl.

Each metric has one name from the node through metrics.jsonl to `status`.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swarmnode.settings.config import Config
from swarmnode.tasks.base import fingerprint_of

WIRE_VERSION = 1  # the rollout message layout (swarmnode.protocol.wire)
RUN_ID_SCHEME = "swarmnode-run-v2"  # what the run id hashes
DHT_NAMESPACE = "swarmnode/v3"  # prefix of every DHT key (v3: heartbeats and manifests in shards)
PAYLOAD_PROTOCOL = "/swarmnode/payload/3"  # libp2p stream protocol for payloads (3: newest-after requests)
CHECKPOINT_FORMAT = 1  # checkpoint directory layout (local only, not in the run id)


def run_id(config: Config, task_fingerprint: str, tokenizer_fingerprint: str, chat_template: bool) -> str:
    """Hash of everything that must match for two nodes' samples to be usable together:
    the protocol versions, task and data, tokenizer, prompt template, sampling and seed."""
    r = config.rollout
    return fingerprint_of(
        RUN_ID_SCHEME,
        f"wire={WIRE_VERSION}",
        f"dht={DHT_NAMESPACE}",
        f"payload={PAYLOAD_PROTOCOL}",
        task_fingerprint,
        tokenizer_fingerprint,
        str(chat_template),
        str(r.group_size),
        str(r.max_new_tokens),
        repr(r.temperature),
        str(r.top_k),
        repr(r.top_p),
        str(config.node.seed),
    )


EVAL_HISTORY = 8  # held-out accuracies a heartbeat carries, oldest first: `status` draws them


class RecordError(ValueError):
    """A record from a peer that does not have the expected shape."""


class _PeerRecord(BaseModel):
    """Strict types, finite floats, bounded strings; unknown fields (newer peers) are dropped."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, allow_inf_nan=False)


class NodeStatus(_PeerRecord):
    """What a node says about itself in its heartbeat (claims: for display only)."""

    round: int = -1
    model: str | None = Field(None, max_length=256)
    params: int | None = None
    lora: int = 0
    backend: str | None = Field(None, max_length=32)
    device: str | None = Field(None, max_length=32)
    reward: float | None = None
    eval_acc: float | None = None
    evals: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(default_factory=list, max_length=EVAL_HISTORY)
    tokens_per_s: float = 0.0
    published: int = 0
    consumed: int = 0
    filtered_frac: float | None = None
    rejected: int = 0


HeartbeatState = Literal["training", "left"]


class Heartbeat(NodeStatus):
    """A node's status as stored in the swarm: who, which run, when, and how long it has been up."""

    peer: str = Field(max_length=128)
    run: str = Field(max_length=64)
    time: float
    state: HeartbeatState = "training"
    version: str | None = Field(None, max_length=32)
    uptime_s: float = 0.0
    served: int = 0
    reach: str | None = Field(None, max_length=16)  # direct, relayed, private or local (swarm.hivemind.reach)

    @classmethod
    def parse(cls, fields: Any) -> Heartbeat:
        """Validate a peer's heartbeat fields; RecordError says what is wrong."""
        if not isinstance(fields, dict):
            raise RecordError("heartbeat is not a map")
        try:
            return cls.model_validate(fields)
        except ValidationError as err:
            first = err.errors()[0]
            raise RecordError(f"heartbeat field {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


@dataclass(frozen=True)
class PeerRow:
    """A peer as `swarmnode status` shows it: its heartbeat, how old that is, and the state
    shown (`stale` for a heartbeat older than the reader's limit)."""

    heartbeat: Heartbeat
    age_s: float
    state: str

    def to_json(self) -> dict[str, Any]:
        return {**self.heartbeat.model_dump(), "age_s": self.age_s, "state": self.state}


# -- metrics.jsonl --------------------------------------------------------------------------


@dataclass
class RoundRecord:
    """One training round of one node, as written to metrics.jsonl."""

    round: int
    peer_id: str
    reward_mean: float
    peer_reward_mean: float | None
    own_samples: int
    peer_samples: int
    peers: int
    gated: int  # peers' samples dropped by the likelihood gate (swarmnode.learn.trust)
    below_bar: int  # peers' samples under the gate's bar, gated or kept for a non-positive advantage
    peer_weight_scale: float | None  # smallest weight-budget factor given to a peer this round
    filtered: int
    filtered_frac: float
    weight_mean: float
    weight_max: float
    truncated_frac: float
    divergence_mean: float
    loss: float
    grad_norm: float
    wire_bytes: int
    wire_tokens: int
    rejected: int
    peer_age_s: float | None  # mean seconds the peers' groups trained on waited since they arrived
    peer_lag: float | None  # mean of how many of its sender's rounds each such group was behind its newest
    tokens_per_s: float
    samples_by_peer: dict[str, int] = field(default_factory=dict)  # peers' samples trained on, per peer
    timings: dict[str, float] = field(default_factory=dict)  # generate_s, train_s, ... round_s

    kind: Literal["round"] = "round"

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

    round: int  # the last round finished (-1 before training)
    phase: Literal["before", "during", "after"]
    eval_acc: float
    ood_acc: float | None = None

    kind: Literal["eval"] = "eval"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, line: dict[str, Any]) -> EvalRecord:
        """An eval line read back; RecordError for a line of another kind or version."""
        if line.get("kind") != "eval" or not all(k in line for k in ("round", "phase", "eval_acc")):
            raise RecordError("not an eval line of this version")
        return cls(round=line["round"], phase=line["phase"], eval_acc=line["eval_acc"], ood_acc=line.get("ood_acc"))


@dataclass
class HalvedRecord:
    """An out-of-memory error halved a batch size in this round: the node runs with `value`
    from now on, while the config (and what reporters were told) keeps what the user set."""

    round: int
    setting: str  # e.g. train.micro_batch_size
    value: int

    kind: Literal["halved"] = "halved"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StartRecord:
    """A node (re)started on this run dir: after a resume, the rounds from `next_round` on
    are run again, so lines of a round repeated after a kill are superseded by later ones."""

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
