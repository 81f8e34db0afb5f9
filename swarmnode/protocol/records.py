"""The records nodes exchange, typed in one place, and every version tag.

- version tags: the wire format, the run-id scheme, the DHT namespace, the payload protocol and
  the checkpoint format. All but the checkpoint's go into the run id, so nodes that cannot read
  each other's data are simply in different runs: they ignore each other, nobody is banned.
- `NodeStatus` is what a node says about itself; `Heartbeat` is that plus what the swarm layer
  adds, as stored in the DHT and shown by `swarmnode status`. Heartbeats come from peers, so
  parsing one is strict about types and ignores fields a newer version may add.

The node's own metrics lines (metrics.jsonl) are swarmnode.ops.lines: they never leave it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from swarmnode.settings.config import Config
from swarmnode.tasks.base import fingerprint_of

WIRE_VERSION = 4  # the rollout message layout (swarmnode.protocol.wire; 2: no sender's model info; 3: the tokenizer named by its document's digest; 4: and by its hub id)
RUN_ID_SCHEME = "swarmnode-run-v3"  # what the run id hashes (v3: not the tokenizer)
DHT_NAMESPACE = "swarmnode/v4"  # prefix of every DHT key (v3: heartbeats and manifests in shards; v4: DHT ids bound to keys)
PAYLOAD_PROTOCOL = "/swarmnode/payload/5"  # libp2p stream protocol for payloads (3: newest-after requests; 4: whom-do-you-know; 5: tokenizer documents)
CHECKPOINT_FORMAT = 1  # checkpoint directory layout (local only, not in the run id)


def run_id(config: Config, task_fingerprint: str, chat_template: bool) -> str:
    """Hash of everything that must match for two nodes' samples to be usable together:
    the protocol versions, task and data, whether prompts go through a chat template, group
    size, sampling and seed. Not the tokenizer: a peer of another model family is in the same
    run, and its batches name their tokenizer (swarmnode.model.families)."""
    r = config.rollout
    return fingerprint_of(
        RUN_ID_SCHEME,
        f"wire={WIRE_VERSION}",
        f"dht={DHT_NAMESPACE}",
        f"payload={PAYLOAD_PROTOCOL}",
        task_fingerprint,
        str(chat_template),
        str(r.group_size),
        str(r.max_new_tokens),
        repr(r.temperature),
        str(r.top_k),
        repr(r.top_p),
        str(config.node.seed),
    )


MAX_TOKENIZER_DOCUMENT_BYTES = 32 << 20  # a tokenizer document as fetched (compressed JSON; the largest hub
# tokenizers' JSON is about 33 MiB raw, a third of that compressed)


def short_peer(peer_id: str) -> str:
    """How a person sees a peer id in status and logs: its last 8 characters (libp2p ids all
    begin alike, 'Qm...'), which end the full id a node prints at start."""
    return f"…{peer_id[-8:]}"


def tokenizer_document_digest(document: bytes) -> str:
    """The name a batch gives its sender's tokenizer: the SHA-256 of its document
    (swarmnode.model.families), so whoever serves the document, its bytes hash to the name."""
    return hashlib.sha256(document).hexdigest()


MAX_USED_NAMED = 32  # peers whose use a heartbeat reports (those it trained on most)
EVAL_HISTORY = 8  # held-out accuracies a heartbeat carries, oldest first: `status` draws them
MAX_CLOCK_SKEW_S = 30.0  # a heartbeat dated further ahead of our clock is refused (a ghost's trick)


class RecordError(ValueError):
    """A record from a peer that does not have the expected shape."""


class _PeerRecord(BaseModel):
    """Strict types, finite floats, bounded strings; unknown fields (newer peers) are dropped."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, allow_inf_nan=False)


class NodeStatus(_PeerRecord):
    """What a node says about itself in its heartbeat (claims: for display only)."""

    round: int = -1
    model: str | None = Field(None, max_length=256)
    tokenizer: str | None = Field(None, max_length=64)  # its tokenizer's fingerprint: its family
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
    # peer id -> that peer's completions this node trained on, its MAX_USED_NAMED largest: what
    # `status` shows a peer as "is anyone using my rollouts?" (a claim: nothing acts on it)
    used: dict[Annotated[str, Field(max_length=128)], Annotated[int, Field(ge=0)]] = Field(default_factory=dict)

    @field_validator("used", mode="before")
    @classmethod
    def _bounded_used(cls, used: object) -> object:
        """Its MAX_USED_NAMED largest well-formed entries; the rest dropped, not the heartbeat,
        so a newer version naming more peers (or one odd entry) is still shown and waited for."""
        if not isinstance(used, dict):
            return used  # not a map: refused as any field of the wrong type
        entries = [(peer, count) for peer, count in used.items()
                   if isinstance(peer, str) and len(peer) <= 128 and type(count) is int and count >= 0]
        return dict(sorted(entries, key=lambda entry: -entry[1])[:MAX_USED_NAMED])


def claimed_use_of(peer_id: str, heartbeats: list[NodeStatus], published: int) -> tuple[int, int]:
    """(how many of `peer_id`'s completions the others claim to have trained on, how many
    others claim any): each claim capped at what `peer_id` published, since more is no use
    anybody could have made. Claims only: shown, never acted on."""
    claims = [min(hb.used.get(peer_id, 0), published) for hb in heartbeats]
    return sum(claims), sum(1 for claim in claims if claim > 0)


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

    def from_the_future(self, now: float) -> bool:
        """Dated further ahead of `now` (our DHT clock) than clocks drift: such a heartbeat
        would never look stale, so it is refused."""
        return self.time > now + MAX_CLOCK_SKEW_S

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
    """A peer as `swarmnode status` shows it: its heartbeat (everything in it is the peer's
    claim, its time included), how old that claims to be, the state shown (`stale` for a
    heartbeat older than the reader's limit), and what the reader checked itself: whether
    the peer answered a direct request, in how many ms, and how it was reached."""

    heartbeat: Heartbeat
    age_s: float
    state: str
    asked: bool = False  # the reader asked it a question only a live peer answers
    answered_ms: float | None = None  # None: did not answer (or was not asked)
    reached: str | None = None  # direct, relayed or local: the path the answer came over

    def to_json(self) -> dict[str, Any]:
        return {
            **self.heartbeat.model_dump(), "age_s": self.age_s, "state": self.state,
            "checked": {"asked": self.asked, "answered_ms": self.answered_ms, "reached": self.reached},
        }
