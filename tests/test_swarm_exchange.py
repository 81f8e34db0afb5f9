"""The rollout exchange over hivemind (`swarmnode/swarm/hivemind/exchange.py`, `announcer.py`):
whom a node asks for batches and when, what a hung or slow DHT costs it, and how its
manifests are announced.

Real p2p daemons and DHT nodes on 127.0.0.1 (tests/conftest.py's `start_runtime`). Nothing
here is timed: a test waits for the event that shows the behaviour, counts the polls that
actually ran (the exchange's `_polls`), and shows that something does not wait on a stalled
DHT by checking that it returned while the DHT call was still stalled (tests/swarm_helpers.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
import threading
import time
from collections import Counter

import msgpack

from swarmnode.loop.ledger import PeerLedger
from swarmnode.loop.pool import HOLD_ROUNDS, OfferedGroup, PeerPool
from swarmnode.swarm.base import GatherWait
from swarmnode.swarm.hivemind import exchange as exchange_module
from swarmnode.swarm.hivemind import payloads
from swarmnode.swarm.hivemind.dht import Manifest
from swarmnode.swarm.hivemind.exchange import StruckOnce, choose_pull_set, direct_pulls
from swarmnode.swarm.hivemind.handover import HandOut
from swarmnode.swarm.hivemind.payloads import PAYLOAD_PROTOCOL
from swarmnode.swarm.hivemind.shards import manifest_family
from tests.swarm_helpers import (
    EVENT_TIMEOUT_S,
    RUN,
    gather_until,
    hangs,
    link,
    pulls_ended,
    wait_for_polls,
    wait_until,
)


def _returns(call, what: str) -> None:
    """Run `call` in a thread and fail the test if it does not return: a call that must not
    wait on a stalled DHT call would otherwise hang the test rather than fail it."""
    returned = threading.Event()
    threading.Thread(target=lambda: (call(), returned.set()), daemon=True).start()
    assert returned.wait(EVENT_TIMEOUT_S), f"{what} never returned"


def test_a_dht_lookup_that_never_answers_costs_a_gather_its_deadline_only(start_runtime, monkeypatch, caplog):
    """A gather that waits for a peer ends at its own deadline while the DHT lookup that would
    find that peer hangs (for good here), and the exchange finds the peer once the DHT answers."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ex_a, ex_b = link(a).exchange, link(b).exchange
    ex_a.live_peers = tuple  # b is found through its manifest only, not through its heartbeat ...
    ex_a.met_directly = list  # ... nor because it asked a, its initial peer, for batches
    monkeypatch.setattr(exchange_module, "LOOKUP_TIMEOUT_S", 3600.0)  # a lookup that hangs, hangs till released
    real_get = a.dht.get_many
    release = asyncio.Event()  # set on a's loop: the DHT answers again
    stalled = threading.Event()

    async def stalls(keys, *args, **kwargs):
        if any(key.startswith(manifest_family(RUN)) for key in keys):
            stalled.set()
        await release.wait()
        return await real_get(keys, *args, **kwargs)

    monkeypatch.setattr(a.dht, "get_many", stalls)
    # b publishes only once nothing started before the patches can still bring its batch: a
    # lookup through the stalled DHT has begun (the exchange runs one lookup at a time, so none
    # through the real DHT is in flight), and no pull started before them is in flight
    assert stalled.wait(EVENT_TIMEOUT_S), "a's lookup for manifests never reached the DHT"
    pulls_ended(a, ex_a)
    ex_b.publish(0, b"D" * 100, 1)
    with caplog.at_level(logging.WARNING, logger=exchange_module.__name__):
        assert ex_a.gather(GatherWait(timeout_s=1.0, wait_for={b.peer_id})) == []
    assert "past its deadline" not in caplog.text, "the gather waited on the lookup (it ran into its grace)"
    assert not ex_a._lookup.done(), "the gather ended at its deadline while the lookup still hung"
    a.loop.call_soon_threadsafe(release.set)  # the DHT answers again: so does the exchange
    got = ex_a.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))
    assert [item.payload for item in got] == [b"D" * 100]


