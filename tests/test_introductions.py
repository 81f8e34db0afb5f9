"""Peer exchange takes names, never orders: what an introduction may make us dial, and how an
answer to 'whom do you know?' is checked."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgpack
import pytest

from swarmnode.swarm.hivemind import introductions as introductions_module
from swarmnode.swarm.hivemind.fetch import FetchError, introductions_of
from swarmnode.swarm.hivemind.introductions import Introductions, peer_of, scope_of, widest_scope, within
from swarmnode.swarm.hivemind.payloads import MAX_INTRODUCTIONS

PEER = "QmS3Wxqi78B4RQ5dJDt1UraQK87qXSJn2fuE4BtZS9gqCV"


def test_a_peer_on_the_internet_cannot_make_us_probe_our_own_network():
    assert [scope_of(a) for a in ("/ip4/127.0.0.1/tcp/1", "/ip4/192.168.1.5/tcp/1", "/ip4/8.8.8.8/tcp/1")] == [
        "loopback", "private", "global"]
    never = ["/ip4/169.254.169.254/tcp/80", "/dns4/example.org/tcp/1", "/ip4/224.0.0.1/tcp/1",
             f"/ip4/8.8.8.8/tcp/1/p2p/{PEER}/p2p-circuit", "/ip4/0.0.0.0/tcp/1", "/unix/tmp/x"]
    assert all(scope_of(a) is None for a in never)
    assert within("/ip4/8.8.8.8/tcp/1", "global") and not within("/ip4/192.168.1.5/tcp/1", "global")
    assert not within("/ip4/127.0.0.1/tcp/1", "private")
    assert within("/ip4/127.0.0.1/tcp/1", "loopback") and within("/ip4/10.0.0.1/tcp/1", "loopback")
    assert widest_scope(["/ip4/127.0.0.1/tcp/1", "/ip4/10.0.0.2/tcp/5"]) == "private"
    assert widest_scope([]) == "global", "an introducer we cannot place gets the narrowest trust"
    assert peer_of(f"/ip4/1.2.3.4/tcp/5/p2p/{PEER}") == PEER and peer_of("/ip4/1.2.3.4/tcp/5") is None


def test_an_answer_is_checked_for_shape_and_size_not_for_truth():
    raw = msgpack.unpackb(msgpack.packb([[PEER, ["/ip4/127.0.0.1/tcp/5"]]]), raw=False)
    assert introductions_of(raw, "p") == [(PEER, ["/ip4/127.0.0.1/tcp/5"])]
    bad = [
        [[PEER, ["/ip4/1.2.3.4/tcp/1"] * 5]],  # too many addresses for one name
        [[PEER]],
        [["not a peer id", []]],
        [[PEER, [1]]],
        {"peers": []},
        [[PEER, []]] * (MAX_INTRODUCTIONS + 1),
    ]
    for answer in bad:
        with pytest.raises(FetchError) as err:
            introductions_of(answer, "p")
        assert err.value.misbehaved, answer


def test_an_initial_peer_asked_before_it_delivered_is_asked_again_at_once_when_it_does(monkeypatch):
    """Asked as an initial peer before we downloaded from it, a peer introduces nobody (a
    crawler learns nothing); once it delivered, it is asked again at once, not a turn later."""
    monkeypatch.setattr(introductions_module, "time", SimpleNamespace(monotonic=lambda: 1000.0))  # no turn comes due
    runtime = SimpleNamespace(initial_peers=["/ip4/127.0.0.1/tcp/1/p2p/QmB"], peer_id="QmC", p2p=None)
    known: list[str] = []
    introductions = Introductions(runtime, "run", lambda: known)
    asked: list[str] = []

    async def ask(peer: str) -> list[tuple[str, list[str]]]:
        asked.append(peer)
        return [("QmA", [])] if peer in known else []

    async def dial(peer: str, addrs: list[str]) -> None:
        pass

    introductions._ask, introductions._dial = ask, dial
    asyncio.run(introductions.maybe_ask(anyone_delivered=False))
    asyncio.run(introductions.maybe_ask(anyone_delivered=False))  # not due again yet
    assert asked == ["QmB"] and introductions.candidates() == ["QmB"]
    known.append("QmB")  # it delivered a checked batch
    asyncio.run(introductions.maybe_ask(anyone_delivered=True))
    assert asked == ["QmB", "QmB"] and introductions.candidates() == ["QmA", "QmB"]
    asyncio.run(introductions.maybe_ask(anyone_delivered=True))
    assert len(asked) == 2, "then in turn, every WHOM_INTERVAL_S"
