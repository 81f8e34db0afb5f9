"""Peers in one process: an in-memory hub that implements both seams, and a node alone.

Every exchange made from a hub is a member of its run (runs never see each other) until its
membership closes. `gather` returns what the other members of the run published since it last
looked, and stops waiting by the same rule as over hivemind (GatherWait). Each member reads its
node's PeerStanding as the hivemind exchange does: a banned peer's batches are not handed out,
and neither are those of a peer held unused and not proven useful (the hold rule), so nodes
stepped in turn (tests, bench/) and threads both behave as over hivemind, minus the network.
Of a peer not proven useful a gather hands out only the newest round published since the last
one, as the hivemind exchange asks such a peer for its newest batch, one at a time; of a proven
peer every round since (up to `keep_rounds`), as the hivemind exchange catches up. What differs
from hivemind, all of it timing or reach the network adds:
- the batch that follows a hold's end is handed out here in the round the hold ends, where over
  hivemind it can come a round later (fetched while the node trains, handed out at the next
  gather);
- of a peer not proven useful that publishes faster than the node, the newest round at the
  gather, where over hivemind it is the newest at the poll that fetched it (the same number of
  batches, a fresher one here);
- every peer not proven useful at every gather, where hivemind asks two such peers a poll, in
  turn (so with many of them a round's polls may not reach each);
- a proven peer's catch-up up to `keep_rounds` back, where hivemind asks at most
  `node.staleness` back: rounds older than that are offered here in the round they arrive, and
  leave at the next expire.
"""

from __future__ import annotations

import threading
import time

from swarmnode.protocol.records import Heartbeat, NodeStatus, tokenizer_document_digest
from swarmnode.swarm.base import NO_WAIT, GatherWait, PeerStanding, Received, SwarmLink, is_proven
from swarmnode.swarm.tokenizer_wants import TokenizerWants


class InMemoryHub:
    """Holds every member's payloads and status, per run."""

    def __init__(self, keep_rounds: int = 8) -> None:
        self.keep_rounds = keep_rounds  # per peer: its newest rounds kept
        self.lock = threading.Condition()
        self.payloads: dict[tuple[str, str, int], bytes] = {}  # (run, peer, round) -> payload
        self.status: dict[tuple[str, str], Heartbeat] = {}  # (run, peer) -> last status
        self.tokenizers: dict[tuple[str, str], dict[str, bytes]] = {}  # (run, peer) -> digest -> document it serves

    def join(self, peer_id: str, run_id: str, standing: PeerStanding) -> SwarmLink:
        """Both seams for one member of `run_id`, whose node keeps `standing`; members of other
        runs never see each other."""
        return SwarmLink(self.exchange(peer_id, run_id, standing), InMemoryMembership(self, peer_id, run_id))

    def exchange(self, peer_id: str, run_id: str, standing: PeerStanding) -> InMemoryExchange:
        with self.lock:
            self.status.setdefault((run_id, peer_id), _heartbeat(peer_id, run_id, NodeStatus()))
        return InMemoryExchange(self, peer_id, run_id, standing)

    def publish(self, run_id: str, peer_id: str, round_: int, payload: bytes) -> None:
        with self.lock:
            self.payloads[(run_id, peer_id, round_)] = payload
            for key in [k for k in self.payloads if k[:2] == (run_id, peer_id) and k[2] <= round_ - self.keep_rounds]:
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
    """One member's data seam; each peer batch is handed out at most once, and a peer's rounds
    only in increasing order."""

    def __init__(self, hub: InMemoryHub, peer_id: str, run_id: str, standing: PeerStanding) -> None:
        self.hub = hub
        self.peer_id = peer_id
        self.run_id = run_id
        self.standing = standing
        self._newest: dict[str, int] = {}  # peer -> newest round handed out
        self._wants = TokenizerWants()
        self._fetched: list[tuple[str, bytes]] = []  # tokenizer documents not yet handed out

    def publish(self, round_: int, payload: bytes, tokens: int = 0) -> None:
        self.hub.publish(self.run_id, self.peer_id, round_, payload)

    def gather(self, wait: GatherWait = NO_WAIT) -> list[Received]:
        with self.hub.lock:
            self.hub.lock.wait_for(lambda: wait.satisfied({peer for peer, _ in self._new(wait)}), wait.timeout_s)
            found = [Received(peer, r, self.hub.payloads[(self.run_id, peer, r)]) for peer, r in sorted(self._new(wait))]
        for item in found:
            self._newest[item.peer_id] = max(item.round, self._newest.get(item.peer_id, item.round))
        return found

    def _new(self, wait: GatherWait) -> list[tuple[str, int]]:
        """(peer, round) of the run not handed out yet, less what the node's standing holds back;
        of a peer not proven useful only its newest, as the hivemind exchange fetches it (one
        batch at a time, asked for its newest); of a proven peer every round, as the hivemind
        exchange's catch-up takes them."""
        new: dict[str, list[int]] = {}
        for run, peer, r in self.hub.payloads:
            if run == self.run_id and peer != self.peer_id and r > self._newest.get(peer, -1):
                new.setdefault(peer, []).append(r)
        return [
            (peer, r) for peer, rounds in new.items() if not self._held_back(peer, wait)
            for r in (rounds if is_proven(self.standing.standing(peer)) else [max(rounds)])
        ]

    def _held_back(self, peer: str, wait: GatherWait) -> bool:
        """Banned, or held unused and not proven useful (as HivemindExchange fetches)."""
        return self.standing.is_banned(peer) or (peer in wait.held and not is_proven(self.standing.standing(peer)))

    def hold(self, held: frozenset[str]) -> None:
        """Nothing fetches between gathers here: the hold is read at each gather."""

    def linger(self, round_: int, peers: set[str], timeout_s: float) -> None:
        """Nothing to wait for: the hub keeps what was published after a member leaves."""

    def offer_tokenizer(self, digest: str, document: bytes) -> None:
        with self.hub.lock:
            self.hub.tokenizers.setdefault((self.run_id, self.peer_id), {})[digest] = document

    def want_tokenizer(self, peer_id: str, digest: str) -> None:
        """Fetched at once, by the rule the hivemind exchange keeps (swarm.tokenizer_wants)."""
        self._wants.want(peer_id, digest)
        while (job := self._wants.next(self.standing.known)) is not None:
            peer, wanted = job
            with self.hub.lock:
                document = self.hub.tokenizers.get((self.run_id, peer), {}).get(wanted)
            matches = document is not None and tokenizer_document_digest(document) == wanted
            if document is not None and not matches:
                self.standing.reject(peer, "served a tokenizer document that does not match its digest")
            self._wants.settle(matches)
            if matches:
                self._fetched.append((wanted, document))

    def tokenizers(self) -> list[tuple[str, bytes]]:
        fetched, self._fetched = self._fetched, []
        return fetched

    def close(self) -> None:
        """Nothing to release; leaving is the membership's to say."""


class InMemoryMembership:
    """One member's view of who else is in its run."""

    def __init__(self, hub: InMemoryHub, peer_id: str, run_id: str) -> None:
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


def solo_link(peer_id: str, run_id: str, standing: PeerStanding) -> SwarmLink:
    """A node alone: a hub of one, so publishing costs little and gathering never waits."""
    return InMemoryHub(keep_rounds=1).join(peer_id, run_id, standing)