def test_peers_with_a_delivery_record_are_pulled_directly_while_the_dht_hangs(start_runtime, monkeypatch):
    """Once a peer delivered, its newer batches are asked of it directly every poll: a DHT
    that stops answering (or a flood under the run's keys) does not touch that exchange."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ledger = PeerLedger()
    ex_a, ex_b = link(a, ledger=ledger).exchange, link(b).exchange
    ex_b.publish(0, b"found in the DHT", 1)
    got = ex_a.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))
    assert [i.payload for i in got] == [b"found in the DHT"]
    ledger.delivered(b.peer_id)  # what the node's intake records for a valid batch
    for _ in range(ledger.max_missed):  # a slower peer: waited for in vain, no longer waited for
        ledger.missed(b.peer_id)
    assert not ledger.earned(b.peer_id)
    assert ex_a.pull_set() == [b.peer_id], "late is no reason to stop asking"
    monkeypatch.setattr(a.dht, "get_many", hangs)
    for round_ in (1, 2):
        ex_b.publish(round_, f"direct {round_}".encode(), 1)
        got = ex_a.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))
        assert [(i.round, i.payload) for i in got] == [(round_, f"direct {round_}".encode())]
    wait_for_polls(ex_a, 4, "asking b again")
    assert ex_a.gather(GatherWait(timeout_s=1, wait_for={b.peer_id})) == [], "nothing newer: nothing handed out twice"


def test_a_slow_dht_lookup_does_not_hold_up_the_direct_pulls(start_runtime, monkeypatch):
    """The background poller asks known peers every poll while a DHT lookup for new peers
    hangs beside it: each of b's newer batches reaches a while one lookup hangs throughout
    (for good here: a real one gives up after LOOKUP_TIMEOUT_S), and without a round waiting
    for it (discovery runs non-stop)."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ledger = PeerLedger()
    ex_a = link(a, RUN, ledger, "swarm.discovery_interval_s=0.01").exchange
    ex_b = link(b).exchange
    ex_b.publish(0, b"found in the DHT", 1)
    got = ex_a.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))
    assert [i.payload for i in got] == [b"found in the DHT"]
    ledger.delivered(b.peer_id)
    ledger.screened(b.peer_id, 8, 4, 0)  # useful: asked every poll
    monkeypatch.setattr(exchange_module, "LOOKUP_TIMEOUT_S", 3600.0)
    manifest_reads: list[int] = []

    async def hangs_counted(keys, *args, **kwargs):
        if any(key.startswith(manifest_family(RUN)) for key in keys):
            manifest_reads.append(1)
        await asyncio.sleep(3600)

    monkeypatch.setattr(a.dht, "get_many", hangs_counted)
    wait_until(lambda: manifest_reads, "a lookup for manifests to hang")
    hanging = ex_a._lookup
    for round_ in (1, 2, 3):
        ex_b.publish(round_, f"direct {round_}".encode(), 1)
        got = gather_until(ex_a, lambda got, r=round_: r in got, f"round {round_}", GatherWait(timeout_s=0.1))
        assert got == {round_: f"direct {round_}".encode()}
    assert ex_a._lookup is hanging and not hanging.done() and len(manifest_reads) == 1, (
        "every batch came while one lookup hung"
    )


def test_a_peer_seen_in_heartbeats_is_pulled_directly_while_its_manifests_stay_hidden(start_runtime, monkeypatch):
    """A new peer is found from the run's heartbeats as well as from manifests: with every DHT
    lookup of node a hanging (its manifests never found), b's batch still arrives once a
    has seen b's heartbeat, and not before."""
    hub = start_runtime("hub")  # both join through a third node: neither talks to the other first
    a = start_runtime("a", hub.visible_maddrs())
    b = start_runtime("b", hub.visible_maddrs())
    ex_a, ex_b = link(a).exchange, link(b).exchange
    seen: list[str] = []
    ex_a.live_peers = lambda: seen
    ex_a.met_directly = list  # b, which sees a's heartbeat, asks a for batches: not this path
    stalled = threading.Event()

    async def hangs_seen(keys, *args, **kwargs):
        if any(key.startswith(manifest_family(RUN)) for key in keys):
            stalled.set()
        await hangs()

    monkeypatch.setattr(a.dht, "get_many", hangs_seen)
    # as in the first test: no lookup through the real DHT, nor a pull from before, in flight
    assert stalled.wait(EVENT_TIMEOUT_S), "a's lookup for manifests never reached the DHT"
    pulls_ended(a, ex_a)
    ex_b.publish(0, b"heard of by heartbeat", 1)
    wait_for_polls(ex_a, 6, "with b unheard of")
    assert ex_a.gather(GatherWait(timeout_s=0.5, wait_for={b.peer_id})) == [], "no manifest, no heartbeat: not found"
    seen.append(b.peer_id)
    got = ex_a.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))
    assert [i.payload for i in got] == [b"heard of by heartbeat"]


