"""Who is in the swarm (`swarmnode/swarm/hivemind/membership.py`, `status.py`, `runtime.py`):
joining through bootstrap peers and outliving them, heartbeats stored once an interval and read
by our own clock, and `status` telling who answered apart from what heartbeats claim.

Real p2p daemons and DHT nodes on 127.0.0.1 (tests/conftest.py's `start_runtime`). Nothing
here is timed: a test waits for the heartbeat, peer or record that shows the behaviour and
counts "never again" over reads that actually ran (tests/swarm_helpers.py).
"""

from __future__ import annotations

import socket
import time

from hivemind.utils.timed_storage import get_dht_time

from swarmnode.protocol.records import MAX_CLOCK_SKEW_S, Heartbeat, NodeStatus
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.base import GatherWait
from swarmnode.swarm.hivemind.dht import owner_or_none, pack
from swarmnode.swarm.hivemind.identity import ensure_identity
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, ShardedFamily
from swarmnode.swarm.hivemind.status import probe, read_heartbeats
from tests.swarm_helpers import EVENT_TIMEOUT_S, RUN, link, store_times, wait_until


def test_a_node_with_fast_rounds_stores_a_heartbeat_once_an_interval_not_once_a_round(start_runtime, monkeypatch):
    """Forty rounds in two seconds announce forty statuses; the DHT gets a heartbeat about
    once a `swarm.heartbeat_interval_s` (of the time the rounds really took), and peers still
    see the newest round."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    watcher, beating = link(a).membership, link(b).membership
    stored = store_times(b, HEARTBEAT_FAMILY, monkeypatch)
    started = time.monotonic()
    for round_ in range(40):
        beating.announce(NodeStatus(round=round_))
        time.sleep(0.05)
    elapsed = time.monotonic() - started  # measured: a busy machine's rounds take longer, and may store more
    interval = beating.settings.heartbeat_interval_s
    assert len(stored) <= 2 * (elapsed / interval + 1), (len(stored), elapsed, interval)

    def newest_seen() -> bool:
        watcher.wait_for_peers(1, timeout_s=0)
        return watcher.live_peers().get(b.peer_id, NodeStatus()).round == 39

    wait_until(newest_seen, "the watcher to see round 39", every_s=0.2)


def test_heartbeats_show_live_peers_of_the_run_only(start_runtime):
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    c = start_runtime("c", a.visible_maddrs())
    # a peer stays live stale_after_s after its last beat: long here, so only b's goodbye ends it
    ex_a, ex_b = link(a, RUN, None, "swarm.stale_after_s=600").membership, link(b).membership
    other = link(c, run="another-run").membership
    ex_b.announce(NodeStatus(round=7, model="tiny"))
    other.announce(NodeStatus(round=9))
    assert ex_a.wait_for_peers(1, timeout_s=EVENT_TIMEOUT_S) == 1

    def b_at_round_7() -> bool:
        ex_a.wait_for_peers(1, timeout_s=0)
        return ex_a.live_peers().get(b.peer_id, NodeStatus()).round == 7

    wait_until(b_at_round_7, "a to see b's round 7", every_s=0.2)
    assert set(ex_a.live_peers()) == {b.peer_id}
    assert (ex_a.live_peers()[b.peer_id].round, ex_a.live_peers()[b.peer_id].model) == (7, "tiny")
    ex_b.close()  # says goodbye: no longer waited for

    def b_gone() -> bool:
        ex_a.wait_for_peers(1, timeout_s=0)
        return ex_a.live_peers() == {}

    wait_until(b_gone, "a to read b's goodbye", every_s=0.2)


def test_any_one_listed_bootstrap_peer_is_enough_and_losing_it_ends_nothing(start_runtime, tmp_path):
    """A list whose first entry is dead still joins through the second; once joined, the
    swarm outlives its bootstrap node: the others keep finding and pulling each other's
    batches through the DHT's routing table."""
    dead = f"/ip4/127.0.0.1/tcp/9/p2p/{ensure_identity(tmp_path / 'dead.key')}"
    boot = start_runtime("boot")
    b = start_runtime("b", [dead, *boot.visible_maddrs()])
    c = start_runtime("c", [dead, *boot.visible_maddrs()])
    ex_b, ex_c = link(b).exchange, link(c).exchange
    ex_b.publish(0, b"before", 1)
    got = ex_c.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))
    assert [i.payload for i in got] == [b"before"]
    boot.shutdown()
    ex_b.publish(1, b"after", 1)
    got = ex_c.gather(GatherWait(timeout_s=EVENT_TIMEOUT_S, wait_for={b.peer_id}))
    assert [i.payload for i in got] == [b"after"], "b and c exchange without the bootstrap node"


def test_a_node_that_lost_every_dht_peer_rejoins_when_its_bootstrap_node_returns(tmp_path):
    """The bootstrap node goes down and comes back at the same address: the node it left alone
    dials it again by itself (`swarm.rejoin_interval_s`) and the two share records again."""
    port = _free_port()
    boot_maddrs = [f"/ip4/127.0.0.1/tcp/{port}"]

    def boot() -> SwarmRuntime:
        runtime = SwarmRuntime(SwarmSettings(host_maddrs=boot_maddrs), tmp_path / "boot.key")
        runtime.start()
        return runtime

    first = boot()
    settings = SwarmSettings(initial_peers=first.visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                             rejoin_interval_s=0.5)
    node = SwarmRuntime(settings, tmp_path / "node.key")
    node.start()
    again = None
    try:
        assert node.dht_peer_count() == 1
        first.shutdown()

        def alone() -> bool:
            node.get_subkeys("anything", timeout=30)  # a lookup that finds the peer gone drops it
            return node.dht_peer_count() == 0

        wait_until(alone, "the node to drop its gone bootstrap peer", every_s=0.2)
        again = boot()
        assert again.store_owned("swarmnode/test/back", b"v", 60, timeout=30)
        wait_until(lambda: node.get_subkeys("swarmnode/test/back", timeout=30), "the node to read the returned node's record", every_s=0.5)
        assert list(node.get_subkeys("swarmnode/test/back", timeout=30).values()) == [b"v"]
        assert node.dht_peer_count() == 1
    finally:
        node.shutdown()
        if again is not None:
            again.shutdown()


