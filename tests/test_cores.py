"""A node's share of the machine's cores (swarmnode/ops/cores.py): nodes started by hand on
one machine divide its cores instead of each taking all of them."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import torch

from swarmnode.ops import cores
from swarmnode.ops.cores import EVERY_S, CoreShare, is_node, nodes_on_this_machine, running_nodes


def test_a_node_takes_its_share_of_the_cores_as_nodes_come_and_go_and_says_so(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = [4]
    monkeypatch.setattr(cores.torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(cores.torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    said, nodes, now = [], [2], [0.0]
    share = CoreShare(said.append, cpus=4, count_nodes=lambda: nodes[0], clock=lambda: now[0])
    share.update()
    assert threads == [2] and "2 swarmnode node(s) on this machine: this one uses 2 of 4 cores" in said[0]
    nodes[0] = 8
    share.update()
    assert threads == [2], "counted again only every EVERY_S"
    now[0] += EVERY_S
    share.update()
    assert threads == [1] and len(said) == 2, "never below one thread"
    nodes[0] = 1
    now[0] += EVERY_S
    share.update()
    assert threads == [4] and len(said) == 3, "alone again: torch's own choice, as at the start"
    now[0] += EVERY_S
    share.update()
    assert len(said) == 3, "said only when the share changes"


def test_threads_the_person_chose_are_kept_and_a_node_alone_keeps_torch_s_choice(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # empty: nobody chose
    assert not CoreShare(lambda text: None).chosen
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    before = torch.get_num_threads()
    CoreShare(lambda text: None, cpus=8, count_nodes=lambda: 4).update()
    assert torch.get_num_threads() == before


def test_running_nodes_are_counted_from_their_command_lines():
    assert is_node(["/x/.venv/bin/python", "/x/.venv/bin/swarmnode", "join", "--solo"])
    assert is_node(["python3", "-m", "swarmnode", "join"])
    assert not is_node(["python3", "-m", "swarmnode", "status"]) and not is_node(["vim", "join.py"])
    before = running_nodes()
    # a fake node whose child has the same command line (a wrapper, a fork): one node, not two
    parent_code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
                   "'swarmnode', 'join']); time.sleep(60)")
    fake = subprocess.Popen([sys.executable, "-c", parent_code, "swarmnode", "join"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(psutil.Process(fake.pid).children()) < 1:
            time.sleep(0.05)
        assert psutil.Process(fake.pid).children(), "the fake node's child started"
        assert running_nodes() == before + 1
    finally:
        for child in psutil.Process(fake.pid).children():
            child.kill()
        fake.kill()
        fake.wait()
    assert nodes_on_this_machine() >= 1
