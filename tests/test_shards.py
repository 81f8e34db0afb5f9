"""Sharded records: the key math, the size estimate, and swarms of up to 1,000 simulated nodes
running the real ShardedFamily on an in-memory DHT (swarmnode.lab.shard_sim)."""

from __future__ import annotations

import asyncio

from hivemind.dht.routing import DHTID
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.lab.eclipse import placed_ids, small_swarm_keys
from swarmnode.lab.shard_sim import ShardedSwarm, run
from swarmnode.swarm.hivemind.shards import (
    HEARTBEAT_FAMILY,
    MAX_LEVEL,
    PROBE_EVERY_READS,
    READ_SHARDS,
    RECORDS_PER_SHARD,
    ShardedFamily,
    SizeEstimate,
    level_for,
    manifest_family,
    shard_key,
    shard_of,
)


@given(st.text(min_size=1, max_size=60), st.integers(0, MAX_LEVEL - 1))
def test_a_shard_splits_into_two_at_the_next_level(peer, level):
    shard = shard_of(peer, level)
    assert 0 <= shard < 2**level
    assert shard_of(peer, level + 1) >> 1 == shard


def test_the_level_keeps_about_records_per_shard_in_a_shard():
    assert level_for(0) == level_for(RECORDS_PER_SHARD) == 0
    for writers in (100, 1_000, 10_000):
        per_shard = writers / 2 ** level_for(writers)
        assert RECORDS_PER_SHARD / 1.5 <= per_shard <= RECORDS_PER_SHARD * 1.5, writers
    assert level_for(10**9) == MAX_LEVEL


def test_a_probe_takes_the_most_writers_a_level_implies_but_not_from_a_lone_record():
    estimate = SizeEstimate()
    assert estimate.write_levels() == [0, 1], "a new node writes where a small swarm reads"
    # writers centred on level 7 (1,000 of them) fill 6-8; one record left at level 11 by an
    # estimate since changed would imply 2,048
    estimate.reset({0: 0, 5: 0, 6: 16, 7: 8, 8: 4, 9: 0, 11: 1})
    assert round(estimate.writers) == 1024 and estimate.level == 7
    assert estimate.write_levels() == [6, 7, 8]
    estimate.reset({0: 1, 1: 1})
    assert estimate.writers == 2, "a node alone with one peer: lone records are all there is"
    estimate.reset({level: 0 for level in range(MAX_LEVEL + 1)})
    assert estimate.level == 0


def test_a_read_of_a_small_swarm_takes_every_shard_and_drops_misfiled_records():
    written = {shard_key("f", 0, 0): [("a", b""), ("b", b""), ("c", b"")]}
    asked = []

    async def read_shards(keys):
        asked.extend(keys)
        return [written.get(key, []) for key in keys]

    family = ShardedFamily("f", "me", owner_of=lambda s: s)
    found = asyncio.run(family.read(read_shards))
    assert found.probed and found.level == 0
    assert sorted(who for who, _ in found.items) == ["a", "b", "c"]
    assert len(asked) == MAX_LEVEL + 1 + 1, "the first read probes each level once, then reads its level"
    found = asyncio.run(family.read(read_shards))
    assert not found.probed and len(asked) == MAX_LEVEL + 3, "later reads: the shards of its level only"

    async def everywhere(keys):  # a storing node of another run checks nothing: "a" in every shard
        return [[("a", b"")] for _ in keys]

    found = asyncio.run(family.read_level(everywhere, 1, READ_SHARDS))
    assert found.shards == [0, 1]
    assert found.counts[shard_of("a", 1)] == 1 and found.counts[1 - shard_of("a", 1)] == 0
    assert len(found.items) == 1, "the reader drops a record outside its owner's shard"


def test_a_thousand_nodes_read_a_bounded_amount_and_find_everyone_within_a_few_steps():
    figures = run(1000, steps=8, newcomer_at=4)
    # every node's estimate lands within a level of the right one
    assert set(figures["levels"]) <= {level_for(1000) - 1, level_for(1000), level_for(1000) + 1}
    assert figures["lookups_mean"] <= READ_SHARDS + 0.1, "after the first probe, two lookups a read"
    assert figures["lookups_max"] <= MAX_LEVEL + 1 + READ_SHARDS
    assert figures["records_p99"] <= 8 * RECORDS_PER_SHARD, "a node a level low reads shards twice as full"
    assert figures["unfound"] == 0 and figures["steps_to_find_all"] <= 3
    assert figures["newcomer_found_after"] is not None and figures["newcomer_found_after"] <= 3
    assert figures["records_mean"] <= 2 * READ_SHARDS * RECORDS_PER_SHARD


def test_a_node_whose_estimate_fell_behind_the_swarm_finds_its_level_again():
    """A node that probed when it was alone reads level 0, where only the writers whose
    levels include 0 are: itself. Its reads are never empty, so only the periodic probe
    brings it to the swarm's level."""
    swarm = ShardedSwarm(300, ttl_steps=4)

    async def steps(count):
        for _ in range(count):
            await swarm.step()

    asyncio.run(steps(8))  # the swarm settles; the records of the first levels expire
    early = next(iter(swarm.families.values()))
    early.estimate.log2_writers, early.reads_since_probe = 0.0, 0
    asyncio.run(steps(4))
    assert early.estimate.level == 0, "its reads of level 0 find only itself"
    asyncio.run(steps(PROBE_EVERY_READS))
    assert abs(early.estimate.level - level_for(300)) <= 1, "a probe found where the writers are"


def test_a_flood_of_identities_costs_readers_nothing_more_and_honest_peers_are_still_found():
    flooded = run(20, steps=60, junk=2000)
    assert flooded["records_p99"] <= 8 * RECORDS_PER_SHARD, "reads stay bounded under 2,000 junk identities"
    assert flooded["unfound"] == 0, "every honest peer is read by another within 60 steps"


def test_the_eclipse_bench_covers_every_key_a_small_swarm_writes():
    """bench/attacks.py eclipse places its refusing nodes next to `small_swarm_keys`: if the
    sharding changed and a small swarm wrote elsewhere, the bench would measure no eclipse."""
    written = set()
    for i in range(64):
        for family in (HEARTBEAT_FAMILY, manifest_family("run")):
            written.update(ShardedFamily(family, f"peer-{i}", lambda subkey: None).write_keys())
    assert written == set(small_swarm_keys("run"))
    key = small_swarm_keys("run")[0]
    target = DHTID.generate(source=key)
    placed = placed_ids(key, 8)
    nearest_random = min(target.xor_distance(DHTID.generate()) for _ in range(1000))
    assert len(set(placed)) == 8 and max(target.xor_distance(placed)) < nearest_random
