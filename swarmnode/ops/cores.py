"""How many CPU threads a node's torch uses when other nodes run on the same machine.

torch takes every core by default, so two nodes started by hand on one machine each ran as
many threads as the machine has cores and fought over them (a median round 3x that of the
same two nodes with one thread each). Unless the person chose (OMP_NUM_THREADS, as the demo
sets for its nodes), a node counts the swarmnode nodes running here every EVERY_S seconds and
takes its share of the cores, saying so when its share changes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

EVERY_S = 10.0  # how often the nodes on this machine are counted again
THREADS_VARIABLE = "OMP_NUM_THREADS"  # set: the person chose the threads, and a node keeps to it


def is_node(argv: list[str]) -> bool:
    """A `swarmnode join` command line: the console script, or `python -m swarmnode`."""
    return "join" in argv and any(Path(arg).name == "swarmnode" for arg in argv[:4])


def running_nodes(proc: Path = Path("/proc")) -> int:
    """Processes running `swarmnode join` here, read from /proc (none where there is none)."""
    count = 0
    for entry in proc.glob("[0-9]*/cmdline"):
        try:
            argv = entry.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        count += is_node(argv)
    return count


def nodes_on_this_machine() -> int:
    """The nodes sharing this machine's cores: at least this one."""
    return max(1, running_nodes())


class CoreShare:
    """This node's share of the machine's cores, kept as nodes come and go."""

    def __init__(
        self,
        say: Callable[[str], None],
        cpus: int | None = None,
        count_nodes: Callable[[], int] = nodes_on_this_machine,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.say, self.count_nodes, self.clock = say, count_nodes, clock
        self.cpus = cpus or os.cpu_count() or 1
        self.chosen = THREADS_VARIABLE in os.environ
        self._next = 0.0

    def update(self) -> None:
        """Count the nodes here (at most every EVERY_S) and take this node's share of the cores."""
        now = self.clock()
        if self.chosen or now < self._next:
            return
        self._next = now + EVERY_S
        nodes = self.count_nodes()
        threads = max(1, self.cpus // nodes)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
            self.say(
                f"{nodes} swarmnode node(s) on this machine: this one uses {threads} of {self.cpus} cores "
                f"({THREADS_VARIABLE} sets it yourself)"
            )
