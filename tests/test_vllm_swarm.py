"""A vLLM node and a Hugging Face node, as separate `swarmnode join` processes, train together."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.test_swarm_processes import NodeProcess, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_a_vllm_node_and_an_hf_node_train_together(tmp_path):
    from swarmnode.model.tiny import TINY_SPEC, ensure_tiny

    ensure_tiny(TINY_SPEC)
    fast = NodeProcess(tmp_path, "v", {"rollout": {"backend": "vllm"}, "swarm": {"min_peers": 1}})
    plain = NodeProcess(tmp_path, "h", {"model": {"lora": {"rank": 8}}, "rollout": {"backend": "hf"}, "swarm": {"min_peers": 1}})
    nodes = [fast, plain]
    try:
        fast.start([])
        wait_for(lambda: (fast.dir / "run" / "swarm.json").exists(), 120, "the vLLM node to start", [fast])
        plain.start(fast.info["maddrs"])
        wait_for(lambda: all(len(n.rounds()) >= 20 for n in nodes), 300, "20 rounds on both nodes", nodes)
        for node in nodes:
            rounds = node.rounds()
            # each counts its own rounds at its own speed: a round may find nothing new. The
            # tiny rounds (0.05-0.3 s) are shorter than a poll interval (0.25 s), so a node's
            # first half second of rounds can pass before its peer's second batch arrives;
            # judged on the second half, once the peer's pace is known
            used = [r["peer_samples"] > 0 for r in rounds[len(rounds) // 2:]]
            assert sum(used) >= 0.5 * len(used), (node.name, [r["peer_samples"] for r in rounds])
            assert all(r["rejected"] == 0 for r in rounds)
        assert all(r["sync_s"] > 0 for r in fast.rounds())  # weights pushed into the engine every step
        done = subprocess.run(
            [sys.executable, "-m", "swarmnode", "status", "--initial-peers", fast.info["maddrs"][0], "--json"],
            capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
        backends = {p["peer"]: p["backend"] for p in json.loads(done.stdout)["peers"]}
        assert backends == {fast.info["peer_id"]: "vllm", plain.info["peer_id"]: "hf"}
    finally:
        for node in nodes:
            node.stop()
