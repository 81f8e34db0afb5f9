"""The payload protocol between two nodes (`swarmnode/swarm/hivemind/payloads.py`, `fetch.py`):
payloads and tokenizer documents served and fetched, and what a requester's streams may hold.

Real p2p daemons on 127.0.0.1 (tests/conftest.py's `start_runtime`); no test here times
anything: each waits for the event that shows the behaviour (tests/swarm_helpers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import threading
import time
from types import SimpleNamespace

import msgpack
import pytest
from hivemind.p2p import PeerID

from swarmnode.loop.ledger import PeerLedger
from swarmnode.protocol.records import tokenizer_document_digest
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.base import GatherWait
from swarmnode.swarm.hivemind import exchange as exchange_module
from swarmnode.swarm.hivemind import fetch, payloads
from swarmnode.swarm.hivemind.dht import payload_digest
from swarmnode.swarm.hivemind.fetch import fetch_payload
from swarmnode.swarm.hivemind.payloads import MAX_STREAMS_PER_PEER, PAYLOAD_PROTOCOL, PayloadServer
from tests.conftest import PATIENT_REQUEST_S
from tests.swarm_helpers import EVENT_TIMEOUT_S, RUN, link, wait_until


@pytest.mark.parametrize("size_mb", [2, 20])
def test_payloads_travel_peer_to_peer(start_runtime, monkeypatch, size_mb):
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ex_a, ex_b = link(a).exchange, link(b).exchange
    payload = os.urandom(size_mb << 20)
    ex_a.publish(0, payload, tokens=len(payload) // 8)
    got = ex_b.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={a.peer_id}))
    assert [(g.peer_id, g.round) for g in got] == [(a.peer_id, 0)]
    assert got[0].payload == payload
    assert ex_b.gather(GatherWait(timeout_s=0.5)) == [], "each batch is handed out once"
    # linger: a finishing node keeps serving until its peers have its batch, and no longer
    wait_until(lambda: b.peer_id in ex_a.server.served_to.get(0, ()), "a to record that b downloaded round 0")
    pauses: list[float] = []  # linger's pauses between its checks (each a poll interval)
    counted = SimpleNamespace(monotonic=time.monotonic, sleep=lambda s: pauses.append(s) or time.sleep(s))
    monkeypatch.setattr(exchange_module, "time", counted)
    ex_a.linger(0, {b.peer_id}, timeout_s=EVENT_TIMEOUT_S)
    assert pauses == [], "b fetched it: a finishing node need not wait, not even a poll"
    started = time.monotonic()
    ex_a.linger(0, {b.peer_id, "QmNobody"}, timeout_s=0.5)
    assert time.monotonic() - started >= 0.5 and pauses, "a peer that never fetched it: waited for until the deadline"


def test_a_tokenizer_document_is_fetched_once_checked_against_its_digest_and_bounded_in_size_and_time(
    start_runtime, monkeypatch
):
    monkeypatch.setattr(payloads, "TOKENIZER_EVERY_S", 0.0)  # each of this test's requests answered
    monkeypatch.setattr(payloads, "FLOOR_GRACE_S", 600.0)  # the server never gives up on an answer first (below)
    server_side = start_runtime("server")
    asker = start_runtime("asker", server_side.visible_maddrs())
    ledger = PeerLedger(SwarmSettings(max_rejects=10))
    ex = link(asker, ledger=ledger).exchange
    served = link(server_side).exchange
    document = os.urandom(300_000)
    digest = tokenizer_document_digest(document)
    served.offer_tokenizer(digest, document)
    with pytest.raises(fetch.FetchError, match="not serve its tokenizer to us now"):  # a stranger that never read our batch: not now
        asker.call(fetch.fetch_tokenizer(asker.p2p, server_side.peer_id, RUN, digest), timeout=EVENT_TIMEOUT_S)
    served.publish(0, b"a batch", tokens=1)
    assert [g.round for g in ex.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={server_side.peer_id}))] == [0]
    ex.want_tokenizer(server_side.peer_id, digest)  # as a node does on reading a batch in a tokenizer it lacks
    assert wait_until(ex.tokenizers, "the tokenizer document to be fetched") == [(digest, document)]
    requests = []
    real_serve = served.server._serve_tokenizer

    async def counting(*args):
        requests.append(args[2])
        await real_serve(*args)

    served.server._serve_tokenizer = counting
    last_fetch = ex.tokenizer_fetcher._task
    ex.want_tokenizer(server_side.peer_id, digest)  # named again by a later batch: cached, not fetched
    asker.call(asyncio.sleep(0), timeout=EVENT_TIMEOUT_S)  # the want, queued on the swarm loop before this, is handled
    assert ex.tokenizer_fetcher._task is last_fetch, "no new fetch started"
    assert ex.tokenizers() == [] and requests == []
    # other bytes under a digest: refused, and a strike (the stream binds the bytes to their sender)
    promised = tokenizer_document_digest(b"promised")
    served.offer_tokenizer(promised, b"other bytes")
    ex.want_tokenizer(server_side.peer_id, promised)
    wait_until(lambda: ledger.counts[server_side.peer_id] > 0, "a strike for the wrong bytes")
    assert ledger.counts[server_side.peer_id] == 1 and ex.tokenizers() == [] and requests == [promised]
    # larger than the receiver takes: refused before it is read, no strike (an honest one may be large)
    with pytest.raises(fetch.FetchError, match="above 1000") as refused:
        asker.call(
            fetch.fetch_tokenizer(asker.p2p, server_side.peer_id, RUN, digest, max_bytes=1000), timeout=EVENT_TIMEOUT_S
        )
    assert not refused.value.misbehaved
    # a peer that never answers costs the fetch its own deadline only: the fetch gives up while
    # the server is still silent (it would stay so far longer than the fetch's deadline)
    silence = {"began": threading.Event(), "ended": False}

    async def silent(*args):
        silence["began"].set()
        try:
            await asyncio.sleep(3600)
        finally:
            silence["ended"] = True

    served.server._serve_tokenizer = silent
    with pytest.raises(fetch.FetchError) as stalled:
        asker.call(
            fetch.fetch_tokenizer(asker.p2p, server_side.peer_id, RUN, digest, timeout_s=1.0), timeout=EVENT_TIMEOUT_S
        )
    assert stalled.value.slow and not stalled.value.misbehaved
    assert silence["began"].is_set() and not silence["ended"], "given up on while the server was still silent"
    assert ledger.counts[server_side.peer_id] == 1


def test_the_announced_round_stays_served_however_many_rounds_follow():
    server = PayloadServer(RUN, keep_rounds=3)
    for r in range(10):
        server.put(r, f"round {r}".encode())
        if r == 2:
            server.pin(2)
    assert sorted(server._payloads) == [2, 7, 8, 9], "the pinned round and the 3 newest"
    server.pin(9)
    server.settle_pin(9, stored=True)  # the DHT now names round 9, not round 2
    server.put(10, b"round 10")
    assert sorted(server._payloads) == [7, 8, 9, 10], "round 2, no longer pinned, goes as any other"
    server.pin(10)
    server.settle_pin(10, stored=False)  # the DHT still names round 9
    for r in (11, 12, 13):
        server.put(r, f"round {r}".encode())
    assert sorted(server._payloads) == [9, 11, 12, 13], "a failed store leaves the older pin"


async def _streams_of(server, requester: str) -> tuple[int, int]:
    """The requester's streams the server holds now: (served, waiting for a request; held unread)."""
    return server._open.get(requester, 0), server._held.get(requester, 0)


