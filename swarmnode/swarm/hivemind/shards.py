"""Records that shard: heartbeats and manifests spread over many DHT keys, so that no key, and
no read, grows with the swarm.

A family of records (all heartbeats; one run's manifests) lives under 2**level keys at each
level 0..MAX_LEVEL: `<family>/<level>/<shard>`, where a peer's shard at a level is the top
`level` bits of a hash of its peer id (so shard s at level l splits into 2s and 2s+1 at l+1).
Each node estimates how many peers write the family (`SizeEstimate`, from what its own reads
find) and picks the level at which a shard holds about RECORDS_PER_SHARD records. It writes
its record at that level and at one level either side, so nodes whose estimates differ a
little still meet, and it reads a few random shards of its level per read, in one lookup (the
caller's `ReadShards`). A node's cost per read is then about READ_SHARDS * RECORDS_PER_SHARD
records, whatever the swarm's size. A read
at a level sees only the writers whose levels include it, so a node whose estimate is too
low (it started alone, and the swarm grew) would stay low on its reads alone: every
PROBE_EVERY_READS reads it probes one shard of every level and starts again from there.

Storing nodes enforce the sharding (`ShardIndex`, used by dht.SwarmRecordValidator): a record
under a shard key must be owned by a peer that hashes into that shard, so an identity writes
one record per level, never into every shard, and a flood of identities fills only the shards
its identities hash into. hivemind's validator sees only a key's hash, so the index holds the
hashes of every shard key of the families it knows: heartbeats, and the node's own run's
manifests (a node of another run stores our manifests unchecked; readers drop misfiled
records themselves, see `in_shard`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hivemind.dht.routing import DHTID

from swarmnode.protocol.records import DHT_NAMESPACE

log = logging.getLogger(__name__)

RECORDS_PER_SHARD = 6  # what a read of one shard aims to find
MAX_LEVEL = 12  # 4,096 shards a level: about 32,000 writers at RECORDS_PER_SHARD
READ_SHARDS = 2  # shards read per read (all of them when the level has fewer)
WRITE_SPREAD = 1  # a writer stores at its level and this many levels either side
PROBE_EVERY_READS = 16  # a probe of every level every this many reads (and at the first)
EMPTY_PROBE_AFTER = 4  # ... and after a read that found nobody, this many reads after the last probe
ESTIMATE_WEIGHT = 0.3  # weight of a new read in the moving estimate (of log2 writers)

HEARTBEAT_FAMILY = f"{DHT_NAMESPACE}/heartbeats"


def manifest_family(run_id: str) -> str:
    """The family of a run's manifests: each peer's newest batch, in its own shard."""
    return f"{DHT_NAMESPACE}/{run_id}/manifests"


def shard_key(family: str, level: int, shard: int) -> str:
    return f"{family}/{level}/{shard}"


def shard_of(peer_id: str, level: int) -> int:
    """The peer's shard at `level`: the top `level` bits of a hash of its id."""
    if level == 0:
        return 0
    top = int.from_bytes(hashlib.blake2b(peer_id.encode(), digest_size=8).digest(), "big")
    return top >> (64 - level)


def level_for(writers: float) -> int:
    """The level at which a shard holds about RECORDS_PER_SHARD of `writers` records."""
    if writers <= RECORDS_PER_SHARD:
        return 0
    return min(MAX_LEVEL, round(math.log2(writers / RECORDS_PER_SHARD)))


def in_shard(peer_id: str, level: int, shard: int) -> bool:
    return shard_of(peer_id, level) == shard


@dataclass
class SizeEstimate:
    """How many peers write a family, as this node's reads have found: a moving mean of
    log2(records in a shard * shards at its level)."""

    log2_writers: float | None = None  # None until the first read

    @property
    def writers(self) -> float:
        return 0.0 if self.log2_writers is None else 2.0**self.log2_writers

    @property
    def level(self) -> int:
        return level_for(self.writers)

    def write_levels(self) -> list[int]:
        centre = self.level
        return [lv for lv in range(centre - WRITE_SPREAD, centre + WRITE_SPREAD + 1) if 0 <= lv <= MAX_LEVEL]

    def observe(self, level: int, counts: list[int]) -> None:
        """A read of `counts` records in shards of `level` (a shard read empty counts as half)."""
        sample = math.log2(max(sum(counts) / len(counts), 0.5) * 2**level)
        if self.log2_writers is None:
            self.log2_writers = sample
        else:
            self.log2_writers += ESTIMATE_WEIGHT * (sample - self.log2_writers)

    def reset(self, probe: dict[int, int]) -> None:
        """Start again from a probe (level -> records in one random shard of it): the most
        writers a level implies, as levels off the writers' own hold fewer. An estimate that
        comes out too high corrects itself (reads at a level above the writers' find nobody),
        one too low would not (its reads see only writers whose levels include it). A lone
        record (one left at a far level by an estimate since changed) counts only where no
        level holds two."""
        implied = [count * 2**level for level, count in probe.items() if count >= 2]
        implied = implied or [count * 2**level for level, count in probe.items() if count]
        self.log2_writers = math.log2(max(implied)) if implied else -1.0


