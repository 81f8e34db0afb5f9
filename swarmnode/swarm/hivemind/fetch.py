"""The asking side of `/swarmnode/payload/5` (swarmnode.swarm.hivemind.payloads serves it).

Every request goes the same way (`_request`): open a stream to the peer, send the request, read
the answer's fixed header within FLOOR_GRACE_S, let the request's own rule judge the header
(how long a body it allows, or why the answer is refused and whose fault that is), then read
the body at the floor rate. What differs between requests is only that rule:

- a round a manifest announced (`fetch_payload`): exactly the size the signed manifest
  promised, and bytes that hash to its digest;
- the next round after one (`fetch_next`, a direct pull of a known peer or a stranger's knock): the peer's oldest round
  after the one asked that is at most `behind` of its rounds behind its newest; a round after
  the one asked, at most our payload limit, or "nothing newer";
- a tokenizer document (`fetch_tokenizer`): at most MAX_TOKENIZER_DOCUMENT_BYTES, bytes whose
  SHA-256 is the digest asked for;
- whom the peer knows (`ask_whom`): at most MAX_INTRODUCTION_BYTES of checked entries.

A batch arrives as one typed result, `Batch` (its round and payload), or None for "nothing
newer"; every failure is a FetchError that says whether the peer misbehaved (a strike), cut the
transfer, was slow, or no longer holds what was asked.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from hivemind.p2p import P2P, PeerID

from swarmnode.protocol.records import MAX_TOKENIZER_DOCUMENT_BYTES, tokenizer_document_digest
from swarmnode.swarm.hivemind.dht import payload_digest
from swarmnode.swarm.hivemind.payloads import (
    CHUNK_BYTES,
    FLOOR_BYTES_PER_S,
    FLOOR_GRACE_S,
    MAX_ADDRS_PER_PEER,
    MAX_INTRODUCTION_BYTES,
    MAX_INTRODUCTIONS,
    NOT_FOUND,
    NOTHING_AFTER,
    NOTHING_NEWER,
    OK,
    PROTOCOL,
)

TOKENIZER_FETCH_TIMEOUT_S = FLOOR_GRACE_S + MAX_TOKENIZER_DOCUMENT_BYTES / FLOOR_BYTES_PER_S  # the largest at the floor rate


class FetchError(RuntimeError):
    """A payload could not be fetched. `misbehaved` is True when the peer sent bad data (as
    opposed to being unreachable or slow), which counts against it."""

    def __init__(
        self, message: str, misbehaved: bool, cut: bool = False, slow: bool = False, gone: bool = False,
        no_room: bool = False,
    ) -> None:
        super().__init__(message)
        self.misbehaved = misbehaved
        self.cut = cut  # the peer closed mid-payload: not provably a lie (a crash looks alike), not retried
        self.slow = slow  # sent below the floor rate: cut by us (a slow link looks alike)
        self.gone = gone  # the round asked for is no longer served: the peer moved on, nothing wasted
        self.no_room = no_room  # our strangers' budget had no room for the length it offered: its fault in nothing


@dataclass(frozen=True)
class Batch:
    """A peer's payload of one of its rounds, as it arrived (checked by the receiver later)."""

    round: int
    payload: bytes


Judge = Callable[[tuple[int, ...]], int | None]  # an answer's header -> the body's length to read (None: none)
Admit = Callable[[int], bool]  # a body's length -> whether our budget takes it now


async def _request(p2p: P2P, peer_id: str, request: dict[str, Any], header: str, judge: Judge) -> tuple[tuple[int, ...], bytes | None]:
    """Ask `peer_id` one request; its answer's header (struct format `header`, status first) and
    its body, whose length `judge` allows or refuses (raising FetchError)."""
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), PROTOCOL)
    try:
        packed = msgpack.packb(request)
        writer.write(struct.pack(">I", len(packed)) + packed)
        await writer.drain()
        fields = struct.unpack(header, await _read_header(reader, peer_id, struct.calcsize(header)))
        length = judge(fields)
        return fields, None if length is None else await _read_payload(reader, peer_id, length)
    finally:
        writer.close()


async def _read_header(reader: asyncio.StreamReader, peer_id: str, size: int) -> bytes:
    """An answer's fixed header, within FLOOR_GRACE_S of asking."""
    try:
        return await asyncio.wait_for(reader.readexactly(size), FLOOR_GRACE_S)
    except TimeoutError:
        raise FetchError(f"{peer_id} did not answer within {FLOOR_GRACE_S:.0f} s", misbehaved=False, slow=True) from None