async def _open_silent_streams(runtime, peer_id: str, count: int) -> tuple[int, list]:
    """Open `count` streams to `peer_id`'s payload handler and say nothing; how many could not
    be opened (a dropped connection), and the streams (kept by the caller: a collected writer
    closes its stream)."""
    streams, refused = [], 0
    for _ in range(count):
        try:
            streams.append(await runtime.p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), PAYLOAD_PROTOCOL))
        except Exception:  # its connection was dropped: the stream never opened
            refused += 1
    return refused, streams


async def _closed(streams: list) -> int:
    return sum(reader.at_eof() or bool(reader.exception()) for _, reader, _ in streams)


def test_idle_payload_streams_from_one_identity_block_no_one(start_runtime, monkeypatch):
    """An identity that opens many streams and says nothing holds MAX_STREAMS_PER_PEER of them
    (for REQUEST_TIMEOUT_S at most), the rest held unread, and no serving slot: an honest
    download goes straight through, while the idle streams still hold their places."""
    monkeypatch.setattr(payloads, "REQUEST_TIMEOUT_S", 600.0)  # the idle ones outlast the test: no race with it
    a = start_runtime("a")
    rogue = start_runtime("rogue", a.visible_maddrs())
    b = start_runtime("b", a.visible_maddrs())
    ex_a = link(a).exchange
    payload = b"E" * 100
    ex_a.publish(0, payload, 1)
    refused, idle = rogue.call(_open_silent_streams(rogue, a.peer_id, 16), timeout=EVENT_TIMEOUT_S)
    assert refused == 0 and len(idle) == 16
    wait_until(
        lambda: a.call(_streams_of(ex_a.server, rogue.peer_id), timeout=10) == (MAX_STREAMS_PER_PEER, 16 - MAX_STREAMS_PER_PEER),
        f"the server to take {MAX_STREAMS_PER_PEER} idle streams and hold the rest unread",
    )
    fetched = b.call(
        fetch_payload(b.p2p, a.peer_id, RUN, 0, len(payload), payload_digest(payload), EVENT_TIMEOUT_S),
        timeout=EVENT_TIMEOUT_S + 10,
    )
    assert fetched == fetch.Batch(0, payload)
    assert a.call(_streams_of(ex_a.server, rogue.peer_id), timeout=10)[0] == MAX_STREAMS_PER_PEER, (
        "served while every idle stream still held its place"
    )


