"""The seams between the round loop and the swarm, and what crosses them.

- `RolloutExchange` carries data: publish my batch, gather peers' batches. How long a gather
  waits and for whom is one value, `GatherWait`, which the loop builds (swarmnode.loop.waiting)
  and every exchange stops on by the same predicate.
- `Membership` carries who is there: my heartbeat, the live peers, what they claim.
- `PeerStanding` goes the other way: what the round loop verified about each peer (its ledger,
  swarmnode.loop.ledger), read by an exchange to choose whom to ask and fetch, and told of the
  faults the transport proves. The exchange reads it on its own thread, so it is thread-safe.

There is no shared round: each node counts its own rounds, and a batch names its sender's. The
round loop sees only these, so it runs the same alone, with in-memory peers, or over hivemind.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

from swarmnode.protocol.records import Heartbeat, NodeStatus


@dataclass(frozen=True)
class Received:
    """A peer's encoded batch, not yet decoded or trusted."""

    peer_id: str
    round: int  # the sender's own round, as its manifest says (the batch must agree)
    payload: bytes


def is_proven(standing: float | None) -> bool:
    """Screened, and some of its samples taught something: asked for new batches every poll,
    and first in the peers' share."""
    return standing is not None and standing > 0


def is_useless(standing: float | None) -> bool:
    """Screened and judged, and none of its samples taught anything (all answers alike, or
    gated): too few screened to judge, a peer stands as a newcomer (loop.ledger.USELESS_AFTER)."""
    return standing is not None and standing <= 0


class PeerStanding(Protocol):
    """The round loop's verified view of its peers, as an exchange reads and reports to it.

    Every call may come from another thread than the loop's. Nothing here is a peer's claim:
    a peer is known by batches this node fetched, decoded and checked itself."""

    def standing(self, peer_id: str) -> float | None:
        """How useful its samples have been lately (see is_proven / is_useless); None: a newcomer
        (never screened, or too little of it to judge)."""
        ...

    def known(self, peer_id: str) -> bool:
        """Delivered a valid batch, has not cut a download since, not banned: asked directly."""
        ...

    def known_peers(self) -> list[str]:
        """Every known peer, in the order they first delivered."""
        ...

    def is_banned(self, peer_id: str) -> bool: ...

    def has_delivered(self, peer_id: str) -> bool:
        """Delivered a valid batch at some point (whatever happened since)."""
        ...

    def has_cut(self, peer_id: str) -> bool:
        """Closed a download mid-payload since its last valid batch."""
        ...

    def ever_delivered(self) -> bool:
        """Some peer delivered a valid batch at some point."""
        ...

    def reject(self, peer_id: str, reason: str) -> None:
        """A provable fault (bad data, a bad manifest): one strike toward a ban."""
        ...

    def cut(self, peer_id: str) -> None:
        """A download cut mid-payload: no strike (a crash looks the same); not waited for,
        nor asked first, until it delivers again."""
        ...


@dataclass(frozen=True)
class GatherWait:
    """How long one gather may wait and for whom; the loop's call (swarmnode.loop.waiting).

    A gather returns once every peer of `wait_for` delivered (and, with `wait_for_any`, at
    least one peer did), or after `timeout_s`. `held`: peers whose recent batch the node
    still holds unused; those not proven useful are not fetched from until the node's take
    says otherwise (`RolloutExchange.hold`) or the next gather (their newer batch would wait
    behind the one held)."""

    timeout_s: float = 0.0
    wait_for: frozenset[str] = field(default_factory=frozenset)
    wait_for_any: bool = False
    held: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "wait_for", frozenset(self.wait_for))
        object.__setattr__(self, "held", frozenset(self.held))

    def satisfied(self, delivered: Collection[str]) -> bool:
        """Whether a gather that has these peers' batches in hand may stop waiting."""
        return self.wait_for <= set(delivered) and (bool(delivered) or not self.wait_for_any)


NO_WAIT = GatherWait()  # hand out what is there, at once


class RolloutExchange(Protocol):
    peer_id: str

    def publish(self, round_: int, payload: bytes, tokens: int) -> None:
        """Make this node's batch of its round `round_` (of `tokens` completion tokens)
        available to peers."""
        ...

    def gather(self, wait: GatherWait = NO_WAIT) -> list[Received]:
        """Peers' batches that arrived since the last call, each (peer, round) once and only
        rounds newer than any handed out for that peer; waits as `wait` says."""
        ...

    def hold(self, held: frozenset[str]) -> None:
        """The peers whose groups the node still holds unused once this round's share was taken
        (what `GatherWait.held` says at a gather, brought up to date for the rest of the round):
        a peer not proven useful whose groups were all used is fetched from again now, so its
        next batch is there at the next gather."""
        ...

    def linger(self, round_: int, peers: set[str], timeout_s: float) -> None:
        """Before leaving: keep serving until `peers` fetched our batch of `round_`, or the timeout."""
        ...

    def offer_tokenizer(self, digest: str, document: bytes) -> None:
        """Serve our tokenizer's document (swarmnode.model.families) to peers that ask for it
        by `digest`, the name our batches give it."""
        ...

    def want_tokenizer(self, peer_id: str, digest: str) -> None:
        """Fetch the tokenizer document `digest` from `peer_id`, whose batch named it, in the
        background, as swarmnode.swarm.tokenizer_wants allows (one fetch at a time, known
        peers first, a few digests a peer)."""
        ...

    def tokenizers(self) -> list[tuple[str, bytes]]:
        """(digest, document) fetched since the last call, each document's SHA-256 checked
        against its digest (a peer that served other bytes got a strike)."""
        ...

    def close(self) -> None: ...


class Membership(Protocol):
    peer_id: str

    def announce(self, status: NodeStatus) -> None:
        """Publish this node's status now (its heartbeat repeats it until the next call)."""
        ...

    def live_peers(self) -> dict[str, Heartbeat]:
        """Peers of this run whose heartbeat is recent and who have not left. Their fields
        are claims: shown by `status`, never trusted for what the node trains."""
        ...

    def wait_for_peers(self, count: int, timeout_s: float) -> int:
        """Block until `count` peers of this run are live (over hivemind: seen in heartbeats or
        met without the DHT, and answered a direct request, a heartbeat alone being a claim)
        or the timeout; return how many are."""
        ...

    def close(self) -> None:
        """Tell peers this node left."""
        ...


@dataclass
class SwarmLink:
    """A node's two seams to its peers."""

    exchange: RolloutExchange
    membership: Membership
