"""/health (Docker's healthcheck asks the node itself) and initial peers from a swarm.json."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from swarmnode.ops.health import HealthServer, ask
from swarmnode.swarm.hivemind.swarm_file import PeersFileError, read_peers_file
from tests.terminal import ctrl_c_as_in_a_terminal

PEER = "/p2p/QmRZjMbRutJDyUJaU87KixfqRQ3wrGF3hTYEnUxr2jWuru"


def test_health_answers_200_when_alive_and_503_when_stalled():
    state = {"alive": True, "round": 3}
    server = HealthServer("127.0.0.1", 0, lambda: dict(state))
    try:
        healthy, said = ask("127.0.0.1", server.port, 5)
        assert healthy and json.loads(said)["round"] == 3
        state["alive"] = False
        healthy, said = ask("127.0.0.1", server.port, 5)
        assert not healthy and json.loads(said)["alive"] is False
    finally:
        server.close()
    healthy, said = ask("127.0.0.1", server.port, 2)
    assert not healthy and "no answer" in said


def test_metrics_are_served_beside_health_in_prometheus_text():
    server = HealthServer("127.0.0.1", 0, lambda: {"alive": True}, metrics=lambda: b"swarmnode_round 7.0\n")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert response.read() == b"swarmnode_round 7.0\n"
    finally:
        server.close()


def test_peers_file_waits_then_drops_loopback(tmp_path):
    path = tmp_path / "swarm.json"
    maddrs = [f"/ip4/127.0.0.1/tcp/31337{PEER}", f"/ip4/172.18.0.2/tcp/31337{PEER}"]
    writer = threading.Timer(0.5, lambda: path.write_text(json.dumps({"peer_id": "x", "maddrs": maddrs})))
    writer.start()
    assert read_peers_file(path, timeout_s=10, poll_s=0.1) == maddrs[1:]
    path.write_text(json.dumps({"maddrs": maddrs[:1]}))
    assert read_peers_file(path, timeout_s=1) == maddrs[:1]  # loopback only: keep it (one host)


@pytest.mark.parametrize("content", ["not json", json.dumps({"maddrs": []}), json.dumps({"x": 1}), "x" * 70_000])
def test_peers_file_rejects_junk(tmp_path, content):
    path = tmp_path / "swarm.json"
    path.write_text(content)
    with pytest.raises(PeersFileError):
        read_peers_file(path, timeout_s=1)


def test_a_bootstrap_list_gives_every_listed_address(tmp_path):
    """The organisers' list: one multiaddr a line, comments and blank lines skipped; any of
    them is enough to join (see tests/test_swarm_membership.py for a dead first entry)."""
    path = tmp_path / "bootstrap.txt"
    listed = [f"/ip4/203.0.113.{i}/tcp/31337{PEER}" for i in (1, 2)]
    path.write_text(f"# swarm bootstrap, 2026-11\n{listed[0]}\n\n  {listed[1]}  # backup\n")
    assert read_peers_file(path, timeout_s=1) == listed
    path.write_text(f"{listed[0]}\nhttps://example.org/peers\n")
    with pytest.raises(PeersFileError, match="line 2"):
        read_peers_file(path, timeout_s=1)


def test_peers_file_that_never_appears_times_out(tmp_path):
    started = time.monotonic()
    with pytest.raises(PeersFileError, match="did not appear"):
        read_peers_file(tmp_path / "missing.json", timeout_s=1, poll_s=0.1)
    assert time.monotonic() - started < 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_swarmnode_health_asks_a_running_node(tmp_path):
    port = _free_port()
    cmd = [sys.executable, "-m", "swarmnode", "join", "--solo", "--rounds", "100000", "-q",
           "--run-dir", str(tmp_path / "run"), "--health-port", str(port), "--set", "node.eval_size=10"]
    node = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=ctrl_c_as_in_a_terminal)
    check = [sys.executable, "-m", "swarmnode", "health", "--port", str(port)]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = subprocess.run(check, capture_output=True, text=True, timeout=60)
            if done.returncode == 0 and json.loads(done.stdout)["round"] is not None:
                break
            assert node.poll() is None, "the node exited"
            time.sleep(1)
        else:
            pytest.fail("the node never reported healthy")
        assert json.loads(done.stdout)["alive"] is True
    finally:
        os.killpg(node.pid, signal.SIGINT)
        try:
            node.wait(60)
        except subprocess.TimeoutExpired:  # not left training for 100,000 rounds
            os.killpg(node.pid, signal.SIGKILL)
            raise
    assert subprocess.run(check, capture_output=True, timeout=60).returncode == 1  # gone: unhealthy
