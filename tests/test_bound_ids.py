"""DHT ids bound to keys (`swarmnode/swarm/hivemind/bound_ids.py`): a contact whose DHT id is
not the hash of its peer id is neither added to the routing table nor routed through, so nodes
placed next to a key by choosing their ids no longer eclipse it.

The checks on a stand-in protocol first; then real p2p daemons and DHT nodes on 127.0.0.1."""

from __future__ import annotations

import asyncio

import pytest
from hivemind.dht.routing import DHTID
from hivemind.p2p import PeerID

from swarmnode.lab.eclipse import Eclipse, grind_identity, shares_leading_bits
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind.bound_ids import REFUSED_REMEMBERED, IdBinding, bind_ids, bound_id, is_bound
from swarmnode.swarm.hivemind.identity import new_identity
from swarmnode.swarm.hivemind.runtime import SwarmError, SwarmRuntime
from tests.swarm_helpers import EVENT_TIMEOUT_S, wait_until


def _peer() -> PeerID:
    return PeerID.from_identity(new_identity())


class _Protocol:
    """What bind_ids wraps of hivemind's DHTProtocol: the table's door and the lookup's."""

    def __init__(self, answer: dict) -> None:
        self.table: list[tuple[DHTID | None, PeerID, bool]] = []
        self.answer = answer

    async def update_routing_table(self, node_id, peer_id, responded=True) -> None:
        self.table.append((node_id, peer_id, responded))

    async def call_find(self, peer, keys):
        return self.answer


def test_a_peer_s_dht_id_is_its_key_s_hash_and_nothing_else():
    a, b = _peer(), _peer()
    assert bound_id(a) == bound_id(PeerID(a.to_bytes())) != bound_id(b)
    assert is_bound(bound_id(a), a) and not is_bound(bound_id(b), a) and not is_bound(None, a)
    assert not is_bound(DHTID(int(bound_id(a)) ^ 1), a), "an id one bit away is another id"


def test_the_table_admits_bound_contacts_only_and_a_lookup_goes_on_through_bound_ones_only():
    honest, placed = _peer(), _peer()
    key = DHTID.generate(source="a shard key")
    near_key = DHTID(int(key) ^ 1)  # what a placed node declares: next to the key
    protocol = _Protocol({key: ("value", {bound_id(honest): honest, near_key: placed})})
    binding = bind_ids(protocol)

    async def meet() -> dict:
        await protocol.update_routing_table(bound_id(honest), honest)
        await protocol.update_routing_table(near_key, placed)
        await protocol.update_routing_table(near_key, placed, responded=False)  # a failure still removes
        return await protocol.call_find(honest, [key])

    found = asyncio.run(meet())
    assert protocol.table == [(bound_id(honest), honest, True), (near_key, placed, False)]
    assert found == {key: ("value", {bound_id(honest): honest})}, "the value stays; the placed contact is dropped"
    assert list(binding.refused) == [placed]


def test_the_refused_contacts_remembered_are_bounded():
    binding = IdBinding()
    peers = [PeerID(i.to_bytes(34, "big")) for i in range(REFUSED_REMEMBERED + 10)]
    for peer in peers:
        assert not binding.admits(DHTID(1), peer)
    assert len(binding.refused) == REFUSED_REMEMBERED and peers[-1] in binding.refused and peers[0] not in binding.refused


def test_a_ground_identity_lands_next_to_its_key():
    identity, tries = grind_identity("a shard key", 2)
    assert tries >= 1 and shares_leading_bits(bound_id(PeerID.from_identity(identity)), "a shard key", 2)


def _in_table(runtime: SwarmRuntime, peer: PeerID) -> bool:
    return peer in runtime.dht.protocol.routing_table.peer_id_to_uid


def test_nodes_placed_next_to_a_key_by_a_chosen_id_are_not_routed_through_and_the_record_lands(start_runtime):
    """Refusing DHT nodes whose free ids sit next to a key (the eclipse bench's attack), joined
    through the honest swarm, swallowed every store of it. Now the honest nodes never add them,
    so a's store reaches b."""
    key = "swarmnode/test/eclipsed"
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    eclipse = Eclipse([key], per_key=5)  # as many as the replicas a record is stored on
    eclipse.start(join=a.visible_maddrs())
    try:
        placed = [p2p.peer_id for p2p, _ in eclipse.nodes]
        assert _in_table(a, b.p2p.peer_id) and _in_table(b, a.p2p.peer_id)
        assert a.dht.node_id == bound_id(a.p2p.peer_id)
        assert not any(_in_table(runtime, peer) for runtime in (a, b) for peer in placed)
        assert set(placed) <= set(a.id_binding.refused)
        assert a.store_owned(key, b"a's record", ttl_s=60)
        wait_until(lambda: b.call(b.read_owned_many([key]), EVENT_TIMEOUT_S)[0], "b to read a's record")
    finally:
        eclipse.stop()


def test_a_node_refuses_initial_peers_whose_ids_are_not_bound(tmp_path):
    """A node of an older version (a DHT id of its own choosing) as the only initial peer: the
    start fails, saying so, instead of joining a swarm it will never route through."""
    eclipse = Eclipse(["swarmnode/test/old"], per_key=1)
    eclipse.start()
    try:
        settings = SwarmSettings(initial_peers=eclipse.maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        runtime = SwarmRuntime(settings, tmp_path / "new.key")
        with pytest.raises(SwarmError, match="none has a DHT id derived from its key"):
            runtime.start()
    finally:
        eclipse.stop()
