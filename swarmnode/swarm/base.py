"""The two seams between the round loop and the swarm.

`RolloutExchange` carries data: publish my batch, gather peers' batches. `Membership` carries
who is there: my heartbeat, the live peers, the round they claim. The round loop sees only
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
    round: int
    payload: bytes


class RolloutExchange(Protocol):
    peer_id: str

    def publish(self, round_: int, payload: bytes, tokens: int) -> None:
        """Make this node's batch for `round_` (of `tokens` completion tokens) available to peers."""
        ...

    def gather(self, round_: int, staleness: int, timeout_s: float) -> list[Received]:
        """Peers' batches of rounds round_-staleness..round_ not returned before."""
        ...

    def close(self) -> None: ...


class Membership(Protocol):
    peer_id: str

    def announce(self, status: NodeStatus) -> None:
        """Publish this node's status now (its heartbeat repeats it until the next call)."""
        ...

    def live_peers(self) -> dict[str, Heartbeat]:
        """Peers of this run whose heartbeat is recent and who have not left."""
        ...

    def swarm_round(self) -> int | None:
        """The round the live peers of this run claim to be at (lower median); None when alone."""
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
