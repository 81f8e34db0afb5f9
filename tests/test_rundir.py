"""One node per run dir, freed however the node ends, and node.log."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from swarmnode.ops.metrics import LiveView
from swarmnode.ops.rundir import RunDirBusy, locked, node_log


def test_a_second_node_on_a_run_dir_is_refused_in_the_same_process_too(tmp_path):
    with locked(tmp_path / "run"):
        with pytest.raises(RunDirBusy, match=rf"pid {os.getpid()}.*its own --run-dir"):
            with locked(tmp_path / "run"):
                pass
    with locked(tmp_path / "run"):  # released at the end of the block
        pass


def test_the_lock_dies_with_its_process_even_on_kill_9(tmp_path):
    run_dir = tmp_path / "run"
    code = (
        "import sys, time; from pathlib import Path; from swarmnode.ops.rundir import locked\n"
        "with locked(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):
            with locked(run_dir):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops the lock with the process
        try:
            with locked(run_dir):
                break
        except RunDirBusy:
            assert time.monotonic() < deadline, "the lock outlived its process"
            time.sleep(0.1)


def test_node_log_holds_what_the_view_printed_and_what_was_logged(tmp_path):
    logging.getLogger().setLevel(logging.INFO)
    with node_log(tmp_path) as path:
        LiveView(quiet=True).say("joined the swarm as Qm...")
        logging.getLogger("swarmnode.test").warning("rejected data from a peer")
    logging.getLogger("swarmnode.test").warning("after the run: not in the log")
    text = path.read_text()
    assert "joined the swarm as Qm..." in text and "rejected data from a peer" in text
    assert "after the run" not in text
