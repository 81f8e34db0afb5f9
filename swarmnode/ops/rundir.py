"""A node's run directory: one node at a time, and a log file of what it said.

Two nodes started on one run dir would share a peer id, interleave their metrics and
overwrite each other's checkpoints, so the first one holds an exclusive lock for as long as
it runs. The lock is `fcntl.flock` on an open file: the kernel drops it when the process
ends however it ends (kill -9 included), so a stale lock never keeps a node out, and two
opens in one process exclude each other too (filelock's FileLock is re-entrant within a
process, which would let two in-process nodes share a dir).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "node.lock"
LOG_FILE = "node.log"
VIEW_LOGGER = "swarmnode.view"  # what the live view prints; written to node.log, not the console twice


class RunDirBusy(RuntimeError):
    """Another node is running in this run dir."""


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """Hold the run dir for this node, or raise RunDirBusy naming the process that holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunDirBusy(
            f"another node (pid {holder}) is running in {run_dir}: give this one its own --run-dir "
            "(each node needs its own directory: its identity, metrics and checkpoints live there)"
        ) from None
    try:
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()  # closing drops the lock


def log_failure(run_dir: Path | str, message: str) -> None:
    """A node that stopped before its log was open (its settings refused) still says why in
    <run-dir>/node.log; a run dir that cannot be written, or that a running node holds, is
    left alone (the terminal says it)."""
    try:
        with locked(Path(run_dir)), open(Path(run_dir) / LOG_FILE, "a", encoding="utf-8") as log_file:
            log_file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} ERROR swarmnode.view: error: {message}\n")
    except (OSError, RunDirBusy):  # a node running there keeps its log to itself
        pass


@contextlib.contextmanager
def node_log(run_dir: Path) -> Iterator[Path]:
    """Append what the node logs and what its live view prints to <run-dir>/node.log."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOG_FILE
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    view = logging.getLogger(VIEW_LOGGER)
    view.setLevel(logging.INFO)
    view.propagate = False  # the view prints to the console itself
    for logger in (logging.getLogger(), view):
        logger.addHandler(handler)
    try:
        yield path
    except BaseException as err:  # the last line of node.log says why the node stopped, as the terminal does
        if isinstance(err, KeyboardInterrupt):
            view.info("stopped by Ctrl-C or SIGTERM")
        elif not isinstance(err, GeneratorExit):
            view.error("error: %s", err if str(err) else type(err).__name__)
        raise
    finally:
        for logger in (logging.getLogger(), view):
            logger.removeHandler(handler)
        handler.close()
