"""Rollout payloads peer to peer: the receiver pulls a batch straight from its producer.

Protocol `/swarmnode/payload/1` on a libp2p stream:
  request  = u32 length + msgpack {"run": str, "round": int}     (at most 1 KiB)
  response = 1 status byte (0 ok, 1 not found) + u64 length + the payload, written in chunks
The receiver knows the size and digest from the producer's signed manifest, refuses anything
larger, reads with a deadline and checks the digest, so a peer cannot push unbounded data.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import Counter, OrderedDict

import msgpack
from hivemind.p2p import P2P, PeerID

from swarmnode.records import PAYLOAD_PROTOCOL
from swarmnode.swarm.hivemind.dht import payload_digest

log = logging.getLogger(__name__)

PROTOCOL = PAYLOAD_PROTOCOL
MAX_REQUEST_BYTES = 1024
CHUNK_BYTES = 1 << 20
OK, NOT_FOUND = 0, 1
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

    def put(self, round_: int, payload: bytes) -> None:
        self._payloads[round_] = payload
        while len(self._payloads) > self.keep_rounds:
            dropped, _ = self._payloads.popitem(last=False)
            self.served_to.pop(dropped, None)

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
        payload = None
        if request.get("run") == self.run_id and isinstance(request.get("round"), int):
            payload = self._payloads.get(request["round"])
        if payload is None:
            writer.write(struct.pack(">BQ", NOT_FOUND, 0))
        else:
            writer.write(struct.pack(">BQ", OK, len(payload)))
            view = memoryview(payload)
            for offset in range(0, len(view), CHUNK_BYTES):
                writer.write(view[offset : offset + CHUNK_BYTES])
                await writer.drain()
            self.served += 1
            self.served_to.setdefault(request["round"], set()).add(requester)
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
    try:
        return await asyncio.wait_for(_fetch(p2p, peer_id, run_id, round_, size, digest), timeout_s)
    except TimeoutError:
        raise FetchError(f"no payload from {peer_id} within {timeout_s:.0f} s", misbehaved=False) from None
    except (ConnectionError, asyncio.IncompleteReadError, OSError) as err:
        raise FetchError(f"connection to {peer_id} failed: {err}", misbehaved=False) from None
    except Exception as err:  # the daemon client reports an unreachable peer as ControlFailure
        if isinstance(err, FetchError):
            raise
        raise FetchError(f"cannot reach {peer_id}: {err}", misbehaved=False) from None


async def _fetch(p2p: P2P, peer_id: str, run_id: str, round_: int, size: int, digest: bytes) -> bytes:
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), PROTOCOL)
    try:
        request = msgpack.packb({"run": run_id, "round": round_})
        writer.write(struct.pack(">I", len(request)) + request)
        await writer.drain()
        status, length = struct.unpack(">BQ", await reader.readexactly(9))
        if status == NOT_FOUND:
            raise FetchError(f"{peer_id} no longer holds round {round_}", misbehaved=False)
        if status != OK or length != size:
            raise FetchError(
                f"{peer_id} sent status {status} and {length} bytes; its manifest promised {size}",
                misbehaved=True,
            )
        try:
            payload = await reader.readexactly(length)
        except asyncio.IncompleteReadError as err:
            raise FetchError(
                f"{peer_id} closed after {len(err.partial)} of the {size} bytes its manifest promised",
                misbehaved=False, cut=True,
            ) from None
    finally:
        writer.close()
    if payload_digest(payload) != digest:
        raise FetchError(f"payload from {peer_id} does not match its signed digest", misbehaved=True)
    return payload