def _free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return probe_socket.getsockname()[1]


def _store_heartbeat(runtime: SwarmRuntime, ahead_s: float, run: str = RUN) -> list[str]:
    """One heartbeat of `runtime`'s identity, dated `ahead_s` past now, stored once (a ghost's); its keys."""
    heartbeat = Heartbeat(
        round=99_999, model="Qwen2.5-72B-Instruct", eval_acc=0.991, peer=runtime.peer_id, run=run,
        time=get_dht_time() + ahead_s, reach="direct",
    )
    keys = ShardedFamily(HEARTBEAT_FAMILY, runtime.peer_id, owner_or_none).write_keys()
    assert runtime.call(runtime.store_owned_all(keys, pack(heartbeat.model_dump()), get_dht_time() + 600), 30)
    return keys


def _read(membership) -> set[str]:
    """The live peers after one more read of the heartbeats."""
    membership.wait_for_peers(1_000, timeout_s=0)
    return set(membership.live_peers())


def test_a_heartbeat_dated_ahead_of_our_clock_is_refused(start_runtime):
    """A year ahead, it would never look stale: neither live, nor waited for, nor in `status`."""
    a = start_runtime("a")
    ghost = start_runtime("ghost", a.visible_maddrs())
    watcher = link(a).membership
    keys = _store_heartbeat(ghost, ahead_s=365 * 24 * 3600.0)
    wait_until(lambda: a.get_subkeys(keys[0], timeout=30), "the record to be readable in a's DHT")
    for _ in range(5):  # read, and read again
        assert _read(watcher) == set()
    assert ghost.peer_id not in {row.heartbeat.peer for row in read_heartbeats(a, stale_after_s=20.0)}


def test_a_ghost_is_gone_within_stale_after_by_our_own_clock(start_runtime):
    """A heartbeat stored once, dated within the allowed skew ahead (so its claimed time stays
    fresh for a while), counts until `stale_after_s` of our clock has passed without a newer
    one, then never again while the same record sits in the DHT; a peer that keeps beating stays."""
    a = start_runtime("a")
    ghost = start_runtime("ghost", a.visible_maddrs())
    honest = start_runtime("honest", a.visible_maddrs())
    watcher = link(a, RUN, None, "swarm.stale_after_s=3").membership  # six of honest's beats
    beating = link(honest, RUN, None, "swarm.heartbeat_interval_s=0.5").membership
    beating.announce(NodeStatus(round=1))
    wait_until(lambda: honest.peer_id in _read(watcher), "the honest peer to count", every_s=0.2)
    _store_heartbeat(ghost, ahead_s=MAX_CLOCK_SKEW_S - 5)
    wait_until(lambda: _read(watcher) == {ghost.peer_id, honest.peer_id}, "both to count at first", every_s=0.2)
    wait_until(lambda: _read(watcher) == {honest.peer_id}, "the ghost's record, which did not move on, to go", every_s=0.2)
    for _ in range(5):  # the same record, read again: still gone
        assert ghost.peer_id not in _read(watcher)
        time.sleep(0.2)


def test_status_shows_who_answered_apart_from_what_they_claim(start_runtime):
    """A throwaway identity stores one glowing heartbeat, dated ahead within the allowed skew,
    and exits: `status` still lists its claims, but only the live peer answered a direct
    request, and only that one is shown as training."""
    a = start_runtime("a")
    honest = start_runtime("honest", a.visible_maddrs())
    link(honest).membership.announce(NodeStatus(round=3))
    ghost = start_runtime("ghost", a.visible_maddrs())
    _store_heartbeat(ghost, ahead_s=MAX_CLOCK_SKEW_S - 5)
    ghost.shutdown()
    reader = start_runtime("reader", a.visible_maddrs())

    def both_listed() -> dict:
        rows = {row.heartbeat.peer: row for row in read_heartbeats(reader, stale_after_s=20.0)}
        return rows if set(rows) == {honest.peer_id, ghost.peer_id} else {}

    rows = wait_until(both_listed, "status to list both heartbeats", every_s=0.3)
    checked = {row.heartbeat.peer: row for row in probe(reader, list(rows.values()))}
    assert checked[ghost.peer_id].heartbeat.eval_acc == 0.991, "its claims are shown ..."
    assert checked[ghost.peer_id].answered_ms is None, "... and that it did not answer"
    assert checked[honest.peer_id].answered_ms is not None and checked[honest.peer_id].reached == "local"
    assert checked[honest.peer_id].to_json()["checked"]["reached"] == "local"
    assert rows[ghost.peer_id].state == "training", "what it claims, fresh by the time it claims ..."
    assert (checked[ghost.peer_id].state, checked[honest.peer_id].state) == ("silent", "training"), "... is shown as such"
