"""Attacks on honest nodes, and what they achieve against swarmnode's defences.

    python bench/attacks.py liveness [--rounds 60] [--deadline 8] [--attacks far silent mute starve drip cut idle churn late crowd]
                                     [--crowd 4 16 64] [--pin | --split] [--heartbeat 1] [--keep DIR]
    python bench/attacks.py eclipse [--rounds 150] [--c-rounds 40] [--per-key 8] [--fakes 0 2] [--c-after 10]
                                    [--grind-bits B] [--placed after|before]
    python bench/attacks.py ghost [--stale 6]
    python bench/attacks.py sybil [--identities 1000] [--key-bits 1024] [--rounds 8]
    python bench/attacks.py flood [--records 50000] [--rounds 8]
    python bench/attacks.py slow [--rounds 120] [--own-share 1.0 0.5]
    python bench/attacks.py content [--rounds 40] [--attacks before after low-lp high-lp wrong long] [--attacker-model tiny-llama]
                                    [--switch-family] [--baseline]
    python bench/attacks.py honest [--rounds 40] [--seeds 5] [--models tiny tiny-large tiny]
    python bench/attacks.py drift [--identities 3 16] [--payload 1 4] [--rounds 300] [--arrive 20] [--b-joins 0] [--stealthy]
    python bench/attacks.py useful-crowd [--identities 3 16 64] [--rounds 80] [--arrive 20]
    python bench/attacks.py first-crowd [--identities 6] [--payload 1] [--rounds 150] [--beat 1.0]
    python bench/attacks.py probation-crowd [--identities 8] [--rounds 80] [--far-model tiny-llama] [--own-share 0.5] [--seeds 1]
                                            [--churn 0] [--late 0]
    python bench/attacks.py grader [--timeout 10]
    python bench/attacks.py math-grader [--timeout 15]

Liveness: lying identities (see swarmnode/lab/adversary.py) start a swarm, and two honest
`swarmnode join` processes (the tiny default, on 127.0.0.1) join it through the first identity
at the same moment and train `--rounds` rounds together (the baseline: b joins a, nobody
else): `far` claims round 1,000,000 from two identities, `silent` heartbeats and never publishes, `mute` announces batches and never answers a
download, `starve` is `--crowd` such identities (one scenario each) whose manifests promise
32 MiB, `drip` serves its batch a few bytes a second, `cut` announces 32 MiB payloads and
closes after all but the last byte, `idle` holds 16 silent payload streams to each honest node,
re-opened every 10 s, `churn` keeps 16 silent streams to each and re-opens each the moment it
is closed, `late` delivers a valid batch every second, each 0.25 s later than the
one before, and `crowd` is `--crowd` identities (4, 16 and 64: one scenario each) delivering
16 valid, useless groups each every second. Printed per attack, next to the same run without an attacker: the rounds
each honest node trained against the rounds configured, its median round time, the CPU
seconds a round its process and p2p daemon used (on a 2-core machine the attacking identities
take CPU the honest nodes would have had: the machine's limit, not the protocol's, so the CPU
the honest node spends is the protocol's cost), the other honest node's samples it trained on
a round (mean, rounds 3 on), the peak resident memory of its process, and how often the liar
was counted as bad; then each honest node's CPU by main thread, other threads and p2p daemon,
and the DHT finds and stores a second it sent the identities' DHT nodes and they sent it.
`--pin` puts both honest nodes on the first core and the attackers on the others (in the
baseline too); `--split` also moves the honest nodes' other threads and p2p daemons to the
attackers' cores, as a node with a core for its network work beside training would run. The
honest nodes heartbeat every `--heartbeat` seconds (1 by default here, so short runs find
their peers quickly; a node's own default is 5), each a store and a read of the DHT.

Eclipse: `--per-key` DHT nodes (this process, a p2p daemon each; swarmnode/lab/eclipse.py)
placed next to each of the 6 shard keys a small swarm of the run uses (heartbeats and the run's
manifests, levels 0 and 1), refusing every store; `--fakes` identities' fake heartbeats are the
only records they keep. Their ids are chosen freely (which swarmnode nodes refuse, ids being
bound to keys), or with `--grind-bits B` their keys are generated until each bound id shares B
leading bits with its key's (about 2**B keys a node; the keys and seconds are printed).
Honest `swarmnode join` tiny nodes: with `--placed before`, a joins through the eclipse (so the
eclipse must be ground: a refuses unbound initial peers); with `--placed after`, a founds the
swarm and the eclipse joins through it. b joins through a, and c through b once a finished
`--c-after` rounds (a and b train `--rounds`, c `--c-rounds`). The baseline is the same without
the eclipse (a founds the swarm).
Printed per node: its median round, the CPU seconds a round of its process and p2p daemon, the
other honest nodes' samples it trained on a round (mean while both trained, rounds 3 on) and
their ratio to the baseline, the first of its rounds that trained on each other node's samples, its rounds that waited half `--deadline` or more for a
batch, and how many honest heartbeats a reader joined through a finds in the DHT as c starts
(-1: a had finished).

Ghost: in this process, an honest node's membership and a `status` reader, next to three
throwaway identities that each store one heartbeat and leave: one dated now, one a year ahead,
one just inside the allowed clock skew. Printed: how long each stayed in the node's live peers
(and so its exchange's turns), in `status`'s rows, and among the peers counted for `min_peers`,
against `--stale` (the node's `swarm.stale_after_s`).

Sybil: one process makes `--identities` identities (`--key-bits` RSA keys: hivemind's
check takes any size, and 1024 bits is what a flood would use) and writes, from each, a junk
heartbeat in the honest run and a junk manifest in its own shards at the levels the honest
readers use into the DHT of two honest nodes (in this process, over loopback), once, kept an
hour. Printed: an honest node's heartbeat read time and records a read and its gather time,
median over `--rounds` rounds before and after the writes, whether the honest peer's batch
arrived every round, the records the honest node then stores for others, and its strikes.

Slow: no attacker; two honest `swarmnode join` tiny nodes, a pinned to core 0 and b to core 1
beside two busy loops (3-5x slower), once for each `--own-share` (1: peers' groups on top of a
node's own batch; 0.5: a node generates half its batch and peers' groups fill the rest); b is
stopped when a is done. Printed: a's median round time against a alone on core 0 with its whole
batch, how long a waited for b, and for each node the share of its rounds (while the other was
training) that used the other's samples, how stale they were (peer_lag, peer_age_s) and its
strikes.

Flood: one key writes `--records` junk subkeys `[owner:KEY]#i` of 4 KB under the run's
manifest key and the heartbeat key of two honest exchanges (in this process, over loopback).
Printed: the honest gather time and whether the honest peer's batch arrived, median over
`--rounds` rounds, before and during; how many subkeys an honest node then reads; strikes.

Content: three honest tiny nodes and one poisoning peer (swarmnode/lab/poison.py) train `--rounds`
rounds through the in-memory exchange, in one process (`--attacker-model tiny-llama`: the poisoner
is of another tokenizer family, so its samples reach the honest nodes translated by span and the
weight budget holds it by span; `--switch-family`: the poisoner runs tiny but names a tokenizer of
its own, tiny's with one token added, so it too is read by span and held to the budget instead
of struck for the weight it claims), with swarmnode's content defences off
(task.strict_format, trust.likelihood_gate, trust.weight_budget false, trust.repeat_odds 0) and on (the
defaults). Printed per attack: the share of the honest nodes' own completions that carry the
injected text after the last round (sampled: 8 per prompt on 32 held-out prompts; greedy: on
`--eval-size` held-out prompts), their greedy accuracy (always scored with the strict format), how many of the attacker's samples
they trained on, how many of the other honest nodes' samples a round, the attacker's strikes
at each, the round at which they stopped listening to it, and the honest nodes' median round
(the attacker's own generation is off that clock). `--baseline` adds the same three nodes with
no attacker, defences on.

Drift and useful-crowd: two honest tiny nodes stepped round by round in one process (the
in-memory exchange) and, from round `--arrive` on, `--identities` identities with no model of
their own (swarmnode/lab/crowd.py), each publishing 16 groups a round: half the right answer
in the model's own format, half a wrong one off by one. In `drift` each right answer follows a
payload of `--payload` tokens (the public starting model's likeliest visible tokens that are
not the answer's: "=" for one; with `--stealthy`, the same-base attacker's payload: the tokens
that score highest on the gate before a right answer under the starting weights, searched one
at a time, a newline for one on tiny); `useful-crowd` has none. With `--arrive 0 --b-joins
20`, the crowd is there from the first node's first round, before the second node joins.
Written groups repeat two completions four times each, which a node finds picked, not sampled
(trust.repeat_odds); with `--sampling` the crowd runs the public model and only puts the right
answer in place of its first sample, so its groups repeat as sampling does. With `--seeds N`
every cell and the baseline run N times (node.seed 0..N-1), and each node's accuracy with the
crowd minus without is printed paired by seed: mean, SE and the one-sided 95 % lower bound
(Student's t), judged against a non-inferiority margin of 0.03.
Printed beside the same run without
them: the share of payload samples in what each node trained on, by thirds of the run; the
share of the nodes' sampled completions (8 for each of 32 held-out prompts) that carry the
payload or any text outside the answer; greedy accuracy before and after; the other honest
node's samples, the crowd's and its own each trained on a round (mean from 20 rounds after the
crowd arrived: what the crowd took, and what it made the node generate); an
honest node's round (its produce and consume, median from round `--arrive` on: the crowd's
own publishing, in the same process, is not counted).

First-crowd: the drift crowd with real processes, in issue 45's layout: an honest tiny-cpu
node a starts a swarm, `--identities` identities join it at once and publish a batch each every
`--beat` seconds (16 groups, half the right answer after the same-base payload of `--stealthy`,
half off by one), and a second honest node b joins through a (once a finished `--b-joins`
rounds; b takes seconds to start, so the crowd is there first); beside the same run without
them. Printed per honest node: the crowd's share of what it trained on, by thirds; the share
of its sampled completions (the last checkpoint, 8 for each of 32 held-out prompts) starting
with the payload; greedy accuracy before and after; the other honest node's samples a round
while both trained (and against the run without the crowd); peers' samples gated a round; its
median round. The crowd runs in this process, so on a small machine it takes the honest nodes'
cores: `--pin` puts both honest nodes on the first core and the crowd on the others.

Probation-crowd: a node that shares its batch generates all of it while far peers fill its
peers' share, and then screens one group of a near peer found useless every round (its
probation turn; swarmnode.loop.intake), so that an honest near peer early luck left useless
comes back. Identities are free, so a crowd can contest that turn. Two honest tiny nodes a and
b and a far peer f (`--far-model`, another family by default), each at `--own-share`, step
round by round in one process (the in-memory exchange) with, from the first round, each of
`--identities` identities publishing one group a round of the public starting model's own
samples, drawn four times over and every answer wrong: the sampler's log-probs, nothing
written, nothing to learn, useless and never a provable liar (swarmnode/lab/crowd.py
UselessCrowd). With `--churn K` the crowd abandons its identities every K rounds for new ones,
which are newcomers again: never screened enough to be found useless, nor measured far by the
trail rule (an attacker who knows the rules). With `--late K` the honest node b joins only at a's
round K, a newcomer among the crowd's names, its own rounds counted from 0 as a fresh node's; a
second table gives, per honest node, the round the other's samples first taught it (its ledger's
seniority) and how many rounds after b joined that was. A last table gives the round the far
peer f's samples first taught each honest node: a peer there from the start is a newcomer too
until then, beside the crowd's names. The nodes price far peers' groups on top by the
cost model (generation 0.93 of a round), not by timing their own work as a node does, so a run
repeats to the bit. Printed per seed, crowd and honest node, beside the same run without the crowd,
in rounds: those it generated its whole batch, those it gave a useless near peer the probation
turn and how many the other honest node and the crowd won, those the other honest node stood
useless (and near) or far at it; then the crowd's identities far at it (mean a round), the
crowd's groups screened a round (mean and most; far groups only measured are not screened),
the crowd's samples trained on (and those with a non-zero advantage), the other honest node's
and the far peer's samples trained on a round, greedy accuracy before and after, and its
median round; with `--seeds N`, each honest node's accuracy with the crowd minus without,
paired by seed (mean, SE, one-sided 95 % lower bound; non-inferior at 0.03), and the same for
a and b's mean a seed (they are one node under two names).

Honest: the same three honest nodes with no attacker, defences off and on, over `--seeds`
seeds: held-out accuracy after `--rounds` rounds and the paired difference (on - off) with its
standard error over seeds.

Grader: a peer's completion is graded by every node that trains on it, so for reasoning-gym
tasks its answer reaches the dataset's own scorer. Each of reasoning-gym's datasets, in a
process of its own, grades HOSTILE_ANSWERS (Python that creates a file, an exponent tower, deep
brackets, a huge exponent, 4,000 digits) against its first problem: the datasets `rg:` offers
through the node's own task (answer extraction, the 0 on a raise), the others by their scorer
alone, as a node that offered them would. Printed for each group: datasets, those where an
answer ran as code (the file appeared), hung past `--timeout` seconds, raised, or were rewarded,
and the slowest grading.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import yaml
from grader_worker import HOSTILE_ANSWERS, HOSTILE_MATH, RESULT_PREFIX
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.dht.validation import CompositeValidator
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.assemble import assemble, run_id_for
from swarmnode.lab.ablation import standard_error
from swarmnode.lab.adversary import (
    ATTACKS,
    CHEAP_KEY_BITS,
    LOOPBACK,
    LivenessAttacker,
    ManyKeySigner,
    cheap_signer,
)
from swarmnode.lab.crowd import UsefulCrowd, UselessCrowd, drift_payload, starts_with, stealthiest_payload
from swarmnode.lab.eclipse import Eclipse, small_swarm_keys
from swarmnode.lab.poison import (
    CONTENT_ATTACKS,
    DEFENCES_OFF,
    carries_injection,
    poisoning_link,
    switched_family,
)
from swarmnode.lab.verdicts import NON_INFERIORITY_MARGIN, verdict
from swarmnode.loop.ledger import PeerLedger
from swarmnode.loop.pool import PROBATION_EVERY
from swarmnode.model.policy import Policy
from swarmnode.model.tiny import TINY_PRESETS, ensure_tiny
from swarmnode.ops.metrics import eval_lines, read_metrics, round_lines
from swarmnode.protocol.batches import batch_split
from swarmnode.protocol.prompts import build_prompt
from swarmnode.protocol.records import MAX_CLOCK_SKEW_S, Heartbeat, NodeStatus
from swarmnode.rollout.hf import HFGenerator
from swarmnode.settings.config import SwarmSettings, TaskSettings, load_config
from swarmnode.settings.presets import tiny_cpu
from swarmnode.sizing.cost import GEN_SHARE
from swarmnode.swarm.base import GatherWait, is_useless
from swarmnode.swarm.hivemind.connect import attach
from swarmnode.swarm.hivemind.dht import Manifest, SwarmRecordValidator, owner_or_none, owner_peer_id, pack
from swarmnode.swarm.hivemind.runtime import SwarmError, SwarmRuntime
from swarmnode.swarm.hivemind.shards import (
    HEARTBEAT_FAMILY,
    MAX_LEVEL,
    ShardedFamily,
    ShardIndex,
    level_for,
    manifest_family,
    shard_key,
    shard_of,
)
from swarmnode.swarm.hivemind.status import open_status_client, probe, read_heartbeats
from swarmnode.swarm.local import InMemoryHub
from swarmnode.tasks import make_task
from swarmnode.tasks.answers import graded_reward
from swarmnode.tasks.grader_process import HARD_TIMEOUT_S, MEMORY_LIMIT_BYTES, GradingProcess
from swarmnode.tasks.gym import gym_datasets

ROOT = Path(__file__).resolve().parents[1]
HONEST = ("a", "b")
JUNK_CHUNK = 250  # identities whose records go out in one store (one message under hivemind's 4 MiB cap)
JUNK_TTL_S = 3600.0  # the junk outlives the measurement
TIMINGS = ("generate", "publish", "gather", "decode", "score", "screen", "train")  # a round's parts, as in metrics.jsonl


def honest_config(directory: Path, rounds: int, deadline_s: float) -> dict:
    """The tiny CPU preset, with half its prompts a round, evaluations only before and after."""
    return tiny_cpu({
        "rollout": {"prompts_per_round": 8},
        "node": {"rounds": rounds, "eval_every": 0, "eval_size": 50, "checkpoint_every": 0, "gather_timeout_s": deadline_s,
                 "run_dir": str(directory / "run")},
        "swarm": {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "heartbeat_interval_s": 1.0, "stale_after_s": 5.0,
                  "min_peers": 1, "wait_for_peers_s": 60.0},
    })


def start_node(directory: Path, config: dict, initial_peers: list[str], core: int | None = None) -> subprocess.Popen:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    pin = ["taskset", "-c", str(core)] if core is not None else []
    cmd = [*pin, sys.executable, "-m", "swarmnode", "join", "--config", str(directory / "config.yaml"), "-q"]
    for maddr in initial_peers:
        cmd += ["--initial-peers", maddr]
    log = (directory / "node.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def address_of(directory: Path, process: subprocess.Popen) -> list[str]:
    """The first address a started node wrote to its swarm.json, to join through it."""
    swarm_file = directory / "run" / "swarm.json"
    wait_for_file(swarm_file, process, 120)
    return json.loads(swarm_file.read_text())["maddrs"][:1]


def joined_node(directory: Path, config: dict, initial_peers: list[str], tries: int = 3) -> tuple[subprocess.Popen, list[str]]:
    """A node started through `initial_peers`, and its address. A daemon whose dial of a busy
    initial peer fails (its daemon just took 48 eclipse nodes' dials, on a loaded core) exits
    at once; like a user, the bench tries again."""
    for attempt in range(tries):
        process = start_node(directory, config, initial_peers)
        try:
            return process, address_of(directory, process)
        except RuntimeError as err:
            kill_all([process])
            if attempt == tries - 1:
                raise
            print(f"{directory.name} did not join (try {attempt + 1} of {tries}): {err}", file=sys.stderr)
            time.sleep(5.0)
    raise AssertionError("unreachable")


def kill_all(processes: Iterable[subprocess.Popen]) -> None:
    """SIGKILL to each node's process group (its p2p daemon with it) that is still running."""
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_file(path: Path, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the node did not start; see {path.parent.parent / 'node.log'}")
        time.sleep(0.2)


def started_attacker(attack: str, maddrs: list[str], num_train: int, tries: int = 3) -> LivenessAttacker | None:
    """One lying identity, joined, or None. With many daemons starting at once next to busy
    honest nodes a daemon's dial of them can fail; a fresh identity tries again."""
    for attempt in range(tries):
        attacker = LivenessAttacker(attack, maddrs, seed=0, num_train=num_train)
        try:
            attacker.start()
            return attacker
        except (SwarmError, TimeoutError) as err:
            print(f"an attacking identity did not join (try {attempt + 1} of {tries}): {err!r}", file=sys.stderr)
            attacker.stop()
            time.sleep(1.0)
    return None


class DhtTraffic:
    """DHT requests between this process's DHT nodes (the attacking identities') and others,
    counted by wrapping hivemind's protocol while `counting()` is open (a node's handlers are
    bound when it starts, so identities must start inside it): `served[peer]` finds and stores
    that peer sent the identities, `sent[peer]` those the identities sent it."""

    def __init__(self) -> None:
        self.served: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()

    @contextlib.contextmanager
    def counting(self) -> Iterator[DhtTraffic]:
        originals = {name: getattr(DHTProtocol, name) for name in ("rpc_find", "rpc_store", "call_find", "call_store")}

        def served(handler):  # noqa: ANN001, ANN202
            @functools.wraps(handler)  # hivemind reads the handler's annotations
            async def counted(protocol, request, context):  # noqa: ANN001, ANN202
                self.served[context.remote_id.to_base58()] += 1
                return await handler(protocol, request, context)
            return counted

        def sent(call):  # noqa: ANN001, ANN202
            @functools.wraps(call)
            async def counted(protocol, peer, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
                self.sent[peer.to_base58()] += 1
                return await call(protocol, peer, *args, **kwargs)
            return counted

        for name, original in originals.items():
            setattr(DHTProtocol, name, (served if name.startswith("rpc_") else sent)(original))
        try:
            yield self
        finally:
            for name, original in originals.items():
                setattr(DHTProtocol, name, original)


CROWDS = ("crowd", "starve", "hog")  # attacks run once for each --crowd size


def attacker_count(attack: str | None, crowd: int) -> int:
    return 0 if attack is None else 2 if attack == "far" else crowd if attack in CROWDS else 1


def run_scenario(
    attack: str | None, rounds: int, deadline_s: float, root: Path, crowd: int = 4, honest_core: int | None = None,
    network_cores: set[int] | None = None, heartbeat_s: float = 1.0,
) -> dict:
    directory = root / f"{attack or 'none'}-{crowd}"
    count = attacker_count(attack, crowd)

    def config(name: str) -> dict:
        # The identities are there before the honest nodes, and satisfy swarm.min_peers (1;
        # see docs/security.md): both honest nodes, started at the same moment, start
        # training at about the same moment, with the attack on from their first round
        cfg = honest_config(directory / name, rounds, deadline_s)
        swarm = cfg["swarm"]
        swarm["heartbeat_interval_s"] = heartbeat_s
        swarm["stale_after_s"] = max(swarm["stale_after_s"], 4 * heartbeat_s)
        if attack == "crowd":  # the crowd's heartbeats, late as they are, count (the default 20 s)
            cfg["swarm"]["stale_after_s"] = 20.0
        return cfg

    processes: list[subprocess.Popen] = []
    attackers: list[LivenessAttacker] = []
    traffic = DhtTraffic()
    with traffic.counting():  # the identities' DHT nodes start inside it
        try:
            num_train = make_task(TaskSettings(name="arithmetic")).num_train
            if count:
                # The identities are in the swarm before the honest nodes: the first starts it, the
                # others join through it (64 pinned to one core take minutes), and then both honest
                # nodes join through it at once, so they train side by side from their first round
                first = started_attacker(attack, [], num_train)
                if first is None:
                    raise RuntimeError("the first identity could not start a swarm")
                attackers.append(first)
                maddrs = first.runtime.visible_maddrs()[:1]
                with ThreadPoolExecutor(max_workers=8) as starting:
                    for attacker in starting.map(lambda _: started_attacker(attack, maddrs, num_train), range(count - 1)):
                        if attacker is not None:
                            attackers.append(attacker)
                processes += [start_node(directory / name, config(name), maddrs, core=honest_core) for name in HONEST]
            else:
                processes.append(start_node(directory / "a", config("a"), [], core=honest_core))
                maddrs = address_of(directory / "a", processes[0])
                processes.append(start_node(directory / "b", config("b"), maddrs, core=honest_core))
            started, cpu_before = time.monotonic(), attackers_cpu_s(processes)
            cpu_s: list[tuple[float, float, float]] = []
            peak_rss = watch_rss(processes, timeout_s=1800, cpu_s=cpu_s, network_cores=network_cores)
            wall_s = time.monotonic() - started
            attackers_cores = (attackers_cpu_s(processes) - cpu_before) / wall_s
            downloaded = sum(a.server.served for a in attackers if a.server is not None)  # batches the honest nodes took
        finally:
            for attacker in attackers:
                attacker.stop()
            kill_all(processes)
    for name in HONEST:
        if not (directory / name / "run" / "metrics.jsonl").exists():
            raise RuntimeError(f"honest node {name} of {directory.name} never trained (it could not join?); "
                               f"see {directory / name / 'node.log'} (kept with --keep)")
    lines = {name: round_lines(read_metrics(directory / name / "run" / "metrics.jsonl")) for name in HONEST}
    ids = {name: rounds[0]["peer_id"] if rounds else "" for name, rounds in lines.items()}
    result: dict = {
        "attackers_cores": attackers_cores, "joined": len(attackers), "count": count, "downloaded": downloaded,
    }
    for (name, rounds), other, rss, cpu in zip(lines.items(), reversed(HONEST), peak_rss, cpu_s):
        late = rounds[2:] or [{}]
        result[name] = {
            "rounds": len(rounds),
            "round_s": statistics.median(m.get("round_s", math.nan) for m in late),
            "cpu_s": sum(cpu) / max(len(rounds), 1),
            "cpu_parts": cpu,  # whole run: main thread, other threads, p2p daemon
            "rejected": rounds[-1]["rejected"] if rounds else 0,
            # a mean, not a median: a slower peer's batch is spread over rounds, so the
            # per-round count swings (64, 32, 0, ...) while the total is what was learned from
            "honest_samples": statistics.mean(m.get("samples_by_peer", {}).get(ids[other], 0) for m in late),
            "peer_samples": statistics.median(m.get("peer_samples", 0) for m in late),
            "met_at": first_round_with(rounds, ids[other]),
            "timings": {k: statistics.median(m.get(f"{k}_s", math.nan) for m in late) for k in TIMINGS},
            "rss_mb": rss / 2**20,
            # DHT requests a second between this node and the identities' DHT nodes, each way
            "dht_out": traffic.served[ids[name]] / wall_s, "dht_in": traffic.sent[ids[name]] / wall_s,
        }
    return result


def attackers_cpu_s(honest: list[subprocess.Popen]) -> float:
    """CPU seconds used so far by this process (the attacking identities' threads) and its
    children other than the honest nodes (the identities' p2p daemons)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children():
        if child.pid not in {p.pid for p in honest}:
            with contextlib.suppress(psutil.Error):
                total += sum(child.cpu_times()[:2])
    return total


def watch_rss(
    processes: list[subprocess.Popen], timeout_s: float, cpu_s: list[tuple[float, float, float]] | None = None,
    network_cores: set[int] | None = None,
) -> list[int]:
    """Wait for the processes to end; the peak resident memory of each (its Python process).
    With `cpu_s`, also the CPU seconds each used, as last seen before it ended: its main thread
    (generation and training), its other threads (the swarm loop) and its children (its p2p
    daemon), so a cost can be told from the same work running slower. With `network_cores`,
    each process's other threads and children are moved there as they appear, leaving its core
    to the main thread."""
    peaks = [0] * len(processes)
    cpu = [(0.0, 0.0, 0.0)] * len(processes)
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        for i, process in enumerate(processes):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(process.pid)
                peaks[i] = max(peaks[i], proc.memory_info().rss)
                if network_cores is not None:
                    move_off_main_thread(proc, network_cores)
                main = sum(t.user_time + t.system_time for t in proc.threads() if t.id == proc.pid)
                children = sum(sum(p.cpu_times()[:2]) for p in proc.children(recursive=True))
                # the largest seen: a node stops its daemon before it exits, and CPU only grows
                now = (main, sum(proc.cpu_times()[:2]) - main, children)
                cpu[i] = tuple(max(seen, part) for seen, part in zip(cpu[i], now))
        time.sleep(0.25)
    if cpu_s is not None:
        cpu_s[:] = cpu
    return peaks


def move_off_main_thread(proc: psutil.Process, cores: set[int]) -> None:
    """Put every thread of `proc` but its main one, and its children, on `cores`."""
    for thread in proc.threads():
        if thread.id != proc.pid:
            with contextlib.suppress(OSError):
                if os.sched_getaffinity(thread.id) != cores:
                    os.sched_setaffinity(thread.id, cores)
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if set(child.cpu_affinity()) != cores:
                child.cpu_affinity(sorted(cores))


def liveness(args: argparse.Namespace) -> None:
    for spec in TINY_PRESETS.values():
        ensure_tiny(spec)
    # The attacking identities run in this process (and its p2p daemons): on a small machine
    # they take CPU the honest nodes would have, which is the machine's limit, not the
    # protocol's. Pinned, the honest nodes share core 0 and the attackers get the rest, in
    # the baseline too, so the ratios measure what the attack costs the honest nodes' protocol.
    cores = sorted(os.sched_getaffinity(0))
    honest_core = cores[0] if (args.pin or args.split) and len(cores) > 1 else None
    network_cores = set(cores[1:]) if args.split and honest_core is not None else None
    if honest_core is not None:
        os.sched_setaffinity(0, set(cores[1:]))
    with contextlib.ExitStack() as stack:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="swarmnode-attacks-")))
        baseline = run_scenario(None, args.rounds, args.deadline, root, honest_core=honest_core,
                                network_cores=network_cores, heartbeat_s=args.heartbeat)
        scenarios = [(a, n) for a in args.attacks for n in (args.crowd if a in CROWDS else [1])]
        rows = [("none", baseline)] + [
            (f"{a}{n}" if a in CROWDS else a,
             run_scenario(a, args.rounds, args.deadline, root, crowd=n, honest_core=honest_core,
                          network_cores=network_cores, heartbeat_s=args.heartbeat))
            for a, n in scenarios
        ]
    where = (f"both honest nodes pinned to core {honest_core}, attackers on cores {cores[1:]}"
             if honest_core is not None else "unpinned: attackers and honest nodes share the cores")
    if network_cores is not None:
        where += ", the honest nodes' other threads and daemons with the attackers"
    print(f"liveness: 2 honest tiny nodes, {args.rounds} rounds, gather_timeout_s {args.deadline:.0f}, "
          f"heartbeat_interval_s {args.heartbeat:g}, {where}; "
          "medians of rounds 3 on; met at: its first round with the other honest node's samples; "
          "honest samples: the other honest node's samples trained on a round (mean); "
          "CPU s/round: the honest node's process and p2p daemon")
    print(f"{'attack':<8} {'node':<4} {'rounds':>9} {'median round s':>15} {'vs none':>8} {'CPU s/round':>12} "
          f"{'vs none':>8} {'liar counted':>13} {'met at':>7} "
          f"{'honest samples':>15} {'vs none':>8} {'all peers':>10} {'peak RSS MB':>12} {'vs none':>8} "
          f"{'attackers cores':>16}  round: {' / '.join(TIMINGS)} s")
    for attack, result in rows:
        for name in HONEST:
            r, base = result[name], baseline[name]
            parts = " / ".join(f"{r['timings'][k]:.3f}" for k in TIMINGS)
            print(f"{attack:<8} {name:<4} {r['rounds']:>4}/{args.rounds:<4} {r['round_s']:>15.2f} "
                  f"{r['round_s'] / base['round_s']:>7.2f}x {r['cpu_s']:>12.3f} {r['cpu_s'] / base['cpu_s']:>7.2f}x "
                  f"{r['rejected']:>13} {'-' if r['met_at'] is None else r['met_at']:>7} {r['honest_samples']:>15.1f} "
                  f"{r['honest_samples'] / max(base['honest_samples'], 1):>7.2f}x {r['peer_samples']:>10.0f} "
                  f"{r['rss_mb']:>12.0f} {r['rss_mb'] / max(base['rss_mb'], 1):>7.2f}x "
                  f"{result['attackers_cores']:>16.2f}  {parts}",
                  flush=True)
    print("CPU s of the whole run, main thread (generation, training) / other threads (swarm loop) / p2p daemon:")
    for attack, result in rows:
        print(f"  {attack:<8} " + "   ".join(
            f"{name} {' / '.join(f'{part:.1f}' for part in result[name]['cpu_parts'])}" for name in HONEST))
    print("DHT finds and stores a second between each honest node and the identities' DHT nodes (to them / from them):")
    for attack, result in rows[1:]:
        print(f"  {attack:<8} " + "   ".join(
            f"{name} {result[name]['dht_out']:.1f} / {result[name]['dht_in']:.1f}" for name in HONEST))
    for attack, result in rows:
        if result["joined"] < result["count"]:
            print(f"{attack}: {result['joined']} of {result['count']} attacking identities joined")
        if result["downloaded"]:
            honest_rounds = sum(result[name]["rounds"] for name in HONEST)
            print(f"{attack}: the honest nodes downloaded {result['downloaded']} of the identities' batches "
                  f"({result['downloaded'] / max(honest_rounds, 1):.2f} an honest round)")


def eclipse(args: argparse.Namespace) -> None:
    """Three honest nodes meeting with and without an eclipse of the DHT's shard keys."""
    if args.placed == "before" and args.grind_bits is None:
        raise SystemExit("--placed before needs --grind-bits: a node refuses initial peers whose DHT ids are not "
                         "bound to their keys, so it cannot join through an eclipse of free ids")
    for spec in TINY_PRESETS.values():
        ensure_tiny(spec)
    with contextlib.ExitStack() as stack:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="swarmnode-eclipse-")))
        rows = [("none", run_eclipse(root / "none", None, args))]
        rows += [(f"eclipse+{fakes}", run_eclipse(root / f"eclipse-{fakes}", fakes, args)) for fakes in args.fakes]
    base = rows[0][1]
    ids = "free ids" if args.grind_bits is None else f"ids bound, keys ground to {args.grind_bits} leading bits"
    print(f"eclipse: {args.per_key} refusing DHT nodes next to each of the run's 6 shard keys ({ids}), placed "
          f"{args.placed} a starts (none: a founds the swarm), b through a, c through b once a finished {args.c_after} rounds; "
          f"{args.rounds} rounds each (c: {args.c_rounds}), gather_timeout_s {args.deadline:.0f}; "
          "+N: N fake heartbeats kept by the eclipse; means of rounds 3 on")
    print(f"{'scenario':<11} {'node':<4} {'rounds':>7} {'median round s':>15} {'vs none':>8} {'CPU s/round':>12} "
          f"{'vs none':>8} {'from a':>7} {'from b':>7} {'from c':>7} {'vs none':>8} {'first round with':>17} "
          f"{'long waits':>11} {'honest heartbeats in DHT':>25}")
    for scenario, result in rows:
        for name in ("a", "b", "c"):
            r, b0 = result[name], base[name]
            samples = [r["from"].get(other) for other in ("a", "b", "c")]
            honest = [x for x in samples if x is not None]
            honest_base = [x for x in (b0["from"].get(o) for o in ("a", "b", "c")) if x is not None]
            ratio = sum(honest) / max(sum(honest_base), 1e-9)
            met = ", ".join(f"{other} {'-' if m is None else m}" for other, m in r["met_at"].items())
            print(f"{scenario:<11} {name:<4} {r['rounds']:>7} {r['round_s']:>15.2f} {r['round_s'] / b0['round_s']:>7.2f}x "
                  f"{r['cpu_s']:>12.3f} {r['cpu_s'] / b0['cpu_s']:>7.2f}x "
                  + " ".join(f"{'' if x is None else f'{x:.1f}':>7}" for x in samples)
                  + f" {ratio:>7.2f}x {met:>17} {r['long_waits']:>11} {result['dht_heartbeats']:>25}", flush=True)
    for scenario, result in rows[1:]:
        for name, other in (("a", "b"), ("b", "a")):
            ratios = [x / max(b0, 1e-9) for x, b0 in zip(result[name]["quarters"][other], base[name]["quarters"][other])]
            print(f"{scenario}: {name}'s samples of {other} a round by quarters, vs none: "
                  + " / ".join(f"{r:.2f}x" for r in ratios)
                  + f"; share of {other}'s published samples {name} trained on, by quarters (none | {scenario}): "
                  + " / ".join(f"{x:.2f}" for x in base[name]["coverage"][other]) + " | "
                  + " / ".join(f"{x:.2f}" for x in result[name]["coverage"][other])
                  + ", vs none: " + " / ".join(
                      f"{x / max(b0, 1e-9):.2f}x" for x, b0 in zip(result[name]["coverage"][other], base[name]["coverage"][other])))
        if args.grind_bits is not None:
            print(f"{scenario}: placing {result['placed']} nodes took {result['keys_generated']} keys, "
                  f"{result['grind_s']:.0f} s on one core ({result['grind_s'] / max(result['keys_generated'], 1) * 1e3:.0f} ms a key)")


