"""What a node's DHT use costs as the swarm grows: real DHT nodes where processes allow, a
simulation of the same protocol beyond.

    python bench/scale.py [--real 10 100 1000] [--simulate 10 100 1000 10000] [--flood 50000]
                          [--dht-nodes 4] [--reads 12] [--keys DIR]

Real: `--dht-nodes` hivemind DHT nodes in this process (over loopback) hold the heartbeats of
N identities (2048-bit RSA keys, made once and kept in `--keys`), each written in its own
shards at the levels a swarm of N uses, as honest nodes would. A new node then reads the
heartbeats `--reads` times with the real ShardedFamily (its first read, and every 16th,
probes every level).
Printed per N: DHT keys looked up and records a read, the requests the reader sent, the bytes
the records take on the wire, the median time of a read, and the requests the busiest of the
DHT nodes served a read. A read's keys go out as one lookup (two with a probe).

Simulated (swarmnode/lab/shard_sim.py): N nodes each run ShardedFamily against an in-memory
DHT where each key lives on the 5 nodes nearest its hash; one step = every node writes and
reads once. Printed per N: keys looked up and records a node reads a step (bytes from the real
record size), requests the busiest storing node serves a step, the steps until every peer and
a newcomer (joining at step 6) were first read by another node, and the level nodes settle
at. `--flood` adds that many junk identities (each in its own shards, at the readers' levels)
to a swarm of 100.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import CompositeValidator
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.lab import shard_sim
from swarmnode.lab.adversary import ManyKeySigner
from swarmnode.protocol.records import Heartbeat
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind.dht import SwarmRecordValidator, owner_or_none, owner_peer_id, pack
from swarmnode.swarm.hivemind.identity import ensure_identity, load_signing_key
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import (
    HEARTBEAT_FAMILY,
    RECORDS_PER_SHARD,
    ShardedFamily,
    level_for,
    shard_key,
    shard_of,
)

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
SIGNATURE_BYTES = len(b"[signature:]") + 344  # hivemind's base64 RSA-2048 signature, appended to each value


def _make_key(path: str) -> None:
    ensure_identity(Path(path))


def identities(directory: Path, count: int) -> list[RSASignatureValidator]:
    """`count` identities, made once (0.3 s each on one core) and reused by later runs."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{i:05d}.key" for i in range(count)]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(f"making {len(missing)} identities in {directory} (once) ...", flush=True)
        with ProcessPoolExecutor(2) as pool:
            list(pool.map(_make_key, missing, chunksize=16))
    return [RSASignatureValidator(load_signing_key(p)) for p in paths]


def record_wire_bytes(subkey: bytes, value: bytes) -> int:
    return len(subkey) + len(value) + SIGNATURE_BYTES