def test_a_stream_that_says_nothing_is_closed_after_the_request_timeout_and_frees_its_place(start_runtime, monkeypatch):
    """The timer the other tests here stretch (tests/conftest.py): a stream whose request does
    not come within REQUEST_TIMEOUT_S is closed, and the requester's places are free again."""
    a = start_runtime("a")
    rogue = start_runtime("rogue", a.visible_maddrs())
    ex_a = link(a).exchange
    payload = b"F" * 100
    ex_a.publish(0, payload, 1)
    monkeypatch.setattr(payloads, "REQUEST_TIMEOUT_S", 0.5)
    refused, idle = rogue.call(_open_silent_streams(rogue, a.peer_id, MAX_STREAMS_PER_PEER), timeout=EVENT_TIMEOUT_S)
    assert refused == 0
    wait_until(lambda: rogue.call(_closed(idle), timeout=10) == MAX_STREAMS_PER_PEER, "every silent stream closed by the server")
    assert a.call(_streams_of(ex_a.server, rogue.peer_id), timeout=10) == (0, 0), "its places freed"
    monkeypatch.setattr(payloads, "REQUEST_TIMEOUT_S", PATIENT_REQUEST_S)  # the fetch below is not about the timer
    fetched = rogue.call(
        fetch_payload(rogue.p2p, a.peer_id, RUN, 0, len(payload), payload_digest(payload), EVENT_TIMEOUT_S),
        timeout=EVENT_TIMEOUT_S + 10,
    )
    assert fetched == fetch.Batch(0, payload), "served again once its silent streams are gone"


