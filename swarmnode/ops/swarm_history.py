"""What the swarm page remembers of the heartbeats it read: each peer's points over time,
the swarm's totals, and who claims to train on whose completions.

Every identity is free, so everything here is bounded: at most `max_peers` peers (when a
new one would pass the bound, the one heard from least recently goes, peers that answered
this reader last), `points_per_peer` points each, and `total_points` points of totals. A
peer adds a point only when its heartbeat is newer than its last one, so a crowd that
writes one heartbeat each costs a row, not a history. Nothing here is checked except what
the rows say was checked (`PeerRow.answered_ms`): the page labels claims as claims.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from swarmnode.protocol.records import PeerRow

MAX_PEERS = 512  # peers remembered (a STATUS_SHARDS read covers about 500)
POINTS_PER_PEER = 240  # a peer's points kept: 20 minutes of 5-second heartbeats
TOTAL_POINTS = 720  # the swarm's totals: an hour of reads every 5 seconds
DRAWN_PEERS = 24  # peers whose series the page is sent and draws: those that answered first
MAX_ROUNDS_PER_S = 10.0  # a peer's rounds counted between two reads at most (none runs faster)
GONE = "gone"  # the state of a peer remembered but missing from the last read (its record expired)
LEFT_OUT = ("used", "evals")  # heartbeat fields the page does not draw: not sent to it


@dataclass(frozen=True)
class PeerPoint:
    """One heartbeat of a peer as the page draws it (its claims; time is the reader's clock)."""

    time: float
    round: int
    reward: float | None
    eval_acc: float | None


@dataclass(frozen=True)
class TotalsPoint:
    """The swarm at one read: peers that answered, peers that claim to train, the rounds a
    minute they claim between this read and the last, and the peers' samples they claim to
    have trained on so far."""

    time: float
    answered: int
    training: int
    rounds_per_min: float | None
    samples: int


@dataclass
class _Peer:
    row: PeerRow
    points: deque[PeerPoint] = field(default_factory=deque)


class SwarmHistory:
    """The bounded memory of a swarm page (one instance; `observe` from one thread at a time,
    `snapshot` from any: the caller holds the lock, swarmnode.ops.status_page)."""

    def __init__(self, max_peers: int = MAX_PEERS, points_per_peer: int = POINTS_PER_PEER,
                 total_points: int = TOTAL_POINTS) -> None:
        if min(max_peers, points_per_peer, total_points) < 1:
            raise ValueError("a swarm history keeps at least one peer and one point")
        self.max_peers = max_peers
        self.points_per_peer = points_per_peer
        self._peers: OrderedDict[str, _Peer] = OrderedDict()  # least recently heard-from first
        self.totals: deque[TotalsPoint] = deque(maxlen=total_points)
        self._last_rounds: dict[str, int] = {}  # for rounds a minute: each training peer's round at the last read
        self._last_read: float | None = None

    def __len__(self) -> int:
        return len(self._peers)

    def observe(self, rows: list[PeerRow], now: float) -> None:
        """One read of the swarm: new heartbeats become points, peers missing from it are
        `gone` (what was checked of them is no longer true), then the totals get a point."""
        read = {row.heartbeat.peer for row in rows}
        for peer, known in self._peers.items():
            if peer not in read and known.row.state != GONE:
                known.row = dataclasses.replace(known.row, state=GONE, asked=False, answered_ms=None, reached=None)
        for row in rows:
            self._remember(row, now)
        self._total(rows, now)

    def answered(self) -> set[str]:
        """The peers that answered the last read: a status read asks them first."""
        return {peer for peer, known in self._peers.items() if known.row.answered_ms is not None}

    def _remember(self, row: PeerRow, now: float) -> None:
        beat = row.heartbeat
        known = self._peers.get(beat.peer)
        if known is not None and beat.time <= known.row.heartbeat.time:
            if beat.time == known.row.heartbeat.time:
                known.row = row  # the same heartbeat, its age and what was checked as read now
            return
        if known is None:
            if len(self._peers) >= self.max_peers:
                self._forget_one()
            known = self._peers[beat.peer] = _Peer(row, deque(maxlen=self.points_per_peer))
        known.row = row
        self._peers.move_to_end(beat.peer)
        known.points.append(PeerPoint(now, beat.round, beat.reward, beat.eval_acc))

    def _forget_one(self) -> None:
        """Room for a newcomer: the least recently heard-from peer that is gone, else that
        did not answer the last read, else the least recently heard-from of all."""
        gone = next((peer for peer, known in self._peers.items() if known.row.state == GONE), None)
        if gone is None:
            gone = next((peer for peer, known in self._peers.items() if known.row.answered_ms is None), None)
        if gone is None:
            gone = next(iter(self._peers))
        del self._peers[gone]
        self._last_rounds.pop(gone, None)

    def _total(self, rows: list[PeerRow], now: float) -> None:
        training = [row for row in rows if row.heartbeat.state == "training" and row.state != "stale"]
        # rounds a minute: claimed, so only of peers that answered, each at most MAX_ROUNDS_PER_S
        rounds = {row.heartbeat.peer: row.heartbeat.round for row in training if row.answered_ms is not None}
        per_min = None
        if self._last_read is not None and now > self._last_read:
            most = MAX_ROUNDS_PER_S * (now - self._last_read)
            advanced = sum(min(most, max(0, r - self._last_rounds[p])) for p, r in rounds.items()
                           if p in self._last_rounds)
            per_min = advanced * 60.0 / (now - self._last_read)
        self._last_rounds = {p: r for p, r in rounds.items() if p in self._peers}
        self._last_read = now
        self.totals.append(TotalsPoint(
            now, sum(1 for row in rows if row.answered_ms is not None), len(training), per_min,
            sum(row.heartbeat.consumed for row in training),
        ))

    def rows(self) -> list[PeerRow]:
        """The newest row of every peer remembered, most recently heard-from first."""
        return [known.row for known in reversed(self._peers.values())]

    def edges(self) -> list[tuple[str, str, int]]:
        """(source, trainer, completions): who claims to have trained on whose completions,
        among the peers remembered; each claim capped at what the source claims it published."""
        published = {peer: known.row.heartbeat.published for peer, known in self._peers.items()}
        return [
            (source, trainer, min(count, published[source]))
            for trainer, known in self._peers.items()
            for source, count in known.row.heartbeat.used.items()
            if source in published and source != trainer and min(count, published[source]) > 0
        ]

    def drawn(self, count: int = DRAWN_PEERS) -> list[str]:
        """The peers whose curves are drawn: those that answered this reader, then the rest,
        each most recently heard-from first (a crowd of silent identities cannot push out
        the live nodes' curves); in the order of their ids, so colours stay put."""
        rows = self.rows()
        ordered = [r for r in rows if r.answered_ms is not None] + [r for r in rows if r.answered_ms is None]
        return sorted(row.heartbeat.peer for row in ordered[:count])

    def to_json(self) -> dict[str, Any]:
        """What the page fetches: rows, the drawn peers' series, totals and the claimed edges
        between drawn peers (what the page draws; the rest is not sent)."""
        drawn = set(order := self.drawn())
        return {
            "peers": [{k: v for k, v in row.to_json().items() if k not in LEFT_OUT} for row in self.rows()],
            "drawn": order,
            "series": {
                peer: {
                    "t": [p.time for p in points], "round": [p.round for p in points],
                    "reward": [p.reward for p in points], "eval_acc": [p.eval_acc for p in points],
                }
                for peer in order for points in [self._peers[peer].points]
            },
            "totals": {
                "t": [p.time for p in self.totals], "answered": [p.answered for p in self.totals],
                "training": [p.training for p in self.totals],
                "rounds_per_min": [p.rounds_per_min for p in self.totals],
                "samples": [p.samples for p in self.totals],
            },
            "edges": [{"from": s, "to": t, "count": n, "checked": False} for s, t, n in self.edges()
                      if s in drawn and t in drawn],
        }

