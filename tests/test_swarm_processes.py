"""Real `swarmnode join` processes on 127.0.0.1: training together, failures, a rogue, status.

One swarm of three heterogeneous tiny nodes is shared by the tests of this module, which run
in order: each one leaves the swarm in the state the next expects (kills and restarts last).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import psutil
import pytest
import yaml
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.lab.adversary import LivenessAttacker
from swarmnode.model.tiny import TINY_PRESETS, ensure_tiny
from swarmnode.ops.metrics import read_metrics, round_lines
from swarmnode.protocol import wire
from swarmnode.settings.config import SwarmSettings
from swarmnode.settings.presets import tiny_cpu
from swarmnode.swarm.hivemind.dht import Manifest, heartbeat_from_record, owner_or_none, pack, payload_digest
from swarmnode.swarm.hivemind.payloads import PayloadServer
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, ShardedFamily, manifest_family, shard_key
from tests.terminal import ctrl_c_as_in_a_terminal

pytestmark = pytest.mark.slow

DEADLINE_S = 8.0
BASE = tiny_cpu({
    "rollout": {"group_size": 4, "prompts_per_round": 4},
    "node": {"rounds": 100_000, "eval_every": 0, "eval_size": 10, "checkpoint_every": 2, "gather_timeout_s": DEADLINE_S},
    "swarm": {
        "host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
        "heartbeat_interval_s": 1.0,
        "stale_after_s": 5.0,
        "min_peers": 2,
        "max_rejects": 3,
    },
})
KINDS = {"a": {"model": {"name": "tiny"}}, "b": {"model": {"name": "tiny", "lora": {"rank": 8}}},
         "c": {"model": {"name": "tiny-llama"}}}  # another tokenizer family: trained on by span


class NodeProcess:
    def __init__(self, root: Path, name: str, kind: dict | None = None) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        kind = KINDS[name] if kind is None else kind
        config = {**BASE, **{k: {**BASE.get(k, {}), **v} for k, v in kind.items()}}
        config["node"] = {**config["node"], "run_dir": str(self.dir / "run")}
        self.config_path = self.dir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, initial_peers: list[str]) -> None:
        cmd = [sys.executable, "-m", "swarmnode", "join", "--config", str(self.config_path), "-q"]
        for maddr in initial_peers:
            cmd += ["--initial-peers", maddr]
        self.starts += 1
        self.log = (self.dir / f"node-{self.starts}.log").open("w")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=ctrl_c_as_in_a_terminal,
        )

    @property
    def info(self) -> dict:
        return json.loads((self.dir / "run" / "swarm.json").read_text())

    def rounds(self) -> list[dict]:
        path = self.dir / "run" / "metrics.jsonl"
        return round_lines(read_metrics(path)) if path.exists() else []

    def output(self) -> str:
        """The log with whitespace runs collapsed (rich may wrap long lines)."""
        return " ".join((self.dir / f"node-{self.starts}.log").read_text().split())

    def kill_group(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def wait_for(condition, timeout: float, what: str, nodes=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        for node in nodes:
            if node.proc.poll() not in (None,):
                pytest.fail(f"node {node.name} exited ({node.proc.returncode}):\n{node.output()[-3000:]}")
        time.sleep(0.5)
    logs = "\n".join(f"--- {n.name}\n{n.output()[-2000:]}" for n in nodes)
    pytest.fail(f"timed out waiting for {what}\n{logs}")


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    for name in {kind["model"]["name"] for kind in KINDS.values()}:  # built here, not in racing processes
        ensure_tiny(TINY_PRESETS[name])
    root = tmp_path_factory.mktemp("swarm")
    nodes = {name: NodeProcess(root, name) for name in "abc"}
    nodes["a"].start([])
    wait_for(lambda: (nodes["a"].dir / "run" / "swarm.json").exists(), 60, "bootstrap", [nodes["a"]])
    bootstrap = nodes["a"].info["maddrs"]
    for name in "bc":
        nodes[name].start(bootstrap)
    yield nodes, bootstrap
    for node in nodes.values():
        node.stop()


def _trained_with_peers(node: NodeProcess, since: int = 1) -> bool:
    rounds = node.rounds()[since:]
    return bool(rounds) and all(r["peer_samples"] > 0 for r in rounds)


def test_three_heterogeneous_nodes_of_two_tokenizer_families_train_on_each_others_samples(swarm):
    nodes, _ = swarm
    live = list(nodes.values())
    # 20 rounds (a few seconds): the three start within a second of each other, and a fast node
    # may run its first rounds before it has found anyone; those are left out below
    wait_for(lambda: all(len(n.rounds()) >= 20 for n in live), 240, "20 rounds on every node", live)
    for node in live:
        rounds = node.rounds()[5:]  # each counts its own rounds; the first ones may find nobody yet
        used = [r["peer_samples"] > 0 for r in rounds]
        # each node counts its own rounds at its own speed: a round may find nothing new
        assert sum(used) >= 0.6 * len(used), (node.name, [r["peer_samples"] for r in rounds])
        assert max(r["peers"] for r in rounds[-6:]) == 2, (node.name, [r["peers"] for r in rounds])
        assert rounds[-1]["rejected"] == 0, "unequal speeds are no lie"
    peer_ids = {n.info["peer_id"] for n in live}
    assert len(peer_ids) == 3


def test_status_lists_the_three_peers_with_their_models(swarm):
    nodes, bootstrap = swarm
    cmd = [sys.executable, "-m", "swarmnode", "status", "--initial-peers", bootstrap[0]]
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    peers = {p["peer"]: p for p in json.loads(done.stdout)["peers"]}
    expected = {n.info["peer_id"]: n for n in nodes.values()}
    assert set(peers) == set(expected)
    models = {expected[p].name: (h["model"], h["lora"], h["state"]) for p, h in peers.items()}
    assert models == {"a": ("tiny", 0, "training"), "b": ("tiny", 8, "training"), "c": ("tiny-llama", 0, "training")}
    assert peers[nodes["a"].info["peer_id"]]["tokenizer"] != peers[nodes["c"].info["peer_id"]]["tokenizer"]
    table = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert table.returncode == 0 and "3 peer(s) of 2 families" in table.stdout, table.stderr
    assert all(len(line) <= 80 for line in table.stdout.splitlines()), table.stdout
    for shown in ("tiny-llama", "LoRA r=8", "eval_acc", "answered", "local", "training"):
        assert shown in table.stdout, (shown, table.stdout)
    assert "Checking that identity" not in table.stderr, "no daemon chatter"
    from_file = [sys.executable, "-m", "swarmnode", "status", "--json",
                 "--initial-peers-from", str(nodes["b"].dir / "run" / "swarm.json")]
    done = subprocess.run(from_file, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert {p["peer"] for p in json.loads(done.stdout)["peers"]} == set(expected)
    in_run_dir = subprocess.run([sys.executable, "-m", "swarmnode", "status", "--json"], capture_output=True,
                                text=True, timeout=120, cwd=nodes["c"].dir / "run")
    assert in_run_dir.returncode == 0, in_run_dir.stderr
    assert {p["peer"] for p in json.loads(in_run_dir.stdout)["peers"]} == set(expected), "no address needed"


def test_status_says_clearly_when_the_swarm_cannot_be_reached(swarm):
    nodes, _ = swarm
    unreachable = f"/ip4/127.0.0.1/tcp/9/p2p/{nodes['a'].info['peer_id']}"
    done = subprocess.run(
        [sys.executable, "-m", "swarmnode", "status", "--initial-peers", unreachable, "--timeout", "10"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1 and "could not join the swarm" in done.stderr


def test_a_rogue_peer_is_refused_counted_and_ignored(swarm, tmp_path):
    nodes, bootstrap = swarm
    honest = [nodes["a"], nodes["b"]]
    rogue = SwarmRuntime(
        SwarmSettings(initial_peers=bootstrap, host_maddrs=["/ip4/127.0.0.1/tcp/0"]), tmp_path / "rogue.key"
    )
    rogue.start()
    try:
        beats = {}
        everyones = shard_key(HEARTBEAT_FAMILY, 0, 0)  # a small swarm's nodes all write level 0
        for subkey, raw in rogue.get_subkeys(everyones).items():
            hb = heartbeat_from_record(subkey, raw)
            beats[hb.peer] = (subkey, hb.model_dump())
        victim_subkey, victim = beats[nodes["a"].info["peer_id"]]
        run_id = victim["run"]
        # forged write into a's heartbeat: refused by every honest DHT node
        forged = pack({**victim, "model": "evil", "time": get_dht_time()})
        assert not rogue.call(rogue.dht.store(everyones, forged, get_dht_time() + 60, subkey=victim_subkey), 10)
        server = PayloadServer(run_id, keep_rounds=20)  # serves whatever the rogue announces
        shards = ShardedFamily(manifest_family(run_id), rogue.peer_id, owner_or_none)
        rogue.call(server.register(rogue.p2p), timeout=10)
        bad_payloads = [
            b"SNRB" + os.urandom(500),  # malformed wire message
            wire.encode(wire.RolloutBatch(run_id, rogue.peer_id, 0, "t", [])),  # wrong round/tokenizer
            msgpack.packb({"flood": "x" * 200_000}),  # big junk
        ]
        before = {n.name: (n.rounds()[-1]["rejected"] if n.rounds() else 0) for n in honest}
        for r in range(1, 13):  # junk as its own rounds 1..12, and one lie about its digest
            payload = bad_payloads[r % len(bad_payloads)]
            rogue.loop.call_soon_threadsafe(server.put, r, payload)
            digest = payload_digest(payload) if r % 4 else payload_digest(b"other")
            manifest = Manifest(rogue.peer_id, r, len(payload), digest, 1).to_value()
            rogue.call(rogue.store_owned_all(shards.write_keys(), manifest, get_dht_time() + 60), 10)
            time.sleep(0.5)
        wait_for(
            lambda: all(n.rounds()[-1]["rejected"] >= 3 for n in honest), 120, "rogue rejected 3 times", honest
        )
        for node in honest:
            last = node.rounds()[-1]
            assert last["rejected"] - before[node.name] >= 3
            assert "ignoring " + rogue.peer_id in node.output(), "banned after max_rejects, said once"
        mark = {n.name: len(n.rounds()) for n in honest}
        wait_for(lambda: all(len(n.rounds()) >= mark[n.name] + 3 for n in honest), 120, "3 more rounds", honest)
        for node in honest:
            after = [r["peer_samples"] > 0 for r in node.rounds()[mark[node.name]:]]
            assert sum(after) >= 0.5 * len(after), ("honest training goes on", [r["peer_samples"] for r in node.rounds()[mark[node.name]:]])
    finally:
        rogue.shutdown()


def test_liars_about_liveness_neither_stop_nor_slow_the_swarm(swarm):
    """Two identities claim round 1,000,000, a third announces batches it never serves: no
    honest round is skipped or slowed, and none of it is counted (a claim proves nothing)."""
    nodes, bootstrap = swarm
    honest = list(nodes.values())
    mark = {n.name: len(n.rounds()) for n in honest}
    base = {n.name: statistics.median(r["round_s"] for r in n.rounds()[-6:]) for n in honest}
    attackers = [LivenessAttacker(kind, bootstrap) for kind in ("far", "far", "mute")]
    try:
        for attacker in attackers:
            attacker.start()
        wait_for(lambda: all(len(n.rounds()) >= mark[n.name] + 14 for n in honest), 240, "14 rounds under attack", honest)
    finally:
        for attacker in attackers:
            attacker.stop()
    for node in honest:
        attacked = node.rounds()[mark[node.name]:]
        numbers = [r["round"] for r in attacked]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), (node.name, numbers)
        assert statistics.median(r["round_s"] for r in attacked) <= 1.5 * base[node.name] + 0.5, node.name
        used = [r["peer_samples"] > 0 for r in attacked]
        assert sum(used) >= 0.5 * len(used), ("honest peers go on training together", [r["peer_samples"] for r in attacked])


def test_kills_restart_and_clean_shutdown(swarm):
    nodes, _ = swarm
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    # the bootstrap node dies: the other two keep exchanging
    a.kill_group()
    mark = {n.name: len(n.rounds()) for n in (b, c)}
    wait_for(lambda: all(len(n.rounds()) >= mark[n.name] + 6 for n in (b, c)), 180, "rounds after a died", [b, c])
    for node in (b, c):
        tail = node.rounds()[mark[node.name] + 3 :]  # a's heartbeat goes stale within a few rounds
        used = [r["peer_samples"] > 0 for r in tail]
        assert sum(used) >= 0.5 * len(used), (node.name, [r["peer_samples"] for r in tail])
    # c killed mid-round: b goes on, never waiting longer than its deadline
    c_peer = c.info["peer_id"]
    c.kill_group()
    mark_b = len(b.rounds())
    wait_for(lambda: len(b.rounds()) >= mark_b + 4, 120, "b alone", [b])
    assert all(r["round_s"] < DEADLINE_S + 5 for r in b.rounds()[mark_b:])
    # c restarts from the same directory: same peer id, resumes, trains with b again
    checkpoint_round = json.loads((c.dir / "run" / "checkpoint" / "meta.json").read_text())["round"]
    c.start(b.info["maddrs"][:1])
    wait_for(lambda: "resumed from" in c.output(), 120, "c resumes", [b, c])
    assert f"{checkpoint_round + 1} round(s) done" in c.output()
    assert c.info["peer_id"] == c_peer
    # a is gone, so c may see one peer of its min_peers 2 and wait its wait_for_peers_s first
    # (unless a heartbeat still counts): then it trains with b
    wait_for(lambda: c.rounds() and c.rounds()[-1]["peer_samples"] > 0, 120 + SwarmSettings().wait_for_peers_s,
             "c trains with b again", [b, c])
    # Ctrl-C, as a terminal sends it (to the whole process group): checkpoint written, the
    # daemon (in a session of its own) stopped by the node after its farewell, one line, exit 130
    children = psutil.Process(b.proc.pid).children(recursive=True)
    assert any("p2pd" in p.name() for p in children)
    os.killpg(b.proc.pid, signal.SIGINT)
    assert b.proc.wait(timeout=60) == 130
    said = b.output()
    assert "stopping: checkpoint of round" in said
    assert not any(noise in said for noise in ("Traceback", "Task was destroyed", "Task exception", "[ERROR]"))
    assert (b.dir / "run" / "checkpoint" / "meta.json").exists()
    time.sleep(1)
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
