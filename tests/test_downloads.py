"""A node's downloads on the swarm loop (swarmnode.swarm.hivemind.downloads): one per peer, a
typed result each, and what follows from it: kept, blamed, cut, retried or given up."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from swarmnode.loop.ledger import PeerLedger
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind import downloads as downloads_module
from swarmnode.swarm.hivemind import exchange as exchange_module
from swarmnode.swarm.hivemind.downloads import (
    KNOCK_PLACE_S,
    KNOCKS_IN_FLIGHT,
    KNOCKS_OPEN,
    MAX_FETCH_ATTEMPTS,
    Downloads,
)
from swarmnode.swarm.hivemind.fetch import Batch, FetchError

MIB = 1 << 20


async def _returns(result):
    return result


async def _raises(error: Exception):
    raise error


async def _settled(downloads: Downloads, peer: str, fetch, round_: int | None, promised: int | None = None) -> None:
    """Start one download and let it end."""
    downloads.start(peer, fetch, round_, promised)
    task = downloads.running[peer].task
    await asyncio.wait([task])
    await asyncio.sleep(0)  # its done-callback runs on the loop


def _downloads(ledger: PeerLedger | None = None) -> Downloads:
    return Downloads(ledger or PeerLedger(), 32 * MIB, max_strangers=64)


def test_a_batch_is_kept_until_handed_out_and_then_only_newer_rounds_are_wanted():
    async def scenario() -> None:
        downloads = _downloads()
        await _settled(downloads, "p", _returns(Batch(4, b"four")), None)
        assert downloads.after("p") == 4 and not downloads.wanted("p", 3), "arrived: an older round is not fetched"
        await _settled(downloads, "p", _returns(Batch(3, b"three")), 3)
        found = downloads.hand_out()
        assert [(item.peer_id, item.round) for item in found] == [("p", 3), ("p", 4)], "in order, each once"
        assert downloads.hand_out() == [] and downloads.newest["p"] == 4
        await _settled(downloads, "p", _returns(Batch(2, b"two")), 2)  # announced earlier, fetched late
        await _settled(downloads, "p", _returns(Batch(4, b"again")), None)
        assert downloads.hand_out() == [], "a round not after the newest handed out is dropped"
        await _settled(downloads, "p", _returns(None), None)
        assert downloads.ready == {}, "nothing newer: nothing kept"
        assert downloads.wanted("p", 5) and not downloads.running

    asyncio.run(scenario())


def test_the_newest_round_of_each_peer_is_kept_for_the_most_recent_peers_only(monkeypatch):
    """Names are free: past MAX_NEWEST_KEPT peers, the one whose newest round moved least
    recently is forgotten (asked again for anything newer than nothing), one that moved lately
    is not; failed tries of announced rounds are bounded the same way."""
    monkeypatch.setattr(downloads_module, "MAX_NEWEST_KEPT", 3)
    downloads = _downloads()
    for peer in ("old", "busy", "third"):
        downloads.handed_out(peer, 5)
    downloads.handed_out("busy", 6)
    downloads.handed_out("new", 1)
    assert list(downloads.newest) == ["third", "busy", "new"]
    assert downloads.after("old") == -1 and downloads.wanted("old", 5), "forgotten: fetched as a new peer's"
    assert downloads.after("busy") == 6 and not downloads.wanted("busy", 6)
    for peer in ("gone-1", "gone-2", "gone-3", "gone-4"):  # failed tries of names that left
        downloads._attempt(peer, 7)
    assert list(downloads.attempts) == [("gone-2", 7), ("gone-3", 7), ("gone-4", 7)], "the oldest tries go first"


def test_bad_bytes_are_blamed_a_cut_is_not_and_neither_is_retried():
    async def scenario() -> None:
        ledger = PeerLedger()
        downloads = _downloads(ledger)
        await _settled(downloads, "liar", _raises(FetchError("bad digest", misbehaved=True)), 7, MIB)
        assert ledger.counts["liar"] == 1 and not downloads.wanted("liar", 7), "a strike, and the round given up"
        ledger.delivered("cutter")
        await _settled(downloads, "cutter", _raises(FetchError("closed", misbehaved=False, cut=True)), 3, MIB)
        assert ledger.counts["cutter"] == 0 and ledger.has_cut("cutter") and not downloads.wanted("cutter", 3)

    asyncio.run(scenario())


def test_an_unreachable_round_is_tried_a_few_times_then_given_up_without_blame():
    async def scenario() -> None:
        ledger = PeerLedger()
        downloads = _downloads(ledger)
        for attempt in range(MAX_FETCH_ATTEMPTS):
            assert downloads.wanted("far", 9), attempt
            await _settled(downloads, "far", _raises(FetchError("cannot reach", misbehaved=False)), 9, MIB)
        assert not downloads.wanted("far", 9) and downloads.wanted("far", 10)
        assert ledger.counts["far"] == 0, "unreachable is no lie"
        assert downloads.backoff.waiting("far", time.monotonic()), "a stranger that wasted its place waits"
        await _settled(downloads, "odd", _raises(RuntimeError("a bug")), 2, MIB)
        assert downloads.attempts[("odd", 2)] == 1, "any failure of an announced round counts as a try"

    asyncio.run(scenario())


def test_a_stranger_whose_download_wasted_its_place_waits_and_a_known_peer_does_not():
    async def scenario() -> None:
        ledger = PeerLedger()
        ledger.delivered("friend")
        downloads = _downloads(ledger)
        slow = FetchError("below the floor", misbehaved=False, slow=True)
        await _settled(downloads, "stranger", _raises(slow), None, 32 * MIB)
        await _settled(downloads, "friend", _raises(slow), None)
        assert downloads.backoff.waiting("stranger", time.monotonic())
        assert not downloads.backoff.waiting("friend", time.monotonic())
        await _settled(downloads, "stranger", _returns(Batch(0, b"x")), None, 32 * MIB)
        assert not downloads.backoff.waiting("stranger", time.monotonic()), "a delivery ends it"

    asyncio.run(scenario())


def test_one_download_a_peer_and_strangers_bounded_by_promised_bytes_a_knock_once_it_names_a_length():
    async def scenario() -> None:
        ledger = PeerLedger()
        ledger.delivered("friend")
        downloads = _downloads(ledger)
        hold = asyncio.Event()

        async def held():
            await hold.wait()
            return None

        downloads.start("friend", held(), None, None)  # a known peer's pull: outside the strangers' budget
        downloads.start("s1", held(), 0, 32 * MIB)
        assert downloads.busy("friend") and downloads.busy("s1") and not downloads.busy("s2")
        assert downloads.room_for_knock(), "one max-size promise of two: room to knock"
        downloads.start("k1", held(), None, 0)  # a knock: no bytes held until its header
        downloads.start("s2", held(), 0, 32 * MIB)
        assert downloads.admit("friend", 32 * MIB), "a known peer's pull needs no room"
        assert not downloads.room_for_knock(), "two max-size promises: an answer could not be taken, so no knock"
        assert not downloads.admit("k1", 1), "two max-size promises: the budget has no room for a byte more"
        assert not downloads.admit("nobody", 1), "a download not running is not admitted"
        downloads.cancel_all()
        assert downloads.running == {}
        downloads.start("k1", held(), None, 0)
        assert downloads.admit("k1", 32 * MIB) and downloads.promises()["k1"] == 32 * MIB, "the length it named is held"
        assert not downloads.admit("k1", 64 * MIB + 1), "past the budget, even alone"
        downloads.cancel_all()
        hold.set()

    asyncio.run(scenario())


def test_a_silent_knock_holds_a_place_for_a_second_and_a_stream_within_a_bound():
    async def scenario() -> None:
        ledger = PeerLedger()
        downloads = _downloads(ledger)
        hold = asyncio.Event()

        async def held():
            await hold.wait()
            return None

        def age_every_knock() -> None:
            for download in downloads.running.values():
                download.started -= KNOCK_PLACE_S

        for n in range(KNOCKS_IN_FLIGHT):
            assert downloads.room_for_knock(), n
            downloads.start(f"hog{n}", held(), None, 0)
        assert not downloads.room_for_knock(), "KNOCKS_IN_FLIGHT silent strangers: no further knock this second"
        age_every_knock()
        assert downloads.room_for_knock(), "a knock holds its place only for its first second"
        for n in range(KNOCKS_IN_FLIGHT, KNOCKS_OPEN):
            downloads.start(f"hog{n}", held(), None, 0)
            age_every_knock()
        assert not downloads.room_for_knock(), "KNOCKS_OPEN knocks waiting for their header: no further one"
        assert downloads.admit("hog0", 1000)
        assert downloads.room_for_knock(), "an answered knock waits no longer"
        ledger.delivered("hog1")
        assert downloads.admit("hog1", 64 * MIB + 1), "delivered meanwhile: outside the strangers' budget"
        downloads.cancel_all()
        no_room = FetchError("no room now", misbehaved=False, no_room=True)
        await _settled(downloads, "newcomer", _raises(no_room), None, 0)
        assert not downloads.backoff.waiting("newcomer", time.monotonic()), "our budget was full: its fault in nothing"
        hold.set()

    asyncio.run(scenario())


def test_the_exchange_knocks_on_a_stranger_with_our_budget_and_pulls_a_known_peer_outside_it(monkeypatch):
    asked: dict[str, dict] = {}
    hold = asyncio.Event()

    async def recorded(p2p, peer, run_id, after, max_bytes, timeout_s, **kwargs):  # noqa: ANN001
        asked[peer] = {"timeout_s": timeout_s, **kwargs}
        await hold.wait()  # running until the end of the test
        return None

    monkeypatch.setattr(exchange_module, "fetch_next", recorded)

    async def scenario() -> None:
        ledger = PeerLedger()
        for peer in ("friend", "useful"):
            ledger.delivered(peer)
        ledger.screened("useful", 8, 8, 0)
        exchange = object.__new__(exchange_module.HivemindExchange)  # only what _ask_directly reads
        exchange.downloads = _downloads(ledger)
        exchange.settings = SwarmSettings()
        exchange.runtime = SimpleNamespace(p2p=None)
        exchange.run_id, exchange.max_payload_bytes, exchange.catch_up_rounds = "run", 32 * MIB, 1
        exchange.ledger = ledger
        exchange._ask_directly(["friend", "useful", "stranger"], strangers={"stranger"})
        assert exchange.downloads.promises() == {"friend": None, "useful": None, "stranger": 0}, (
            "a knock holds no bytes yet"
        )
        await asyncio.sleep(0)
        assert asked["friend"]["admit"] is None and asked["friend"]["timeout_s"] == SwarmSettings().fetch_timeout_s
        assert asked["useful"]["behind"] == 1, "a peer proven useful catches up on the rounds it may be behind"
        assert asked["friend"]["behind"] == asked["stranger"]["behind"] == 0, "the others: their newest"
        assert asked["stranger"]["timeout_s"] == exchange_module.STRANGER_PULL_TIMEOUT_S
        assert asked["stranger"]["admit"](1000) and exchange.downloads.promises()["stranger"] == 1000, (
            "the length its answer names is held against the strangers' budget"
        )
        exchange.downloads.cancel_all()
        hold.set()

    asyncio.run(scenario())
