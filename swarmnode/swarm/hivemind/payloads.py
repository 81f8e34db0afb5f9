"""Rollout payloads peer to peer: the receiver pulls a batch straight from its producer.

Protocol `/swarmnode/payload/3` on a libp2p stream, two requests (each at most 1 KiB):
  {"run": str, "round": int}  that round's payload, as a DHT manifest announced it:
      response = 1 status byte (0 ok, 1 not found) + u64 length + the payload, in chunks
      The receiver knows size and digest from the producer's signed manifest, refuses anything
      larger, reads with a deadline and checks the digest.
  {"run": str, "after": int}  the newest payload of a round after `after`, asked directly of a
      peer that delivered before, with no DHT lookup (swarm.hivemind.exchange):
      response = 1 status byte (0 ok, 2 nothing newer) + u64 round + u64 length + the payload
      The stream itself authenticates the sender (libp2p's secure channel binds it to the peer
      id); the receiver refuses a length above its limit before reading and a round not after
      the one it asked for.
Either way a peer cannot push unbounded data.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import Counter, OrderedDict

import msgpack
from hivemind.p2p import P2P, PeerID

from swarmnode.protocol.records import PAYLOAD_PROTOCOL
from swarmnode.swarm.hivemind.dht import payload_digest

log = logging.getLogger(__name__)

PROTOCOL = PAYLOAD_PROTOCOL
MAX_REQUEST_BYTES = 1024
CHUNK_BYTES = 1 << 20
OK, NOT_FOUND, NOTHING_NEWER = 0, 1, 2
SERVE_TIMEOUT_S = 120.0  # one answer; a stalled reader loses its slot
REQUEST_TIMEOUT_S = 2.0  # a request is a few dozen bytes: an opened stream that says nothing is closed
MAX_STREAMS_PER_PEER = 2  # streams one requester may hold open at once; more are closed at once


class FetchError(RuntimeError):
    """A payload could not be fetched. `misbehaved` is True when the peer sent bad data (as
    opposed to being unreachable or slow), which counts against it."""

    def __init__(self, message: str, misbehaved: bool, cut: bool = False) -> None:
        super().__init__(message)
        self.misbehaved = misbehaved
        self.cut = cut  # the peer closed mid-payload: not provably a lie (a crash looks alike), not retried


class PayloadServer:
    """Serves this node's recent payloads to peers that ask for them by (run, round)."""

    def __init__(self, run_id: str, keep_rounds: int, max_concurrent: int = 8) -> None:
        self.run_id = run_id
        self.keep_rounds = keep_rounds
        self._payloads: OrderedDict[int, bytes] = OrderedDict()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._open: Counter[str] = Counter()  # requester -> streams it holds open now
        self.served = 0
        self.served_to: dict[int, set[str]] = {}  # round -> peers that downloaded it
        self._pinned: set[int] = set()  # rounds whose manifest is (or is being put) in the DHT

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
        await p2p.add_binary_stream_handler(PROTOCOL, self.handle)

    async def handle(self, info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request. Free identities buy nothing here: each requester holds at most
        MAX_STREAMS_PER_PEER streams, and a stream holds one of the few serving slots only once
        its request has arrived (within REQUEST_TIMEOUT_S), so idle streams block nobody."""
        requester = info.peer_id.to_base58() if getattr(info, "peer_id", None) is not None else "?"
        if self._open[requester] >= MAX_STREAMS_PER_PEER:
            writer.close()
            return
        self._open[requester] += 1
        try:
            request = await asyncio.wait_for(_read_request(reader), timeout=REQUEST_TIMEOUT_S)
            async with self._slots:  # a requester that stops reading holds a slot SERVE_TIMEOUT_S at most
                await asyncio.wait_for(self._answer(requester, request, writer), timeout=SERVE_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError) as err:
            log.debug("payload request from %s failed: %s", requester, err)
        finally:
            self._open[requester] -= 1
            if not self._open[requester]:
                del self._open[requester]
            writer.close()

    async def _answer(self, requester: str, request: dict, writer: asyncio.StreamWriter) -> None:
        ours = request.get("run") == self.run_id
        if isinstance(request.get("after"), int):
            newer = [r for r in self._payloads if ours and r > request["after"]]
            if not newer:
                writer.write(struct.pack(">BQQ", NOTHING_NEWER, 0, 0))
                await writer.drain()
                return
            round_ = max(newer)
            writer.write(struct.pack(">BQQ", OK, round_, len(self._payloads[round_])))
        else:
            round_ = request.get("round") if ours and isinstance(request.get("round"), int) else None
            if round_ not in self._payloads:
                writer.write(struct.pack(">BQ", NOT_FOUND, 0))
                await writer.drain()
                return
            writer.write(struct.pack(">BQ", OK, len(self._payloads[round_])))
        view = memoryview(self._payloads[round_])
        for offset in range(0, len(view), CHUNK_BYTES):
            writer.write(view[offset : offset + CHUNK_BYTES])
            await writer.drain()
        self.served += 1
        self.served_to.setdefault(round_, set()).add(requester)
        await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> dict:
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    if length > MAX_REQUEST_BYTES:
        raise ValueError(f"request of {length} bytes")
    request = msgpack.unpackb(await reader.readexactly(length), raw=False, max_str_len=256)
    if not isinstance(request, dict):
        raise ValueError("request is not a map")
    return request


async def fetch_payload(
    p2p: P2P, peer_id: str, run_id: str, round_: int, size: int, digest: bytes, timeout_s: float
) -> bytes:
    """Download one payload whose size and digest the producer's manifest promised."""
    return await _bounded(_fetch(p2p, peer_id, run_id, round_, size, digest), peer_id, timeout_s)


async def fetch_newest(
    p2p: P2P, peer_id: str, run_id: str, after: int, max_bytes: int, timeout_s: float
) -> tuple[int, bytes] | None:
    """Ask a peer directly for its newest payload of a round after `after`: (round, payload),
    or None when it has nothing newer."""
    return await _bounded(_fetch_newest(p2p, peer_id, run_id, after, max_bytes), peer_id, timeout_s)


async def _bounded(download, peer_id: str, timeout_s: float):  # noqa: ANN001, ANN202
    """One download under a deadline, every failure a FetchError that says whose fault it is."""
    try:
        return await asyncio.wait_for(download, timeout_s)
    except TimeoutError:
        raise FetchError(f"no payload from {peer_id} within {timeout_s:.0f} s", misbehaved=False) from None
    except (ConnectionError, asyncio.IncompleteReadError, OSError) as err:
        raise FetchError(f"connection to {peer_id} failed: {err}", misbehaved=False) from None
    except Exception as err:  # the daemon client reports an unreachable peer as ControlFailure
        if isinstance(err, FetchError):
            raise
        raise FetchError(f"cannot reach {peer_id}: {err}", misbehaved=False) from None


async def _ask(p2p: P2P, peer_id: str, request: dict) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), PROTOCOL)
    packed = msgpack.packb(request)
    writer.write(struct.pack(">I", len(packed)) + packed)
    await writer.drain()
    return reader, writer


