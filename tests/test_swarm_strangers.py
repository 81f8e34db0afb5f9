"""What peers that lie, cut transfers or are unknown cost a node over hivemind: strikes for
provable lies only, cut transfers never retried, strangers' downloads bounded in count and bytes
(`swarmnode/swarm/hivemind/downloads.py`, `exchange.py`).

Real p2p daemons and DHT nodes on 127.0.0.1 (tests/conftest.py's `start_runtime`). Nothing
here is timed: a test waits for the fetch, strike or poll that shows the behaviour, and counts
"not asked again" against polls and lookups that actually ran (tests/swarm_helpers.py).
"""

from __future__ import annotations

import struct
import threading

import msgpack

from swarmnode.loop.ledger import PeerLedger
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.base import GatherWait
from swarmnode.swarm.hivemind import payloads
from swarmnode.swarm.hivemind.dht import Manifest, payload_digest
from swarmnode.swarm.hivemind.downloads import choose_downloads
from swarmnode.swarm.hivemind.payloads import PAYLOAD_PROTOCOL
from tests.swarm_helpers import (
    RUN,
    announce,
    count_lookups,
    gathers_nothing_until,
    link,
    wait_for_polls,
    wait_until,
)


def _failures(exchange) -> list[tuple[str, int | None, object]]:
    """A list that grows by (peer, round asked or None for a direct pull, FetchError) as the
    exchange's downloads fail."""
    failed: list[tuple[str, int | None, object]] = []
    real_failed = exchange.downloads._failed

    def recording(peer, asked, error):
        failed.append((peer, asked, error))
        real_failed(peer, asked, error)

    exchange.downloads._failed = recording
    return failed


async def _lookup_idle(exchange) -> bool:
    """No DHT lookup of the exchange under way (read on its loop)."""
    return exchange._lookup is None or exchange._lookup.done()


def test_lying_peers_are_counted_and_unreachable_ones_are_not(start_runtime):
    honest = start_runtime("honest")
    rogue = start_runtime("rogue", honest.visible_maddrs())
    ledger = PeerLedger(SwarmSettings(max_rejects=10))
    ex = link(honest, ledger=ledger).exchange
    ex.live_peers = tuple  # the rogue is found through its manifests only, not its heartbeat,
    ex.met_directly = list  # nor because it asked us for batches
    failed = _failures(ex)
    lookups = count_lookups(ex)
    rogue_ex = link(rogue).exchange
    # 1: content that does not match the signed digest
    rogue_ex.server.put(0, b"A" * 1000)
    lie = Manifest(rogue.peer_id, 0, 1000, payload_digest(b"B" * 1000), 1)
    assert announce(rogue, lie)
    gathers_nothing_until(ex, rogue.peer_id, lambda: ledger.counts[rogue.peer_id] >= 1, "the lie to be counted")
    assert ledger.counts[rogue.peer_id] == 1
    # 2: a manifest announcing more than this node accepts (counted once, however often read)
    big = Manifest(rogue.peer_id, 1, 1 << 40, payload_digest(b""), 1)
    assert announce(rogue, big)
    gathers_nothing_until(ex, rogue.peer_id, lambda: ledger.counts[rogue.peer_id] >= 2, "the oversized manifest to be counted")
    read_since = len(lookups)
    gathers_nothing_until(ex, rogue.peer_id, lambda: len(lookups) >= read_since + 3, "three more reads of the manifests")
    assert ledger.counts[rogue.peer_id] == 2
    # 3: announced, then gone: not the peer's fault, nothing counted. The lookups pause while
    # the rogue announces and goes, so no read of the manifest comes between the two
    looking = ex._look_up
    paused = threading.Event()

    async def unless_paused():
        if not paused.is_set():
            await looking()

    ex._look_up = unless_paused
    paused.set()
    wait_until(lambda: honest.call(_lookup_idle(ex), timeout=10), "the lookup under way to end")
    good = b"C" * 1000
    rogue_ex.server.put(2, good)
    assert announce(rogue, Manifest(rogue.peer_id, 2, 1000, payload_digest(good), 1))
    rogue.shutdown()
    paused.clear()
    gathers_nothing_until(
        ex, rogue.peer_id, lambda: any(asked == 2 for _, asked, _ in failed), "a fetch of round 2 to fail"
    )
    assert ledger.counts[rogue.peer_id] == 2


