"""Peers that meet without the DHT (`swarmnode/swarm/hivemind/introductions.py`, `exchange.py`,
`membership.py`): with every DHT store refused, nodes still find each other through initial
peers, those that asked them for batches and 'whom do you know?', and count each other for
`swarm.min_peers`.

Real p2p daemons and DHT nodes on 127.0.0.1 (tests/conftest.py's `start_runtime`); the tests
wait for the meeting, never for a time (tests/swarm_helpers.py).
"""

from __future__ import annotations

from swarmnode.loop.ledger import PeerLedger
from swarmnode.swarm.base import GatherWait
from tests.swarm_helpers import EVENT_TIMEOUT_S, RUN, link, wait_until


async def _refused(*args, **kwargs) -> bool:
    """Every DHT store refused (an eclipse of the shard keys)."""
    return False


def test_peers_meet_through_each_other_when_every_dht_store_is_refused(start_runtime, monkeypatch):
    """An eclipse of the DHT's shard keys (their nearest nodes refuse every store) left two
    honest nodes, one joined through the other, strangers for good. Without the DHT: b pulls
    from a, its initial peer, a from b that downloaded from it, and c, joined through b, meets
    a because b, asked whom it knows, names it."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    c = start_runtime("c", b.visible_maddrs())
    links = {}
    for name, runtime in (("a", a), ("b", b), ("c", c)):
        monkeypatch.setattr(runtime, "store_owned_all", _refused)
        links[name] = link(runtime, RUN, PeerLedger())
    met: dict[str, set[str]] = {name: set() for name in links}
    ids = {"a": a.peer_id, "b": b.peer_id, "c": c.peer_id}
    rounds = [0]

    def a_round_and_everyone_met() -> bool:
        rounds[0] += 1
        for name, node in links.items():
            node.exchange.publish(rounds[0], f"{name} round {rounds[0]}".encode(), 1)
        for name, node in links.items():
            for item in node.exchange.gather(GatherWait(timeout_s=0.2)):
                node.exchange.ledger.delivered(item.peer_id)  # what the intake says of a checked batch
                met[name].add(item.peer_id)
        return all(len(m) == 2 for m in met.values())

    wait_until(a_round_and_everyone_met, "every node to get batches from both others", every_s=0)
    assert {name: met[name] for name in links} == {n: set(ids.values()) - {ids[n]} for n in links}
    assert all(not node.membership.live_peers() for node in links.values()), "nobody was found through the DHT"


def test_min_peers_counts_peers_met_without_the_dht(start_runtime, monkeypatch):
    """With every DHT store refused nobody is live in heartbeats, and a node waited out
    swarm.wait_for_peers_s though it had joined through a live peer. b counts a, its initial
    peer, once a answered; a counts b, which asked it for a batch."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    links = {}
    for name, runtime in (("a", a), ("b", b)):
        monkeypatch.setattr(runtime, "store_owned_all", _refused)
        links[name] = link(runtime, RUN, PeerLedger())
    # wait_for_peers returns as soon as the count is reached: 1 is the meeting, not a timeout
    assert links["b"].membership.wait_for_peers(1, timeout_s=EVENT_TIMEOUT_S) == 1
    assert links["a"].membership.wait_for_peers(1, timeout_s=EVENT_TIMEOUT_S) == 1, "b asked a for its batches"
    assert not links["a"].membership.live_peers() and not links["b"].membership.live_peers()
    lone = start_runtime("lone")
    monkeypatch.setattr(lone, "store_owned_all", _refused)
    assert link(lone, RUN, PeerLedger()).membership.wait_for_peers(1, timeout_s=2) == 0, "nobody met: nobody counted"
