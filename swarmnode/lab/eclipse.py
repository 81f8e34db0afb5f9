"""An eclipse of discovery, for bench/attacks.py: DHT nodes placed next to a run's shard keys
that refuse every store.

Records live on the few nodes nearest their key, and a run's shard keys are public (the run id
is a hash of public settings). So an attacker starts `per_key` nodes next to each key: every
store there goes to them, and they keep nothing. Records whose subkey is one of `accept` (the
attacker's own identities) are kept, so the eclipse can also serve fake heartbeats.

Two ways to place them. hivemind lets a DHT node choose its id (`DHTNode.create(node_id=...)`),
so free placed ids differ from the key's only in the lowest bits; swarmnode nodes refuse such
contacts (swarmnode.swarm.hivemind.bound_ids). With `grind_bits`, each node's key is generated
again and again until its bound id shares that many leading bits with the key's: about
2**grind_bits keys a node, which `Eclipse.keys_generated` and `grind_s` report.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
from pathlib import Path

import msgpack
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import P2P, PeerID

from swarmnode.swarm.hivemind.bound_ids import bound_id
from swarmnode.swarm.hivemind.identity import new_identity
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


def shares_leading_bits(node_id: DHTID, key: str, bits: int) -> bool:
    """Whether `node_id` and `key`'s id agree in their `bits` leading bits (of hivemind's 160)."""
    return (int(node_id) ^ int(DHTID.generate(source=key))) >> (DHTID.HASH_FUNC().digest_size * 8 - bits) == 0


def grind_identity(key: str, bits: int) -> tuple[bytes, int]:
    """An RSA identity (libp2p's serialized private key) whose bound DHT id shares `bits`
    leading bits with `key`'s id, and how many keys it took to find: what a place next to a key
    costs once ids are bound."""
    tries = 0
    while True:
        tries += 1
        identity = new_identity()
        if shares_leading_bits(bound_id(PeerID.from_identity(identity)), key, bits):
            return identity, tries


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

    def __init__(
        self, keys: list[str], per_key: int, accept: set[bytes] | None = None, grind_bits: int | None = None,
    ) -> None:
        self.keys, self.per_key, self.grind_bits = keys, per_key, grind_bits
        self.accept = accept if accept is not None else set()  # shared: an identity may be added later
        self.nodes: list[tuple[P2P, DHTNode]] = []
        self.keys_generated = 0  # keys generated to place the nodes (grinding only)
        self.grind_s = 0.0  # ... and the seconds it took, on one core
        self._identities = tempfile.TemporaryDirectory(prefix="swarmnode-eclipse-")
        self._places: list[tuple[DHTID | None, Path | None]] | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="eclipse", daemon=True)

    def start(self, timeout_s: float = 300.0, join: list[str] | None = None) -> None:
        """Place the nodes (grinding their keys first, if asked), then start them: the first
        through `join` (a swarm's addresses; None: it founds the DHT), the rest through it."""
        places = self.place()
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(places, join or []), self.loop).result(timeout_s)

    def place(self) -> list[tuple[DHTID | None, Path | None]]:
        """Per node, a free id (None when bound) and an identity file (None: a throwaway key),
        ground once (an attacker grinds before the swarm it targets starts)."""
        if self._places is None:
            self._places = self._grind()
        return self._places

    def _grind(self) -> list[tuple[DHTID | None, Path | None]]:
        if self.grind_bits is None:
            return [(node_id, None) for key in self.keys for node_id in placed_ids(key, self.per_key)]
        started = time.perf_counter()
        places: list[tuple[DHTID | None, Path | None]] = []
        for key in self.keys:
            for _ in range(self.per_key):
                identity, tries = grind_identity(key, self.grind_bits)
                self.keys_generated += tries
                path = Path(self._identities.name) / f"{len(places)}.key"
                path.write_bytes(identity)
                places.append((None, path))
        self.grind_s = time.perf_counter() - started
        return places

    async def _start(self, places: list[tuple[DHTID | None, Path | None]], join: list[str]) -> None:
        first = await self._node(*places[0], join)
        self.nodes.append(first)
        bootstrap = [str(m) for m in await first[0].get_visible_maddrs()]
        rest = places[1:]
        for start in range(0, len(rest), STARTED_AT_ONCE):
            batch = rest[start : start + STARTED_AT_ONCE]
            self.nodes += await asyncio.gather(*(self._node(*place, bootstrap) for place in batch))

    async def _node(self, node_id: DHTID | None, identity: Path | None, initial_peers: list[str]) -> tuple[P2P, DHTNode]:
        p2p = await P2P.create(
            initial_peers=initial_peers or None, host_maddrs=LOOPBACK, nat_port_map=False,
            identity_path=str(identity) if identity else None,
        )
        node = await DHTNode.create(
            p2p=p2p, node_id=node_id if node_id is not None else bound_id(p2p.peer_id),
            initial_peers=initial_peers or None, record_validator=RefuseStores(self.accept), cache_locally=False,
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
        self._identities.cleanup()
