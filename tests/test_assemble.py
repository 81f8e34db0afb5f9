"""The composition root: every way out closes what was opened, and nothing else."""

from __future__ import annotations

import json
import socket
import threading
import time

import psutil
import pytest

from swarmnode.assemble import AssemblyError, assemble
from swarmnode.loop.ledger import PeerLedger
from swarmnode.ops.health import ask
from swarmnode.ops.metrics import read_metrics, round_lines
from swarmnode.protocol import records
from swarmnode.protocol.prompts import build_prompt
from swarmnode.rollout.base import sampling_seed
from swarmnode.settings.config import load_config
from swarmnode.swarm.local import InMemoryHub

LOOPBACK = "swarm.host_maddrs=[/ip4/127.0.0.1/tcp/0]"


def _config(tmp_path, name="n", *sets):
    return load_config(
        None,
        [
            f"node.run_dir={tmp_path / name}",
            "rollout.group_size=4",
            "rollout.prompts_per_round=3",
            "rollout.max_new_tokens=6",
            "node.eval_size=4",
            "node.checkpoint_every=0",
            "node.gather_timeout_s=3",
            "swarm.heartbeat_interval_s=0.5",
            LOOPBACK,
            *sets,
        ],
    )


def _daemons() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "p2pd" in p.name() and p.is_running()]


def _swarm_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name in ("swarm-loop", "health") and t.is_alive()]


@pytest.fixture
def nothing_left_running():
    """Fails the test when it leaves a p2p daemon or a swarm/health thread behind."""
    before = {p.pid for p in _daemons()}
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and ({p.pid for p in _daemons()} - before or _swarm_threads()):
        time.sleep(0.2)
    assert not {p.pid for p in _daemons()} - before, "a p2p daemon outlived its node"
    assert not _swarm_threads(), "a swarm or /health thread outlived its node"


def test_a_solo_node_runs_and_closes_its_metrics(tmp_path, make_policy, nothing_left_running):
    config = _config(tmp_path, "solo", "swarm.enabled=false")
    with assemble(config, policy=make_policy()) as node:
        summary = node.run(rounds=2)
    assert node.metrics.closed
    assert 0.0 <= summary["eval_after"] <= 1.0
    assert [m["round"] for m in round_lines(read_metrics(tmp_path / "solo" / "metrics.jsonl"))] == [0, 1]


def test_missing_task_data_fails_before_anything_starts(tmp_path, nothing_left_running):
    config = _config(tmp_path, "n", "task.name=gsm8k", f"task.data={tmp_path / 'nope'}")
    with pytest.raises(AssemblyError, match="does not exist") as failure:
        with assemble(config):
            pass
    assert failure.value.exit_code == 2
    assert not (tmp_path / "n" / "swarm.json").exists(), "no daemon was started"


def test_an_unreachable_swarm_fails_with_exit_1(tmp_path, make_policy, nothing_left_running):
    unreachable = "/ip4/127.0.0.1/tcp/9/p2p/QmUZb37HNUQ8PpaQBmGUU3BRKiRaGLCscvutEhCH4gAxeN"
    config = _config(tmp_path, "n", f"swarm.initial_peers=[{unreachable}]", "swarm.startup_timeout_s=5")
    with pytest.raises(AssemblyError, match="could not join the swarm") as failure:
        with assemble(config, policy=make_policy()):
            pass
    assert failure.value.exit_code == 1


def test_a_model_that_fails_to_load_takes_the_started_daemon_down(tmp_path, nothing_left_running):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    config = _config(tmp_path, "n", f"model.name={empty}", "task.name=arithmetic")
    with pytest.raises(AssemblyError) as failure:
        with assemble(config):
            pass
    assert failure.value.exit_code == 2
    assert (tmp_path / "n" / "swarm.json").exists(), "the daemon had started before the model failed"


def test_a_real_model_without_a_data_set_is_a_clear_error(tmp_path, nothing_left_running):
    """Naming a real model starts from GSM8K; without --data that means the hub."""
    config = _config(tmp_path, "n", "model.name=Qwen2.5-0.5B", "task.data=/nonexistent/gsm8k", "node.memory_check=false")
    assert config.task.name == "gsm8k"
    with pytest.raises(AssemblyError, match="/nonexistent/gsm8k") as failure:
        with assemble(config):
            pass
    assert failure.value.exit_code == 2


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_generator_that_fails_takes_swarm_and_seams_down(tmp_path, make_policy, nothing_left_running):
    config = _config(tmp_path, "n", "rollout.backend=vllm")
    with pytest.raises(AssemblyError, match="vLLM does not import"):
        with assemble(config, policy=make_policy()):
            pass