def test_peers_not_proven_useful_are_asked_a_few_a_poll_in_turn():
    """Identities that deliver junk cost few requests: every useful peer is asked each poll,
    the rest two a poll in turn, so each of sixteen is still asked every eighth poll, and one
    or two (an honest peer whose batch taught nothing) every poll."""
    junk = [f"junk{i}" for i in range(16)]
    standing = {"useful": 0.4, "new": None, **dict.fromkeys(junk, 0.0)}
    pull_set = ["useful", "new", *junk]
    asked = Counter()
    for poll in range(17 * 8):
        chosen = direct_pulls(pull_set, standing, poll)
        assert "useful" in chosen and len(chosen) == 1 + 2
        asked.update(chosen)
    assert asked["useful"] == 17 * 8 and {asked[p] for p in ["new", *junk]} == {16}
    assert direct_pulls(["useful", "new", "junk0"], standing, 5) == ["useful", "new", "junk0"]


def test_peers_not_proven_useful_whose_groups_are_held_are_not_asked():
    """A crowd of useless identities whose groups the node still holds costs no requests: only
    the useful peer and those held nothing of are asked, in turn as before."""
    junk = [f"junk{i}" for i in range(16)]
    standing = {"useful": 0.4, "new": None, **dict.fromkeys(junk, 0.0)}
    held = frozenset(["new", *junk[:15], "useful"])
    for poll in range(8):
        assert direct_pulls(["useful", "new", *junk], standing, poll, held) == ["useful", "junk15"]


def test_a_pull_set_too_small_for_every_known_peer_leaves_none_out_for_good():
    """Seventeen known peers, a set of sixteen: the useful one is always in, and the ties
    among the rest (all scored 0: a crowd of useless identities and one unlucky honest peer)
    fall differently at each poll, so every one of them is asked."""
    known = [f"junk{i}" for i in range(16)] + ["unlucky", "useful"]
    standing = {peer: 0.0 for peer in known} | {"useful": 0.5}
    rng = random.Random(0)
    sets = [choose_pull_set(known, standing, 16, rng) for _ in range(40)]
    assert all(len(chosen) == 16 and chosen[0] == "useful" for chosen in sets)
    assert set().union(*sets) == set(known)
    assert sum("unlucky" in chosen for chosen in sets) >= 20


def test_a_useless_peer_is_asked_for_more_only_once_its_groups_are_used(start_runtime):
    """The polls leave a peer whose samples taught nothing alone while the node holds its
    groups unused (its newer batch would only wait behind them), and ask it again once the
    node's gather says it holds none: a useless identity costs a download per batch the node
    used, not two requests a poll."""
    honest = start_runtime("honest")
    junk = start_runtime("junk", honest.visible_maddrs())
    ledger = PeerLedger()
    ledger.delivered(junk.peer_id)
    ledger.screened(junk.peer_id, offered=8, useful=0, round_=0)
    asked = []

    async def nothing_newer(info, reader, writer):
        (length,) = struct.unpack(">I", await reader.readexactly(4))
        request = msgpack.unpackb(await reader.readexactly(length))
        if "whom" in request:  # asked whom it knows (peer exchange, its own pace): nobody
            writer.write(struct.pack(">BI", payloads.NOTHING_NEWER, 0))
        else:
            asked.append(request)
            writer.write(struct.pack(">BQQ", payloads.NOTHING_NEWER, 0, 0))
        await writer.drain()
        writer.close()

    junk.call(junk.p2p.add_binary_stream_handler(PAYLOAD_PROTOCOL, nothing_newer), timeout=10)
    ex = link(honest, ledger=ledger).exchange
    held = frozenset({junk.peer_id})
    assert ex.gather(GatherWait(timeout_s=0, held=held)) == []
    # a pull started before the gather above finishes first
    pulls_ended(honest, ex)
    asked.clear()
    wait_for_polls(ex, 8, "while junk's groups are held")
    assert asked == [], "held: not asked in eight polls"
    assert ex.gather(GatherWait(timeout_s=0)) == []  # the node used what it held of the peer
    wait_until(lambda: len(asked) >= 2, "junk to be asked again")
    assert len(asked) >= 2, "nothing held: asked every poll (the only peer not proven useful)"