def test_streams_over_the_limit_are_held_not_closed_so_reopening_them_gains_nothing(start_runtime, monkeypatch):
    """Closing a stream over a requester's limit at once let one identity re-open sixteen in a
    loop, a stream a moment (4x the honest round): they are held unread for TARPIT_S instead,
    and past MAX_HELD_PER_PEER the requester's connection is dropped."""
    monkeypatch.setattr(payloads, "MAX_HELD_PER_PEER", 8)
    monkeypatch.setattr(payloads, "REQUEST_TIMEOUT_S", 600.0)  # served ones stay open meanwhile
    monkeypatch.setattr(payloads, "TARPIT_S", 600.0)  # so does every held one: any stream closed is closed at once
    a = start_runtime("a")
    rogue = start_runtime("rogue", a.visible_maddrs())
    ex_a = link(a).exchange
    refused, first = rogue.call(_open_silent_streams(rogue, a.peer_id, MAX_STREAMS_PER_PEER + 8), timeout=EVENT_TIMEOUT_S)
    assert refused == 0 and len(first) == MAX_STREAMS_PER_PEER + 8, "all of the first ones opened"
    wait_until(
        lambda: a.call(_streams_of(ex_a.server, rogue.peer_id), timeout=10) == (MAX_STREAMS_PER_PEER, 8),
        "the server to serve 4 of the streams and hold the 8 over the limit",
    )
    assert ex_a.server.tarpitted == 8
    assert rogue.call(_closed(first), timeout=10) == 0, "over the limit, held: nothing to re-open"
    # past the held cap the next one is closed at once and the connection dropped, which resets its
    # served streams too: what it opens after reconnecting is served (and judged) afresh
    refused, more = rogue.call(_open_silent_streams(rogue, a.peer_id, 4), timeout=EVENT_TIMEOUT_S)
    wait_until(lambda: refused + rogue.call(_closed(more), timeout=10) >= 1, "past the held cap: a stream closed at once")
    wait_until(lambda: a.call(_dropped(ex_a.server), timeout=10) == {rogue.peer_id}, "the rogue's connection dropped")


async def _dropped(server) -> set[str]:
    return set(server._dropped_at)


@pytest.mark.parametrize(
    "request_,status,round_",
    [
        ({"run": RUN, "after": -1}, payloads.OK, 2),  # the newest
        ({"run": RUN, "after": -1, "behind": 1}, payloads.OK, 1),  # the oldest at most 1 behind the newest
        ({"run": RUN, "after": 0, "behind": 5}, payloads.OK, 1),  # the next after the asker's
        ({"run": RUN, "after": -1, "behind": -1}, payloads.OK, 2),  # not a count of rounds: the newest
        ({"run": RUN, "after": -1, "behind": True}, payloads.OK, 2),
        ({"run": RUN, "after": -1, "behind": 10**9}, payloads.OK, 2),  # above MAX_BEHIND: the newest
        ({"run": RUN, "after": 2}, payloads.NOTHING_NEWER, 0),
        ({"run": RUN, "after": 2**63}, payloads.NOTHING_NEWER, 0),
        # other runs are not served, and told so apart from 'nothing newer': a node of another
        # run (a shared bootstrap node) never counts as a peer of ours for min_peers
        ({"run": "another run", "after": -1}, payloads.NOT_FOUND, 0),
        ({"run": RUN, "after": "zero"}, payloads.NOT_FOUND, None),  # not a round: asked as neither
        ({"run": RUN, "after": None, "round": 1}, payloads.OK, None),
    ],
)
def test_odd_direct_pull_requests_get_a_plain_answer(start_runtime, request_, status, round_):
    server_side = start_runtime("server")
    asker = start_runtime("asker", server_side.visible_maddrs())
    server = PayloadServer(RUN, keep_rounds=5)
    server_side.call(server.register(server_side.p2p), timeout=10)
    for r in range(3):
        server.put(r, f"round {r}".encode())

    async def ask() -> tuple[int, int | None]:
        _, reader, writer = await asker.p2p.call_binary_stream_handler(
            PeerID.from_base58(server_side.peer_id), PAYLOAD_PROTOCOL
        )
        packed = msgpack.packb(request_)
        writer.write(struct.pack(">I", len(packed)) + packed)
        await writer.drain()
        if isinstance(request_.get("after"), int):
            answer, rnd, _ = struct.unpack(">BQQ", await reader.readexactly(17))
            return answer, rnd
        answer, _ = struct.unpack(">BQ", await reader.readexactly(9))
        return answer, None

    answer, rnd = asker.call(ask(), timeout=EVENT_TIMEOUT_S)
    assert answer == status and (round_ is None or rnd == round_)


