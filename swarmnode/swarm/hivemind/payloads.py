"""Rollout payloads peer to peer, the serving side: the receiver pulls a batch straight from its
producer (swarmnode.swarm.hivemind.fetch asks).

Protocol `/swarmnode/payload/5` on a libp2p stream, four requests (each at most 1 KiB):
  {"run": str, "round": int}  that round's payload, as a DHT manifest announced it:
      response = 1 status byte (0 ok, 1 not found) + u64 length + the payload, in chunks
      The receiver knows size and digest from the producer's signed manifest, refuses anything
      larger, reads with a deadline and checks the digest.
  {"run": str, "after": int, "behind": int}  the payload of the oldest round after `after` that
      is at most `behind` (0 when absent, at most MAX_BEHIND) of our rounds behind our newest:
      the newest with 0, and with the asker's staleness the next round it can still use, so a
      peer pulled directly (no DHT manifests) misses no round it could train on. Asked directly of
      a peer that delivered before, with no DHT lookup (swarm.hivemind.exchange):
      response = 1 status byte (0 ok, 2 nothing newer) + u64 round + u64 length + the payload
      The stream itself authenticates the sender (libp2p's secure channel binds it to the peer
      id); the receiver refuses a length above its limit before reading and a round not after
      the one it asked for.
  {"run": str, "tokenizer": str}  the document of the tokenizer our batches name by this digest
      (swarmnode.model.families): response = 1 status byte (0 ok, 1 not served, 2 not now) + u64
      length + the document. Answered only to a peer that downloaded our batch or delivered
      to us, once per TOKENIZER_EVERY_S a requester (an honest one asks once) and
      TOKENIZERS_PER_WINDOW times in all in that time; the receiver refuses a length above
      MAX_TOKENIZER_DOCUMENT_BYTES before reading, and bytes whose SHA-256 is not the digest
      (a lie: a strike).
  {"run": str, "whom": true}  whom do you know? (peer exchange, swarm.hivemind.introductions):
      response = 1 status byte (0 ok, 2 not now) + u32 length + a msgpack list of at most
      MAX_INTRODUCTIONS [peer id, [multiaddr, ...]] of peers that delivered valid batches to the
      answering node; at most MAX_INTRODUCTION_BYTES, answered once per WHOM_EVERY_S a requester,
      and only to a peer that downloaded from it or delivered to it.
      A list is a claim: the asker dials each entry and counts it only once it delivers.
Either way a peer cannot push unbounded data, nor hold a download open by sending slowly: after
FLOOR_GRACE_S a payload must keep arriving at FLOOR_BYTES_PER_S or the download is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

import msgpack
from hivemind.p2p import P2P, PeerID

from swarmnode.bounded import note_newest
from swarmnode.protocol.records import (
    PAYLOAD_PROTOCOL,
)

log = logging.getLogger(__name__)

PROTOCOL = PAYLOAD_PROTOCOL
MAX_REQUEST_BYTES = 1024
CHUNK_BYTES = 1 << 20
OK, NOT_FOUND, NOTHING_NEWER = 0, 1, 2
REQUEST_TIMEOUT_S = 2.0  # a request is a few dozen bytes: an opened stream that says nothing is closed
MAX_STREAMS_PER_PEER = 4  # streams one requester may have served at once (an honest one: a download, a direct
# pull, 'whom do you know?', a liveness question); more are held unread ...
TARPIT_S = 30.0  # ... this long, then closed: closing them at once let a requester re-open them in a loop
MAX_HELD_PER_PEER = 32  # past this many held, a requester's streams are closed and its connection dropped
MAX_HELD = 128  # streams held unread from all requesters together (each is a socket): past it, closed at once
MAX_BEHIND = 64  # the most rounds behind our newest a direct pull may ask to start from
ANSWER_TIMEOUT_S = 3.0  # a live peer answers a direct question within this (`answers`)
MAX_INTRODUCTIONS = 16  # peers in one answer to 'whom do you know?'
MAX_ADDRS_PER_PEER = 4
MAX_INTRODUCTION_BYTES = 16 * 1024
NOTHING_AFTER = 2**62  # a round no peer has: a live one answers 'nothing newer' at once (`answers`)
WHOM_EVERY_S = 5.0  # a requester gets at most one answer to 'whom do you know?' this often
REMEMBERED_REQUESTERS = 64  # peers that downloaded from us (and, apart, that asked), newest kept: tried as strangers too
FLOOR_GRACE_S = 5.0  # a download's first bytes may take this long (dialling, a busy server) ...
FLOOR_BYTES_PER_S = 256 * 1024  # ... then the payload must keep coming at least this fast
TOKENIZER_EVERY_S = 600.0  # a requester gets our tokenizer's document at most this often ...
TOKENIZERS_PER_WINDOW = 32  # ... and all requesters together at most this many times in that time


class PayloadServer:
    """Serves this node's recent payloads to peers that ask for them by (run, round)."""

    def __init__(self, run_id: str, keep_rounds: int, max_concurrent: int = 8) -> None:
        self.run_id = run_id
        self.keep_rounds = keep_rounds
        self._payloads: OrderedDict[int, bytes] = OrderedDict()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._open: Counter[str] = Counter()  # requester -> streams it holds open now
        self._held: Counter[str] = Counter()  # requester -> streams over its limit, held unread
        self._dropped_at: dict[str, float] = {}  # requester -> when its connection was last dropped
        self._p2p: P2P | None = None
        self.tarpitted = 0  # streams held unread so far
        self.requesters: OrderedDict[str, None] = OrderedDict()  # who downloaded our batches lately, newest last
        # peers of our run that asked for a batch while we had none newer, newest last: kept apart,
        # since asking costs nothing, so a crowd of askers cannot push out those that downloaded
        self.askers: OrderedDict[str, None] = OrderedDict()
        self._answered_whom: dict[str, float] = {}  # requester -> when it last got our introductions
        # whom we introduce: [peer id, [multiaddr, ...]] of peers that delivered to us (the exchange sets it),
        # and to whom: those that downloaded from us, or delivered to us (`is_known`, the exchange's ledger)
        self.introductions: Callable[[], list[tuple[str, list[str]]]] = list
        self.is_known: Callable[[str], bool] = lambda peer: False
        self.served = 0
        self.served_to: dict[int, set[str]] = {}  # round -> peers that downloaded it
        self._pinned: set[int] = set()  # rounds whose manifest is (or is being put) in the DHT
        self.tokenizer_documents: dict[str, bytes] = {}  # digest -> our tokenizer's document (swarmnode.model.families)
        self._served_tokenizer: dict[str, float] = {}  # requester -> when it last got a tokenizer document

    def put(self, round_: int, payload: bytes) -> None:
        """Serve this round, and the `keep_rounds` newest with it (besides the pinned one)."""
        self._payloads[round_] = payload
        evictable = [r for r in self._payloads if r not in self._pinned]  # oldest first
        for dropped in evictable[: max(0, len(evictable) - self.keep_rounds)]:
            del self._payloads[dropped]
            self.served_to.pop(dropped, None)

    def pin(self, round_: int) -> None:
        """Keep serving `round_` however many rounds follow: its manifest is being stored in
        the DHT, where a stranger reads it and then asks for it."""
        self._pinned.add(round_)

    def settle_pin(self, round_: int, stored: bool) -> None:
        """The store of `round_`'s manifest ended: stored, it replaces every older pin (the DHT
        now names it); not stored, the pin it had goes and the older ones stay."""
        if stored:
            self._pinned = {round_}
        else:
            self._pinned.discard(round_)

    async def register(self, p2p: P2P) -> None:
        self._p2p = p2p
        await p2p.add_binary_stream_handler(PROTOCOL, self.handle)

    async def handle(self, info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request. Free identities buy nothing here: each requester has at most
        MAX_STREAMS_PER_PEER streams served, and a stream holds one of the few serving slots only
        once its request has arrived (within REQUEST_TIMEOUT_S), so idle streams block nobody.
        A stream over the limit is held unread (`_tarpit`), not closed, so re-opening streams
        in a loop gains a requester nothing."""
        requester = info.peer_id.to_base58() if getattr(info, "peer_id", None) is not None else "?"
        if self._open[requester] >= MAX_STREAMS_PER_PEER:
            await self._tarpit(requester, writer)
            return
        self._open[requester] += 1
        try:
            request = await asyncio.wait_for(_read_request(reader), timeout=REQUEST_TIMEOUT_S)
            async with self._slots:  # a requester that stops reading holds a slot as long as the floor rate allows
                await asyncio.wait_for(self._answer(requester, request, writer), timeout=self._serve_timeout_s())
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError) as err:
            log.debug("payload request from %s failed: %s", requester, err)
        finally:
            self._open[requester] -= 1
            if not self._open[requester]:
                del self._open[requester]
            writer.close()

    async def _tarpit(self, requester: str, writer: asyncio.StreamWriter) -> None:
        """Hold a stream over the requester's limit for TARPIT_S, unread, then close it; past
        MAX_HELD_PER_PEER held, close at once and drop the requester's connection (at most
        once a TARPIT_S): it must dial again, a handshake on its side too."""
        if sum(self._held.values()) >= MAX_HELD:  # identities are free: the tarpit is bounded as a whole
            writer.close()
            return
        if self._held[requester] >= MAX_HELD_PER_PEER:
            writer.close()
            now = time.monotonic()
            for peer in [p for p, at in self._dropped_at.items() if now - at >= TARPIT_S]:
                del self._dropped_at[peer]
            if self._p2p is not None and now - self._dropped_at.get(requester, -TARPIT_S) >= TARPIT_S:
                self._dropped_at[requester] = now
                log.info("dropping the connection of %s: it keeps opening payload streams", requester)
                with contextlib.suppress(Exception):  # gone already, or a daemon without the call
                    await self._p2p._client.disconnect(PeerID.from_base58(requester))
            return
        self._held[requester] += 1
        self.tarpitted += 1
        try:
            with contextlib.suppress(asyncio.CancelledError):  # shutting down: hivemind would print the cancellation
                await asyncio.sleep(TARPIT_S)
        finally:
            self._held[requester] -= 1
            if not self._held[requester]:
                del self._held[requester]
            writer.close()

    def _serve_timeout_s(self) -> float:
        """How long one answer may take: our largest payload at the floor rate a receiver
        holds us to, after the grace."""
        largest = max((len(p) for p in [*self._payloads.values(), *self.tokenizer_documents.values()]), default=0)
        return FLOOR_GRACE_S + largest / FLOOR_BYTES_PER_S

    async def _answer(self, requester: str, request: dict, writer: asyncio.StreamWriter) -> None:
        ours = request.get("run") == self.run_id
        if request.get("whom") is True:
            await self._introduce(requester, ours, writer)
            return
        if isinstance(request.get("tokenizer"), str):
            await self._serve_tokenizer(requester, ours, request["tokenizer"], writer)
            return
        if isinstance(request.get("after"), int):
            if not ours:  # said apart from 'nothing newer', so a node of another run is never counted as ours
                writer.write(struct.pack(">BQQ", NOT_FOUND, 0, 0))
                await writer.drain()
                return
            newer = [r for r in self._payloads if r > request["after"]]
            if not newer:
                writer.write(struct.pack(">BQQ", NOTHING_NEWER, 0, 0))
                await writer.drain()
                if request["after"] < NOTHING_AFTER:  # a peer waiting for our batches, not a probe
                    _remember(self.askers, requester)
                return
            round_ = next_round(newer, request.get("behind"))
            writer.write(struct.pack(">BQQ", OK, round_, len(self._payloads[round_])))
        else:
            round_ = request.get("round") if ours and isinstance(request.get("round"), int) else None
            if round_ not in self._payloads:
                writer.write(struct.pack(">BQ", NOT_FOUND, 0))
                await writer.drain()
                return
            writer.write(struct.pack(">BQ", OK, len(self._payloads[round_])))
        await _send(writer, self._payloads[round_])
        self.served += 1
        self.served_to.setdefault(round_, set()).add(requester)
        _remember(self.requesters, requester)
        self.askers.pop(requester, None)
        await writer.drain()

    async def _serve_tokenizer(self, requester: str, ours: bool, digest: str, writer: asyncio.StreamWriter) -> None:
        """Our tokenizer's document, to a peer that downloaded a batch of ours or delivered one
        to us (the reader of a batch in our tokenizer has), at most once per TOKENIZER_EVERY_S
        a requester and TOKENIZERS_PER_WINDOW to everyone in that time: identities are free."""
        document = self.tokenizer_documents.get(digest) if ours else None
        now = time.monotonic()
        for peer in [p for p, at in self._served_tokenizer.items() if now - at >= TOKENIZER_EVERY_S]:
            del self._served_tokenizer[peer]  # only requesters within the interval are kept (at most the budget)
        if document is None:
            writer.write(struct.pack(">BQ", NOT_FOUND, 0))
        elif (
            requester in self._served_tokenizer or len(self._served_tokenizer) >= TOKENIZERS_PER_WINDOW
            or not (requester in self.requesters or self.is_known(requester))
        ):
            writer.write(struct.pack(">BQ", NOTHING_NEWER, 0))  # not now
        else:
            self._served_tokenizer[requester] = now
            writer.write(struct.pack(">BQ", OK, len(document)))
            await _send(writer, document)
        await writer.drain()

    async def _introduce(self, requester: str, ours: bool, writer: asyncio.StreamWriter) -> None:
        now = time.monotonic()
        if not ours or now - self._answered_whom.get(requester, -WHOM_EVERY_S) < WHOM_EVERY_S:
            writer.write(struct.pack(">BI", NOTHING_NEWER, 0))
            await writer.drain()
            return
        if requester not in self.requesters and not self.is_known(requester):
            writer.write(struct.pack(">BI", NOTHING_NEWER, 0))  # a crawler learns nothing: download first
            await writer.drain()
            return
        self._answered_whom[requester] = now
        if len(self._answered_whom) > 4 * REMEMBERED_REQUESTERS:  # bounded: forget the oldest answers
            for peer in sorted(self._answered_whom, key=self._answered_whom.get)[: REMEMBERED_REQUESTERS]:
                del self._answered_whom[peer]
        entries = [
            [peer, [a for a in addrs if len(a) <= 256][:MAX_ADDRS_PER_PEER]]
            for peer, addrs in self.introductions() if peer != requester
        ][:MAX_INTRODUCTIONS]
        packed = msgpack.packb(entries)
        while len(packed) > MAX_INTRODUCTION_BYTES:
            entries = entries[:-1]
            packed = msgpack.packb(entries)
        writer.write(struct.pack(">BI", OK, len(packed)) + packed)
        await writer.drain()


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    view = memoryview(data)
    for offset in range(0, len(view), CHUNK_BYTES):
        writer.write(view[offset : offset + CHUNK_BYTES])
        await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> dict:
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    if length > MAX_REQUEST_BYTES:
        raise ValueError(f"request of {length} bytes")
    request = msgpack.unpackb(await reader.readexactly(length), raw=False, max_str_len=256)
    if not isinstance(request, dict):
        raise ValueError("request is not a map")
    return request


def _remember(peers: OrderedDict[str, None], requester: str) -> None:
    """A peer of our run that talks to us, newest last (REMEMBERED_REQUESTERS kept): the
    exchange may ask it for batches in turn, so two nodes that never find each other in the
    DHT still meet once one reached the other."""
    note_newest(peers, requester, None, REMEMBERED_REQUESTERS)


def next_round(newer: list[int], behind: object) -> int:
    """Of our served rounds after the asker's, the one a direct pull gets: the oldest at most
    `behind` rounds behind our newest (a value that is not an int in [0, MAX_BEHIND]: 0)."""
    newest = max(newer)
    within = behind if isinstance(behind, int) and not isinstance(behind, bool) and 0 <= behind <= MAX_BEHIND else 0
    return min(r for r in newer if r >= newest - within)
