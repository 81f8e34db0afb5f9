"""The swarm's latencies, which the tests do not time: two or three nodes in this process, on
127.0.0.1, each figure the median of --repeats tries, in milliseconds.

The tests (tests/test_swarm_exchange.py, tests/test_swarm_payloads.py) check these behaviours
by cause and order, which holds however busy the machine is; this prints how long they take
here (each well under a second or two on an idle 2-core machine):

- publish: three publishes while the manifest's DHT store is stalled;
- gather past deadline: a 1 s gather waiting for a peer while every DHT lookup hangs, less 1 s;
- direct pull: a known, useful peer's new batch, from its publish until it is in hand, while a
  DHT lookup hangs (the background polls only);
- ask at once: the same with polls 10 s apart, a round waiting for that peer (its own ask);
- linger: a finishing node's linger once its peer has fetched its batch.

python bench/swarm_latency.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from swarmnode.loop.ledger import PeerLedger
from swarmnode.settings.config import SwarmSettings, load_config
from swarmnode.swarm.base import GatherWait
from swarmnode.swarm.hivemind.connect import attach
from swarmnode.swarm.hivemind.runtime import SwarmRuntime

RUN = "bench-latency"


async def _hangs(*args, **kwargs) -> None:
    await asyncio.sleep(3600)


class Lab:
    """Runtimes on 127.0.0.1 in this process, shut down together."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.runtimes: list[SwarmRuntime] = []

    def start(self, name: str, initial: list[str] | None = None) -> SwarmRuntime:
        settings = SwarmSettings(initial_peers=initial or [], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        runtime = SwarmRuntime(settings, self.workdir / f"{name}-{len(self.runtimes)}.key")
        runtime.start()
        self.runtimes.append(runtime)
        return runtime

    def pair(self) -> tuple[SwarmRuntime, SwarmRuntime]:
        a = self.start("a")
        return a, self.start("b", a.visible_maddrs())

    def close(self) -> None:
        for runtime in self.runtimes:
            runtime.shutdown()


def _link(runtime: SwarmRuntime, ledger: PeerLedger | None = None, *sets: str):
    config = load_config(None, ["swarm.heartbeat_interval_s=0.5", "wire.max_bytes=67108864", *sets])
    return attach(runtime, RUN, config, ledger or PeerLedger())


def publish_with_a_stalled_store(lab: Lab) -> float:
    a, b = lab.pair()
    ex_b = _link(b).exchange
    b.dht.store_many = _hangs
    started = time.perf_counter()
    for round_ in range(3):
        ex_b.publish(round_, f"round {round_}".encode(), 1)
    return time.perf_counter() - started


def gather_past_its_deadline(lab: Lab) -> float:
    a, b = lab.pair()
    ex_a, ex_b = _link(a).exchange, _link(b).exchange
    ex_a.live_peers, ex_a.met_directly = tuple, list
    a.dht.get_many = _hangs
    ex_b.publish(0, b"D" * 100, 1)
    started = time.perf_counter()
    ex_a.gather(GatherWait(timeout_s=1.0, wait_for={b.peer_id}))
    return time.perf_counter() - started - 1.0


def _known_pair(lab: Lab, *sets: str):
    a, b = lab.pair()
    ledger = PeerLedger()
    ex_a, ex_b = _link(a, ledger, *sets).exchange, _link(b, None, *sets).exchange
    ex_b.publish(0, b"round 0", 1)
    assert ex_a.gather(GatherWait(timeout_s=60, wait_for={b.peer_id})), "b never found"
    ledger.delivered(b.peer_id)
    ledger.screened(b.peer_id, 8, 8, 0)
    return a, b, ex_a, ex_b


def direct_pull_while_a_lookup_hangs(lab: Lab) -> float:
    a, b, ex_a, ex_b = _known_pair(lab, "swarm.discovery_interval_s=0.01")
    a.dht.get_many = _hangs
    time.sleep(0.5)
    ex_b.publish(1, b"round 1", 1)
    started = time.perf_counter()
    while not ex_a.gather(GatherWait(timeout_s=0.01)):
        pass
    return time.perf_counter() - started


def asked_at_once(lab: Lab) -> float:
    a, b, ex_a, ex_b = _known_pair(lab, "swarm.poll_interval_s=10", "swarm.discovery_interval_s=60")
    time.sleep(0.5)
    ex_b.publish(1, b"round 1", 1)
    started = time.perf_counter()
    ex_a.gather(GatherWait(timeout_s=30, wait_for={b.peer_id}))
    return time.perf_counter() - started


def linger_once_fetched(lab: Lab) -> float:
    a, b = lab.pair()
    ex_a, ex_b = _link(a).exchange, _link(b).exchange
    ex_a.publish(0, b"batch", 1)
    ex_b.gather(GatherWait(timeout_s=60, wait_for={a.peer_id}))
    started = time.perf_counter()
    ex_a.linger(0, {b.peer_id}, timeout_s=10)
    return time.perf_counter() - started


FIGURES = {
    "publish x3, store stalled": publish_with_a_stalled_store,
    "gather past deadline, DHT hung": gather_past_its_deadline,
    "direct pull, lookup hung": direct_pull_while_a_lookup_hangs,
    "ask at once, polls 10 s apart": asked_at_once,
    "linger once fetched": linger_once_fetched,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'figure':<32} {'median ms':>10} {'max ms':>8}")
    for name, measure in FIGURES.items():
        samples = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as workdir:
                lab = Lab(Path(workdir))
                try:
                    samples.append(1000 * measure(lab))
                finally:
                    lab.close()
        print(f"{name:<32} {statistics.median(samples):>10.1f} {max(samples):>8.1f}", flush=True)


if __name__ == "__main__":
    main()