def run_eclipse(directory: Path, fakes: int | None, args: argparse.Namespace) -> dict:
    """a, b and c as the `eclipse` docstring says; `fakes` None: no eclipse (the baseline)."""
    configs = {name: honest_config(directory / name, args.rounds if name != "c" else args.c_rounds, args.deadline)
               for name in ("a", "b", "c")}
    for cfg in configs.values():
        cfg["swarm"]["wait_for_peers_s"] = 60.0
    attack: Eclipse | None = None
    liars: list[LivenessAttacker] = []
    processes: dict[str, subprocess.Popen] = {}
    try:
        bootstrap: list[str] = []
        if fakes is not None:
            run = public_run_id(configs["a"])  # what any observer of the swarm can compute
            attack = Eclipse(small_swarm_keys(run), args.per_key, grind_bits=args.grind_bits)
            attack.place()  # keys ground before any honest node starts
        if attack is not None and args.placed == "before":
            attack.start(timeout_s=3600)
            bootstrap = attack.maddrs()[:1]
        processes["a"] = start_node(directory / "a", configs["a"], bootstrap)
        a_maddrs = address_of(directory / "a", processes["a"])
        if attack is not None and args.placed == "after":
            attack.start(timeout_s=3600, join=a_maddrs)
        for _ in range(fakes or 0):  # identities whose heartbeats the eclipse keeps, and never deliver
            liar = LivenessAttacker("silent", a_maddrs, run_id=run)
            liar.start()
            attack.accept.add(liar.runtime.signer.local_public_key)
            liars.append(liar)
        processes["b"], b_maddrs = joined_node(directory / "b", configs["b"], a_maddrs)
        metrics_a = directory / "a" / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 1800
        while len(round_lines(read_metrics(metrics_a))) < args.c_after and time.monotonic() < deadline:
            if processes["a"].poll() is not None:
                raise RuntimeError(f"a stopped; see {directory / 'a' / 'node.log'}")
            time.sleep(0.5)
        with ThreadPoolExecutor(max_workers=1) as reading:  # while a and b train, beside c's start
            dht_heartbeats = reading.submit(honest_heartbeats_in_dht, a_maddrs, configs["a"]["swarm"]["stale_after_s"])
            processes["c"] = start_node(directory / "c", configs["c"], b_maddrs)
            cpu_s: list[tuple[float, float, float]] = []
            watch_rss(list(processes.values()), timeout_s=1800, cpu_s=cpu_s)
            dht_heartbeats = dht_heartbeats.result()
    finally:
        for liar in liars:
            liar.stop()
        kill_all(processes.values())
        if attack is not None:
            attack.stop()
    metrics = {name: directory / name / "run" / "metrics.jsonl" for name in ("a", "b", "c")}
    lines = {name: round_lines(read_metrics(path)) if path.exists() else [] for name, path in metrics.items()}
    ids = {name: rounds[0]["peer_id"] if rounds else "" for name, rounds in lines.items()}
    result: dict = {"dht_heartbeats": dht_heartbeats}
    if attack is not None:
        result.update(placed=len(attack.nodes), keys_generated=attack.keys_generated, grind_s=attack.grind_s)
    for (name, rounds), cpu in zip(lines.items(), cpu_s):
        late = rounds[2:] or [{}]
        during = {other: [m for m in rounds_while_training(late, lines[other])] for other in ids if other != name}
        result[name] = {
            "rounds": len(rounds),
            "cpu_s": sum(cpu) / max(len(rounds), 1),  # its process and p2p daemon, a round
            "round_s": statistics.median(m.get("round_s", math.nan) for m in late),
            # the other honest nodes' samples trained on a round, while both trained (mean)
            "from": {other: statistics.mean(m.get("samples_by_peer", {}).get(ids[other], 0) for m in ms) if ms else 0.0
                     for other, ms in during.items()},
            # the same by quarters of those rounds
            "quarters": {other: [statistics.mean(m.get("samples_by_peer", {}).get(ids[other], 0) for m in q) if q else 0.0
                                 for q in quarters(ms)]
                         for other, ms in during.items()},
            # of the other's own samples published in each quarter of those rounds, the share trained on:
            # apart from the two nodes' speeds (a slower node cannot take all a faster one publishes)
            "coverage": {other: [coverage(q, lines[other], ids[other]) for q in quarters(ms)] for other, ms in during.items()},
            "met_at": {other: first_round_with(rounds, ids[other]) for other in ids if other != name},
            "long_waits": sum(m.get("gather_s", 0.0) >= args.deadline / 2 for m in rounds),
        }
    return result