Items = list[tuple[Any, Any]]  # (subkey, value) pairs of one shard
ReadShards = Callable[[list[str]], Awaitable[list[Items]]]  # the items of each key, in one lookup
OwnerOf = Callable[[Any], "str | None"]  # the peer id owning a subkey, None when unowned


@dataclass
class ShardReads:
    """What one read found, for the caller and for benches: the records filed in their
    owner's shard, the shards read and how many such records each held."""

    items: Items
    level: int
    shards: list[int]
    counts: list[int]
    probed: bool = False


@dataclass
class ShardedFamily:
    """One node's view of one family: where to write its record, and a bounded read."""

    family: str
    peer_id: str
    owner_of: OwnerOf
    estimate: SizeEstimate = field(default_factory=SizeEstimate)
    rng: random.Random = field(default_factory=random.Random)
    reads_since_probe: int = 0

    def write_keys(self) -> list[str]:
        return [shard_key(self.family, lv, shard_of(self.peer_id, lv)) for lv in self.estimate.write_levels()]

    async def read(self, read_shards: ReadShards, shards: int = READ_SHARDS) -> ShardReads:
        """Read `shards` random shards at this node's level (every shard when there are fewer).
        First, every PROBE_EVERY_READS reads, and after a read that found nobody (at most every
        EMPTY_PROBE_AFTER reads), probe one shard of every level to find where the writers
        are: a node joining a large swarm, or one whose estimate is below the writers', finds
        them again."""
        probed = self.estimate.log2_writers is None or self.reads_since_probe >= PROBE_EVERY_READS
        if probed:
            await self._probe(read_shards)
        found = await self._read_level(read_shards, self.estimate.level, shards)
        if not sum(found.counts) and not probed and self.reads_since_probe >= EMPTY_PROBE_AFTER:
            await self._probe(read_shards)
            found = await self._read_level(read_shards, self.estimate.level, shards)
            probed = True
        self.reads_since_probe += 1
        self.estimate.observe(found.level, found.counts)
        found.probed = probed
        return found

    async def read_level(self, read_shards: ReadShards, level: int, shards: int) -> ShardReads:
        """`shards` random shards of `level`, without touching the estimate (status)."""
        return await self._read_level(read_shards, level, shards)

    async def _read_level(self, read_shards: ReadShards, level: int, shards: int) -> ShardReads:
        chosen = sorted(self.rng.sample(range(2**level), min(shards, 2**level)))
        filed = await self._read_filed(read_shards, [(level, shard) for shard in chosen])
        return ShardReads([item for items in filed for item in items], level, chosen, [len(items) for items in filed])

    async def _read_filed(self, read_shards: ReadShards, where: list[tuple[int, int]]) -> list[Items]:
        """The records of each (level, shard), in one lookup, that are filed in their owner's
        shard: storing nodes of other runs do not check ours."""
        answers = await read_shards([shard_key(self.family, level, shard) for level, shard in where])
        return [
            [(subkey, value) for subkey, value in answer if self._filed(subkey, level, shard)]
            for (level, shard), answer in zip(where, answers)
        ]

    def _filed(self, subkey: Any, level: int, shard: int) -> bool:
        owner = self.owner_of(subkey)
        return owner is not None and in_shard(owner, level, shard)

    async def _probe(self, read_shards: ReadShards) -> None:
        self.reads_since_probe = 0
        where = [(level, self.rng.randrange(2**level)) for level in range(MAX_LEVEL + 1)]
        filed = await self._read_filed(read_shards, where)
        self.estimate.reset({level: len(items) for (level, _), items in zip(where, filed)})
        log.debug("probed %s: about %.0f writers, level %d", self.family, self.estimate.writers, self.estimate.level)


class ShardIndex:
    """The hashes of every shard key of the families a storing node checks, each with its
    (level, shard): a record under one of them must be owned by a peer of that shard."""

    def __init__(self) -> None:
        self._shards: dict[bytes, tuple[int, int]] = {}
        self._families: set[str] = set()

    def add(self, family: str) -> None:
        if family in self._families:
            return
        self._families.add(family)
        for level in range(MAX_LEVEL + 1):
            for shard in range(2**level):
                self._shards[DHTID.generate(source=shard_key(family, level, shard)).to_bytes()] = (level, shard)

    def shard(self, key_id: bytes) -> tuple[int, int] | None:
        """(level, shard) of a known shard key's hash; None for any other key."""
        return self._shards.get(key_id)