def test_a_held_peer_s_manifest_waits_like_its_direct_pull(start_runtime):
    """A known peer outside the pull set (more known peers than swarm.max_pull_peers) is found
    through its manifests. While the node holds its groups unused and it is not proven useful,
    its new manifest is skipped too, not only its direct pull; once nothing of it is held, or
    once it proved useful, its manifest is fetched."""
    honest = start_runtime("honest")
    junk = start_runtime("junk", honest.visible_maddrs())
    ledger = PeerLedger()
    ledger.delivered(junk.peer_id)
    ledger.screened(junk.peer_id, offered=8, useful=0, round_=0)
    ex = link(honest, ledger=ledger).exchange
    manifest = Manifest(junk.peer_id, 1000, 4096, b"d" * 32, 100)

    async def parse() -> Manifest | None:  # on the exchange's loop, as its polls run it
        return ex._parse(junk.signer.local_public_key, manifest.to_value(), pulled=set())

    ex.gather(GatherWait(timeout_s=0, held=frozenset({junk.peer_id})))
    assert honest.call(parse(), timeout=10) is None, "held and useless: its manifest waits"
    ex.gather(GatherWait(timeout_s=0))
    assert honest.call(parse(), timeout=10) == manifest, "nothing held: fetched"
    ledger.screened(junk.peer_id, offered=8, useful=8, round_=0)
    ex.gather(GatherWait(timeout_s=0, held=frozenset({junk.peer_id})))
    assert honest.call(parse(), timeout=10) == manifest, "proven useful: fetched while held"


def test_a_bad_manifest_is_one_strike_however_often_it_is_read(start_runtime):
    """The same bad record read at every poll is struck once; a new bad record of the same
    owner is a new lie, struck again."""
    honest = start_runtime("honest")
    liar = start_runtime("liar", honest.visible_maddrs())
    ledger = PeerLedger()
    ex = link(honest, ledger=ledger).exchange

    async def parse(raw: bytes) -> Manifest | None:  # on the exchange's loop, as its polls run it
        return ex._parse(liar.signer.local_public_key, raw, pulled=set())

    for _ in range(3):
        assert honest.call(parse(b"not msgpack"), timeout=10) is None
    assert ledger.counts[liar.peer_id] == 1, "one bad record read three times: one strike"
    assert honest.call(parse(b"still not msgpack"), timeout=10) is None
    assert ledger.counts[liar.peer_id] == 2, "a new bad record: a new strike"


def test_the_memory_of_struck_manifests_holds_one_record_an_owner_and_a_bounded_number_of_owners():
    """A crowd of names each writing bad manifests cannot grow it: one record an owner, the
    owners struck last kept; an owner pushed out and read again is struck again."""
    struck = StruckOnce(kept=3)
    assert struck.first("a", b"x") and not struck.first("a", b"x")
    assert struck.first("a", b"y"), "a new record of the same owner"
    assert not struck.first("a", b"y") and len(struck) == 1, "one record an owner"
    for name in "bcd":
        assert struck.first(name, b"x")
    assert len(struck) == 3, "at most `kept` owners"
    assert struck.first("a", b"y"), "pushed out by three names struck since: its record counts again"
    assert not struck.first("d", b"x"), "the owners struck last are kept"


