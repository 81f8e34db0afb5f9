"""DHT node ids bound to libp2p keys (S/Kademlia's idea), so a place in the DHT costs keys.

hivemind lets a DHT node choose its own id, and a record lives on the few nodes whose ids are
nearest its key, so anyone could start nodes next to a run's shard keys that swallow every
store (an eclipse), at no cost. Here a node's DHT id is a hash of its peer id, which is a hash
of its public key, and a node neither adds to its routing table nor routes through a contact
whose declared id is not that hash: not a node that pings or asks it, not one named in an
answer to a lookup. Placing one node among the nodes nearest a key then means generating keys
until one hashes near it: about N / k keys among N honest nodes, for each place
(bench/id_grinding.py measures the rate; docs/security.md the cost).

hivemind builds its DHT protocol inside `DHTNode.create` with no parameter for it, so
`bind_ids` wraps the two doors of an existing protocol: `update_routing_table`, through which
every contact (incoming request, answer, ping) enters the table, and `call_find`, whose answers
name the contacts a lookup goes on to.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.p2p import PeerID

from swarmnode.bounded import note_newest

log = logging.getLogger(__name__)

ID_DOMAIN = b"swarmnode/dht-id/1:"  # hashed before the peer id, so the id means nothing outside swarmnode
REFUSED_REMEMBERED = 1024  # contacts refused and already told in the log, at most (oldest forgotten)


def bound_id(peer_id: PeerID) -> DHTID:
    """The DHT id a node of this peer id must have: SHA-1 (hivemind's id hash) of the domain and
    the peer id's bytes."""
    return DHTID.generate(source=ID_DOMAIN + peer_id.to_bytes())


def is_bound(node_id: DHTID | None, peer_id: PeerID) -> bool:
    """Whether `node_id` is the id `peer_id`'s key gives (None, no id declared, is not)."""
    return node_id is not None and node_id == bound_id(peer_id)


class IdBinding:
    """The check a protocol's two doors make, and the contacts it refused (told once each, in a
    bounded memory, so a crowd of placed nodes cannot grow the log or the process)."""

    def __init__(self) -> None:
        self.refused: OrderedDict[PeerID, None] = OrderedDict()

    def admits(self, node_id: DHTID | None, peer_id: PeerID) -> bool:
        if is_bound(node_id, peer_id):
            return True
        if peer_id not in self.refused:
            log.info(
                "DHT contact %s not added: its DHT id is not derived from its key (a swarmnode node "
                "older than DHT namespace v4, or a node placing itself next to a key)", peer_id,
            )
        note_newest(self.refused, peer_id, None, REFUSED_REMEMBERED)
        return False


def bind_ids(protocol: DHTProtocol) -> IdBinding:
    """Make `protocol` refuse contacts whose DHT id is not bound to their key; returns the
    binding (what it refused). Call before the node meets anyone (DHTNode.create without
    initial peers), so no unbound contact is in the table."""
    binding = IdBinding()
    update_routing_table = protocol.update_routing_table
    call_find = protocol.call_find

    async def bound_update(node_id: DHTID | None, peer_id: PeerID, responded: bool = True) -> None:
        if responded and node_id is not None and not binding.admits(node_id, peer_id):
            return  # an answer or request from it is still served; it is never routed through
        await update_routing_table(node_id, peer_id, responded=responded)

    async def bound_find(peer: PeerID, keys: Collection[DHTID]) -> dict[DHTID, tuple[Any, dict[DHTID, PeerID]]] | None:
        found = await call_find(peer, keys)
        if found is None:
            return None
        return {
            key: (value, {node: named for node, named in nearest.items() if binding.admits(node, named)})
            for key, (value, nearest) in found.items()
        }

    protocol.update_routing_table = bound_update
    protocol.call_find = bound_find
    return binding
