"""An eclipse of discovery, for bench/attacks.py: DHT nodes placed next to a run's shard keys
that refuse every store.

A hivemind DHT node chooses its own id (`DHTNode.create(node_id=...)`, not bound to its libp2p
key), records live on the few nodes nearest their key, and a run's shard keys are public (the
run id is a hash of public settings). So an attacker starts `per_key` nodes whose ids differ from
each key's id only in the lowest bits: they are the nearest nodes to it, every store there goes
to them, and they keep nothing. Records whose subkey is one of `accept` (the attacker's own
identities) are kept, so the eclipse can also serve fake heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import msgpack
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import P2P

from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, WRITE_SPREAD, manifest_family, shard_key

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
STARTED_AT_ONCE = 8  # daemons started together


def small_swarm_keys(run_id: str) -> list[str]:
    """The shard keys a swarm of a few peers writes and reads: both families at level 0 and,
    with WRITE_SPREAD, every shard of the levels up to it (6 keys with WRITE_SPREAD 1)."""
    families = [HEARTBEAT_FAMILY, manifest_family(run_id)]
    return [shard_key(f, level, shard) for f in families for level in range(WRITE_SPREAD + 1) for shard in range(2**level)]


def placed_ids(key: str, count: int) -> list[DHTID]:
    """`count` DHT ids nearer to `key`'s id than any random node's (they differ in the low bits)."""
    target = int(DHTID.generate(source=key))
    return [DHTID(target ^ i) for i in range(1, count + 1)]


class RefuseStores(RecordValidatorBase):
    """Keeps only records whose subkey is one of `accept`: every honest store is refused."""

    def __init__(self, accept: set[bytes]) -> None:
        self.accept = accept

    def validate(self, record: DHTRecord) -> bool:
        with contextlib.suppress(ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            return msgpack.unpackb(record.subkey) in self.accept
        return False

    def sign_value(self, record: DHTRecord) -> bytes:
        return record.value

    def strip_value(self, record: DHTRecord) -> bytes:
        return record.value

    @property
    def priority(self) -> int:
        return 10

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False


class Eclipse:
    """`per_key` refusing DHT nodes next to each of `keys`, on one event loop thread of this
    process (a p2p daemon each). `start()` then `maddrs()` to join through them; `stop()`."""

    def __init__(self, keys: list[str], per_key: int, accept: set[bytes] | None = None) -> None:
        self.ids = [node_id for key in keys for node_id in placed_ids(key, per_key)]
        self.accept = accept if accept is not None else set()  # shared: an identity may be added later
        self.nodes: list[tuple[P2P, DHTNode]] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="eclipse", daemon=True)

    def start(self, timeout_s: float = 300.0) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout_s)

    async def _start(self) -> None:
        first = await self._node(self.ids[0], [])
        self.nodes.append(first)
        bootstrap = [str(m) for m in await first[0].get_visible_maddrs()]
        rest = self.ids[1:]
        for start in range(0, len(rest), STARTED_AT_ONCE):
            batch = rest[start : start + STARTED_AT_ONCE]
            self.nodes += await asyncio.gather(*(self._node(node_id, bootstrap) for node_id in batch))

    async def _node(self, node_id: DHTID, initial_peers: list[str]) -> tuple[P2P, DHTNode]:
        p2p = await P2P.create(initial_peers=initial_peers or None, host_maddrs=LOOPBACK, nat_port_map=False)
        node = await DHTNode.create(
            p2p=p2p, node_id=node_id, initial_peers=initial_peers or None,
            record_validator=RefuseStores(self.accept), cache_locally=False,
        )
        return p2p, node

    def maddrs(self) -> list[str]:
        """Where to join the eclipsed DHT (the first node's addresses)."""
        p2p = self.nodes[0][0]
        return [str(m) for m in asyncio.run_coroutine_threadsafe(p2p.get_visible_maddrs(), self.loop).result(10)]

    def stop(self) -> None:
        async def shut() -> None:
            for p2p, node in self.nodes:
                with contextlib.suppress(Exception):
                    await node.shutdown()
                with contextlib.suppress(Exception):
                    await p2p.shutdown()

        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shut(), self.loop).result(60)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
