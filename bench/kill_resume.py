"""kill -9 at a random moment, again and again: how much work a volunteer loses.

    python bench/kill_resume.py [--tries 10] [--checkpoint-every-s 5] [--seed 0]

One tiny `swarmnode join` node (a swarm of its own, on 127.0.0.1, one run dir) is started,
killed with SIGKILL (its whole process group, daemon included) at a random moment between
`--min-s` and `--max-s` after it started, and started again with the same command, `--tries`
times. Checkpoints come by time only (`node.checkpoint_every=0`,
`node.checkpoint_every_s=--checkpoint-every-s`). Printed per try: whether the start resumed
(and from the round of the last checkpoint), whether the peer id stayed the same, the rounds
finished before the kill, and the work lost: the rounds after the last checkpoint and the
seconds between that checkpoint and the kill (at most the checkpoint period plus a round).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarmnode.model.tiny import TINY_PRESETS, ensure_tiny
from swarmnode.ops.metrics import read_metrics, round_lines


def start(run_dir: Path, checkpoint_every_s: float, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "swarmnode", "join", "--run-dir", str(run_dir), "--rounds", "1000000", "-q",
           "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--set", "node.checkpoint_every=0",
           "--set", f"node.checkpoint_every_s={checkpoint_every_s}", "--set", "node.eval_size=10"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def checkpoint(run_dir: Path) -> dict | None:
    meta = run_dir / "checkpoint" / "meta.json"
    return json.loads(meta.read_text()) if meta.exists() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--checkpoint-every-s", type=float, default=5.0)
    parser.add_argument("--min-s", type=float, default=8.0, help="earliest kill, seconds after the start")
    parser.add_argument("--max-s", type=float, default=25.0, help="latest kill, seconds after the start")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for spec in TINY_PRESETS.values():
        ensure_tiny(spec)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="swarmnode-kill-") as scratch:
        run_dir = Path(scratch) / "run"
        peer_ids, lost_s, lost_rounds, failures = set(), [], [], 0
        print(f"{args.tries} kills of a tiny node, checkpoints every {args.checkpoint_every_s:.0f} s (by time only)")
        print(f"{'try':>3} {'resumed from':>13} {'peer id':>8} {'rounds done':>12} {'lost rounds':>12} {'lost s':>7}")
        for attempt in range(args.tries):
            before = checkpoint(run_dir)
            log = Path(scratch) / f"node-{attempt}.log"
            process = start(run_dir, args.checkpoint_every_s, log)
            time.sleep(rng.uniform(args.min_s, args.max_s))
            killed_at = time.time()
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            said = " ".join(log.read_text().split())
            expected = f"{before['round'] + 1} round(s) done" if before else None
            resumed = "-" if before is None else (str(before["round"] + 1) if expected in said else "NO")
            swarm = run_dir / "swarm.json"
            peer = json.loads(swarm.read_text())["peer_id"] if swarm.exists() else "?"
            peer_ids.add(peer)
            done = [r for r in round_lines(read_metrics(run_dir / "metrics.jsonl")) if r["time"] <= killed_at]
            last_done = done[-1]["round"] if done else -1
            saved = checkpoint(run_dir)
            saved_round = saved["round"] if saved else -1
            # no checkpoint yet: everything since the first round was lost
            since = killed_at - (saved["time"] if saved else done[0]["time"] if done else killed_at)
            failures += resumed == "NO"
            lost_rounds.append(last_done - saved_round)
            lost_s.append(since)
            print(f"{attempt + 1:>3} {resumed:>13} {peer[-8:]:>8} {last_done + 1:>12} {last_done - saved_round:>12} "
                  f"{since:>7.1f}", flush=True)
        print(f"resumed every time: {failures == 0}; one peer id: {len(peer_ids) == 1}; "
              f"work lost at most {max(lost_rounds)} round(s), {max(lost_s):.1f} s "
              f"(checkpoint period {args.checkpoint_every_s:.0f} s)")


if __name__ == "__main__":
    main()