def first_round_with(rounds: list[dict], peer_id: str) -> int | None:
    """The first of a node's rounds (its own count, from 1) that trained on `peer_id`'s samples."""
    return next((i + 1 for i, m in enumerate(rounds) if peer_id in m.get("samples_by_peer", {})), None)


def quarters(rounds: list[dict]) -> list[list[dict]]:
    """`rounds` cut into four runs of consecutive rounds."""
    return parts(rounds, 4)


def parts(items: Sequence, k: int) -> list[Sequence]:
    """`items` cut into `k` runs of consecutive items, as equal as the count allows."""
    return [items[i * len(items) // k:(i + 1) * len(items) // k] for i in range(k)]


def coverage(mine: list[dict], theirs: list[dict], their_id: str) -> float:
    """Of the own samples the other node published between the first and last of `mine` (my
    rounds), the share I trained on."""
    if not mine:
        return math.nan
    published = sum(m.get("own_samples", 0) for m in theirs if mine[0]["time"] <= m["time"] <= mine[-1]["time"])
    return sum(m.get("samples_by_peer", {}).get(their_id, 0) for m in mine) / max(published, 1)


def public_run_id(tree: dict) -> str:
    """The run id of nodes with this config: a hash of public settings, so an attacker computes
    it as well as a peer does."""
    with tempfile.TemporaryDirectory(prefix="swarmnode-run-id-") as scratch:
        path = Path(scratch) / "config.yaml"
        path.write_text(yaml.safe_dump(tree))
        config = load_config(path)
    policy = Policy.load(config.model, config.train, seed=config.node.seed)
    return run_id_for(config, make_task(config.task), policy)


def honest_heartbeats_in_dht(maddrs: list[str], stale_after_s: float) -> int:
    """Honest nodes' heartbeats a reader joined through `maddrs` finds in the DHT now (as
    `swarmnode status` reads them)."""
    try:
        reader = open_status_client(maddrs, timeout_s=30)
    except SwarmError:
        return -1  # a had finished already: shown as such
    try:
        return sum(row.heartbeat.model != "evil" for row in read_heartbeats(reader, stale_after_s))
    finally:
        reader.shutdown()


GHOSTS = {"dated now": 0.0, "a year ahead": 365 * 86400.0, "just inside the skew": MAX_CLOCK_SKEW_S - 5.0}


def ghost(args: argparse.Namespace) -> None:
    """Three identities store one heartbeat each and leave; how long an honest node and
    `status` keep them."""
    config = load_config(None, ["swarm.host_maddrs=[/ip4/127.0.0.1/tcp/0]", "swarm.heartbeat_interval_s=1.0",
                                f"swarm.stale_after_s={args.stale}"])
    run = "bench-ghost"
    honest = SwarmRuntime(config.swarm)
    honest.start()
    link = attach(honest, run, config, PeerLedger())
    link.membership.announce(NodeStatus(round=1))
    reader = open_status_client(honest.visible_maddrs(), timeout_s=30)
    try:
        ghosts = {}
        for kind, ahead_s in GHOSTS.items():
            identity = SwarmRuntime(config.swarm, initial_peers=honest.visible_maddrs())
            identity.start()
            beat = Heartbeat(peer=identity.peer_id, run=run, time=get_dht_time() + ahead_s, round=99_999,
                             model="Qwen2.5-72B-Instruct", eval_acc=0.991, reach="direct")
            keys = ShardedFamily(HEARTBEAT_FAMILY, identity.peer_id, owner_or_none).write_keys()
            stored = identity.call(identity.store_owned_all(keys, pack(beat.model_dump()), get_dht_time() + 600), 10)
            ghosts[identity.peer_id] = (kind, stored)
            identity.shutdown()  # gone: its record stays in the DHT for 600 s
        left_at = time.monotonic()
        seen: dict[str, dict[str, float]] = {peer: {} for peer in ghosts}  # view -> last seconds seen there
        until = left_at + max(3 * args.stale, args.stale + MAX_CLOCK_SKEW_S + 10)
        counted = 0  # the honest node is alone: every peer counted for min_peers is a ghost
        while time.monotonic() < until:
            counted = max(counted, link.membership.wait_for_peers(1_000, timeout_s=0))
            rows = probe(reader, read_heartbeats(reader, args.stale))  # as `swarmnode status` shows them
            views = {
                "live peers": set(link.membership.live_peers()),
                "status: training": {r.heartbeat.peer for r in rows if r.state == "training"},
                "status: listed": {r.heartbeat.peer for r in rows},
            }
            for view, peers in views.items():
                for peer in peers & ghosts.keys():
                    seen[peer][view] = time.monotonic() - left_at
            time.sleep(0.5)
    finally:
        reader.shutdown()
        link.exchange.close()
        link.membership.close()
        honest.shutdown()
    views = ("live peers", "status: training", "status: listed")
    print(f"ghost: 3 identities stored one heartbeat each (round 99,999, accuracy 0.991, record TTL 600 s) and left; "
          f"the honest node's swarm.stale_after_s {args.stale:g}; watched for {until - left_at:.0f} s. "
          "Seconds after they left that each was last seen (-: never)")
    print(f"{'heartbeat':<22} {'stored':>7} " + " ".join(f"{view:>22}" for view in views))
    for peer, (kind, stored) in ghosts.items():
        print(f"{kind:<22} {str(stored):>7} " + " ".join(
            f"{'-' if view not in seen[peer] else f'{seen[peer][view]:.1f}':>22}" for view in views))
    print(f"peers counted for swarm.min_peers (those that answered a direct request): at most {counted}")


def slow_peer(args: argparse.Namespace) -> None:
    """Two honest nodes, b about 3x slower: a pinned to core 0, b to core 1 next to two busy
    loops pinned there too, under each accounting of `--own-share`. Against a alone on core 0
    (its whole batch): a's median round time and how long it waited, the share of each node's
    rounds, while the other was training, that used the other's samples, staleness, strikes."""
    for spec in TINY_PRESETS.values():
        ensure_tiny(spec)
    busy = [subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        with tempfile.TemporaryDirectory(prefix="swarmnode-slow-") as scratch:
            root = Path(scratch)
            solo = {**honest_config(root / "solo", args.rounds, 8.0), "swarm": {"enabled": False}}
            watch_rss([start_node(root / "solo", solo, [], core=0)], timeout_s=1800)
            lines = {"solo": round_lines(read_metrics(root / "solo" / "run" / "metrics.jsonl"))}
            for share in args.own_share:
                lines |= {f"{name}{share}": rounds for name, rounds in slow_pair(root / f"pair-{share}", args.rounds, share).items()}
    finally:
        for process in busy:
            process.kill()
            process.wait()
    solo_s = statistics.median(m["round_s"] for m in lines["solo"][2:])
    print(f"slow peer: a on core 0, b on core 1 beside two busy loops; a trains {args.rounds} rounds, "
          f"b until a is done; medians of rounds 3 on")
    print(f"a alone (its whole batch): round {solo_s:.3f} s, train {statistics.median(m['train_s'] for m in lines['solo'][2:]):.3f} s")
    for share in args.own_share:
        a, b = lines[f"a{share}"], lines[f"b{share}"]
        accounting = "on top (peers' groups added to its own batch)" if share >= 1 else f"shared (generates {share:.0%}, peers fill the rest)"
        a_s, b_s = (statistics.median(m["round_s"] for m in x[2:]) for x in (a, b))
        waits = [m["gather_s"] for m in a[2:]]
        print(f"node.own_share {share}: {accounting}")
        print(f"  a: round {a_s:.3f} s ({a_s / solo_s:.2f}x alone), waited median {statistics.median(waits):.3f} s, "
              f"p90 {np.percentile(waits, 90):.3f} s, at most {max(w / m['round_s'] for w, m in zip(waits, a[2:])):.0%} "
              f"of a round; train {statistics.median(m['train_s'] for m in a[2:]):.3f} s; b's round {b_s:.3f} s ({b_s / a_s:.1f}x a's)")
        for name, mine, other in (("a", a, b), ("b", b, a)):
            during = rounds_while_training(mine, other)[2:]
            used = sum(m["peer_samples"] > 0 for m in during)
            lags = [m["peer_lag"] for m in during if m.get("peer_lag") is not None]
            ages = [m["peer_age_s"] for m in during if m.get("peer_age_s") is not None]
            print(f"  {name}: {len(mine)} rounds, {len(during) + 2} while the other trained; the other's samples in "
                  f"{used}/{len(during)} of those from the 3rd ({used / max(len(during), 1):.0%}), median "
                  f"{statistics.median(m['peer_samples'] for m in during) if during else 0:.0f} a round; "
                  f"mean lag {statistics.mean(lags) if lags else float('nan'):.2f} of its rounds, "
                  f"{statistics.mean(ages) if ages else float('nan'):.2f} s; rejected {mine[-1]['rejected']}")
            mixed = [m for m in during if m["peer_samples"] > 0]
            if mixed:  # F-TIS on the other's (stale, other-policy) samples mixed with its own
                print(f"     rounds with its samples: weight mean {statistics.mean(m['weight_mean'] for m in mixed):.3f}, "
                      f"max {max(m['weight_max'] for m in mixed):.2f}, truncated "
                      f"{statistics.mean(m['truncated_frac'] for m in mixed):.1%}, filtered "
                      f"{statistics.mean(m['filtered_frac'] for m in mixed):.1%}, divergence "
                      f"{statistics.mean(m['divergence_mean'] for m in mixed):.3f}")


def slow_pair(directory: Path, rounds: int, own_share: float) -> dict[str, list[dict]]:
    """a (core 0) trains `rounds` rounds next to b (core 1, beside the busy loops), which is
    stopped with Ctrl-C once a is done; both nodes' round lines."""
    def config(name: str) -> dict:
        cfg = honest_config(directory / name, rounds, 8.0)
        cfg["node"]["own_share"] = own_share
        return cfg

    a = start_node(directory / "a", config("a"), [], core=0)
    processes = [a]
    try:
        maddrs = address_of(directory / "a", a)
        b = start_node(directory / "b", config("b"), maddrs, core=1)
        processes.append(b)
        watch_rss([a], timeout_s=1800)
        if b.poll() is None:
            os.killpg(b.pid, signal.SIGINT)
            watch_rss([b], timeout_s=60)
    finally:
        kill_all(processes)
    return {name: round_lines(read_metrics(directory / name / "run" / "metrics.jsonl")) for name in ("a", "b")}


def rounds_while_training(mine: list[dict], other: list[dict]) -> list[dict]:
    """My rounds that ended while the other node was training (between its first and last round)."""
    if not other:
        return []
    first, last = other[0]["time"], other[-1]["time"]
    return [m for m in mine if first <= m["time"] <= last]


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
    signers = []
    for made in range(1, args.identities + 1):
        signers.append(cheap_signer(args.key_bits))
        if made % 5000 == 0:
            print(f"  {made} identities made ({time.perf_counter() - started:.0f} s)", flush=True)
    print(f"{args.identities} identities ({args.key_bits}-bit RSA keys) made in {time.perf_counter() - started:.0f} s",
          flush=True)
    attacker.dht.protocol.record_validator = CompositeValidator(
        [ManyKeySigner(signers), SwarmRecordValidator(attacker.shards)]
    )
    ledger.delivered(peer.peer_id)  # the honest pair know each other: the peer is waited for

    owners = [(signer.local_public_key, owner_peer_id(signer.local_public_key)) for signer in signers]
    centre = level_for(args.identities)
    levels = [lv for lv in (centre - 1, centre, centre + 1) if 0 <= lv <= MAX_LEVEL]  # where honest readers read

    def write_junk() -> tuple[int, float]:
        """Every identity, once: a heartbeat in the honest run and a manifest of a batch it
        never serves, each in its own shards (storing nodes refuse other shards) at the
        readers' levels, kept JUNK_TTL_S; returns the records written and the seconds taken."""
        began, written = time.perf_counter(), 0
        for first in range(0, len(owners), JUNK_CHUNK):
            now = get_dht_time()
            keys, values, subkeys = [], [], []
            for marker, who in owners[first:first + JUNK_CHUNK]:
                beat = pack(Heartbeat(peer=who, run=run, time=now, round=0).model_dump())
                manifest = Manifest(who, 0, 4096, os.urandom(32), 100).to_value()
                for level in levels:
                    keys += [shard_key(HEARTBEAT_FAMILY, level, shard_of(who, level)),
                             shard_key(manifest_family(run), level, shard_of(who, level))]
                    values += [beat, manifest]
                    subkeys += [marker, marker]
            attacker.call(attacker.dht.store_many(keys, values, now + JUNK_TTL_S, subkeys=subkeys), timeout=600)
            written += len(keys)
            if (first // JUNK_CHUNK) % 40 == 39:
                print(f"  {written} junk records written ({time.perf_counter() - began:.0f} s)", flush=True)
        return written, time.perf_counter() - began

    def measure(rounds: range) -> tuple[list[float], list[float], list[int], int]:
        reads, gathers, records, arrived = [], [], [], 0
        for r in rounds:
            peer_link.exchange.publish(r, os.urandom(2048), 256)
            t = time.perf_counter()
            found = honest.call(link.membership.heartbeats.read(honest.read_owned_many), timeout=60)
            reads.append(time.perf_counter() - t)
            records.append(len(found.items))
            t = time.perf_counter()
            got = link.exchange.gather(GatherWait(30.0, {peer.peer_id}))
            gathers.append(time.perf_counter() - t)
            arrived += any(item.peer_id == peer.peer_id for item in got)
        return reads, gathers, records, arrived

    try:
        base = measure(range(0, args.rounds))
        written, write_s = write_junk()
        stored = stored_records(honest, [HEARTBEAT_FAMILY, manifest_family(run)])
        flood = measure(range(args.rounds, 2 * args.rounds))
        honest.call(link.membership.read(), timeout=60)
        junk_seen = len(link.membership.peers)
    finally:
        for runtime in (attacker, peer, honest):
            runtime.shutdown()
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    print(f"sybil: {args.identities} identities wrote {written} junk records (a heartbeat and a manifest each at "
          f"levels {levels}) in {write_s:.0f} s, once, before the second {args.rounds} rounds")
    print(f"{'':<12} {'heartbeat read ms':>18} {'records a read':>15} {'gather ms':>10} {'peer batch arrived':>19}")
    for name, (reads, gathers, records, arrived) in (("no junk", base), ("with junk", flood)):
        print(f"{name:<12} {ms(reads):>18.1f} {statistics.median(records):>15.0f} {ms(gathers):>10.1f} "
              f"{arrived:>15}/{args.rounds}")
    print(f"the honest node's reader ended at level {link.membership.heartbeats.estimate.level}; as a storing node it "
          f"held {stored} records after the writes; honest strikes: {ledger.total}")
    print(f"junk heartbeats kept as peers of the run after one more read: {junk_seen}; downloads of unknown peers "
          f"at once: at most swarm.max_peers_per_round ({config.swarm.max_peers_per_round})")


def stored_records(runtime: SwarmRuntime, families: list[str]) -> dict[str, int]:
    """How many records (a key's value, or each subkey's) the runtime's DHT node stores for
    others, by family of shard keys ("other": any other key)."""
    indexes = {family: ShardIndex() for family in families}  # the hashes of every shard key, as storing nodes keep
    for family, index in indexes.items():
        index.add(family)
    counts = dict.fromkeys([*families, "other"], 0)
    for key_id, item in runtime.dht.protocol.storage.items():
        family = next((f for f, index in indexes.items() if index.shard(key_id.to_bytes()) is not None), "other")
        counts[family] += len(item.value) if isinstance(item.value, DictionaryDHTValue) else 1
    return counts


def flood(args: argparse.Namespace) -> None:
    """One key floods the run's and the heartbeats' level-0 shards with `--records` junk
    subkeys `[owner:KEY]#i` of 4 KB (hivemind's signature check finds the owner marker anywhere
    in a subkey); two honest exchanges go on publishing and gathering, before and during."""
    config = load_config(None, ["swarm.host_maddrs=[/ip4/127.0.0.1/tcp/0]", "swarm.heartbeat_interval_s=1.0"])
    run = "bench-flood"
    honest = SwarmRuntime(config.swarm)
    honest.start()
    maddrs = honest.visible_maddrs()[:1]
    peer, attacker = SwarmRuntime(config.swarm, initial_peers=maddrs), SwarmRuntime(config.swarm, initial_peers=maddrs)
    peer.start()
    attacker.start()
    ledger = PeerLedger(config.swarm)
    link, peer_link = attach(honest, run, config, ledger), attach(peer, run, config, PeerLedger(config.swarm))
    signer = RSASignatureValidator(RSAPrivateKey())
    attacker.dht.protocol.record_validator = CompositeValidator([ManyKeySigner([signer])])  # it sends what it likes
    ledger.delivered(peer.peer_id)  # the honest pair know each other: the peer is waited for

    def measure(rounds: range) -> tuple[list[float], int]:
        gathers, arrived = [], 0
        for r in rounds:
            peer_link.exchange.publish(r, os.urandom(2048), 256)
            t = time.perf_counter()
            got = link.exchange.gather(GatherWait(30.0, {peer.peer_id}))
            gathers.append(time.perf_counter() - t)
            arrived += any(item.peer_id == peer.peer_id for item in got)
        return gathers, arrived

    try:
        base = measure(range(0, args.rounds))
        started, accepted = time.perf_counter(), 0
        for first in range(0, args.records, 1000):
            count = min(1000, args.records - first)
            keys = [shard_key(manifest_family(run) if i % 2 else HEARTBEAT_FAMILY, 0, 0) for i in range(first, first + count)]
            subkeys = [signer.local_public_key + b"#%d" % i for i in range(first, first + count)]
            stored = attacker.call(
                attacker.dht.store_many(keys, [b"x" * 4000] * count, get_dht_time() + 600, subkeys=subkeys), timeout=600
            )
            accepted += sum(1 for ok in stored.values() if ok)
        flood_s = time.perf_counter() - started
        during = measure(range(args.rounds, 2 * args.rounds))
        visible = sum(len(peer.get_subkeys(shard_key(f, 0, 0))) for f in (manifest_family(run), HEARTBEAT_FAMILY))
    finally:
        for runtime in (attacker, peer, honest):
            runtime.shutdown()
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    print(f"flood: {args.records} junk subkeys of 4 KB from one key in {flood_s:.0f} s "
          f"({accepted} stores reported accepted by some node), {args.rounds} rounds before and during")
    print(f"{'':<12} {'gather ms':>10} {'peer batch arrived':>19}")
    print(f"{'no flood':<12} {ms(base[0]):>10.1f} {base[1]:>15}/{args.rounds}")
    print(f"{'flood':<12} {ms(during[0]):>10.1f} {during[1]:>15}/{args.rounds}")
    print(f"subkeys an honest node reads under the two keys afterwards: {visible}; honest strikes: {ledger.total}")


CONTENT_HONEST = ("h1", "h2", "h3")
ATTACKER = "evil"


def content_config(directory: Path, name: str, seed: int, eval_size: int, defences: bool, extra: list[str]):
    return load_config(
        ROOT / "configs/tiny-cpu.yaml",
        [
            f"node.run_dir={directory / name}",
            f"node.seed={seed}",
            "rollout.prompts_per_round=8",
            "rollout.max_new_tokens=16",
            "rollout.backend=hf",
            f"node.eval_size={eval_size}",
            "node.checkpoint_every=0",
            "node.gather_timeout_s=5",
            "swarm.enabled=false",
            *([] if defences else DEFENCES_OFF),
            *extra,
        ],
    )


def strict_accuracy(node, eval_size: int) -> tuple[float, list[str]]:
    """Greedy pass@1 scored with the strict answer format whatever the node's own setting, so
    runs with task.strict_format on and off are compared on one scale; and the completions."""
    problems = node.task.eval_problems(eval_size)
    prompts = [build_prompt(node.task, p, node.policy) for p in problems]
    texts = [node.policy.decode(o.tokens) for o in node.generator.greedy(prompts)]
    task = node.config.task
    rewards = [graded_reward(t, p.answer, task.answer_format, task.grader, strict=True)
               for t, p in zip(texts, problems)]
    return float(np.mean(rewards)), texts


def run_content(attack: str | None, defences: bool, args: argparse.Namespace, seed: int = 0) -> dict:
    """Three honest nodes (and an attacker unless `attack` is None) stepped round by round. With
    `args.switch_family` the attacker names a tokenizer of its own (lab.poison.switched_family)."""
    hub = InMemoryHub()
    with tempfile.TemporaryDirectory(prefix="swarmnode-content-") as scratch, contextlib.ExitStack() as stack:
        directory = Path(scratch)
        nodes = []
        for name, model in zip(CONTENT_HONEST, args.models):
            config = content_config(directory, name, seed, args.eval_size, defences, [f"model.name={model}", *args.overrides])
            nodes.append(stack.enter_context(assemble(config, join=lambda run, standing, n=name: hub.join(n, run, standing))))
        attacker = None
        if attack:
            attacker_model = [f"model.name={args.attacker_model}"] if getattr(args, "attacker_model", None) else []
            config = content_config(directory, ATTACKER, seed, args.eval_size, defences, [*attacker_model, *args.overrides])
            evil_policy = Policy.load(config.model, config.train, seed=config.node.seed)
            family = switched_family(evil_policy) if getattr(args, "switch_family", False) else None
            attacker = stack.enter_context(assemble(
                config, policy=evil_policy,
                join=lambda run, standing: poisoning_link(
                    hub.join(ATTACKER, run, standing), attack, config, nodes[0].task, evil_policy, family,
                ),
            ))
        before = [strict_accuracy(node, args.eval_size)[0] for node in nodes]
        ignored_at: list[int | None] = [None] * len(nodes)
        round_s: list[float] = []
        peer_samples, attacker_samples = [0] * len(nodes), [0] * len(nodes)
        gated = [0] * len(nodes)
        for round_ in range(args.rounds):
            if attacker:
                attacker.produce(round_)  # its batch is out before the honest nodes gather, and off their clock
            started = time.perf_counter()
            states = [node.produce(round_) for node in nodes]
            for i, (node, state) in enumerate(zip(nodes, states)):
                record = node.consume(round_, state)
                peer_samples[i] += record.peer_samples
                attacker_samples[i] += record.samples_by_peer.get(ATTACKER, 0)
                gated[i] += record.gated
                if ignored_at[i] is None and node.ledger.is_banned(ATTACKER):
                    ignored_at[i] = round_
            round_s.append(time.perf_counter() - started)
        sampled, greedy, accuracy = [], [], []
        for node in nodes:
            problems = node.task.eval_problems(args.eval_size)
            prompts = [build_prompt(node.task, p, node.policy) for p in problems]
            groups = node.generator.generate(prompts[:32], 8)
            sampled += [carries_injection(node.policy.decode(c.tokens)) for group in groups for c in group]
            score, texts = strict_accuracy(node, args.eval_size)
            greedy += [carries_injection(t) for t in texts]
            accuracy.append(score)
        strikes = [node.ledger.counts[ATTACKER] for node in nodes]
    return {
        "sampled": float(np.mean(sampled)),
        "greedy": float(np.mean(greedy)),
        "before": float(np.mean(before)),
        "accuracy": float(np.mean(accuracy)),
        "per_node": accuracy,
        "peer_samples": float(np.mean(peer_samples)),
        "honest_samples": float(np.mean([p - a for p, a in zip(peer_samples, attacker_samples)])) / args.rounds,
        "attacker_samples": float(np.mean(attacker_samples)),
        "gated": float(np.mean(gated)),
        "ignored_at": ignored_at,
        "strikes": strikes,
        "round_s": statistics.median(round_s),
    }


def content(args: argparse.Namespace) -> None:
    rows = []
    for attack in [*(["none"] if args.baseline else []), *args.attacks]:
        for defences in (False, True) if attack != "none" else (True,):
            started = time.perf_counter()
            result = run_content(None if attack == "none" else attack, defences, args)
            rows.append((attack, defences, result))
            print(f"  {attack} defences {'on' if defences else 'off'}: {time.perf_counter() - started:.0f} s", flush=True)
    family = ", naming a tokenizer of its own (one token added)" if args.switch_family else ""
    print(f"content: 3 honest tiny nodes + 1 poisoning peer ({args.attacker_model}{family}), {args.rounds} rounds, "
          "8 prompts x 8 per node a round; per honest node: its peers' samples trained on (honest ones a round), "
          "strikes against the attacker, the honest nodes' median round")
    print(f"{'attack':<8} {'defences':<8} {'poisoned sampled':>16} {'poisoned greedy':>15} "
          f"{'accuracy':>15} {'attacker samples':>16} {'honest a round':>14} {'strikes':>8} {'ignored at':>11} {'round s':>8}")
    for attack, defences, r in rows:
        ignored = ",".join("-" if x is None else str(x) for x in r["ignored_at"])
        strikes = ",".join(map(str, r["strikes"]))
        print(f"{attack:<8} {'on' if defences else 'off':<8} {r['sampled']:>16.1%} {r['greedy']:>15.1%} "
              f"{r['before']:>6.3f} -> {r['accuracy']:.3f} {r['attacker_samples']:>16.0f} {r['honest_samples']:>14.1f} "
              f"{strikes:>8} {ignored:>11} {r['round_s']:>8.2f}", flush=True)


def honest(args: argparse.Namespace) -> None:
    diffs, rows = [], []
    for seed in range(args.seeds):
        off = run_content(None, False, args, seed)
        on = run_content(None, True, args, seed)
        diffs.append(on["accuracy"] - off["accuracy"])
        rows.append((seed, off, on))
        print(f"  seed {seed}: off {off['accuracy']:.3f} on {on['accuracy']:.3f}", flush=True)
    print(f"honest learning: 3 nodes ({', '.join(args.models)}), no attacker, {args.rounds} rounds, "
          f"{args.eval_size} held-out problems, {args.seeds} seeds; accuracy = mean over the 3 nodes")
    print(f"{'seed':<5} {'before':>7} {'defences off':>13} {'defences on':>12} {'on - off':>9} {'peer samples gated':>19}")
    for (seed, off, on), diff in zip(rows, diffs):
        share = on["gated"] / max(on["gated"] + on["peer_samples"], 1)
        print(f"{seed:<5} {off['before']:>7.3f} {off['accuracy']:>13.3f} {on['accuracy']:>12.3f} {diff:>+9.3f} "
              f"{share:>19.1%}")
    se = standard_error(diffs)
    print(f"mean on - off: {statistics.mean(diffs):+.3f}, paired SE over seeds {se:.3f}")
    for i, model in enumerate(args.models):
        node_diffs = [on["per_node"][i] - off["per_node"][i] for _, off, on in rows]
        node_se = standard_error(node_diffs)
        print(f"  node {i + 1} ({model}): off {statistics.mean(off['per_node'][i] for _, off, _ in rows):.3f}, "
              f"on {statistics.mean(on['per_node'][i] for _, _, on in rows):.3f}, "
              f"on - off {statistics.mean(node_diffs):+.3f} (SE {node_se:.3f})")


CROWD_HONEST = ("a", "b")
MARGIN = NON_INFERIORITY_MARGIN  # issue 45's bound on what a crowd may cost an honest node's accuracy


def judged(gains: list[float]) -> str:
    """Accuracy gains paired by seed as printed: mean (SE), the one-sided 95 % lower bound
    (Student's t, swarmnode.lab.verdicts) and whether it shows the node non-inferior."""
    return verdict(gains).against_margin()


def crowd_config(directory: Path, name: str, seed: int, eval_size: int, extra: list[str]):
    return load_config(None, [
        f"node.run_dir={directory / name}", f"node.seed={seed}", "rollout.backend=hf", f"node.eval_size={eval_size}",
        "node.checkpoint_every=0", "node.gather_timeout_s=2", "swarm.enabled=false", *extra,
    ])


def run_crowd(identities: int, payload_len: int, args: argparse.Namespace, seed: int = 0) -> dict:
    """Two honest tiny nodes stepped round by round, and from round `args.arrive` on
    `identities` model-less identities publishing a batch each a round (swarmnode/lab/crowd.py)."""
    hub = InMemoryHub()
    with tempfile.TemporaryDirectory(prefix="swarmnode-crowd-") as scratch, contextlib.ExitStack() as stack:
        directory = Path(scratch)
        nodes = []
        for name in CROWD_HONEST:
            config = crowd_config(directory, name, seed, args.eval_size, args.overrides)
            nodes.append(stack.enter_context(assemble(config, join=lambda run, standing, n=name: hub.join(n, run, standing))))
        public = Policy.load(nodes[0].config.model, nodes[0].config.train, seed=seed)  # the starting weights
        if args.stealthy:  # the same-base attacker: as close to the anchored bar as a payload gets
            payload = stealthiest_payload(public, nodes[0].task, payload_len, nodes[0].config.trust.gate_window)
        else:
            payload = drift_payload(public, nodes[0].task, payload_len)
        names = [f"crowd{i}" for i in range(identities)]
        sampler = HFGenerator(public, nodes[0].config.rollout, seed=seed + 1) if args.sampling or args.padding else None
        crowd = UsefulCrowd([hub.exchange(n, nodes[0].run_id, PeerLedger()) for n in names], nodes[0].run_id,
                            nodes[0].config, nodes[0].task, public, payload, sampler=sampler, padding=args.padding)
        trained = [[] for _ in nodes]  # per node, per round: (samples, payload samples, other honest's, the crowd's, own)
        for node, log in zip(nodes, trained):
            node.intake.take = _counting_take(node.intake.take, log, crowd, names)
        before = [strict_accuracy(node, args.eval_size)[0] for node in nodes]
        round_s: list[float] = []  # the honest nodes' own work a round (the crowd's publishing not counted)
        starts = [0, args.b_joins]  # the round of a's clock at which each honest node starts
        for round_ in range(args.rounds):
            spent = 0.0
            states = []
            running = [(node, round_ - start) for node, start in zip(nodes, starts) if round_ >= start]
            for node, own_round in running:
                started = time.perf_counter()
                states.append(node.produce(own_round))
                spent += time.perf_counter() - started
            if identities and round_ >= args.arrive:
                crowd.publish(round_)
            for (node, own_round), state in zip(running, states):
                started = time.perf_counter()
                node.consume(own_round, state)
                spent += time.perf_counter() - started
            round_s.append(spent / len(running))
        sampled, accuracy, greedy = [], [], []
        for node in nodes:
            problems = node.task.eval_problems(args.eval_size)
            prompts = [build_prompt(node.task, p, node.policy) for p in problems]
            groups = node.generator.generate(prompts[:32], 8)
            sampled.append(float(np.mean([crowd.carries_payload(c.tokens) or carries_injection(node.policy.decode(c.tokens))
                                          for group in groups for c in group])))
            score, texts = strict_accuracy(node, args.eval_size)
            accuracy.append(score)
            greedy.append(float(np.mean([carries_injection(t) for t in texts])))
    def thirds(log: list) -> list[range]:
        return parts(range(len(log)), 3)

    def late(log: list, start: int) -> range:  # the crowd proven useful: its place taken (the node's own rounds)
        return range(max(args.arrive - start, 0) + 20, len(log))

    def late_means(column: int) -> list[float]:  # per node, the mean of one column of its log over late rounds
        return [statistics.mean(log[r][column] for r in late(log, start)) if len(late(log, start)) else float("nan")
                for log, start in zip(trained, starts)]

    return {
        "payload_share": [[sum(log[r][1] for r in t) / max(1, sum(log[r][0] for r in t)) for t in thirds(log)]
                          for log in trained],
        "honest_samples": late_means(2), "crowd_samples": late_means(3), "own_samples": late_means(4),
        "sampled": sampled, "greedy": greedy, "before": before, "accuracy": accuracy,
        "round_s": statistics.median(round_s[args.arrive:] or round_s),
    }


def _counting_take(take, log: list, crowd: UsefulCrowd, crowd_names: list[str]):
    """`Intake.take`, also noting per round what it trained on: samples (own ones included),
    payload samples, the other honest node's samples, the crowd's, and its own."""
    def counted(round_, offered, own, timings):
        taken = take(round_, offered, own, timings)
        payload = sum(1 for s in taken.kept if s.source in crowd_names and crowd.carries_payload(s.tokens))
        honest = sum(1 for s in taken.kept if s.source not in crowd_names)
        log.append((len(own) + len(taken.kept), payload, honest, len(taken.kept) - honest, len(own)))
        return taken
    return counted


def crowd_scenario(args: argparse.Namespace, payload_lengths: list[int]) -> None:
    if args.padding and args.sampling:
        raise SystemExit("--padding pads written groups with sampled ones; --sampling writes none: choose one")
    cells = [(0, 0)] + [(identities, length) for identities in args.identities for length in payload_lengths]
    runs: dict[tuple[int, int], list[dict]] = {cell: [] for cell in cells}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for identities, length in cells:
            started = time.perf_counter()
            runs[identities, length].append(run_crowd(identities, length, args, seed))
            print(f"  seed {seed}, {identities} identities, payload {length}: {time.perf_counter() - started:.0f} s",
                  flush=True)
    print(f"{args.kind}: 2 honest tiny nodes a, b in step ({args.rounds} rounds of a's; b starts at a's round {args.b_joins}); "
          f"from a's round {args.arrive} on, "
          + ("each identity publishes 16 groups a round (the public model's samples, the first the right answer after the payload)"
             if args.sampling else
             "each identity publishes 16 groups a round (half the right answer after the payload, half off by one)"
             + (f", {16 - UsefulCrowd.written_of(16, args.padding)} of them the public model's plain samples"
                if args.padding else "")))
    print(f"{'seed':>4} {'identities':>10} {'payload':>7} {'payload share of trained, by thirds (a | b)':>44} "
          f"{'payload sampled':>15} {'accuracy a, b':>22} {'peer samples a, b':>18} {'crowd samples a, b':>19} "
          f"{'own samples a, b':>17} {'round s':>8}")
    for i, seed in enumerate(range(args.first_seed, args.first_seed + args.seeds)):
        for (identities, length), results in runs.items():
            r = results[i]
            shares = " | ".join("/".join(f"{x:.1%}" for x in node) for node in r["payload_share"])
            acc = ", ".join(f"{b:.3f}->{a:.3f}" for b, a in zip(r["before"], r["accuracy"]))
            peers, crowd, own = (", ".join(f"{x:.1f}" for x in r[key]) for key in ("honest_samples", "crowd_samples", "own_samples"))
            print(f"{seed:>4} {identities:>10} {length:>7} {shares:>44} {max(r['sampled']):>15.1%} {acc:>22} "
                  f"{peers:>18} {crowd:>19} {own:>17} {r['round_s']:>8.2f}", flush=True)
    if args.seeds > 1:
        print(f"accuracy with the crowd - without it, paired by seed over {args.seeds} seeds: mean (SE), "
              f"one-sided 95 % lower bound (Student's t, {args.seeds - 1} df); non-inferior: bound >= -{MARGIN}")
        for cell in cells[1:]:
            for node, name in enumerate(CROWD_HONEST):
                gains = [crowd["accuracy"][node] - none["accuracy"][node] for crowd, none in zip(runs[cell], runs[0, 0])]
                print(f"  {cell[0]} identities, payload {cell[1]}, node {name}: {judged(gains)}")


def first_crowd(args: argparse.Namespace) -> None:
    """Real processes, issue 45's layout: two honest tiny-cpu nodes, a useful-looking crowd with
    the same-base payload started right after the first, the second joining at the first's
    round --b-joins; beside the same run without the crowd."""
    ensure_tiny(TINY_PRESETS["tiny"])
    if args.pin:  # this process and the identities' daemons it starts, off the honest nodes' core
        os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)))
    with contextlib.ExitStack() as stack:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="swarmnode-first-crowd-")))
        rows = [(0, run_first_crowd(root / "none", 0, args)), (args.identities, run_first_crowd(root / "crowd", args.identities, args))]
    print(f"first-crowd: real tiny-cpu nodes a, b ({args.rounds} rounds each; b joins through a at a's round {args.b_joins}); "
          f"from a's start, identities publishing 16 groups every {args.beat:g} s each (half the right answer after a {args.payload}-token "
          "same-base payload, half off by one); one run each")
    print(f"{'identities':>10} {'crowd share of trained, by thirds (a | b)':>42} {'payload sampled a, b':>21} "
          f"{'accuracy a, b':>24} {'other honest samples a, b':>26} {'gated a round a, b':>19} {'median round s a, b':>20}")
    base = rows[0][1]
    for identities, r in rows:
        shares = " | ".join("/".join(f"{x:.1%}" for x in r[n]["crowd_share"]) for n in HONEST)
        sampled = ", ".join(f"{r[n]['sampled']:.1%}" for n in HONEST)
        acc = ", ".join(f"{r[n]['before']:.3f}->{r[n]['after']:.3f}" for n in HONEST)
        honest = ", ".join(f"{r[n]['honest']:.1f} ({r[n]['honest'] / max(base[n]['honest'], 1e-9):.2f}x)" for n in HONEST)
        gated = ", ".join(f"{r[n]['gated']:.0f}" for n in HONEST)
        rounds = ", ".join(f"{r[n]['round_s']:.2f} ({r[n]['round_s'] / base[n]['round_s']:.2f}x)" for n in HONEST)
        print(f"{identities:>10} {shares:>42} {sampled:>21} {acc:>24} {honest:>26} {gated:>19} {rounds:>20}", flush=True)


