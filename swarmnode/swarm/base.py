"""The two seams between the round loop and the swarm.

`RolloutExchange` carries data: publish my batch, gather peers' batches. `Membership` carries
who is there: my heartbeat, the live peers, what they claim. There is no shared round: each
node counts its own rounds, and a batch names its sender's. The round loop sees only
these, so it runs the same alone, with in-memory peers, or over hivemind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from swarmnode.records import Heartbeat, NodeStatus


@dataclass(frozen=True)
class Received:
    """A peer's encoded batch, not yet decoded or trusted."""

    peer_id: str
    round: int  # the sender's own round, as its manifest says (the batch must agree)
    payload: bytes
    after_s: float | None = None  # seconds into the gather it arrived (0: already there)


class RolloutExchange(Protocol):
    peer_id: str

    def publish(self, round_: int, payload: bytes, tokens: int) -> None:
        """Make this node's batch of its round `round_` (of `tokens` completion tokens)
        available to peers."""
        ...

    def gather(
        self,
        timeout_s: float,
        wait_for: set[str] | frozenset[str] = frozenset(),
        wait_for_any: bool = False,
        held: frozenset[str] = frozenset(),
    ) -> list[Received]:
        """Peers' batches that arrived since the last call, each (peer, round) once and only
        rounds newer than any handed out for that peer; waits until every peer in `wait_for`
        delivered one (and, with `wait_for_any`, at least one peer did), or `timeout_s`.
        `held`: peers whose recent batch the node still holds unused. Until the next call,
        those not proven useful need not be fetched from: their newer batch would wait behind
        it (a transport where fetching costs nothing may ignore it)."""
        ...

    def linger(self, round_: int, peers: set[str], timeout_s: float) -> None:
        """Before leaving: keep serving until `peers` fetched our batch of `round_`, or the timeout."""
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
        """Block until `count` peers of this run are live or the timeout; return how many are."""
        ...

    def close(self) -> None:
        """Tell peers this node left."""
        ...


@dataclass
class SwarmLink:
    """A node's two seams to its peers."""

    exchange: RolloutExchange
    membership: Membership
