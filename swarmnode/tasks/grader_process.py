"""math-verify in a process of its own, killed at a hard time and memory limit.

Peers choose what a node grades. `cheap_to_grade` keeps what reaches math-verify small, but a
list of what is cheap can miss the next sympy blow-up, and in big-integer work no alarm
stops sympy; nor does any off the main thread. So grading runs in a worker process
(swarmnode.tasks.grading_worker) that gets at most MEMORY_LIMIT_BYTES of address space and
HARD_TIMEOUT_S an answer: past either it is killed, the answer scores 0 (as anything
math-verify cannot read does), and the next answer starts a new worker. The messages are JSON
lines, so nothing between the two processes is unpickled.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import select
import subprocess
import sys
import threading
import time

log = logging.getLogger(__name__)

HARD_TIMEOUT_S = 15.0  # an answer's grading at most (math-verify's own alarms stop at 5 s a step)
START_TIMEOUT_S = 120.0  # the worker's start (importing sympy and math-verify; slow on a busy machine)
MEMORY_LIMIT_BYTES = 2 * 1024**3  # the worker's address space: sympy expanding a huge power hits it


def limit_memory(limit_bytes: int = MEMORY_LIMIT_BYTES) -> None:
    """The worker's first act, before it imports sympy: its address space capped (a
    MemoryError there scores the answer 0; past it the worker dies and is started again)."""
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


class GradingProcess:
    """One worker, used by one request at a time (a lock), started on first use."""

    def __init__(self, hard_timeout_s: float = HARD_TIMEOUT_S) -> None:
        self.hard_timeout_s = hard_timeout_s
        self.killed = 0  # workers killed at a limit: a count for tests and logs
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def equal(self, predicted: str, reference: str, latex: bool = False) -> bool:
        """math-verify's answer in the worker; False when it fails, dies or passes a limit."""
        request = json.dumps({"predicted": predicted, "reference": reference, "latex": latex}) + "\n"
        with self._lock:
            try:
                process = self._running()
                process.stdin.write(request)
                process.stdin.flush()
                answer = self._line(process, self.hard_timeout_s)
            except (OSError, TimeoutError, ValueError) as err:
                self._kill(f"{type(err).__name__}: {err}")
                return False
            return isinstance(answer, dict) and answer.get("equal") is True

    def close(self) -> None:
        with self._lock:
            if self._process is not None:
                self._process.kill()
                self._process.wait()
                self._process = None

    def _running(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "swarmnode.tasks.grading_worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            if self._line(self._process, START_TIMEOUT_S) != {"ready": True}:
                raise OSError("the grading worker did not start")
        return self._process

    @staticmethod
    def _line(process: subprocess.Popen[str], timeout_s: float) -> object:
        """The worker's next line as JSON; TimeoutError past `timeout_s`, OSError at its end."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                line = process.stdout.readline()
                if not line:
                    raise OSError(f"the grading worker exited ({process.poll()})")
                return json.loads(line)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no answer within {timeout_s:.0f} s")

    def _kill(self, why: str) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
        self.killed += 1
        log.warning("grading: the worker was stopped (%s); the answer scores 0", why)


_shared: GradingProcess | None = None
_shared_lock = threading.Lock()


def shared_grader() -> GradingProcess:
    """The process's one grading worker (a node grades one answer at a time)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = GradingProcess()
        return _shared