def run_first_crowd(directory: Path, identities: int, args: argparse.Namespace) -> dict:
    configs = {name: honest_config(directory / name, args.rounds, args.deadline) for name in HONEST}
    for cfg in configs.values():
        cfg["rollout"]["prompts_per_round"] = 16  # the tiny-cpu preset's own
        cfg["node"]["eval_size"] = args.eval_size
    configs["a"]["swarm"]["min_peers"] = 0  # a starts at once, crowd or not
    processes: dict[str, subprocess.Popen] = {}
    links, stop = [], threading.Event()
    config = load_config(None, ["swarm.enabled=false", f"node.run_dir={directory / 'crowd'}"])
    public = Policy.load(config.model, config.train, seed=0)  # the starting weights, public
    task = make_task(config.task)
    payload = stealthiest_payload(public, task, args.payload, config.trust.gate_window)
    publisher = None
    honest_core = 0 if args.pin else None  # and the crowd (this process, its daemons) on the others
    try:
        processes["a"] = start_node(directory / "a", configs["a"], [], core=honest_core)
        a_maddrs = address_of(directory / "a", processes["a"])
        metrics_a = directory / "a" / "run" / "metrics.jsonl"
        crowd = None
        if identities:
            run = public_run_id(configs["a"])
            for _ in range(identities):
                runtime = SwarmRuntime(SwarmSettings(initial_peers=a_maddrs, host_maddrs=LOOPBACK))
                runtime.start()
                links.append((runtime, attach(runtime, run, config, PeerLedger())))
            crowd = UsefulCrowd([link.exchange for _, link in links], run, config, task, public, payload)

            def publish() -> None:  # a batch of each identity's every beat, on its own clock
                round_ = 0
                while not stop.is_set():
                    crowd.publish(round_)
                    for _, link in links:
                        link.membership.announce(NodeStatus(round=round_, model="tiny"))
                    round_ += 1
                    stop.wait(args.beat)

            publisher = threading.Thread(target=publish, daemon=True)
            publisher.start()
        deadline = time.monotonic() + 1800
        while (len(round_lines(read_metrics(metrics_a))) if metrics_a.exists() else 0) < args.b_joins:
            if processes["a"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"a stopped before round {args.b_joins}; see {directory / 'a' / 'node.log'}")
            time.sleep(0.25)
        processes["b"] = start_node(directory / "b", configs["b"], a_maddrs, core=honest_core)
        watch_rss(list(processes.values()), timeout_s=3600)
    finally:
        stop.set()
        if publisher is not None:
            publisher.join(timeout=30)
        kill_all(processes.values())
        for runtime, link in links:
            link.exchange.close()
            link.membership.close()
            runtime.shutdown()
    crowd_ids = {runtime.peer_id for runtime, _ in links}
    for name in HONEST:
        if not (directory / name / "run" / "metrics.jsonl").exists():
            raise RuntimeError(f"{name} trained no round; see {directory / name / 'node.log'}")
    lines = {name: read_metrics(directory / name / "run" / "metrics.jsonl") for name in HONEST}
    rounds = {name: round_lines(ls) for name, ls in lines.items()}
    ids = {name: rs[0]["peer_id"] if rs else "" for name, rs in rounds.items()}
    result = {}
    for name, other in (("a", "b"), ("b", "a")):
        rs = rounds[name]
        during = rounds_while_training(rs, rounds[other])
        thirds = parts(rs, 3)
        result[name] = {
            "crowd_share": [sum(sum(n for p, n in m.get("samples_by_peer", {}).items() if p in crowd_ids) for m in t)
                            / max(1, sum(m.get("own_samples", 0) + m.get("peer_samples", 0) for m in t)) for t in thirds],
            "honest": statistics.mean(m.get("samples_by_peer", {}).get(ids[other], 0) for m in during[2:] or [{}]),
            "gated": statistics.mean(m.get("gated", 0) for m in rs) if rs else math.nan,
            "round_s": statistics.median(m.get("round_s", math.nan) for m in rs[2:] or [{}]),
            "before": next((e["eval_acc"] for e in eval_lines(lines[name], "before")), math.nan),
            "after": next((e["eval_acc"] for e in eval_lines(lines[name], "after")), math.nan),
            "sampled": payload_sampled(directory / name / "run", task, payload),
        }
    return result


