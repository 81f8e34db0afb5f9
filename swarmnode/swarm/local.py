"""Peers in one process: an in-memory hub that implements both seams, and a node alone.

Every exchange made from a hub is a member of its run until its membership closes. `gather`
returns what the other members published for the window and stops waiting once each peer it
was told to wait for has delivered, so nodes stepped in turn (tests, bench/) and threads both
behave as over hivemind, minus the network.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

from swarmnode.records import Heartbeat, NodeStatus
from swarmnode.swarm.base import ProbeResult, Received, SwarmLink


class InMemoryHub:
    """Holds every member's payloads and status, per run."""

    def __init__(self, keep_rounds: int = 8) -> None:
        self.keep_rounds = keep_rounds
        self.lock = threading.Condition()
        self.payloads: dict[tuple[str, str, int], bytes] = {}  # (run, peer, round) -> payload
        self.status: dict[tuple[str, str], Heartbeat] = {}  # (run, peer) -> last status

    def join(self, peer_id: str, run_id: str = "") -> SwarmLink:
        """Both seams for one member of `run_id`."""
        return SwarmLink(self.exchange(peer_id, run_id), InMemoryMembership(self, peer_id, run_id))

    def exchange(self, peer_id: str, run_id: str = "") -> InMemoryExchange:
        with self.lock:
            self.status.setdefault((run_id, peer_id), _heartbeat(peer_id, run_id, NodeStatus()))
        return InMemoryExchange(self, peer_id, run_id)

    def publish(self, run_id: str, peer_id: str, round_: int, payload: bytes) -> None:
        with self.lock:
            self.payloads[(run_id, peer_id, round_)] = payload
            for key in [k for k in self.payloads if k[2] < round_ - self.keep_rounds]:
                del self.payloads[key]
            self.lock.notify_all()

    def members(self, run_id: str) -> set[str]:
        """Peers of the run that have not left."""
        return {peer for (run, peer), hb in self.status.items() if run == run_id and hb.state != "left"}

    def set_status(self, run_id: str, peer_id: str, heartbeat: Heartbeat) -> None:
        with self.lock:
            self.status[(run_id, peer_id)] = heartbeat
            self.lock.notify_all()


def _heartbeat(peer_id: str, run_id: str, status: NodeStatus, state: str = "training") -> Heartbeat:
    return Heartbeat(**status.model_dump(), peer=peer_id, run=run_id, time=time.time(), state=state)


class InMemoryExchange:
    """One member's data seam; each peer batch is handed out at most once."""

    def __init__(self, hub: InMemoryHub, peer_id: str, run_id: str = "") -> None:
        self.hub = hub
        self.peer_id = peer_id
        self.run_id = run_id
        self._seen: set[tuple[str, int]] = set()

    def publish(self, round_: int, payload: bytes, tokens: int = 0) -> None:
        self.hub.publish(self.run_id, self.peer_id, round_, payload)

    def gather(
        self,
        round_: int,
        staleness: int,
        timeout_s: float = 0.0,
        wait_for: set[str] | frozenset[str] = frozenset(),
        wait_for_any: bool = False,
    ) -> list[Received]:
        started = time.monotonic()

        def done() -> bool:
            delivered = self._delivered(round_, staleness)
            return set(wait_for) <= delivered and (bool(delivered) or not wait_for_any)

        with self.hub.lock:
            self.hub.lock.wait_for(done, timeout=timeout_s)
            found = [
                Received(peer, r, payload, after_s=time.monotonic() - started)
                for (run, peer, r), payload in sorted(self.hub.payloads.items())
                if run == self.run_id and self._fresh(peer, r, round_, staleness)
            ]
        self._seen.update((item.peer_id, item.round) for item in found)
        return found

    def linger(self, round_: int, peers: set[str], timeout_s: float) -> None:
        """Nothing to wait for: the hub keeps what was published after a member leaves."""

    def probe(self, wanted: dict[str, int], timeout_s: float = 0.0) -> concurrent.futures.Future:
        """Answered at once: the hub holds every payload it still keeps."""
        with self.hub.lock:
            results: list[ProbeResult] = [
                (peer, r, self.hub.payloads.get((self.run_id, peer, r))) for peer, r in wanted.items()
            ]
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(results)
        return future

    def _delivered(self, round_: int, staleness: int) -> set[str]:
        return {
            peer for (run, peer, r) in self.hub.payloads if run == self.run_id and self._fresh(peer, r, round_, staleness)
        }

    def _fresh(self, peer: str, r: int, round_: int, staleness: int) -> bool:
        return peer != self.peer_id and round_ - staleness <= r <= round_ and (peer, r) not in self._seen

    def close(self) -> None:
        """Nothing to release; leaving is the membership's to say."""


class InMemoryMembership:
    """One member's view of who else is in its run."""

    def __init__(self, hub: InMemoryHub, peer_id: str, run_id: str = "") -> None:
        self.hub = hub
        self.peer_id = peer_id
        self.run_id = run_id

    def announce(self, status: NodeStatus) -> None:
        self.hub.set_status(self.run_id, self.peer_id, _heartbeat(self.peer_id, self.run_id, status))

    def live_peers(self) -> dict[str, Heartbeat]:
        with self.hub.lock:
            return {
                peer: self.hub.status[(self.run_id, peer)]
                for peer in self.hub.members(self.run_id) - {self.peer_id}
            }

    def wait_for_peers(self, count: int, timeout_s: float) -> int:
        with self.hub.lock:
            self.hub.lock.wait_for(lambda: len(self.hub.members(self.run_id) - {self.peer_id}) >= count, timeout_s)
        return len(self.live_peers())

    def close(self) -> None:
        """Leave the run: the others stop waiting for this member."""
        with self.hub.lock:
            last = self.hub.status.get((self.run_id, self.peer_id))
        if last is not None:
            self.hub.set_status(self.run_id, self.peer_id, last.model_copy(update={"state": "left"}))


def solo_link(peer_id: str) -> SwarmLink:
    """A node alone: a hub of one, so publishing costs nothing and gathering never waits."""
    return InMemoryHub(keep_rounds=0).join(peer_id)
