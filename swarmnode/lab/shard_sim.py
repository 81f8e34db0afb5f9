"""A swarm of N nodes writing and reading one sharded family, on an in-memory DHT.

Each node runs the real `ShardedFamily` (its estimate, levels, probes and reads); only the DHT
is modelled: a key's records live on the NUM_REPLICAS storing nodes nearest to its hash (as in
hivemind's Kademlia), a lookup costs each of them one request, and a record expires
`ttl_steps` after it was written. Junk identities write into their own shards, as the
storing nodes' shard check leaves them no other choice, at the levels honest nodes read.
bench/scale.py reports it next to measurements on real DHT nodes, and the tests check that
a node's reads stay bounded and every peer is found.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import statistics
from bisect import bisect_left
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from swarmnode.swarm.hivemind.shards import ShardedFamily, level_for, shard_key, shard_of

NUM_REPLICAS = 5  # hivemind DHTNode's default
FAMILY = "sim/heartbeats"


def _key_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest(), "big")


@dataclass
class StepFigures:
    """What one step cost, per node, and what the swarm found."""

    lookups: list[int]  # per node
    records: list[int]  # per node, records read
    busiest_storer: int  # requests served by the most-asked storing node
    levels: Counter[int]
    newly_found: set[str]  # peers read by some other node for the first time this step


@dataclass
class ShardedSwarm:
    nodes: int
    junk: int = 0
    ttl_steps: int = 12
    seed: int = 0
    records: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))  # key -> peer -> step written
    step_no: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.families: dict[str, ShardedFamily] = {}
        self.storers = sorted(_key_hash(f"storer-{i}") for i in range(self.nodes))  # every node stores for the DHT
        self._replicas: dict[str, list[int]] = {}
        self.junk_ids = [f"junk-{self.seed}-{i}" for i in range(self.junk)]
        self.found: dict[str, int] = {}  # peer -> step it was first read by another node
        self.joined: dict[str, int] = {}
        for _ in range(self.nodes):
            self.add_node()

    def add_node(self) -> str:
        peer = f"peer-{self.seed}-{len(self.families)}"
        self.families[peer] = ShardedFamily(FAMILY, peer, _owner, rng=random.Random(self.rng.random()))
        self.joined[peer] = self.step_no
        return peer

    def replicas(self, key: str) -> list[int]:
        """The storing nodes of a key: the NUM_REPLICAS ids nearest its hash (nearest on the
        ring stands in for XOR distance; either spreads keys evenly)."""
        if key not in self._replicas:
            at = bisect_left(self.storers, _key_hash(key))
            count = min(NUM_REPLICAS, len(self.storers))
            self._replicas[key] = [self.storers[(at + i) % len(self.storers)] for i in range(count)]
        return self._replicas[key]

    async def step(self, reads_per_node: int = 1) -> StepFigures:
        """Every node writes its record at its levels, then reads (`reads_per_node` reads)."""
        for peer, family in self.families.items():
            for key in family.write_keys():
                self.records[key][peer] = self.step_no
        junk_levels = self._junk_levels()
        for peer in self.junk_ids:
            for level in junk_levels:
                self.records[shard_key(FAMILY, level, shard_of(peer, level))][peer] = self.step_no
        served: Counter[int] = Counter()
        lookups, records, newly = [], [], set()
        for peer, family in self.families.items():
            asked: list[str] = []

            async def read_shards(keys: list[str], asked: list[str] = asked) -> list[list[tuple[str, bytes]]]:
                asked.extend(keys)
                return [[(who, b"") for who, written in self.records.get(key, {}).items()
                         if self.step_no - written < self.ttl_steps] for key in keys]

            count = 0
            for _ in range(reads_per_node):
                found = await family.read(read_shards)
                count += len(found.items)
                for who, _ in found.items:
                    if who != peer and who in self.joined and who not in self.found:
                        self.found[who] = self.step_no
                        newly.add(who)
            for key in asked:
                for storer in self.replicas(key):
                    served[storer] += 1
            lookups.append(len(asked))
            records.append(count)
        self.step_no += 1
        levels = Counter(family.estimate.level for family in self.families.values())
        return StepFigures(lookups, records, max(served.values(), default=0), levels, newly)

    def _junk_levels(self) -> list[int]:
        """Where honest nodes read: the junk goes there (it cannot choose its shard)."""
        centre = level_for(len(self.families) + self.junk)
        return [lv for lv in (centre - 1, centre, centre + 1) if lv >= 0]


def _owner(subkey: object) -> str | None:
    return subkey if isinstance(subkey, str) else None


def run(nodes: int, steps: int, junk: int = 0, seed: int = 0, newcomer_at: int | None = None) -> dict:
    """Run `steps` steps; a newcomer joins at `newcomer_at`. Figures over the steps after the
    first (the first read of every node is a probe of every level)."""
    swarm = ShardedSwarm(nodes, junk=junk, seed=seed)
    newcomer = None
    figures = []

    async def go() -> None:
        nonlocal newcomer
        for step in range(steps):
            if step == newcomer_at:
                newcomer = swarm.add_node()
            figures.append(await swarm.step())

    asyncio.run(go())
    steady = figures[1:] or figures
    all_lookups = [x for f in steady for x in f.lookups]
    all_records = [x for f in steady for x in f.records]
    unfound = [p for p in swarm.joined if p not in swarm.found]
    return {
        "nodes": nodes,
        "junk": junk,
        "lookups_mean": statistics.fmean(all_lookups),
        "lookups_max": max(all_lookups),
        "records_mean": statistics.fmean(all_records),
        "records_p99": sorted(all_records)[int(0.99 * (len(all_records) - 1))],
        "busiest_storer": statistics.median(f.busiest_storer for f in steady),
        "levels": dict(figures[-1].levels),
        "steps_to_find_all": max((swarm.found[p] - swarm.joined[p] for p in swarm.found), default=0),
        "unfound": len(unfound),
        "newcomer_found_after": (
            swarm.found[newcomer] - swarm.joined[newcomer] if newcomer in swarm.found else None
        ),
    }