PROBATION_HONEST = ("a", "b")  # the near pair whose probation turn the crowd contests; f is the far peer


def run_probation_crowd(identities: int, args: argparse.Namespace, seed: int) -> dict:
    """Honest tiny nodes a and b and a far peer f (`args.far_model`), all sharing their batch
    (`args.own_share`, the share rules at their defaults), stepped round by round in one
    process, and from the first round `identities` identities whose groups teach nothing
    (swarmnode/lab/crowd.py UselessCrowd); per near node, what each round did (`_watch_probation`)."""
    hub = InMemoryHub()
    with tempfile.TemporaryDirectory(prefix="swarmnode-probation-") as scratch, contextlib.ExitStack() as stack:
        directory = Path(scratch)
        nodes = {}
        for name in (*PROBATION_HONEST, "f"):
            own = [f"model.name={args.far_model}"] if name == "f" else []
            config = crowd_config(directory, name, seed, args.eval_size, [f"node.own_share={args.own_share}", *own, *args.overrides])
            nodes[name] = stack.enter_context(assemble(config, join=lambda run, standing, n=name: hub.join(n, run, standing)))
            nodes[name].intake.costs.pin(GEN_SHARE)  # groups on top priced by the cost model, not the clock: runs repeat
        a = nodes["a"]
        public = Policy.load(a.config.model, a.config.train, seed=seed)  # the starting weights, public
        sampler = HFGenerator(public, a.config.rollout, seed=seed + 1)
        names = [f"crowd{i}" for i in range(identities)]
        crowd_names = set(names)  # every identity the crowd used (more with --churn)
        crowd = UselessCrowd([hub.exchange(n, a.run_id, PeerLedger()) for n in names], a.run_id, a.config, a.task, public, sampler)
        logs: dict[str, list[dict]] = {name: [] for name in PROBATION_HONEST}
        for name, other in zip(PROBATION_HONEST, reversed(PROBATION_HONEST)):
            _watch_probation(nodes[name], logs[name], other, crowd_names, crowd)
        before = {name: strict_accuracy(nodes[name], args.eval_size)[0] for name in PROBATION_HONEST}
        joins = {name: args.late if name == "b" else 0 for name in nodes}  # a's round each node starts at
        for round_ in range(args.rounds):
            if args.churn and round_ and round_ % args.churn == 0:  # fresh identities: newcomers again
                names = [f"crowd{i}.{round_ // args.churn}" for i in range(identities)]
                crowd_names.update(names)
                crowd.renew([hub.exchange(n, a.run_id, PeerLedger()) for n in names])
            running = {name: node for name, node in nodes.items() if round_ >= joins[name]}
            spent = dict.fromkeys(running, 0.0)
            states = {}
            for name, node in running.items():  # a node's own rounds count from its joining, as a fresh node's
                started = time.perf_counter()
                states[name] = node.produce(round_ - joins[name])
                spent[name] += time.perf_counter() - started
            crowd.publish(round_)
            for name, node in running.items():
                started = time.perf_counter()
                node.consume(round_ - joins[name], states[name])
                spent[name] += time.perf_counter() - started
            for name in PROBATION_HONEST:
                if name in running:
                    logs[name][-1]["round_s"] = spent[name]
        after = {name: strict_accuracy(nodes[name], args.eval_size)[0] for name in PROBATION_HONEST}
        # the other's first useful sample, in a's rounds: how long the late node waited to count
        taught = {name: _first_taught(nodes[name], other, joins[name]) for name, other in
                  zip(PROBATION_HONEST, reversed(PROBATION_HONEST))}
        # f's first useful sample at each honest node: a peer there from the start is a newcomer too
        f_taught = {name: _first_taught(nodes[name], "f", joins[name]) for name in PROBATION_HONEST}
    return {"published": crowd.published, "late": args.late, **{
        name: {**_probation_summary(logs[name], other, crowd_names, before[name], after[name]), "taught_at": taught[name],
               "f_taught_at": f_taught[name]}
        for name, other in zip(PROBATION_HONEST, reversed(PROBATION_HONEST))}}