async def _read_payload(
    reader: asyncio.StreamReader, peer_id: str, length: int, floor_bytes_per_s: float = FLOOR_BYTES_PER_S,
    grace_s: float = FLOOR_GRACE_S,
) -> bytes:
    """`length` bytes, arriving at `floor_bytes_per_s` at least once `grace_s` passed: a
    peer that promised a large payload cannot hold the download (and the budget it takes,
    swarm.hivemind.downloads) by sending nothing, or a few bytes a second."""
    started = time.monotonic()
    parts: list[bytes] = []
    received = 0
    while received < length:
        due = started + grace_s + received / floor_bytes_per_s  # when more than `received` must be here
        try:
            # never a zero timeout: bytes already buffered must not be refused for a late wake-up
            chunk = await asyncio.wait_for(reader.read(min(CHUNK_BYTES, length - received)), max(0.05, due - time.monotonic()))
        except TimeoutError:
            raise FetchError(
                f"{peer_id} sent {received} of the {length} bytes it promised in {time.monotonic() - started:.1f} s, "
                f"below {floor_bytes_per_s / 1024:.0f} KiB/s", misbehaved=False, slow=True,
            ) from None
        if not chunk:
            raise FetchError(f"{peer_id} closed after {received} of the {length} bytes it promised", misbehaved=False, cut=True)
        parts.append(chunk)
        received += len(chunk)
    return b"".join(parts)


async def _bounded(download, peer_id: str, timeout_s: float):  # noqa: ANN001, ANN202
    """One download under a deadline, every failure a FetchError that says whose fault it is."""
    try:
        return await asyncio.wait_for(download, timeout_s)
    except TimeoutError:
        raise FetchError(f"no payload from {peer_id} within {timeout_s:.0f} s", misbehaved=False, slow=True) from None
    except (ConnectionError, asyncio.IncompleteReadError, OSError) as err:
        raise FetchError(f"connection to {peer_id} failed: {err}", misbehaved=False) from None
    except Exception as err:  # the daemon client reports an unreachable peer as ControlFailure
        if isinstance(err, FetchError):
            raise
        raise FetchError(f"cannot reach {peer_id}: {err}", misbehaved=False) from None


async def fetch_payload(
    p2p: P2P, peer_id: str, run_id: str, round_: int, size: int, digest: bytes, timeout_s: float
) -> Batch:
    """Download one payload whose size and digest the producer's manifest promised."""

    def judge(header: tuple[int, ...]) -> int:
        status, length = header
        if status == NOT_FOUND:
            raise FetchError(f"{peer_id} no longer holds round {round_}", misbehaved=False, gone=True)
        if status != OK or length != size:
            raise FetchError(f"{peer_id} sent status {status} and {length} bytes; its manifest promised {size}", misbehaved=True)
        return length

    _, payload = await _bounded(_request(p2p, peer_id, {"run": run_id, "round": round_}, ">BQ", judge), peer_id, timeout_s)
    if payload_digest(payload) != digest:
        raise FetchError(f"payload from {peer_id} does not match its signed digest", misbehaved=True)
    return Batch(round_, payload)


async def fetch_next(
    p2p: P2P, peer_id: str, run_id: str, after: int, max_bytes: int, timeout_s: float, behind: int = 0,
    admit: Admit | None = None,
) -> Batch | None:
    """Ask a peer directly for its next payload after round `after`: its oldest round after it
    at most `behind` of its rounds behind its newest (0: the newest); None when it has nothing
    newer. The stream authenticates the sender; a round not after `after` or a length above
    `max_bytes` is refused before the body is read, and so is a length `admit` (a budget that
    learns the length only from the header) has no room for."""

    def judge(header: tuple[int, ...]) -> int | None:
        status, round_, length = header
        if status == NOTHING_NEWER:
            return None
        if status == NOT_FOUND:  # a node of another run (a shared bootstrap node): no lie, no strike
            raise FetchError(f"{peer_id} serves another run", misbehaved=False)
        if status != OK or round_ <= after or not 0 < length <= max_bytes:
            raise FetchError(
                f"{peer_id} answered status {status}, round {round_} (asked after {after}), {length} bytes "
                f"(at most {max_bytes})", misbehaved=True,
            )
        if admit is not None and not admit(length):
            raise FetchError(f"no room now for {length} bytes from {peer_id}", misbehaved=False, no_room=True)
        return length

    request = {"run": run_id, "after": after, "behind": behind}
    (_, round_, _), payload = await _bounded(_request(p2p, peer_id, request, ">BQQ", judge), peer_id, timeout_s)
    return None if payload is None else Batch(round_, payload)


