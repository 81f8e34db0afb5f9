"""`swarmnode demo` end to end, and its clean-up when interrupted."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from swarmnode.demo import DEMO_BASE, NODE_KINDS, equal_time_gain, modelled_times, node_config, solo_config
from swarmnode.ops.lines import EvalRecord, RoundRecord
from swarmnode.ops.metrics import round_lines
from swarmnode.settings.config import Config
from tests.terminal import ctrl_c_as_in_a_terminal

pytestmark = pytest.mark.slow


def test_node_configs_are_heterogeneous_and_valid(tmp_path):
    configs = [Config.model_validate(node_config(DEMO_BASE, i, 3, 10, tmp_path / str(i))) for i in range(3)]
    alone = Config.model_validate(solo_config(node_config(DEMO_BASE, 1, 3, 10, tmp_path / "1"), tmp_path / "1" / "solo"))
    assert not alone.swarm.enabled and alone.node.run_dir == tmp_path / "1" / "solo" / "run"
    assert (alone.model, alone.rollout, alone.train, alone.node.rounds) == (
        configs[1].model, configs[1].rollout, configs[1].train, configs[1].node.rounds)
    assert [(c.model.name, c.model.lora.rank) for c in configs] == [("tiny", 0), ("tiny", 16), ("tiny-llama", 0)]
    assert all(c.swarm.min_peers == 2 for c in configs)
    assert len({str(c.node.run_dir) for c in configs}) == 3
    assert len(NODE_KINDS) == 3


def test_demo_runs_a_local_swarm_and_reports_learning(tmp_path):
    out = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "swarmnode", "demo", "--nodes", "2", "--rounds", "3", "--dir", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held-out accuracy" in done.stdout and "tiny LoRA" in done.stdout
    assert (out / "curves.png").stat().st_size > 10_000
    for node in ("node-0", "node-1"):
        lines = [json.loads(x) for x in (out / node / "run" / "metrics.jsonl").read_text().splitlines()]
        assert lines[0]["kind"] == "start" and lines[1]["phase"] == "before" and lines[-1]["phase"] == "after"
        assert sum(m["peer_samples"] for m in round_lines(lines)) > 0, "the nodes learned from each other"
        # the baseline: the same config alone, as many rounds, no peers
        alone = [json.loads(x) for x in (out / node / "solo" / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [m["round"] for m in round_lines(alone)] == [0, 1, 2]
        assert all(m["peer_samples"] == 0 for m in round_lines(alone)) and alone[-1]["phase"] == "after"
        logs = sorted(str(p.relative_to(out / node)) for p in (out / node).rglob("node.log"))
        assert logs == ["run/node.log", "solo/run/node.log"], "one node.log a node process: the node's own"
        assert "round 3/3" in (out / node / "run" / "node.log").read_text()
    rows = [line for line in done.stdout.splitlines() if line.startswith("│ ")]
    assert len(rows) == 2 and all(len(re.findall(r"(?<![-+.\d])\d\.\d{3}\b", row)) == 3 for row in rows), \
        "before, after and alone for each node"
    pids = [json.loads((out / n / "run" / "swarm.json").read_text())["pid"] for n in ("node-0", "node-1")]
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_demo_refuses_a_directory_it_did_not_create(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    done = subprocess.run(
        [sys.executable, "-m", "swarmnode", "demo", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "not a demo directory" in done.stderr
    assert (tmp_path / "precious.txt").exists()


def test_ctrl_c_stops_every_process_the_demo_started(tmp_path):
    out = tmp_path / "demo"
    demo = subprocess.Popen(
        [sys.executable, "-m", "swarmnode", "demo", "--nodes", "2", "--rounds", "100000", "--dir", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_as_in_a_terminal,
    )
    try:
        infos = [out / n / "run" / "swarm.json" for n in ("node-0", "node-1")]
        deadline = time.monotonic() + 300
        while not all(p.exists() for p in infos) and time.monotonic() < deadline:
            assert demo.poll() is None, demo.stderr.read()[-3000:]
            time.sleep(0.5)
        pids = [json.loads(p.read_text())["pid"] for p in infos]
        family = [psutil.Process(p) for p in pids]
        family += [c for p in list(family) for c in p.children(recursive=True)]
        assert any("p2pd" in p.name() for p in family)
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=120)
    finally:  # a failure above must not leave two nodes training for 100,000 rounds (each in a session of its own)
        if demo.poll() is None:
            started = psutil.Process(demo.pid)
            for process in [*started.children(recursive=True), started]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            demo.wait(30)
    assert demo.returncode == 130, err[-3000:]
    assert "every node stopped" in " ".join(err.split())
    alive = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []


def _round(index: int, tokens: int, own: int, peers: int) -> RoundRecord:
    return RoundRecord(
        round=index, peer_id="n", reward_mean=0.5, peer_reward_mean=None, own_samples=own, peer_samples=peers, peers=1,
        gated=0, below_bar=0, peer_weight_scale=None, filtered=0, filtered_frac=0.0, weight_mean=1.0, weight_max=1.0,
        truncated_frac=0.0, divergence_mean=0.0, loss=0.0, grad_norm=0.0, wire_bytes=0, wire_tokens=tokens,
        rejected=0, peer_age_s=None, peer_lag=None, tokens_per_s=0.0,
    )


def test_the_demo_compares_a_swarm_node_with_alone_at_the_same_modelled_time():
    """Alone: 4 rounds of 100 tokens and 8 samples, 0.4 -> 0.6 at round 4. In the swarm the node
    generates half (50 tokens) and trains on 8: a round costs 0.93 * 0.5 + 0.07 = 0.535 of one
    alone, so its 8 rounds end at 4.28; alone's end (4.0) is the shorter, where the swarm node's
    curve (0.4 at 0, 0.7 at 4.28) reads 0.4 + 0.3 * 4 / 4.28."""
    alone = [_round(i, 100, 8, 0) for i in range(4)]
    swarm = [_round(i, 50, 4, 4) for i in range(8)]
    alone_evals = [EvalRecord(-1, "before", 0.4), EvalRecord(3, "after", 0.6)]
    swarm_evals = [EvalRecord(-1, "before", 0.4), EvalRecord(7, "after", 0.7)]
    assert modelled_times(swarm, alone)[-1] == pytest.approx(8 * 0.535)
    at, gain = equal_time_gain((swarm, swarm_evals), (alone, alone_evals))
    assert at == pytest.approx(4.0)
    assert gain == pytest.approx(0.4 + 0.3 * 4 / 4.28 - 0.6)
    assert equal_time_gain((swarm, swarm_evals[:1]), (alone, alone_evals)) is None, "one point is no curve"