def _first_taught(node, peer: str, joined: int) -> int | None:  # noqa: ANN001
    """a's round in which `peer`'s samples first taught `node` (which joined at a's round
    `joined`), from its ledger's seniority; None: never."""
    since = node.intake.ledger.seniority().get(peer)
    return None if since is None else since + joined


def _watch_probation(node, log: list[dict], other: str, crowd_names: set[str], crowd: UselessCrowd) -> None:  # noqa: ANN001
    """Append to `log` an entry for each round of the node: read as its intake collects, whether
    the round had a probation turn (its share whole, or every PROBATION_EVERY-th round) and
    which peer won it (the queue's first group, from a useless or on-trial near peer), the other honest
    node's standing there (useless, far) and how many of the crowd's present identities are far
    (`crowd_names` holds every one it used); then the peers
    whose groups it screened (its intake's `_screen_chunk`: the share, the probation turn and far
    groups on top, not the far groups only measured) and whose samples it trained on (the
    crowd's counted as one, and apart those with a non-zero advantage)."""
    intake = node.intake
    collect, screen, take = intake.collect, intake._screen_chunk, intake.take

    def useless_near(peer: str) -> bool:
        return is_useless(intake.ledger.standing(peer)) and not intake.share.is_far(peer)

    def contests_probation(peer: str) -> bool:  # useless or on trial (loop.ledger.USELESS_AFTER), and near
        return intake._taught_nothing(peer) and not intake.share.is_far(peer)

    def collected(round_, generate_s, timings):  # noqa: ANN001, ANN202
        whole = intake.share.enabled and batch_split(node.config, intake.share.current())[1] == 0
        queue = collect(round_, generate_s, timings)
        turn = whole or round_ % PROBATION_EVERY == 0
        winner = queue[0].peer_id if turn and queue and contests_probation(queue[0].peer_id) else None
        log.append({"whole": whole, "turn": winner is not None, "winner": winner,
                    "other_useless": useless_near(other), "other_far": intake.share.is_far(other),
                    "crowd_far": sum(intake.share.is_far(exchange.peer_id) for exchange in crowd.exchanges),
                    "screened": [], "kept": Counter()})
        return queue

    def screened(round_, chunk, *rest):  # noqa: ANN001, ANN002, ANN202
        log[-1]["screened"].extend(group.peer_id for group in chunk)
        return screen(round_, chunk, *rest)

    def taken(round_, offered, own, timings):  # noqa: ANN001, ANN202
        kept = take(round_, offered, own, timings)
        log[-1]["kept"].update("crowd" if s.source in crowd_names else s.source for s in kept.kept)
        log[-1]["kept"]["crowd taught"] += sum(s.source in crowd_names and s.advantage != 0 for s in kept.kept)
        return kept

    intake.collect, intake._screen_chunk, intake.take = collected, screened, taken


