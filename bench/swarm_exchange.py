"""Swarm exchange overhead: publish + gather per round with 2, 4 and 8 local nodes.

Each node is its own process with its own p2p daemon on 127.0.0.1, running the real
HivemindExchange with no model: every round it publishes one batch and gathers its peers',
so the round time is the exchange overhead alone (DHT manifest, polling, peer-to-peer pulls,
waiting for the slowest peer that has delivered before, as a node does). Also prints the bytes on the wire per completion token.

python bench/swarm_exchange.py                      # tiny-default batches, 2/4/8 nodes
python bench/swarm_exchange.py --shape paper        # 24 prompts x 12 completions x 256 tokens
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from swarmnode.loop.ledger import PeerLedger
from swarmnode.protocol import wire
from swarmnode.protocol.records import NodeStatus
from swarmnode.settings.config import load_config
from swarmnode.swarm.base import GatherWait
from swarmnode.swarm.hivemind.connect import attach
from swarmnode.swarm.hivemind.dht import DIGEST_BYTES, Manifest
from swarmnode.swarm.hivemind.runtime import SwarmRuntime

SHAPES = {  # prompts, completions per prompt, tokens per completion
    "tiny": (16, 8, 6),  # the tiny CPU default: short arithmetic answers
    "paper": (24, 12, 256),  # the paper's batch with 256-token completions
}
RUN = "bench-exchange"


def make_payload(shape: str, peer: str, round_: int) -> tuple[bytes, int]:
    prompts, group, length = SHAPES[shape]
    rng = np.random.default_rng(round_)
    groups = []
    for p in range(prompts):
        lengths = np.full(group, length, dtype=np.int64)
        n = int(lengths.sum())
        groups.append(
            wire.CompletionGroup(
                p, lengths, rng.integers(0, 150_000, n, dtype=np.int32), -rng.random(n, dtype=np.float32)
            )
        )
    batch = wire.RolloutBatch(RUN, peer, round_, "0" * 64, groups)
    return wire.encode(batch), batch.num_tokens


def node_main(index: int, nodes: int, rounds: int, shape: str, maddrs_queue, results_queue, workdir: str) -> None:
    initial = [] if index == 0 else [maddrs_queue.get()]
    config = load_config(None, [
        "swarm.host_maddrs=[/ip4/127.0.0.1/tcp/0]", "swarm.heartbeat_interval_s=1.0", "swarm.poll_interval_s=0.05",
        "wire.max_bytes=67108864", "node.staleness=1",
    ])
    runtime = SwarmRuntime(config.swarm, Path(workdir) / f"{index}.key", initial)
    runtime.start()
    if index == 0:
        for _ in range(nodes - 1):
            maddrs_queue.put(runtime.visible_maddrs()[0])
    ledger = PeerLedger(config.swarm)
    link = attach(runtime, RUN, config, ledger)
    exchange, membership = link.exchange, link.membership
    membership.announce(NodeStatus(round=0))
    membership.wait_for_peers(nodes - 1, timeout_s=60)
    samples = []
    for r in range(rounds):
        membership.announce(NodeStatus(round=r))
        payload, tokens = make_payload(shape, runtime.peer_id, r)
        t0 = time.perf_counter()
        exchange.publish(r, payload, tokens)
        t1 = time.perf_counter()
        # as the node does: wait for peers that delivered (none yet: for the first from anyone)
        expected = ledger.expected(set(membership.live_peers()))
        got = exchange.gather(GatherWait(timeout_s=10.0, wait_for=expected, wait_for_any=not ledger.ever_delivered()))
        for item in got:
            ledger.delivered(item.peer_id)
        t2 = time.perf_counter()
        samples.append({"publish": t1 - t0, "gather": t2 - t1, "peers": len({g.peer_id for g in got}),
                        "bytes": len(payload), "tokens": tokens})
    membership.close()
    runtime.shutdown()
    results_queue.put((index, samples))


def run(nodes: int, rounds: int, shape: str) -> dict:
    ctx = mp.get_context("spawn")
    maddrs, results = ctx.Queue(), ctx.Queue()
    with tempfile.TemporaryDirectory() as workdir:
        procs = [ctx.Process(target=node_main, args=(i, nodes, rounds, shape, maddrs, results, workdir))
                 for i in range(nodes)]
        for p in procs:
            p.start()
        collected = [results.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    warm = [s for _, samples in collected for s in samples[2:]]  # the first rounds include start-up skew
    per_round = [s["publish"] + s["gather"] for s in warm]
    return {
        "median_ms": 1000 * statistics.median(per_round),
        "publish_ms": 1000 * statistics.median(s["publish"] for s in warm),
        "gather_ms": 1000 * statistics.median(s["gather"] for s in warm),
        "p90_ms": 1000 * sorted(per_round)[int(0.9 * (len(per_round) - 1))],
        "complete": sum(s["peers"] == nodes - 1 for s in warm) / len(warm),
        "bytes": warm[0]["bytes"],
        "tokens": warm[0]["tokens"],
    }


def wire_bytes_per_token(shape: str) -> str:
    payload, tokens = make_payload(shape, "Qm" + "x" * 44, 0)
    manifest = len(Manifest("Qm" + "x" * 44, 0, len(payload), b"\0" * DIGEST_BYTES, tokens).to_value())
    signed_manifest = manifest + len(b"[signature:]") + 344  # base64 of a 2048-bit RSA-PSS signature
    request, response_header = 40, 9  # msgpack {run, round} + u32 length; status byte + u64 length
    total = len(payload) + request + response_header + signed_manifest
    return (
        f"{shape}: {tokens} tokens, payload {len(payload)} B = {len(payload) / tokens:.2f} B/token; "
        f"with manifest ({signed_manifest} B signed) and request/response framing: {total / tokens:.2f} B/token "
        "(before libp2p's own TLS/yamux framing)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rounds", type=int, default=22)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    args = parser.parse_args()
    print(wire_bytes_per_token(args.shape))
    print(f"{'nodes':>5} {'round ms (median)':>18} {'p90':>8} {'publish':>8} {'gather':>8} {'all peers':>10}")
    for n in args.nodes:
        r = run(n, args.rounds, args.shape)
        print(f"{n:>5} {r['median_ms']:>18.1f} {r['p90_ms']:>8.1f} {r['publish_ms']:>8.1f} "
              f"{r['gather_ms']:>8.1f} {r['complete']:>9.0%}", flush=True)


if __name__ == "__main__":
    main()