def measure_real(writers: int, dht_nodes: int, reads: int, keys: Path) -> dict:
    signers = identities(keys, writers)
    settings = SwarmSettings(host_maddrs=LOOPBACK)
    nodes = [SwarmRuntime(settings)]
    nodes[0].start()
    first = nodes[0].visible_maddrs()[:1]
    for _ in range(dht_nodes - 1):
        nodes.append(SwarmRuntime(settings, initial_peers=first))
        nodes[-1].start()
    reader = SwarmRuntime(settings, initial_peers=first)
    reader.start()
    served = [0] * len(nodes)
    sent = [0]  # requests the reader sends
    real_find = reader.dht.protocol.call_find

    async def counted_find(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        sent[0] += 1
        return await real_find(*args, **kwargs)

    reader.dht.protocol.call_find = counted_find
    for i, node in enumerate(nodes):  # requests each DHT node answers from its storage
        for store in (node.dht.protocol.storage, node.dht.protocol.cache):
            original = store.get

            def counted(key, i=i, original=original):  # noqa: ANN001, ANN202
                served[i] += 1
                return original(key)

            store.get = counted
    writer = nodes[-1]
    writer.dht.protocol.record_validator = CompositeValidator([ManyKeySigner(signers), SwarmRecordValidator(writer.shards)])
    try:
        centre = level_for(writers)
        levels = [lv for lv in (centre - 1, centre, centre + 1) if lv >= 0]
        now = get_dht_time()
        keys_, values, subkeys = [], [], []
        for signer in signers:
            who = owner_peer_id(signer.local_public_key)
            beat = pack(Heartbeat(peer=who, run="bench-scale", time=now, round=1, model="tiny").model_dump())
            for level in levels:
                keys_.append(shard_key(HEARTBEAT_FAMILY, level, shard_of(who, level)))
                values.append(beat)
                subkeys.append(signer.local_public_key)
        started = time.perf_counter()
        for at in range(0, len(keys_), 500):
            writer.call(
                writer.dht.store_many(keys_[at:at + 500], values[at:at + 500], now + 600, subkeys=subkeys[at:at + 500]),
                timeout=600,
            )
        print(f"  N={writers}: {len(keys_)} records stored in {time.perf_counter() - started:.1f} s", flush=True)
        family = ShardedFamily(HEARTBEAT_FAMILY, reader.peer_id, owner_or_none)
        rows = []
        for _ in range(reads):
            asked: list[str] = []

            async def read_shards(keys: list[str], asked: list[str] = asked) -> list:
                asked.extend(keys)
                return await reader.read_owned_many(keys, 10.0)

            before, sent_before = list(served), sent[0]
            t = time.perf_counter()
            found = reader.call(family.read(read_shards), timeout=120)
            elapsed = time.perf_counter() - t
            rows.append({
                "lookups": len(asked), "sent": sent[0] - sent_before, "records": len(found.items), "probed": found.probed,
                "bytes": sum(record_wire_bytes(s, v) for s, v in found.items), "s": elapsed,
                "busiest": max(after - b for after, b in zip(served, before)),
            })
    finally:
        for node in [reader, *nodes]:
            node.shutdown()
    steady = rows[1:] or rows  # the periodic probe (every 16th read) included
    return {
        "N": writers, "level": family.estimate.level,
        "lookups": statistics.fmean(r["lookups"] for r in steady),
        "records": statistics.fmean(r["records"] for r in steady),
        "sent": statistics.fmean(r["sent"] for r in steady),
        "bytes": statistics.fmean(r["bytes"] for r in steady),
        "ms": 1000 * statistics.median(r["s"] for r in steady),
        "busiest": statistics.median(r["busiest"] for r in steady),
        "probe_ms": 1000 * rows[0]["s"], "probe_lookups": rows[0]["lookups"],
    }


def real_record_bytes() -> int:
    """The wire size of one real heartbeat record (owner marker, value, signature)."""
    signer = RSASignatureValidator()
    who = owner_peer_id(signer.local_public_key)
    beat = pack(Heartbeat(peer=who, run="x" * 16, time=get_dht_time(), round=1, model="Qwen/Qwen2.5-1.5B").model_dump())
    return record_wire_bytes(signer.local_public_key, beat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=int, nargs="*", default=[10, 100, 1000])
    parser.add_argument("--simulate", type=int, nargs="*", default=[10, 100, 1000, 10000])
    parser.add_argument("--flood", type=int, default=50000, help="junk identities next to 100 simulated nodes (0 = none)")
    parser.add_argument("--dht-nodes", type=int, default=4)
    parser.add_argument("--reads", type=int, default=33, help="reads by the new node (two periodic probes)")
    parser.add_argument("--steps", type=int, default=33, help="simulated steps")
    parser.add_argument("--keys", type=Path, default=Path(tempfile.gettempdir()) / "swarmnode-scale-keys")
    args = parser.parse_args()

    if args.real:
        print(f"real: {args.dht_nodes} DHT nodes, heartbeats of N identities, {args.reads} reads by a new node "
              f"(the first probes every level; figures are means over the others, periodic probes included)",
              flush=True)
        results = [measure_real(n, args.dht_nodes, args.reads, args.keys) for n in args.real]
        print(f"{'N':>6} {'level':>5} {'keys/read':>9} {'requests sent/read':>18} {'records/read':>12} {'KB/read':>8} "
              f"{'ms/read':>8} {'busiest node req/read':>21} {'probe ms':>8}")
        for r in results:
            print(f"{r['N']:>6} {r['level']:>5} {r['lookups']:>9.2f} {r['sent']:>18.2f} {r['records']:>12.1f} {r['bytes'] / 1024:>8.1f} "
                  f"{r['ms']:>8.1f} {r['busiest']:>21.1f} {r['probe_ms']:>8.0f}")
        base = results[0]
        for r in results[1:]:
            print(f"N={r['N']} vs N={base['N']}: bytes {r['bytes'] / base['bytes']:.2f}x, keys "
                  f"{r['lookups'] / base['lookups']:.2f}x, time {r['ms'] / base['ms']:.2f}x")
    record_bytes = real_record_bytes()
    if args.simulate:
        print(f"\nsimulated: one step = every node writes and reads once; {RECORDS_PER_SHARD} records a shard aimed at; "
              f"{record_bytes} B a record (a real heartbeat)", flush=True)
        print(f"{'N':>6} {'keys/step':>12} {'records/step':>12} {'KB/step':>8} {'p99 KB':>7} {'busiest storer req':>18} "
              f"{'all found by step':>17} {'newcomer found':>14} {'levels':>12}")
        sims = []
        for n in args.simulate:
            s = shard_sim.run(n, args.steps, newcomer_at=min(6, args.steps - 2))  # a newcomer at step 6
            sims.append(s)
            print(f"{n:>6} {s['lookups_mean']:>12.2f} {s['records_mean']:>12.1f} "
                  f"{s['records_mean'] * record_bytes / 1024:>8.1f} {s['records_p99'] * record_bytes / 1024:>7.1f} "
                  f"{s['busiest_storer']:>18.0f} {s['steps_to_find_all']:>17} {str(s['newcomer_found_after']):>14} "
                  f"{str(s['levels']):>12}", flush=True)
        for s in sims[1:]:
            print(f"N={s['nodes']} vs N={sims[0]['nodes']}: bytes {s['records_mean'] / sims[0]['records_mean']:.2f}x, "
                  f"keys {s['lookups_mean'] / sims[0]['lookups_mean']:.2f}x, busiest storer "
                  f"{s['busiest_storer'] / sims[0]['busiest_storer']:.2f}x")
    if args.flood:
        steps = 48
        plain = shard_sim.run(100, steps)
        flooded = shard_sim.run(100, steps, junk=args.flood)
        print(f"\nflood: 100 simulated nodes, {steps} steps, with and without {args.flood} junk identities")
        for name, s in (("none", plain), ("flood", flooded)):
            print(f"  {name:<6} records/step {s['records_mean']:.1f} (p99 {s['records_p99']}), honest peers not yet "
                  f"read by another: {s['unfound']}, every found one by step {s['steps_to_find_all']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