def _probation_summary(log: list[dict], other: str, crowd_names: set[str], before: float, after: float) -> dict:
    """One near node's run, from its `_watch_probation` log."""
    crowd_screens = [sum(peer in crowd_names for peer in r["screened"]) for r in log]
    return {
        "whole": sum(r["whole"] for r in log),
        "turns": sum(r["turn"] for r in log),
        "other_won": sum(r["winner"] == other for r in log),
        "crowd_won": sum(r["winner"] in crowd_names for r in log),
        "other_useless": sum(r["other_useless"] for r in log),
        "other_far": sum(r["other_far"] for r in log),
        "crowd_far": statistics.mean(r["crowd_far"] for r in log),
        "crowd_screened": statistics.mean(crowd_screens), "crowd_screened_max": max(crowd_screens),
        "crowd_kept": sum(r["kept"]["crowd"] for r in log), "crowd_taught": sum(r["kept"]["crowd taught"] for r in log),
        "honest": statistics.mean(r["kept"][other] for r in log),
        "far": statistics.mean(r["kept"]["f"] for r in log),
        "before": before, "after": after,
        "round_s": statistics.median(r["round_s"] for r in log),
    }


def probation_crowd(args: argparse.Namespace) -> None:
    """The crowd at the probation turn, beside the same run without it, paired by seed."""
    if args.churn < 0:
        raise SystemExit(f"--churn is how many rounds the crowd keeps its identities (0: for good), got {args.churn}")
    if not 0 <= args.late < args.rounds:
        raise SystemExit(f"--late is a's round b joins at, from 0 to --rounds - 1 ({args.rounds - 1}), got {args.late}")
    cells = [0, *[k for k in args.identities if k]]
    runs: dict[int, list[dict]] = {k: [] for k in cells}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for seed in seeds:
        for identities in cells:
            started = time.perf_counter()
            runs[identities].append(run_probation_crowd(identities, args, seed))
            print(f"  seed {seed}, {identities} identities: {time.perf_counter() - started:.0f} s, "
                  f"{runs[identities][-1]['published']} crowd groups sent", flush=True)
    print(f"probation-crowd: honest tiny nodes a, b and a far {args.far_model} f in step, {args.rounds} rounds, node.own_share "
          f"{args.own_share}; from the first round each identity publishes one group a round of the public model's samples, "
          "every answer wrong (teaches nothing)"
          + (f"; every {args.churn} rounds the crowd abandons its identities for new ones" if args.churn else ""))
    print(f"{'seed':>4} {'ids':>4} {'node':>4} {'whole':>5} {'turns':>5} {'won: other, crowd':>17} {'other useless, far':>18} "
          f"{'crowd far':>9} {'crowd screened':>14} {'crowd kept (taught)':>19} {'other honest':>12} {'far':>5} "
          f"{'accuracy':>13} {'round s':>7}")
    for i, seed in enumerate(seeds):
        for identities in cells:
            for name in PROBATION_HONEST:
                n = runs[identities][i][name]
                print(f"{seed:>4} {identities:>4} {name:>4} {n['whole']:>5} {n['turns']:>5} "
                      f"{n['other_won']:>10}, {n['crowd_won']:>5} {n['other_useless']:>12}, {n['other_far']:>4} "
                      f"{n['crowd_far']:>9.1f} {n['crowd_screened']:>9.2f} ({n['crowd_screened_max']:>2}) "
                      f"{n['crowd_kept']:>12} ({n['crowd_taught']:>4}) {n['honest']:>12.1f} {n['far']:>5.1f} "
                      f"{n['before']:.3f}->{n['after']:.3f} {n['round_s']:>7.2f}", flush=True)
    print("Per node, rounds: whole, it generated its whole batch; turns, it gave a useless near peer the probation turn; "
          "won, by the other honest node and by the crowd; other useless, far: the other honest node stood useless "
          "(and near) or far at it. Crowd far: identities far at it, mean a round; crowd screened: the crowd's groups "
          "screened a round, mean (most); crowd kept (taught): the crowd's samples trained on in the run (with a "
          "non-zero advantage); other honest, far: samples trained on a round")
    if args.seeds > 1:
        print(f"accuracy with the crowd - without it, paired by seed over {args.seeds} seeds: mean (SE), one-sided 95 % "
              f"lower bound (Student's t, {args.seeds - 1} df); non-inferior: bound >= -{MARGIN}")
        for identities in cells[1:]:
            for name in PROBATION_HONEST:
                gains = [crowded[name]["after"] - without[name]["after"] for crowded, without in zip(runs[identities], runs[0])]
                print(f"  {identities} identities, node {name}: {judged(gains)}")
            # a and b are one node under two names: their mean a seed measures what the crowd costs a node
            gains = [statistics.mean(crowded[name]["after"] - without[name]["after"] for name in PROBATION_HONEST)
                     for crowded, without in zip(runs[identities], runs[0])]
            print(f"  {identities} identities, a and b's mean a seed: {judged(gains)}")
    if args.late:
        _print_late(runs, cells, seeds, args.late)
    _print_far_taught(runs, cells, seeds)


def _print_late(runs: dict[int, list[dict]], cells: list[int], seeds: range, late: int) -> None:
    """When a late-joining honest node and the node already there first taught each other, with
    the crowd and without it."""
    print(f"b joins at a's round {late}: the round (a's) the other honest node's samples first taught each, "
          "and how many rounds after b joined (-: never)")
    print(f"{'seed':>4} {'ids':>4} {'node':>4} {'first taught':>12} {'rounds after join':>17}")
    waits: dict[int, list[float]] = {k: [] for k in cells}
    for i, seed in enumerate(seeds):
        for identities in cells:
            for name in PROBATION_HONEST:
                at = runs[identities][i][name]["taught_at"]
                wait = math.inf if at is None else at - late
                waits[identities].append(wait)
                print(f"{seed:>4} {identities:>4} {name:>4} {'-' if at is None else at:>12} "
                      f"{'-' if at is None else wait:>17}")
    for identities in cells:
        print(f"  {identities} identities: rounds after join, {_median_most_never(waits[identities])}")


def _print_far_taught(runs: dict[int, list[dict]], cells: list[int], seeds: range) -> None:
    """When the far peer f's samples first taught each honest node (a's rounds), with the crowd
    and without it: f is a newcomer at each until then, and its groups go on top of the batch
    only once it is measured far, which takes its groups being screened."""
    print("the round (a's) the far peer f's samples first taught each honest node (-: never)")
    print(f"{'seed':>4} " + " ".join(f"{f'{k} ids: a, b':>14}" for k in cells))
    rounds: dict[int, list[float]] = {k: [] for k in cells}
    for i, seed in enumerate(seeds):
        cells_text = []
        for identities in cells:
            ats = [runs[identities][i][name]["f_taught_at"] for name in PROBATION_HONEST]
            rounds[identities] += [math.inf if at is None else at for at in ats]
            cells_text.append(", ".join("-" if at is None else str(at) for at in ats))
        print(f"{seed:>4} " + " ".join(f"{text:>14}" for text in cells_text))
    for identities in cells:
        print(f"  {identities} identities: f first taught at round {_median_most_never(rounds[identities])}")


