"""Two nodes started by hand on one machine, as the README's recipe does: how long a round takes.

    python bench/two_nodes.py [--rounds 60]

Each setting starts node a (the tiny default, on 127.0.0.1) and node b joining it through a's
swarm.json, both `swarmnode join` processes, `--rounds` rounds each, and prints each node's
median round time over its rounds after the first 10 (while both run): by default (each node
takes its share of the cores, swarmnode/ops/cores.py), with OMP_NUM_THREADS=1 (one thread
each, as the demo gives two nodes on two cores) and with OMP_NUM_THREADS set to every core
(what each node took before it counted the others).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SKIP = 10  # rounds at the start, while the second node may still be starting


def run_pair(directory: Path, rounds: int, threads: str | None) -> list[float]:
    """Both nodes' median round seconds (a, b)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    common = ["--rounds", str(rounds), "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "-q",
              "--set", "node.eval_size=50", "--set", "node.checkpoint_every=0", "--set", "swarm.min_peers=1"]
    join = [sys.executable, "-m", "swarmnode", "join"]
    a_dir, b_dir = directory / "a", directory / "b"
    logs = [open(directory / f"{name}.out", "w") for name in ("a", "b")]
    a = subprocess.Popen([*join, "--run-dir", str(a_dir), *common], env=env, stdout=logs[0], stderr=subprocess.STDOUT)
    b = subprocess.Popen([*join, "--run-dir", str(b_dir), "--initial-peers-from", str(a_dir / "swarm.json"), *common],
                         env=env, stdout=logs[1], stderr=subprocess.STDOUT)
    for process in (a, b):
        if process.wait(timeout=900) != 0:
            raise SystemExit(f"a node failed: see {directory}")
    for log in logs:
        log.close()
    medians = []
    for run_dir in (a_dir, b_dir):
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        rounds_s = [line["round_s"] for line in lines if line.get("kind") == "round"][SKIP:]
        medians.append(statistics.median(rounds_s))
    return medians


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    settings = [("default (share of the cores)", None), ("one thread each", "1"), (f"every core each ({cpus})", str(cpus))]
    results = {}
    with tempfile.TemporaryDirectory(prefix="swarmnode-two-") as scratch:
        for label, threads in settings:
            started = time.perf_counter()
            directory = Path(scratch) / label.split()[0]
            directory.mkdir()
            results[label] = run_pair(directory, args.rounds, threads)
            print(f"  {label}: {time.perf_counter() - started:.0f} s", flush=True)
    base = statistics.mean(results["one thread each"])
    print(f"two tiny nodes on {cpus} cores, {args.rounds} rounds each; median round s after round {SKIP}")
    for label, (a, b) in results.items():
        print(f"{label:<28} a {a:.3f}  b {b:.3f}  ({statistics.mean((a, b)) / base:.2f}x one thread each)")


if __name__ == "__main__":
    main()