def test_publishing_never_waits_on_a_dht_store_and_the_newest_manifest_wins(start_runtime, monkeypatch):
    """A store that hangs (DHT nodes slow on purpose) holds no round: publish returns while
    the store is still stalled, and once the DHT answers again the newest batch is what peers find."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ex_a, ex_b = link(a).exchange, link(b).exchange
    ex_a.live_peers = tuple  # b is found through its manifest only, not through its heartbeat,
    ex_a.met_directly = list  # nor because it asked a, its initial peer, for batches
    real_store = b.dht.store_many
    release = asyncio.Event()  # set on b's loop: the DHT answers again
    manifest_stalled = threading.Event()

    async def stalls(keys, *args, **kwargs):
        if any(key.startswith(f"{ex_b.manifests.family}/") for key in keys):  # not a heartbeat's store
            manifest_stalled.set()
        await release.wait()
        return await real_store(keys, *args, **kwargs)

    monkeypatch.setattr(b.dht, "store_many", stalls)
    pulls_ended(a, ex_a)  # none of b from before the cut brings round 0
    _returns(lambda: ex_b.publish(0, b"round 0", 1), "publishing round 0")
    # round 0's store is under way before rounds 1 and 2 come, so which round the stalled store
    # holds is not a race: 1 and 2 both wait behind it, and only the newer of them is announced
    assert manifest_stalled.wait(EVENT_TIMEOUT_S), "round 0's manifest never reached the DHT store"
    _returns(lambda: [ex_b.publish(r, f"round {r}".encode(), 1) for r in (1, 2)], "publishing rounds 1 and 2")
    assert not release.is_set(), "all three publishes returned while the store was stalled"
    assert ex_a.gather(GatherWait(timeout_s=1.0, wait_for={b.peer_id})) == [], "nothing announced yet"
    b.loop.call_soon_threadsafe(release.set)
    got = gather_until(ex_a, lambda got: 2 in got, "round 2 found", GatherWait(timeout_s=1.0, wait_for={b.peer_id}))
    assert got.get(2) == b"round 2"
    assert 1 not in got, "round 1 was superseded before it was announced"


def test_manifests_are_stored_once_a_discovery_interval_and_a_stranger_still_fetches(start_runtime, monkeypatch):
    """Fast rounds do not mean a DHT store each: the first manifest goes out at once, the next
    no sooner than `swarm.discovery_interval_s` later, with the newest round; a stranger that
    reads the first one fetches its round although many rounds followed it."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ex_a, ex_b = link(a).exchange, link(b).exchange
    # the manifest path alone: a direct pull of b, once a sees its heartbeat, would fetch the
    # newest round, and whether it comes first is a race the machine's load decides
    ex_a.live_peers = tuple
    ex_a.met_directly = list  # nor a pull of b because b asked a for batches
    real_store = b.dht.store_many
    stored: list[float] = []  # when each store of b's manifests began
    first_fetched = asyncio.Event()  # set on b's loop once a has round 0: the second store may end

    async def counting(keys, *args, **kwargs):
        if any(key.startswith(manifest_family(RUN)) for key in keys):  # heartbeats are stored too
            stored.append(time.monotonic())
            if len(stored) > 1:  # the DHT names round 0 until a read it (a slow reader on a busy machine)
                await first_fetched.wait()
        return await real_store(keys, *args, **kwargs)

    monkeypatch.setattr(b.dht, "store_many", counting)
    pinned: list[tuple[int, float]] = []  # (round, when): each manifest the announcer took to store
    real_pin = ex_b.server.pin
    ex_b.server.pin = lambda round_: pinned.append((round_, time.monotonic())) or real_pin(round_)
    pulls_ended(a, ex_a)  # none of b from before the cut brings a later round
    ex_b.publish(0, b"round 0", 1)
    wait_until(lambda: stored, "round 0's manifest store to begin")
    for round_ in range(1, 12):  # eleven fast rounds, within the interval
        ex_b.publish(round_, f"round {round_}".encode(), 1)
    first = ex_a.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))
    assert [(item.round, item.payload) for item in first] == [(0, b"round 0")], "the first round, still served"
    b.loop.call_soon_threadsafe(first_fetched.set)
    got = {item.round for item in ex_a.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))}
    assert got == {11}, "then the newest"
    interval = b.settings.discovery_interval_s
    assert [r for r, _ in pinned] == [0, 11] and len(stored) == 2, (pinned, stored)
    assert pinned[1][1] - pinned[0][1] >= interval - 0.01, "no sooner than the interval after the first"