def test_a_stranger_seen_in_heartbeats_that_cuts_a_transfer_is_not_asked_again(start_runtime):
    """A peer known only from its heartbeat is asked directly in turn, until it cuts a
    transfer: then it is asked no more (its manifests still lead to it, within the strangers'
    bound), so a cutting identity costs one max-size read, not one a turn."""
    honest = start_runtime("honest")
    rogue = start_runtime("rogue", honest.visible_maddrs())
    ledger = PeerLedger()
    ex = link(honest, ledger=ledger).exchange
    ex.live_peers = lambda: [rogue.peer_id]
    asked = []

    async def cut(info, reader, writer):
        (length,) = struct.unpack(">I", await reader.readexactly(4))
        asked.append(msgpack.unpackb(await reader.readexactly(length)))
        writer.write(struct.pack(">BQQ", payloads.OK, 5, 1000) + bytes(999))
        await writer.drain()
        writer.close()

    rogue.call(rogue.p2p.add_binary_stream_handler(PAYLOAD_PROTOCOL, cut), timeout=10)
    wait_until(lambda: ledger.has_cut(rogue.peer_id), "the rogue to be asked and cut the transfer")
    wait_for_polls(ex, 12, "after the cut")
    assert len(asked) == 1 and ledger.has_cut(rogue.peer_id), asked
    assert ledger.counts[rogue.peer_id] == 0, "a crash looks the same: no strike"


def test_a_cut_transfer_is_not_retried_and_costs_standing_not_a_strike(start_runtime):
    honest = start_runtime("honest")
    rogue = start_runtime("rogue", honest.visible_maddrs())
    ledger = PeerLedger(SwarmSettings(max_missed=2))
    ledger.delivered(rogue.peer_id)  # it delivered before: waited for, fetched first
    ex = link(honest, RUN, ledger, "swarm.discovery_interval_s=0.5").exchange  # more reads: more chances to retry
    lookups = count_lookups(ex)
    size, streams = 1 << 20, []

    async def cut(info, reader, writer):
        (length,) = struct.unpack(">I", await reader.readexactly(4))
        request = msgpack.unpackb(await reader.readexactly(length))
        streams.append(("after", request["after"]) if "after" in request else ("round", request["round"]))
        if "after" in request:  # asked directly: the newest, round 5
            writer.write(struct.pack(">BQQ", payloads.OK, 5, size) + bytes(size - 1))
        else:
            writer.write(struct.pack(">BQ", payloads.OK, size) + bytes(size - 1))
        await writer.drain()
        writer.close()

    rogue.call(rogue.p2p.add_binary_stream_handler(PAYLOAD_PROTOCOL, cut), timeout=10)
    for r in (1, 2):
        assert announce(rogue, Manifest(rogue.peer_id, r, size, b"d" * 32, 1))
        assert ex.gather(GatherWait(timeout_s=0.5, wait_for={rogue.peer_id})) == []
    wait_until(lambda: len(streams) >= 2, "two transfers from the rogue, each cut")
    read_since = len(lookups)
    gathers_nothing_until(ex, rogue.peer_id, lambda: len(lookups) >= read_since + 2, "two more reads of its manifests")
    wait_for_polls(ex, 4, "after the cuts")
    assert len(streams) == len(set(streams)) >= 2, ("nothing cut is asked for again", streams)
    assert ledger.counts[rogue.peer_id] == 0, "a crash looks the same: no strike"
    assert not ledger.earned(rogue.peer_id), "no longer waited for, fetched first or asked directly"
    assert ex.pull_set() == []


def _manifest(peer: str, round_: int, size: int) -> Manifest:
    return Manifest(peer, round_, size, b"d" * 32, 1)


def test_downloads_one_per_peer_and_strangers_bounded_in_count_and_bytes():
    mib = 1 << 20
    known = {"friend"}.__contains__
    strangers = [_manifest(f"s{i}", 0, 32 * mib) for i in range(8)]
    chosen = choose_downloads(
        [_manifest("friend", 0, 32 * mib), _manifest("friend", 1, mib), *strangers], {}, known, 64, 64 * mib
    )
    assert [(m.peer_id, m.round) for m in chosen] == [("friend", 0), ("s0", 0), ("s1", 0)]
    running = {"s0": 32 * mib}
    assert [m.peer_id for m in choose_downloads(strangers, running, known, 64, 64 * mib)] == ["s1"]
    small = [_manifest(f"t{i}", 0, 1024) for i in range(8)]
    assert len(choose_downloads(small, {}, known, 3, 64 * mib)) == 3