async def fetch_tokenizer(
    p2p: P2P, peer_id: str, run_id: str, digest: str, max_bytes: int = MAX_TOKENIZER_DOCUMENT_BYTES,
    timeout_s: float = TOKENIZER_FETCH_TIMEOUT_S,
) -> bytes:
    """The tokenizer document `digest` from the peer whose batch named it: at most `max_bytes`
    (a larger one is refused before it is read), within `timeout_s` and the floor rate, and
    bytes whose SHA-256 is `digest` (others are a lie: FetchError with misbehaved)."""

    def judge(header: tuple[int, ...]) -> int:
        status, length = header
        if status == NOT_FOUND:  # restarted with another tokenizer, say: not provably a lie
            raise FetchError(f"{peer_id} serves no tokenizer {digest[:16]}", misbehaved=False, gone=True)
        if status == NOTHING_NEWER:
            raise FetchError(f"{peer_id} will not serve its tokenizer to us now", misbehaved=False)
        if status != OK:
            raise FetchError(f"{peer_id} answered a tokenizer request with status {status}", misbehaved=True)
        if length > max_bytes:  # an honest peer may have a tokenizer this large: refused, not blamed
            raise FetchError(f"{peer_id} offers a tokenizer document of {length} bytes, above {max_bytes}", misbehaved=False)
        return length

    request = {"run": run_id, "tokenizer": digest}
    _, document = await _bounded(_request(p2p, peer_id, request, ">BQ", judge), peer_id, timeout_s)
    if tokenizer_document_digest(document) != digest:
        raise FetchError(f"{peer_id} served a tokenizer document that does not match the digest it named", misbehaved=True)
    return document


async def ask_whom(p2p: P2P, peer_id: str, run_id: str, timeout_s: float) -> list[tuple[str, list[str]]]:
    """Ask a peer whom it knows: up to MAX_INTRODUCTIONS (peer id, multiaddrs), unchecked
    claims; an empty list when it has no answer for us now. FetchError on a malformed answer."""

    def judge(header: tuple[int, ...]) -> int | None:
        status, length = header
        if status == NOTHING_NEWER:
            return None
        if status != OK or length > MAX_INTRODUCTION_BYTES:
            raise FetchError(f"{peer_id} answered 'whom' with status {status}, {length} bytes", misbehaved=True)
        return length

    async def ask() -> list[tuple[str, list[str]]]:
        _, body = await _request(p2p, peer_id, {"run": run_id, "whom": True}, ">BI", judge)
        return [] if body is None else introductions_of(msgpack.unpackb(body, raw=False, max_str_len=256), peer_id)

    return await _bounded(ask(), peer_id, timeout_s)


def introductions_of(raw: object, peer_id: str) -> list[tuple[str, list[str]]]:
    """The entries of a 'whom' answer, checked for shape and size (their truth is not)."""
    if not isinstance(raw, list) or len(raw) > MAX_INTRODUCTIONS:
        raise FetchError(f"{peer_id} sent a malformed list of peers", misbehaved=True)
    entries = []
    for entry in raw:
        valid = (
            isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], list)
            and len(entry[1]) <= MAX_ADDRS_PER_PEER and all(isinstance(a, str) for a in entry[1])
        )
        if not valid:
            raise FetchError(f"{peer_id} sent a malformed list of peers", misbehaved=True)
        try:
            PeerID.from_base58(entry[0])
        except Exception:  # base58 or multihash errors of a made-up id
            raise FetchError(f"{peer_id} introduced {entry[0][:60]!r}, not a peer id", misbehaved=True) from None
        entries.append((entry[0], list(entry[1])))
    return entries


async def answers(p2p: P2P, peer_id: str, run_id: str, timeout_s: float) -> float | None:
    """Seconds a peer took to answer a question only a live one answers ('anything after
    round 2^62?'), None when it did not: what a heartbeat claims, checked."""
    started = time.monotonic()
    try:
        await fetch_next(p2p, peer_id, run_id, NOTHING_AFTER, 1, timeout_s)
    except FetchError:
        return None
    return time.monotonic() - started
