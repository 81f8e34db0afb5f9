"""What a place in the DHT costs once DHT ids are bound to keys (swarmnode/swarm/hivemind/bound_ids.py).

    python bench/id_grinding.py [--keys 40] [--replicas 5] [--swarms 2 10 100 1000 10000]

A node's DHT id is a hash of its peer id, so the only way to choose it is to generate libp2p
RSA keys until one hashes where wanted. This prints the measured time to generate one key (the
median of `--keys`, on one core) and, for swarms of N honest DHT nodes with uniform ids and
records stored on the `--replicas` nodes nearest their key (hivemind's num_replicas), the
expected keys and time on one core to:

- place one node among the k nearest a key: a random id is nearer than the k-th nearest of N
  honest ids with probability k / (N + 1), so (N + 1) / k keys;
- eclipse one key (all k nearest are the attacker's): each of k ids must beat every honest id,
  probability 1 / (N + 1) each, so k (N + 1) keys; a small swarm writes 6 shard keys.

Before ids were bound, both cost nothing: a DHT node took any id it was given.
"""

from __future__ import annotations

import argparse
import statistics
import time

from hivemind.p2p import PeerID

from swarmnode.swarm.hivemind.bound_ids import bound_id
from swarmnode.swarm.hivemind.identity import new_identity

SMALL_SWARM_KEYS = 6  # the shard keys a swarm of a few peers writes (swarmnode.lab.eclipse.small_swarm_keys)


def key_seconds(count: int) -> list[float]:
    """Seconds to generate one identity and its bound id, `count` times."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        bound_id(PeerID.from_identity(new_identity()))
        times.append(time.perf_counter() - started)
    return times


def human(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=40, help="keys generated to time one")
    parser.add_argument("--replicas", type=int, default=5, help="the nodes nearest a key that store it (k)")
    parser.add_argument("--swarms", type=int, nargs="+", default=[2, 10, 100, 1000, 10000], help="honest DHT nodes N")
    args = parser.parse_args()
    times = key_seconds(args.keys)
    per_key = statistics.median(times)
    k = args.replicas
    print(f"one RSA-2048 identity and its bound id: median {per_key * 1e3:.0f} ms over {args.keys} "
          f"(min {min(times) * 1e3:.0f}, max {max(times) * 1e3:.0f}), one core")
    print(f"{'honest nodes N':>15} {'keys: one of the k nearest':>27} {'time':>9} {'keys: eclipse a key':>20} {'time':>9} "
          f"{'time: eclipse 6 keys':>21}")
    for n in args.swarms:
        one, eclipse = max(1.0, (n + 1) / k), k * (n + 1)  # with N < k every id is among the k nearest
        print(f"{n:>15} {one:>27.1f} {human(one * per_key):>9} {eclipse:>20} {human(eclipse * per_key):>9} "
              f"{human(SMALL_SWARM_KEYS * eclipse * per_key):>21}")
    print(f"k = {k}; before ids were bound every place cost nothing (a DHT node took any id it was given)")


if __name__ == "__main__":
    main()