def test_a_checkpoint_of_another_run_closes_everything(tmp_path, make_policy, nothing_left_running):
    with assemble(_config(tmp_path, "n", "swarm.enabled=false"), policy=make_policy()) as node:
        node.run(rounds=1)
    other_run = _config(tmp_path, "n", "rollout.group_size=5")  # same dir, another run id
    with pytest.raises(AssemblyError, match="belongs to run") as failure:
        with assemble(other_run, policy=make_policy()):
            pass
    assert failure.value.exit_code == 2


def test_a_health_port_in_use_closes_everything(tmp_path, make_policy, nothing_left_running):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = _config(tmp_path, "n", f"node.health_port={taken.getsockname()[1]}")
        with pytest.raises(AssemblyError, match="cannot serve /health"):
            with assemble(config, policy=make_policy()):
                pass


def test_a_failure_inside_the_run_closes_everything_and_says_goodbye(tmp_path, make_policy, nothing_left_running):
    hub = InMemoryHub()
    watchers = []

    def join(run_id, standing):
        watchers.append(hub.join("watcher", run_id, PeerLedger()).membership)
        return hub.join("n", run_id, standing)

    config = _config(tmp_path, "n")
    with pytest.raises(RuntimeError, match="boom"):
        with assemble(config, policy=make_policy(), join=join) as node:
            (watcher,) = watchers
            assert set(watcher.live_peers()) == {"n"}
            node.run_round(0)
            raise RuntimeError("boom")
    assert watcher.live_peers() == {}, "the node's membership said it left"
    assert node.metrics.closed


def test_a_swarm_node_is_built_and_taken_down(tmp_path, make_policy, nothing_left_running):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = _config(tmp_path, "n", f"node.health_port={port}")
    with assemble(config, policy=make_policy()) as node:
        info = json.loads((tmp_path / "n" / "swarm.json").read_text())
        assert info["peer_id"] == node.peer_id and _daemons()
        assert node.run_round(0).own_samples == 12
        healthy, said = ask("127.0.0.1", port, 5)
        assert healthy and json.loads(said)["peer_id"] == node.peer_id
    assert not ask("127.0.0.1", port, 1)[0], "/health stopped with the node"


def test_nodes_of_different_wire_versions_ignore_each_other_without_bans(
    tmp_path, make_policy, monkeypatch, caplog, nothing_left_running
):
    """A format bump makes another run: no batch is fetched, nobody is banned, each is named once."""
    with assemble(_config(tmp_path, "old"), policy=make_policy()) as old:
        bootstrap = json.loads((tmp_path / "old" / "swarm.json").read_text())["maddrs"][:1]
        monkeypatch.setattr(records, "WIRE_VERSION", records.WIRE_VERSION + 1)
        new_config = _config(tmp_path, "new", f"swarm.initial_peers={json.dumps(bootstrap)}")
        with assemble(new_config, policy=make_policy()) as new:
            monkeypatch.undo()
            assert new.run_id != old.run_id
            for round_ in range(2):
                states = [n.produce(round_) for n in (old, new)]
                for node, state in zip((old, new), states):
                    node.membership.announce(node.report.status(round_))
                    record = node.consume(round_, state)
                    assert record.peer_samples == 0 and record.rejected == 0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and "not ours" not in caplog.text:
                time.sleep(0.2)
            assert old.ledger.total == 0 and new.ledger.total == 0
            assert old.membership.live_peers() == {} and new.membership.live_peers() == {}
    assert "not ours" in caplog.text and "ignoring" not in caplog.text


