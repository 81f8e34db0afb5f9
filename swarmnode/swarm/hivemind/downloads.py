"""A node's downloads from its peers, on the swarm loop: what runs, what arrived, what is done.

One download per peer at a time, so identities cannot multiply their share by announcing many
batches. A download asks either for a round a manifest announced or, of a peer we pull from
directly, for its next round after the last we have; either way it ends in one typed result
(swarmnode.swarm.hivemind.fetch: a `Batch`, None for "nothing newer", or a FetchError). What
arrived waits in `ready` until a gather hands it out; from then on only newer rounds of that
peer are fetched.

Strangers (peers without a delivery record) are bounded together: at most
`swarm.max_peers_per_round` downloads and UNEARNED_PAYLOADS_IN_FLIGHT payloads of our limit in
promised bytes at once (`choose_downloads`), the smallest promise first, and a stranger whose
download wasted its place (silent, too slow, cut, unreachable) waits out a growing back-off
(`Backoff`) before it is downloaded from again. A thousand junk manifests cost a bounded number
of doomed downloads and bounded memory, not a round.

A stranger asked directly (a knock: no manifest says how much it will send) holds no bytes of
that budget until its answer's header names a length (`admit`). A knock takes one of
KNOCKS_IN_FLIGHT places for its first KNOCK_PLACE_S only (a batch is served from memory, so an
answer usually starts by then) and a stream until its header or the pull's deadline, at most
KNOCKS_OPEN of them: identities that answer with silence hold a place for a second each, not
the budget an honest newcomer's batch needs, and a busy honest peer still has the whole grace
to answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from swarmnode.bounded import note_newest
from swarmnode.swarm.base import PeerStanding, Received
from swarmnode.swarm.hivemind.dht import Manifest
from swarmnode.swarm.hivemind.fetch import Batch, FetchError

log = logging.getLogger(__name__)

# peers whose newest round handed out is kept, least recently moved first out (and failed tries
# of announced rounds, oldest first out): names are free. A peer forgotten here is asked for
# anything newer than nothing; the pool keeps a live peer's rounds forward, and takes a silent
# one's as a new peer's (its ledger forgot it too: swarmnode.loop.ledger.forget_silent)
MAX_NEWEST_KEPT = 4096
MAX_FETCH_ATTEMPTS = 3  # tries of one announced round from an unreachable peer before it is given up (no blame)
UNEARNED_PAYLOADS_IN_FLIGHT = 2  # strangers' downloads at once, in promised bytes, as max-size payloads
KNOCKS_IN_FLIGHT = 8  # strangers asked directly in the last KNOCK_PLACE_S, at once ...
KNOCK_PLACE_S = 1.0  # ... (a knock holds no bytes until its header, and a place only this long)
KNOCKS_OPEN = 32  # knocks waiting for their header at once, however old (a stream each)
STRANGER_BACKOFF_S = 10.0  # a stranger whose download wasted its place waits this long before the next ...
STRANGER_BACKOFF_MAX_S = 600.0  # ... doubled at each failure in a row, up to this

Key = tuple[str, int]  # (peer, its round)


class Backoff:
    """Strangers whose last downloads wasted their place (silent, too slow, cut, unreachable),
    and until when each waits before it is downloaded from again: STRANGER_BACKOFF_S, doubled
    at each failure in a row. An identity that announces a new round every second cannot
    re-arm a doomed download every second; a new identity costs a key and a DHT store."""

    def __init__(self, base_s: float = STRANGER_BACKOFF_S, cap_s: float = STRANGER_BACKOFF_MAX_S) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self._failures: Counter[str] = Counter()
        self._until: dict[str, float] = {}

    def failed(self, peer: str, now: float) -> None:
        self._failures[peer] += 1
        self._until[peer] = now + min(self.cap_s, self.base_s * 2 ** min(self._failures[peer] - 1, 30))
        for old in [p for p, until in self._until.items() if until < now - self.cap_s]:  # bounded memory
            del self._until[old]
            del self._failures[old]

    def delivered(self, peer: str) -> None:
        self._failures.pop(peer, None)
        self._until.pop(peer, None)

    def waiting(self, peer: str, now: float) -> bool:
        return self._until.get(peer, 0.0) > now


@dataclass
class Download:
    """One download running."""

    task: asyncio.Task
    round: int | None  # the round a manifest announced; None: the next after what we have (fetch_next)
    promised: int | None  # bytes it may bring, counted against strangers' budget; None: a known peer's direct pull
    # (a stranger's knock promises 0 until its header names a length)
    started: float = 0.0  # time.monotonic() at its start


class Downloads:
    """The downloads running, the payloads arrived and not handed out, and each peer's newest
    round handed out (or given up on). On the swarm loop only."""

    def __init__(self, ledger: PeerStanding, max_payload_bytes: int, max_strangers: int) -> None:
        self.ledger = ledger
        self.max_payload_bytes = max_payload_bytes
        self.max_strangers = max_strangers
        self.running: dict[str, Download] = {}
        self.ready: dict[Key, bytes] = {}  # downloaded, not yet handed out
        self.newest: OrderedDict[str, int] = OrderedDict()  # peer -> newest round handed out or given up on
        self.attempts: Counter[Key] = Counter()
        self.backoff = Backoff()
        self.arrival = asyncio.Event()  # set when a download completes

    def busy(self, peer: str) -> bool:
        return peer in self.running

    def promises(self) -> dict[str, int | None]:
        """Per peer with a download running, the bytes it promised (None: a known peer's pull)."""
        return {peer: download.promised for peer, download in self.running.items()}

    def after(self, peer: str) -> int:
        """The round a direct pull of `peer` asks for anything after: the newest we have of it."""
        return max([self.newest.get(peer, -1), *(r for p, r in self.ready if p == peer)])

    def wanted(self, peer: str, round_: int) -> bool:
        """A round of `peer` newer than any we have of it (handed out or arrived), not being fetched."""
        running = self.running.get(peer)
        return round_ > self.after(peer) and not (running is not None and running.round == round_)

    def room_for_knock(self) -> bool:
        """Another stranger may be asked directly now: strangers' promised bytes leave room,
        fewer than KNOCKS_IN_FLIGHT knocks began in the last KNOCK_PLACE_S and fewer than
        KNOCKS_OPEN wait for their header, and strangers' downloads stay within
        `choose_downloads`' count."""
        count, promised = strangers_in_flight(self.promises(), self.ledger.known)
        now = time.monotonic()
        waiting = [d for d in self.running.values() if d.round is None and d.promised == 0]
        fresh = sum(1 for d in waiting if now - d.started < KNOCK_PLACE_S)
        return (
            count < self.max_strangers and promised < UNEARNED_PAYLOADS_IN_FLIGHT * self.max_payload_bytes
            and fresh < KNOCKS_IN_FLIGHT and len(waiting) < KNOCKS_OPEN
        )

    def admit(self, peer: str, length: int) -> bool:
        """A stranger's knock was answered with `length` bytes: whether strangers' promised bytes
        have room for them, and if so they are held until the download ends."""
        download = self.running.get(peer)
        if download is None:
            return False  # not ours to admit (fail closed)
        if download.promised is None or self.ledger.known(peer):
            return True  # a known peer's pull, or a stranger that delivered meanwhile: outside the budget
        _, promised = strangers_in_flight(self.promises(), self.ledger.known)
        if promised - download.promised + length > UNEARNED_PAYLOADS_IN_FLIGHT * self.max_payload_bytes:
            return False
        download.promised = length
        return True

    def start(self, peer: str, fetch: Coroutine[Any, Any, Batch | None], round_: int | None, promised: int | None) -> None:
        """Run `fetch` (of `round_`, or the newest) as the peer's download."""
        task = asyncio.create_task(fetch)
        self.running[peer] = Download(task, round_, promised, time.monotonic())
        task.add_done_callback(lambda done: self._settle(peer, round_, done))

    def _settle(self, peer: str, asked: int | None, task: asyncio.Task) -> None:
        """A download ended: keep the payload, blame the peer, or count a failed attempt."""
        if self.running.get(peer) is not None and self.running[peer].task is task:
            del self.running[peer]
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            self._arrived(peer, asked, task.result())
        elif isinstance(error, FetchError):
            self._failed(peer, asked, error)
        else:  # fetch.py turns every failure into a FetchError; anything else is a bug worth seeing
            log.warning("download from %s failed: %r", peer, error)
            if asked is not None:
                self._attempt(peer, asked)

    def _arrived(self, peer: str, asked: int | None, batch: Batch | None) -> None:
        if batch is None:  # a direct pull: nothing newer
            return
        if batch.round <= self.newest.get(peer, -1):
            return  # older than what we handed out meanwhile: a peer's rounds are handed out only forward
        self.backoff.delivered(peer)
        self.ready[(peer, batch.round)] = batch.payload
        self.arrival.set()

    def _failed(self, peer: str, asked: int | None, error: FetchError) -> None:
        if not (error.misbehaved or error.gone or error.no_room) and not self.ledger.known(peer):
            self.backoff.failed(peer, time.monotonic())
        if error.misbehaved:
            self._give_up(peer, asked)
            self.ledger.reject(peer, str(error))
        elif error.cut:
            self._give_up(peer, asked)
            self.ledger.cut(peer)
            log.debug("fetch %s round %s: %s", peer, asked, error)
        elif asked is None:  # unreachable or slow: asked again next poll, while the ledger knows it
            log.debug("direct pull from %s: %s", peer, error)
        else:
            log.debug("fetch %s round %d: %s", peer, asked, error)
            self._attempt(peer, asked)

    def _attempt(self, peer: str, asked: int) -> None:
        """A failed try of an announced round; after MAX_FETCH_ATTEMPTS it is given up, unblamed."""
        self.attempts[(peer, asked)] += 1
        while len(self.attempts) > MAX_NEWEST_KEPT:  # a name that failed once and left
            del self.attempts[next(iter(self.attempts))]
        if self.attempts.get((peer, asked), 0) >= MAX_FETCH_ATTEMPTS:
            self.handed_out(peer, asked)  # unreachable: stop asking for this round, without blaming it

    def _give_up(self, peer: str, asked: int | None) -> None:
        if asked is not None:
            self.handed_out(peer, asked)

    def hand_out(self) -> list[Received]:
        """Everything arrived since the last call, each (peer, round) once, in order."""
        found = [Received(peer, r, payload) for (peer, r), payload in sorted(self.ready.items())]
        self.ready.clear()
        for item in found:
            self.handed_out(item.peer_id, item.round)
        return found

    def handed_out(self, peer: str, round_: int) -> None:
        """From now on only rounds newer than `round_` of `peer` are fetched."""
        note_newest(self.newest, peer, max(round_, self.newest.get(peer, round_)), MAX_NEWEST_KEPT)
        self.attempts = Counter({k: v for k, v in self.attempts.items() if k[1] > self.newest.get(k[0], -1)})

    def cancel_all(self) -> None:
        for download in list(self.running.values()):
            download.task.cancel()
        self.running.clear()


def choose_downloads(
    manifests: list[Manifest],
    running: Mapping[str, int | None],
    known: Callable[[str], bool],
    max_others: int,
    max_other_bytes: int,
) -> list[Manifest]:
    """Which new manifests to download now, given the downloads running (peer -> promised
    bytes). One download per peer at a time; peers that delivered before always; others up to
    `max_others` downloads and `max_other_bytes` promised bytes at once, so payloads promised by
    strangers (and cut before their last byte) hold a bounded amount of memory."""
    busy = set(running)
    count, promised = strangers_in_flight(running, known)
    chosen = []
    for manifest in manifests:
        if manifest.peer_id in busy:
            continue
        if not known(manifest.peer_id):
            if count >= max_others or promised + manifest.size > max_other_bytes:
                continue
            count, promised = count + 1, promised + manifest.size
        busy.add(manifest.peer_id)
        chosen.append(manifest)
    return chosen


def strangers_in_flight(running: Mapping[str, int | None], known: Callable[[str], bool]) -> tuple[int, int]:
    """The downloads running (peer -> promised bytes) from peers without a delivery record:
    how many, and the bytes they promised."""
    others = [size for peer, size in running.items() if size is not None and not known(peer)]
    return len(others), sum(others)