def test_a_round_waiting_for_a_known_peer_asks_it_at_once_not_at_the_next_poll(start_runtime):
    """With polls 10 s apart (and the DHT read as rarely), a round that waits for a peer that
    delivered before does not wait for the next poll: it asks that peer itself. Here the
    background polls ask nobody at all once b is known, and b's new batch still arrives
    within the round's wait."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    slow_polls = ("swarm.poll_interval_s=10", "swarm.discovery_interval_s=60")
    ex_a, ex_b = link(a, RUN, None, *slow_polls).exchange, link(b, RUN, None, *slow_polls).exchange
    ex_b.publish(0, b"round 0", 1)
    # found at a's second or third poll (a's first ran before b was attached): two chances, so a
    # slow lookup or direct pull at one of them does not fail the test's setup
    first = ex_a.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))
    assert [item.round for item in first] == [0], "found through the DHT or a direct pull"
    ex_a.ledger.delivered(b.peer_id)  # what the node's intake says of a batch that passed its checks
    ex_a.ledger.screened(b.peer_id, 8, 8, 0)  # ... and of samples that proved useful
    background_pulls: list[int] = []
    ex_a._pull_known = lambda: background_pulls.append(1)  # the polls ask nobody from now on
    pulls_ended(a, ex_a)
    ex_b.publish(1, b"round 1", 1)
    got = ex_a.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))
    assert [item.round for item in got] == [1], "asked by the waiting round itself"


def test_peers_not_proven_useful_get_one_batch_a_round_or_one_a_hold_and_never_miss_a_round(start_runtime):
    """The pool's hold (loop/pool.py) and the exchange's pulls together, over real daemons. Two
    peers not proven useful publish a batch in each of our rounds: a newcomer whose groups
    stay unused, and one whose groups the node uses every round (on trial, screened). The node
    goes through its rounds in the intake's order (expire, the peers the pool holds, gather,
    add, take, `hold`), and each round's work lasts a few polls and a download. The used
    peer is fetched once a round, its newest. The newcomer is left alone while its batch is
    held; its hold ends a round before the batch leaves, the newer batch is fetched in the
    background of that round and takes the old one's place at the next gather: groups in
    every round, and one download per HOLD_ROUNDS rounds, not one a poll."""
    honest = start_runtime("honest")
    runtimes = {name: start_runtime(name, honest.visible_maddrs()) for name in ("newcomer", "used")}
    ledger = PeerLedger()
    ex = link(honest, RUN, ledger).exchange
    publishers = {name: link(runtime, RUN).exchange for name, runtime in runtimes.items()}
    newcomer, used = runtimes["newcomer"].peer_id, runtimes["used"].peer_id
    pool = PeerPool()
    arrivals: dict[str, list[tuple[int, int]]] = {newcomer: [], used: []}  # (our round, its round) handed out

    def publish(round_: int) -> None:
        for publisher in publishers.values():
            publisher.publish(round_, f"round {round_}".encode(), 1)
        wait_until(lambda: all(round_ in p.server._payloads for p in publishers.values()), f"round {round_} served")

    def one_round(our_round: int, wait: GatherWait) -> None:
        pool.expire(time.monotonic(), max_age_s=300, staleness=1, our_round=our_round,
                    newcomers={peer for peer in pool.peers if ledger.standing(peer) is None})
        for item in ex.gather(GatherWait(timeout_s=wait.timeout_s, wait_for=wait.wait_for,
                                         held=pool.holding(our_round))):
            ledger.delivered(item.peer_id)  # what the intake says of a batch that passed its checks
            groups = [OfferedGroup(item.peer_id, item.round, k, [], time.monotonic()) for k in range(2)]
            assert pool.add(item.peer_id, item.round, groups, our_round)
            arrivals[item.peer_id].append((our_round, item.round))
        pool.take(pool.offers(our_round).get(used, []))  # used up, screened: taught nothing yet
        ex.hold(pool.holding(our_round))  # as the intake's take ends

    publish(0)
    one_round(0, GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={newcomer, used}))
    assert arrivals == {newcomer: [(0, 0)], used: [(0, 0)]}, "found through the DHT, heartbeats or a direct pull"
    rounds = 2 * HOLD_ROUNDS + 2
    for our_round in range(1, rounds):
        publish(our_round)
        wait_for_polls(ex, 2, "of a round's work")
        pulls_ended(honest, ex)
        one_round(our_round, GatherWait(timeout_s=0))
        assert newcomer in pool.peers, f"the newcomer had no groups in our round {our_round}: {arrivals[newcomer]}"
    assert ledger.standing(newcomer) is None and ledger.standing(used) is None, "never proven useful"
    assert arrivals[used] == [(r, r) for r in range(rounds)], "every round its newest, once"
    assert [r for r, _ in arrivals[newcomer]] == [0, HOLD_ROUNDS, 2 * HOLD_ROUNDS], "asked again only as its hold ended"


def _arrived(runtime, exchange, peer: str, round_: int, payload: bytes) -> None:
    """A batch downloaded and not handed out yet, put where a finished download puts it."""

    async def put() -> None:
        exchange.downloads.ready[(peer, round_)] = payload

    runtime.call(put(), timeout=5)


def test_a_gather_stuck_in_its_hand_out_past_the_grace_still_gives_the_node_the_batch(start_runtime, monkeypatch):
    """The node stops waiting for a gather GATHER_GRACE_S past its deadline (its swarm loop is
    stuck). Here the loop is stuck in the hand-out itself: it has taken the batch from the
    arrivals and marked its round fetched, so it is not fetched again. The node, giving up,
    gets what that hand-out gave, rather than a result no one reads."""
    a = start_runtime("a")
    ex = link(a).exchange
    _arrived(a, ex, "peer", 0, b"round 0")
    monkeypatch.setattr(exchange_module, "GATHER_GRACE_S", 0.2)
    hand_out = ex.downloads.hand_out

    def stuck_once():
        monkeypatch.setattr(ex.downloads, "hand_out", hand_out)
        time.sleep(1.0)  # the loop, stuck past the grace
        return hand_out()

    monkeypatch.setattr(ex.downloads, "hand_out", stuck_once)
    first = ex.gather(GatherWait(timeout_s=0))
    second = ex.gather(GatherWait(timeout_s=0))
    assert [(item.peer_id, item.round) for item in first + second] == [("peer", 0)], "handed out once, not lost"


def test_a_gather_the_node_gave_up_on_hands_out_nothing_and_the_next_one_gets_the_batch(start_runtime, monkeypatch):
    """The swarm loop is stuck inside a gather before its hand-out, the node gives up on it and
    goes on; when the loop comes back, that gather must not hand the batch out into a result
    no one reads (nor hold its peer): the batch waits for the node's next gather."""
    a = start_runtime("a")
    ex = link(a).exchange
    _arrived(a, ex, "peer", 0, b"round 0")
    monkeypatch.setattr(exchange_module, "GATHER_GRACE_S", 0.0)
    checked = threading.Event()

    class StuckWait(GatherWait):
        def satisfied(self, delivered) -> bool:  # the gather's first look, on the loop, stuck
            time.sleep(3.0)
            checked.set()
            return True

    assert ex.gather(StuckWait(timeout_s=1.0, held=frozenset({"other"}))) == [], "given up on at its deadline"
    assert checked.wait(EVENT_TIMEOUT_S), "the stuck loop came back"
    a.call(asyncio.sleep(0), timeout=5)  # the loop went on past that gather's end
    assert ("peer", 0) in ex.downloads.ready, "left for the next gather"
    assert "peer" not in ex._held, "the late gather held nobody"
    monkeypatch.undo()  # the loop runs freely again: the grace is its own
    got = ex.gather(GatherWait(timeout_s=0))
    assert [(item.peer_id, item.round) for item in got] == [("peer", 0)], "the next gather hands it out"


def test_a_gather_hands_out_once_and_only_while_the_node_waits():
    """The hand-out itself, without a swarm: run once, given to the node once it settles, and
    nothing at all once the node has given up."""
    handed = HandOut()
    handed.run(lambda: ["batch"])
    handed.run(lambda: ["again"])
    assert handed.settle() == ["batch"], "handed out once"
    given_up = HandOut()
    assert given_up.settle() == []
    given_up.run(lambda: ["late"])
    assert given_up.settle() == [], "given up on: the late gather hands out nothing"
