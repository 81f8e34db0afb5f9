"""What a node keeps per name beside a crowd that makes new ones: a simulation with the real
Intake's ledger, pool and screener, no models and no network.

    python bench/forgetting.py                      # 8 new names a round, 5,000 rounds
    python bench/forgetting.py --names 64 --rounds 5000
    python bench/forgetting.py --keep-all           # as before 2026-12-06: nothing forgotten

Names are free, so a crowd can send each name's batch once and never again. Every round of the
simulation `--names` new names deliver one batch of one group, which the node uses at once (a
newcomer turn), as the churning crowd of bench/attacks.py probation-crowd does; one honest peer
delivers and teaches every round. The intake forgets names that never taught and were silent
for SILENT_ROUNDS of our rounds (swarmnode.loop.ledger.forget_silent). The bench prints, at
checkpoints, the names seen so far, the ledger's records, the pool's per-name entries, and the
median time of one round's walks of the ledger (the exchange's known peers and the gather's
expected ones) and of the forgetting itself.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from swarmnode.loop.intake import Intake
from swarmnode.loop.ledger import SILENT_ROUNDS, PeerLedger
from swarmnode.loop.pool import OfferedGroup
from swarmnode.settings.config import load_config

CHECKPOINTS = (100, 1_000, 2_000, 5_000, 20_000, 100_000)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_intake(run_dir: Path) -> Intake:
    """An Intake on the tiny preset's settings; the exchange, membership and model are never
    touched by what this bench calls."""
    config = load_config(None, [f"node.run_dir={run_dir}"])
    return Intake(config, None, None, "run", None, None, PeerLedger(config.swarm))


def walk_s(intake: Intake) -> float:
    """One round's walks of the ledger: whom the exchange asks, whom the gather waits for."""
    t = time.perf_counter()
    intake.ledger.known_peers()
    intake.ledger.expected()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=positive_int, default=8, help="new names a round (default 8)")
    parser.add_argument("--rounds", type=positive_int, default=5_000, help="our rounds (default 5,000)")
    parser.add_argument("--keep-all", action="store_true", help="forget nothing, as the node did before 2026-12-06")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        intake = build_intake(Path(scratch))
        ledger, pool = intake.ledger, intake.pool
        walks: list[float] = []
        forgets: list[float] = []
        rule = "nothing forgotten" if args.keep_all else f"forgotten after {SILENT_ROUNDS} silent rounds"
        print(f"{args.names} new names a round, each sending one batch; {rule}")
        print(f"{'round':>7} {'names seen':>11} {'ledger records':>15} {'pool entries':>13} "
              f"{'walks, ms':>10} {'forget, ms':>11}")
        for round_ in range(args.rounds):
            t = time.perf_counter()
            if args.keep_all:
                ledger.advance(round_)
            else:
                intake.forget_silent(round_)
            forgets.append(time.perf_counter() - t)
            arrived = time.monotonic()
            for peer in ["honest", *(f"name-{round_}-{k}" for k in range(args.names))]:
                ledger.delivered(peer)
                pool.add(peer, round_, [OfferedGroup(peer, round_, 0, [], arrived)], round_)
            pool.take([group for groups in pool.offers(round_).values() for group in groups])
            ledger.screened("honest", 8, 8, round_)
            walks.append(walk_s(intake))
            done = round_ + 1
            if done in CHECKPOINTS or done == args.rounds:
                recent = slice(-min(100, done), None)
                print(f"{done:>7} {done * args.names + 1:>11} {len(ledger.peers):>15} {len(pool._arrived_in):>13} "
                      f"{statistics.median(walks[recent]) * 1e3:>10.3f} {statistics.median(forgets[recent]) * 1e3:>11.3f}")
        print("walks and forget: medians over the last 100 rounds before each line")


if __name__ == "__main__":
    main()