def test_nodes_of_the_same_version_do_exchange(tmp_path, make_policy, nothing_left_running):
    """The control for the test above: same settings, same run, samples flow both ways. The
    nodes are stepped in turn, so each round may wait (up to gather_timeout_s) for the other's
    batch to come over the network: a large wait_share lifts the share-of-own-time bound."""
    waits = "node.wait_share=100"
    with assemble(_config(tmp_path, "a", waits), policy=make_policy()) as a:
        bootstrap = json.loads((tmp_path / "a" / "swarm.json").read_text())["maddrs"][:1]
        with assemble(_config(tmp_path, "b", waits, f"swarm.initial_peers={json.dumps(bootstrap)}"),
                      policy=make_policy()) as b:
            assert a.run_id == b.run_id
            for node in (a, b):
                node.membership.announce(node.report.status(0))
            assert a.membership.wait_for_peers(1, 10) == 1 and b.membership.wait_for_peers(1, 10) == 1
            samples = []

            def step(round_: int) -> None:
                states = [n.produce(round_) for n in (a, b)]
                samples.append([n.consume(round_, s).peer_samples for n, s in zip((a, b), states)])

            # The first delivery each way comes when the DHT read finds the other's batch (no
            # round waits for a peer that has not delivered); from then on each round waits for it
            round_ = 0
            while not all(any(got[i] for got in samples) for i in (0, 1)):
                assert round_ < 8, samples
                step(round_)
                round_ += 1
            first = len(samples)
            for _ in range(2):
                step(round_)
                round_ += 1
            assert samples[first:] == [[12, 12], [12, 12]], samples
            assert a.ledger.earned(b.peer_id) and b.ledger.earned(a.peer_id)


def test_nodes_of_one_seed_sample_independently_and_each_identity_reproducibly(tmp_path, make_policy):
    """Every node keeps node.seed 0 unless told otherwise: its sampling stream also takes its
    identity, so two nodes' groups do not share their random draws, and one identity's do."""
    hub = InMemoryHub()

    def sampled(name: str, directory: str) -> list[list[int]]:
        config = _config(tmp_path, directory, "swarm.enabled=false", "rollout.max_new_tokens=12")
        with assemble(config, join=lambda run, standing: hub.join(name, run, standing), policy=make_policy()) as node:
            assert node.generator.seed == sampling_seed(config.node.seed, name)
            prompt = build_prompt(node.task, node.task.train_problem(0), node.policy)
            return [c.tokens.tolist() for c in node.generator.generate([prompt], 8)[0]]

    first = sampled("a", "a1")
    assert sampled("a", "a2") == first, "one identity, one seed: the same draws"
    assert sampled("b", "b") != first, "another identity with the same node.seed draws its own"
    assert len({sampling_seed(0, f"peer-{i}") for i in range(1000)}) == 1000


def test_a_restart_never_holds_a_round_twice_in_metrics_and_says_whether_it_starts_over(tmp_path, make_policy):
    """Resumed from a checkpoint, the rounds logged after it leave metrics.jsonl, those before
    stay; with no checkpoint (killed before the first), a node starts over, says so, and the
    earlier start's lines move whole to a file of their own (TensorBoard's steps are purged)."""
    config = _config(tmp_path, "again", "swarm.enabled=false", "report.to=[tensorboard]")
    run_dir = tmp_path / "again"
    with assemble(config, policy=make_policy()) as node:
        node.run(rounds=3)  # a normal end writes a checkpoint of round 2
    lines = read_metrics(run_dir / "metrics.jsonl")
    with (run_dir / "metrics.jsonl").open("a") as metrics:  # as if it ran on to round 5, then kill -9
        for extra in (3, 4, 5):
            metrics.write(json.dumps({**round_lines(lines)[-1], "round": extra}) + "\n")
    with assemble(config, policy=make_policy()) as node:
        assert node.next_round == 3
        node.run(rounds=5)
    rounds = [m["round"] for m in round_lines(read_metrics(run_dir / "metrics.jsonl"))]
    assert rounds == [0, 1, 2, 3, 4], "rounds 3-5 of the lost run are not kept beside their redo"
    assert "line(s) logged after it dropped" in (run_dir / "node.log").read_text()
    (run_dir / "checkpoint").rename(run_dir / "gone")  # no checkpoint: the next start is round 1 again
    with assemble(config, policy=make_policy()) as node:
        assert node.next_round == 0
        node.run(rounds=2)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [m["round"] for m in round_lines(metrics)] == [0, 1]
    assert sum(1 for m in metrics if m.get("phase") == "before") == 1
    assert "no checkpoint in" in (run_dir / "node.log").read_text() and "starting over from round 1" in (run_dir / "node.log").read_text()
    earlier = [p for p in run_dir.glob("metrics.*.jsonl")]
    assert len(earlier) == 1 and [m["round"] for m in round_lines(read_metrics(earlier[0]))] == [0, 1, 2, 3, 4]