def test_a_node_of_another_run_answers_no_liveness_probe_and_earns_no_strike(start_runtime):
    other_run = start_runtime("other")
    asker = start_runtime("asker", other_run.visible_maddrs())
    server = PayloadServer("another run", keep_rounds=5)
    other_run.call(server.register(other_run.p2p), timeout=10)
    assert asker.call(fetch.answers(asker.p2p, other_run.peer_id, RUN, 30.0), timeout=EVENT_TIMEOUT_S) is None
    with pytest.raises(fetch.FetchError) as refused:
        asker.call(fetch.fetch_next(asker.p2p, other_run.peer_id, RUN, -1, 1 << 20, 30.0), timeout=EVENT_TIMEOUT_S)
    assert not refused.value.misbehaved
    assert asker.call(fetch.answers(asker.p2p, other_run.peer_id, "another run", 30.0), timeout=EVENT_TIMEOUT_S) is not None


def test_a_knock_asks_our_budget_for_the_length_the_header_names_before_reading_the_body(start_runtime):
    """A stranger's answer names 1000 bytes and then sends nothing: refused at its header, at
    once, when our budget has no room (not after waiting for a body); read whole when it has."""
    stalling = start_runtime("stalling")
    asker = start_runtime("asker", stalling.visible_maddrs())

    async def header_then_silence(info, reader, writer) -> None:  # noqa: ANN001
        await payloads._read_request(reader)
        writer.write(struct.pack(">BQQ", payloads.OK, 0, 1000))
        await writer.drain()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
        writer.close()

    stalling.call(stalling.p2p.add_binary_stream_handler(PAYLOAD_PROTOCOL, header_then_silence), timeout=10)
    offered: list[int] = []

    def no_room(length: int) -> bool:
        offered.append(length)
        return False

    started = time.monotonic()
    with pytest.raises(fetch.FetchError) as refused:
        asker.call(fetch.fetch_next(asker.p2p, stalling.peer_id, RUN, -1, 1 << 20, 30.0, admit=no_room),
                   timeout=EVENT_TIMEOUT_S)
    assert offered == [1000] and refused.value.no_room and not refused.value.misbehaved
    assert time.monotonic() - started < payloads.FLOOR_GRACE_S, "refused at the header, not after the body's grace"

    server_side = start_runtime("server", stalling.visible_maddrs())
    server = PayloadServer(RUN, keep_rounds=5)
    server_side.call(server.register(server_side.p2p), timeout=10)
    server.put(0, b"x" * 1000)
    batch = asker.call(fetch.fetch_next(asker.p2p, server_side.peer_id, RUN, -1, 1 << 20, 30.0,
                                        admit=lambda length: True), timeout=EVENT_TIMEOUT_S)
    assert batch.round == 0 and batch.payload == b"x" * 1000


def test_a_direct_pull_catches_up_round_by_round_within_the_asker_s_staleness():
    """A peer pulled directly published rounds 4 to 7 since our last (3): with a staleness of 1
    we take 6 (7 would make 6 too stale to train on, 4 and 5 are already), then 7; with 0 the
    newest, as before."""
    newer = [4, 5, 6, 7]
    assert payloads.next_round(newer, 1) == 6 and payloads.next_round([7], 1) == 7
    assert payloads.next_round(newer, 0) == 7 and payloads.next_round(newer, None) == 7
    assert payloads.next_round(newer, payloads.MAX_BEHIND) == 4
