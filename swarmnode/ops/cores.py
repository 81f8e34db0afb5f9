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
    """Processes running `swarmnode join` here, read from /proc (none where there is none).
    One whose parent is one too is the same node (a wrapper such as `timeout`, or a child
    forked with the node's command line) and is not counted again."""
    parents: dict[int, int] = {}  # node pid -> its parent's pid
    for entry in proc.glob("[0-9]*/cmdline"):
        try:
            argv = entry.read_bytes().decode(errors="replace").split("\0")
            if is_node(argv):
                # /proc/<pid>/stat: "pid (comm) state ppid ...", comm may hold spaces and parentheses
                parents[int(entry.parent.name)] = int((entry.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return sum(1 for parent in parents.values() if parent not in parents)


def nodes_on_this_machine() -> int:
    """The nodes sharing this machine's cores: at least this one."""
    return max(1, running_nodes())


def usable_cpus() -> int:
    """The cores this process may run on (a container's cpuset, taskset), not the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


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
        self.cpus = cpus or usable_cpus()
        self.alone = torch.get_num_threads()  # torch's own choice, kept while no other node runs here
        self.chosen = bool(os.environ.get(THREADS_VARIABLE))
        self._next = 0.0

    def update(self) -> None:
        """Count the nodes here (at most every EVERY_S) and take this node's share of the cores."""
        now = self.clock()
        if self.chosen or now < self._next:
            return
        self._next = now + EVERY_S
        nodes = self.count_nodes()
        threads = self.alone if nodes <= 1 else max(1, self.cpus // nodes)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
            self.say(
                f"{nodes} swarmnode node(s) on this machine: this one uses {threads} of {self.cpus} cores "
                f"({THREADS_VARIABLE} sets it yourself)"
            )