async def _read_payload(reader: asyncio.StreamReader, peer_id: str, length: int) -> bytes:
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as err:
        raise FetchError(
            f"{peer_id} closed after {len(err.partial)} of the {length} bytes it promised", misbehaved=False, cut=True
        ) from None


async def _fetch_newest(p2p: P2P, peer_id: str, run_id: str, after: int, max_bytes: int) -> tuple[int, bytes] | None:
    reader, writer = await _ask(p2p, peer_id, {"run": run_id, "after": after})
    try:
        status, round_, length = struct.unpack(">BQQ", await reader.readexactly(17))
        if status == NOTHING_NEWER:
            return None
        if status != OK or round_ <= after or not 0 < length <= max_bytes:
            raise FetchError(
                f"{peer_id} answered status {status}, round {round_} (asked after {after}), {length} bytes "
                f"(at most {max_bytes})", misbehaved=True,
            )
        return round_, await _read_payload(reader, peer_id, length)
    finally:
        writer.close()


async def _fetch(p2p: P2P, peer_id: str, run_id: str, round_: int, size: int, digest: bytes) -> bytes:
    reader, writer = await _ask(p2p, peer_id, {"run": run_id, "round": round_})
    try:
        status, length = struct.unpack(">BQ", await reader.readexactly(9))
        if status == NOT_FOUND:
            raise FetchError(f"{peer_id} no longer holds round {round_}", misbehaved=False)
        if status != OK or length != size:
            raise FetchError(
                f"{peer_id} sent status {status} and {length} bytes; its manifest promised {size}",
                misbehaved=True,
            )
        payload = await _read_payload(reader, peer_id, length)
    finally:
        writer.close()
    if payload_digest(payload) != digest:
        raise FetchError(f"payload from {peer_id} does not match its signed digest", misbehaved=True)
    return payload
