"""Attacks on honest nodes, and what they achieve against swarmnode's defences.

    python bench/attacks.py liveness [--rounds 24] [--deadline 8] [--attacks far silent mute drip]
    python bench/attacks.py sybil [--identities 1000] [--rounds 8]

Liveness: two honest `swarmnode join` processes (the tiny default, on 127.0.0.1) train
`--rounds` rounds together while a lying identity joins their run (see
swarmnode/swarm/hivemind/adversary.py): `far` claims round 1,000,000 from two identities,
`silent` heartbeats and never publishes, `mute` announces batches and never answers a
download, `drip` serves its batch a few bytes a second. Printed per attack: the rounds each
honest node trained against the rounds configured, its median round time (rounds 3 on)
next to the same run without an attacker, and how often the liar was counted as bad.

Sybil: one process writes, from `--identities` keys of its own, a junk heartbeat (the honest
run, the honest round) and a junk manifest for every round into the DHT of two honest nodes
(in this process, over loopback). Printed: an honest node's heartbeat read and gather times,
median over `--rounds` rounds, without and with the junk, and whether the honest peer's batch
still arrived every round.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import CompositeValidator, DHTRecord, RecordValidatorBase
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.config import load_config
from swarmnode.metrics import read_metrics, round_lines
from swarmnode.records import Heartbeat
from swarmnode.swarm.hivemind.adversary import ATTACKS, LivenessAttacker
from swarmnode.swarm.hivemind.connect import attach
from swarmnode.swarm.hivemind.dht import (
    HEARTBEAT_KEY,
    Manifest,
    SwarmRecordValidator,
    manifest_key,
    owner_peer_id,
    pack,
)
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.ledger import PeerLedger
from swarmnode.tiny import TINY_PRESETS, ensure_tiny

HONEST = ("a", "b")


def honest_config(directory: Path, rounds: int, deadline_s: float) -> dict:
    return {
        "model": {"name": "tiny", "device": "cpu"},
        "task": {"name": "arithmetic", "system_prompt": ""},
        "rollout": {"group_size": 8, "prompts_per_round": 8, "max_new_tokens": 10},
        "train": {"lr": 1e-4},
        "node": {"rounds": rounds, "eval_size": 50, "checkpoint_every": 0, "gather_timeout_s": deadline_s,
                 "run_dir": str(directory / "run")},
        "swarm": {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "heartbeat_interval_s": 1.0, "stale_after_s": 5.0,
                  "min_peers": 1, "wait_for_peers_s": 60.0},
    }


def start_node(directory: Path, config: dict, initial_peers: list[str]) -> subprocess.Popen:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "swarmnode", "join", "--config", str(directory / "config.yaml"), "-q"]
    for maddr in initial_peers:
        cmd += ["--initial-peers", maddr]
    log = (directory / "node.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_for_file(path: Path, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the node did not start; see {path.parent.parent / 'node.log'}")
        time.sleep(0.2)


def run_scenario(attack: str | None, rounds: int, deadline_s: float, root: Path) -> dict:
    directory = root / (attack or "none")
    bootstrap = start_node(directory / "a", honest_config(directory / "a", rounds, deadline_s), [])
    processes = [bootstrap]
    attackers: list[LivenessAttacker] = []
    try:
        wait_for_file(directory / "a" / "run" / "swarm.json", bootstrap, 120)
        maddrs = json.loads((directory / "a" / "run" / "swarm.json").read_text())["maddrs"][:1]
        processes.append(start_node(directory / "b", honest_config(directory / "b", rounds, deadline_s), maddrs))
        for _ in range(2 if attack == "far" else 1 if attack else 0):
            attackers.append(LivenessAttacker(attack, maddrs))
            attackers[-1].start()
        for process in processes:
            process.wait(timeout=1800)
    finally:
        for attacker in attackers:
            attacker.stop()
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    result = {}
    for name in HONEST:
        lines = round_lines(read_metrics(directory / name / "run" / "metrics.jsonl"))
        result[name] = {
            "rounds": len(lines),
            "round_s": statistics.median(m["round_s"] for m in lines[2:]) if len(lines) > 2 else float("nan"),
            "rejected": lines[-1]["rejected"] if lines else 0,
            "peer_samples": sum(m["peer_samples"] for m in lines),
        }
    return result


def liveness(args: argparse.Namespace) -> None:
    for spec in TINY_PRESETS.values():
        ensure_tiny(spec)
    with tempfile.TemporaryDirectory(prefix="swarmnode-attacks-") as scratch:
        root = Path(scratch)
        baseline = run_scenario(None, args.rounds, args.deadline, root)
        rows = [("none", baseline)] + [(a, run_scenario(a, args.rounds, args.deadline, root)) for a in args.attacks]
    print(f"liveness: 2 honest tiny nodes, {args.rounds} rounds, gather_timeout_s {args.deadline:.0f}")
    print(f"{'attack':<8} {'node':<4} {'rounds':>9} {'median round s':>15} {'vs none':>8} {'liar counted':>13} {'peer samples':>13}")
    for attack, result in rows:
        for name in HONEST:
            r, base = result[name], baseline[name]
            print(f"{attack:<8} {name:<4} {r['rounds']:>4}/{args.rounds:<4} {r['round_s']:>15.2f} "
                  f"{r['round_s'] / base['round_s']:>7.2f}x {r['rejected']:>13} {r['peer_samples']:>13}", flush=True)


class ManyKeySigner(RecordValidatorBase):
    """Signs each record with the key its subkey names: one process, many identities."""

    def __init__(self, signers: list[RSASignatureValidator]) -> None:
        self.signers = {s.local_public_key: s for s in signers}
        self.check = RSASignatureValidator()

    def validate(self, record: DHTRecord) -> bool:
        return self.check.validate(record)

    def sign_value(self, record: DHTRecord) -> bytes:
        for marker, signer in self.signers.items():
            if marker in record.subkey:
                return signer.sign_value(record)
        return record.value

    def strip_value(self, record: DHTRecord) -> bytes:
        return self.check.strip_value(record)

    @property
    def priority(self) -> int:
        return 10

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False


def sybil(args: argparse.Namespace) -> None:
    config = load_config(None, ["swarm.host_maddrs=[/ip4/127.0.0.1/tcp/0]", "swarm.heartbeat_interval_s=1.0"])
    run = "bench-sybil"
    honest = SwarmRuntime(config.swarm)
    honest.start()
    maddrs = honest.visible_maddrs()[:1]
    peer = SwarmRuntime(config.swarm, initial_peers=maddrs)
    attacker = SwarmRuntime(config.swarm, initial_peers=maddrs)
    peer.start()
    attacker.start()
    ledger = PeerLedger(config.swarm)
    link, peer_link = attach(honest, run, config, ledger), attach(peer, run, config, PeerLedger(config.swarm))
    started = time.perf_counter()
    signers = [RSASignatureValidator(RSAPrivateKey()) for _ in range(args.identities)]
    print(f"{args.identities} identities made in {time.perf_counter() - started:.0f} s", flush=True)
    attacker.dht.protocol.record_validator = CompositeValidator([ManyKeySigner(signers), SwarmRecordValidator()])
    ledger.delivered(peer.peer_id, -1)  # the honest pair know each other: the peer is waited for

    owners = [(signer.local_public_key, owner_peer_id(signer.local_public_key)) for signer in signers]

    def junk(round_: int) -> None:
        """Every identity: a heartbeat claiming the honest round, a manifest of a batch it never serves."""
        now = get_dht_time()
        keys, values, subkeys = [], [], []
        for marker, who in owners:
            beat = Heartbeat(peer=who, run=run, time=now, round=round_)
            keys += [HEARTBEAT_KEY, manifest_key(run, round_)]
            values += [pack(beat.model_dump()), Manifest(who, round_, 4096, os.urandom(32), 100).to_value()]
            subkeys += [marker, marker]
        attacker.call(attacker.dht.store_many(keys, values, now + 120, subkeys=subkeys), timeout=600)

    def measure(rounds: range, with_junk: bool) -> tuple[list[float], list[float], int]:
        reads, gathers, arrived = [], [], 0
        for r in rounds:
            if with_junk:
                junk(r)
            peer_link.exchange.publish(r, os.urandom(2048), 256)
            t = time.perf_counter()
            honest.call(link.membership.read(), timeout=60)
            reads.append(time.perf_counter() - t)
            t = time.perf_counter()
            got = link.exchange.gather(r, 1, 30.0, {peer.peer_id})
            gathers.append(time.perf_counter() - t)
            arrived += any(item.peer_id == peer.peer_id for item in got)
        return reads, gathers, arrived

    try:
        base = measure(range(0, args.rounds), False)
        flood = measure(range(args.rounds, 2 * args.rounds), True)
        junk_seen = len(link.membership.peers)
    finally:
        for runtime in (attacker, peer, honest):
            runtime.shutdown()
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    print(f"sybil: {args.identities} junk heartbeats and {args.identities} junk manifests per round, "
          f"{args.rounds} rounds each")
    print(f"{'':<12} {'heartbeat read ms':>18} {'gather ms':>10} {'peer batch arrived':>19}")
    print(f"{'no junk':<12} {ms(base[0]):>18.1f} {ms(base[1]):>10.1f} {base[2]:>15}/{args.rounds}")
    print(f"{'with junk':<12} {ms(flood[0]):>18.1f} {ms(flood[1]):>10.1f} {flood[2]:>15}/{args.rounds}")
    print(f"junk heartbeats parsed as peers of the run: {junk_seen}; downloads of unknown peers at once: "
          f"at most swarm.max_peers_per_round ({config.swarm.max_peers_per_round})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    live = sub.add_parser("liveness", help="real processes: round clock and waiting")
    live.add_argument("--rounds", type=int, default=24)
    live.add_argument("--deadline", type=float, default=8.0, help="honest nodes' node.gather_timeout_s")
    live.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS))
    syb = sub.add_parser("sybil", help="junk heartbeats and manifests from many identities")
    syb.add_argument("--identities", type=int, default=1000)
    syb.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    if args.kind == "liveness":
        liveness(args)
    else:
        sybil(args)


if __name__ == "__main__":
    main()
