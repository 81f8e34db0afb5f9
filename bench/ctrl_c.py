"""Ctrl-C as a terminal delivers it: how long a node takes to stop, and what it prints.

    python bench/ctrl_c.py [--tries 3] [--after-s 20]

A tiny `swarmnode join` node (a swarm of its own on 127.0.0.1) is started in a process group
of its own with SIGINT at its default (as in a terminal), and `--after-s` seconds later the
whole group gets SIGINT, as Ctrl-C in a terminal sends it (the p2p daemon included, unless it
runs in a session of its own). Printed per try: seconds from the signal to the exit, the
exit code, the lines printed after the signal, whether a traceback or daemon error was among
them, and whether a p2p daemon outlived the node.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

NOISE = ("Traceback", "Task was destroyed", "Task exception", "[ERROR]", "error:")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a bench run from a background job inherits it ignored


def one_try(root: Path, after_s: float) -> dict:
    log = root / "node.log.txt"
    cmd = [sys.executable, "-m", "swarmnode", "join", "--run-dir", str(root / "run"), "--rounds", "1000000",
           "-q", "--host-maddrs", "/ip4/127.0.0.1/tcp/0"]
    node = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_default_sigint, env={**os.environ, "OMP_NUM_THREADS": "1"})
    time.sleep(after_s)
    daemons = [p for p in psutil.Process(node.pid).children(recursive=True) if "p2pd" in p.name()]
    printed_before = len(log.read_text().splitlines())
    started = time.monotonic()
    os.killpg(node.pid, signal.SIGINT)
    code = node.wait(timeout=120)
    seconds = time.monotonic() - started
    time.sleep(1.0)
    after = log.read_text().splitlines()[printed_before:]
    return {
        "seconds": seconds,
        "code": code,
        "lines": [line.strip() for line in after if line.strip()],
        "noise": any(word in line for line in after for word in NOISE),
        "daemon_left": any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in daemons),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--after-s", type=float, default=20.0, help="seconds after the start to send Ctrl-C")
    args = parser.parse_args()
    results = []
    for attempt in range(args.tries):
        with tempfile.TemporaryDirectory(prefix="swarmnode-ctrl-c-") as scratch:
            result = one_try(Path(scratch), args.after_s)
        results.append(result)
        print(f"try {attempt + 1}: exit {result['code']} after {result['seconds']:.1f} s, "
              f"{len(result['lines'])} line(s), noise {result['noise']}, daemon left {result['daemon_left']}")
        for line in result["lines"]:
            print(f"    {line}")
    print(f"median {statistics.median(r['seconds'] for r in results):.1f} s to exit; "
          f"max {max(r['seconds'] for r in results):.1f} s")


if __name__ == "__main__":
    main()