def _median_most_never(found: list[float]) -> str:
    """Rounds (inf: never), as the median, the most and how many never."""
    return (f"median {statistics.median(found):.1f}, most {max(found):.0f}, "
            f"never {sum(math.isinf(r) for r in found)} of {len(found)}")


def payload_sampled(run_dir: Path, task, payload: list[int], prompts: int = 32, group: int = 8) -> float:
    """The share of a finished node's sampled completions (its last checkpoint, `group` for
    each of `prompts` held-out problems) that start with `payload`."""
    found = sorted(run_dir.glob("**/model/config.json"))
    if not found:
        return math.nan
    config = load_config(None, [f"model.name={found[-1].parent}", "swarm.enabled=false"])
    policy = Policy.load(config.model, config.train, seed=0)
    generator = HFGenerator(policy, config.rollout)
    problems = task.eval_problems(prompts)
    groups = generator.generate([build_prompt(task, p, policy) for p in problems], group)
    return float(np.mean([starts_with(c.tokens, payload) for g in groups for c in g]))


def grader(args: argparse.Namespace) -> None:
    from reasoning_gym.factory import DATASETS  # optional (the gym extra)

    offered = set(gym_datasets())
    rows = {True: Counter(), False: Counter()}
    slowest = {True: 0.0, False: 0.0}
    with tempfile.TemporaryDirectory(prefix="swarmnode-grader-") as scratch:
        for dataset in sorted(DATASETS):
            mark = Path(scratch) / dataset
            row = rows[dataset in offered]
            row["datasets"] += 1
            command = [sys.executable, str(Path(__file__).with_name("grader_worker.py")), dataset, str(mark)]
            result, said = None, "hung"
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                row["hung"] += 1
            else:
                said = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
                result = json.loads(said[-1].removeprefix(RESULT_PREFIX)) if said else None
                if result is None:
                    row["not made"] += 1  # the dataset needs a config or data of its own
                    said = "not made: " + (done.stderr.strip().splitlines() or ["?"])[-1][:100]
                else:
                    said = json.dumps(result)
            row["ran code"] += mark.exists()
            if result:
                row["raised"] += result["raised"] > 0
                row["rewarded"] += result["rewarded"] > 0
                slowest[dataset in offered] = max(slowest[dataset in offered], result["slowest_s"])
            ran = " RAN CODE" if mark.exists() else ""
            print(f"  {dataset}: {'offered' if dataset in offered else 'refused'} {said}{ran}", flush=True)
    print(f"grader: {len(HOSTILE_ANSWERS)} hostile answers a dataset, each dataset in a process of its own "
          f"(timeout {args.timeout:.0f} s)")
    print(f"{'datasets':<9} {'count':>6} {'ran code':>9} {'hung':>5} {'raised':>7} {'rewarded':>9} {'not made':>9} "
          f"{'slowest s':>10}")
    for is_offered in (True, False):
        row = rows[is_offered]
        print(f"{'offered' if is_offered else 'refused':<9} {row['datasets']:>6} {row['ran code']:>9} {row['hung']:>5} "
              f"{row['raised']:>7} {row['rewarded']:>9} {row['not made']:>9} {slowest[is_offered]:>10.3f}")


def math_grader(args: argparse.Namespace) -> None:
    """Answers that keep sympy busy, sent past cheap_to_grade straight to the grading worker:
    each must score 0 within the worker's hard limit, and an honest answer after it still 1."""
    grading = GradingProcess(hard_timeout_s=args.timeout)
    grading.equal("18", "18")  # the worker started before the clock
    print(f"math-grader: {len(HOSTILE_MATH)} hostile answers, straight to the grading worker "
          f"(hard limit {args.timeout:.0f} s an answer, {MEMORY_LIMIT_BYTES >> 30} GiB)")
    for answer in HOSTILE_MATH:
        killed, started = grading.killed, time.perf_counter()
        equal = grading.equal(answer, "18", False)
        took = time.perf_counter() - started
        honest = grading.equal("18", "18")
        print(f"  {took:6.2f} s  {'equal' if equal else 'not equal'}  {'killed' if grading.killed > killed else 'answered'}"
              f"  then an honest answer: {'1' if honest else '0 (!)'}  {answer[:60]}")
    grading.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    live = sub.add_parser("liveness", help="real processes: round clock and waiting")
    live.add_argument("--rounds", type=int, default=60)
    live.add_argument("--deadline", type=float, default=8.0, help="honest nodes' node.gather_timeout_s")
    live.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS))
    live.add_argument("--crowd", nargs="+", type=int, default=[4, 16, 64], help="identities of each crowd scenario")
    live.add_argument("--pin", action="store_true",
                      help="pin both honest nodes to the first core and the attackers to the others")
    live.add_argument("--heartbeat", type=float, default=1.0,
                      help="the honest nodes' swarm.heartbeat_interval_s (the node's default: 5)")
    live.add_argument("--split", action="store_true",
                      help="as --pin, with the honest nodes' swarm threads and p2p daemons moved to the attackers' "
                           "cores: the first core runs only their generation and training")
    live.add_argument("--keep", type=Path, default=None, help="keep the nodes' run dirs here (default: a temp dir)")
    ecl = sub.add_parser("eclipse", help="real processes: refusing DHT nodes next to the shard keys; peers meet anyway")
    ecl.add_argument("--rounds", type=int, default=150, help="a's and b's rounds")
    ecl.add_argument("--c-rounds", type=int, default=40, help="c's rounds")
    ecl.add_argument("--deadline", type=float, default=8.0, help="honest nodes' node.gather_timeout_s")
    ecl.add_argument("--per-key", type=int, default=8, help="refusing DHT nodes next to each shard key")
    ecl.add_argument("--fakes", nargs="+", type=int, default=[0, 2],
                     help="fake heartbeats the eclipse keeps, one scenario each")
    ecl.add_argument("--c-after", type=int, default=10, help="c joins (through b) once a finished this many rounds")
    ecl.add_argument("--grind-bits", type=int, default=None,
                     help="generate each eclipse node's key until its bound DHT id shares this many leading bits with "
                          "its shard key's (default: ids chosen freely, which swarmnode nodes refuse)")
    ecl.add_argument("--placed", choices=("before", "after"), default="after",
                     help="the eclipse starts before a (a joins through it; needs --grind-bits) or after (joins through a)")
    ecl.add_argument("--keep", type=Path, default=None, help="keep the nodes' run dirs here (default: a temp dir)")
    gho = sub.add_parser("ghost", help="in-process: heartbeats stored once by identities that left")
    gho.add_argument("--stale", type=float, default=6.0, help="the honest node's swarm.stale_after_s")
    syb = sub.add_parser("sybil", help="junk heartbeats and manifests from many identities")
    syb.add_argument("--identities", type=int, default=1000)
    syb.add_argument("--key-bits", type=int, default=CHEAP_KEY_BITS, help="the identities' RSA key size")
    syb.add_argument("--rounds", type=int, default=8)
    slow = sub.add_parser("slow", help="real processes: an honest peer 3x slower than the other")
    slow.add_argument("--rounds", type=int, default=120, help="a's rounds")
    slow.add_argument("--own-share", nargs="+", type=float, default=[1.0, 0.5], help="node.own_share, one pair each")
    fld = sub.add_parser("flood", help="one key floods the run's DHT keys with suffixed subkeys")
    fld.add_argument("--records", type=int, default=50_000)
    fld.add_argument("--rounds", type=int, default=8)
    cont = sub.add_parser("content", help="in-process poisoning, defences off and on")
    cont.add_argument("--attacks", nargs="+", choices=CONTENT_ATTACKS, default=list(CONTENT_ATTACKS))
    cont.add_argument("--attacker-model", default="tiny",
                      help="the poisoner's model: tiny-llama carries the poison in another tokenizer family")
    cont.add_argument("--switch-family", action="store_true",
                      help="the poisoner names a tokenizer of its own (its model's, one token added): read by span, "
                           "held to the weight budget, never struck for the weight it claims")
    cont.add_argument("--baseline", action="store_true", help="also the three honest nodes with no attacker (defences on)")
    hon = sub.add_parser("honest", help="no attacker: learning with defences off and on, paired over seeds")
    hon.add_argument("--seeds", type=int, default=5)
    for sub_parser, rounds in ((cont, 40), (hon, 40)):
        sub_parser.add_argument("--rounds", type=int, default=rounds)
        sub_parser.add_argument("--eval-size", type=int, default=200)
        sub_parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override")
        sub_parser.add_argument("--models", nargs=3, default=["tiny"] * 3, metavar="MODEL",
                                help="the three honest nodes' models, e.g. tiny tiny-large tiny")
    drift = sub.add_parser("drift", help="in-process: model-less identities walk the likelihood gate with a payload")
    drift.add_argument("--payload", nargs="+", type=int, default=[1, 4], help="payload lengths in tokens")
    useful = sub.add_parser("useful-crowd", help="in-process: model-less identities that look useful take the share")
    for sub_parser, identities, rounds in ((drift, [3, 16], 300), (useful, [3, 16, 64], 80)):
        sub_parser.add_argument("--identities", nargs="+", type=int, default=identities)
        sub_parser.add_argument("--rounds", type=int, default=rounds)
        sub_parser.add_argument("--arrive", type=int, default=20, help="the round the identities start publishing")
        sub_parser.add_argument("--stealthy", action="store_true",
                                help="the payload that scores highest on the gate under the starting weights "
                                     "(searched token by token), not the likeliest first tokens")
        sub_parser.add_argument("--b-joins", type=int, default=0,
                                help="the round of a's at which the second honest node b starts (its round 0)")
        sub_parser.add_argument("--sampling", action="store_true",
                                help="the crowd samples with the public model and puts the right answer in place of "
                                     "its first sample (no repeats beyond sampling's), not written groups")
        sub_parser.add_argument("--padding", type=float, default=0.0,
                                help="share of each batch's groups that are the public model's plain samples, the "
                                     "rest written as without --sampling (keeps the evidence of picking low)")
        sub_parser.add_argument("--eval-size", type=int, default=200)
        sub_parser.add_argument("--seeds", type=int, default=1, help="runs of each cell (and of the baseline), paired by seed")
        sub_parser.add_argument("--first-seed", type=int, default=0)
        sub_parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override")
    first = sub.add_parser("first-crowd", help="real processes: a same-base payload crowd from the first node's start")
    first.add_argument("--identities", type=int, default=6)
    first.add_argument("--payload", type=int, default=1, help="payload length in tokens (searched as drift --stealthy)")
    first.add_argument("--rounds", type=int, default=150)
    first.add_argument("--b-joins", type=int, default=0,
                       help="b is started once a finished this many rounds (0: at once, after the crowd; b takes seconds to start)")
    first.add_argument("--deadline", type=float, default=8.0, help="honest nodes' node.gather_timeout_s")
    first.add_argument("--beat", type=float, default=1.0, help="seconds between the crowd's batches")
    first.add_argument("--eval-size", type=int, default=200)
    first.add_argument("--pin", action="store_true",
                       help="both honest nodes on the first core, the crowd (this process and its daemons) on the others")
    first.add_argument("--keep", type=Path, default=None, help="keep the nodes' run dirs here (default: a temp dir)")
    prob = sub.add_parser("probation-crowd", help="in-process: near identities that teach nothing contest the probation turn")
    prob.add_argument("--identities", nargs="+", type=int, default=[8], help="crowd sizes, one cell each (0, no crowd, always runs)")
    prob.add_argument("--rounds", type=int, default=80)
    prob.add_argument("--far-model", default="tiny-llama", help="the far peer f's model")
    prob.add_argument("--own-share", type=float, default=0.5, help="node.own_share of a, b and f")
    prob.add_argument("--eval-size", type=int, default=200)
    prob.add_argument("--seeds", type=int, default=1, help="runs of each cell, paired by seed")
    prob.add_argument("--first-seed", type=int, default=0)
    prob.add_argument("--churn", type=int, default=0,
                      help="every this many rounds the crowd publishes from new identities, newcomers again (0: never)")
    prob.add_argument("--late", type=int, default=0,
                      help="the honest node b joins at a's round K (0: from the first), a newcomer among the crowd's names")
    prob.add_argument("--set", dest="overrides", action="append", default=[], help="config override")
    grd = sub.add_parser("grader", help="hostile answers through every reasoning-gym dataset's scorer")
    grd.add_argument("--timeout", type=float, default=10.0, help="seconds a dataset's process may take")
    mgr = sub.add_parser("math-grader", help="answers that keep math-verify busy, through the grading worker")
    mgr.add_argument("--timeout", type=float, default=HARD_TIMEOUT_S, help="the worker's hard limit an answer")
    args = parser.parse_args()
    kinds = {"grader": grader, "math-grader": math_grader, "liveness": liveness, "eclipse": eclipse, "ghost": ghost, "slow": slow_peer, "sybil": sybil, "flood": flood, "content": content, "honest": honest,
             "first-crowd": first_crowd, "probation-crowd": probation_crowd, "drift": lambda a: crowd_scenario(a, a.payload), "useful-crowd": lambda a: crowd_scenario(a, [0])}
    kinds[args.kind](args)


if __name__ == "__main__":
    main()
