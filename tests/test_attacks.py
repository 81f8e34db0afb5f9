"""Liveness attacks and unequal peers, with in-memory peers (fast, exact).

There is no shared round to capture: each node counts its own rounds, and a peer's claims and
batches change only which fresh samples it may learn from, never how many rounds a node
trains, which prompts it gets, or when it stops. Waiting is bounded by the node's own time.
"""

from __future__ import annotations

import threading

from swarmnode.assemble import assemble
from swarmnode.loop.ledger import PeerLedger
from swarmnode.ops.metrics import read_metrics, round_lines
from swarmnode.protocol import wire
from swarmnode.protocol.batches import assigned_prompt_ids
from swarmnode.protocol.records import NodeStatus
from swarmnode.settings.config import load_config
from swarmnode.swarm.local import InMemoryHub
from swarmnode.tasks import ArithmeticTask

TASK = ArithmeticTask()


def _config(tmp_path, name, *sets):
    return load_config(
        None,
        [
            f"node.run_dir={tmp_path / name}",
            "rollout.group_size=4",
            "rollout.prompts_per_round=2",
            "rollout.max_new_tokens=6",
            "node.eval_size=4",
            "node.checkpoint_every=0",
            "node.gather_timeout_s=4",
            "swarm.enabled=false",
            *sets,
        ],
    )


def _run_together(tmp_path, make_policy, hub, names, rounds, *sets, before=None):
    """Run honest nodes to `rounds` in threads; their metrics lines per name. `before(run)`
    runs once, with the honest run id, before any node starts its rounds."""
    errors = []
    ready = threading.Barrier(len(names))
    once = threading.Lock()
    done: list[bool] = []

    def join(name, run, standing):
        with once:
            if before is not None and not done:
                before(run)
                done.append(True)
        return hub.join(name, run, standing)

    def run(name):
        try:
            with assemble(_config(tmp_path, name, *sets), policy=make_policy(), join=lambda r, standing: join(name, r, standing)) as node:
                ready.wait(timeout=60)
                node.run(rounds=rounds)
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    return {name: round_lines(read_metrics(tmp_path / name / "metrics.jsonl")) for name in names}


def test_identities_claiming_and_delivering_far_rounds_change_no_honest_round(tmp_path, make_policy):
    """Two identities heartbeat round 1,000,000 and publish *valid* batches of round 900 on:
    each honest node trains exactly its 12 rounds, on its own assignment, and nobody is struck
    (a far round is no lie: each node counts its own)."""
    hub = InMemoryHub()
    liars = []

    def far_liars(run):
        for name in ("liar-1", "liar-2"):
            node = assemble(_config(tmp_path, name), policy=make_policy(), join=lambda r, standing, n=name: hub.join(n, r, standing))
            liars.append(node)
            liar = node.__enter__()
            liar.membership.announce(NodeStatus(round=1_000_000))
            for round_ in range(900, 903):
                liar.produce(round_)

    try:
        lines = _run_together(tmp_path, make_policy, hub, ["a", "b"], 12, before=far_liars)
    finally:
        for node in liars:
            node.__exit__(None, None, None)
    for name, rounds in lines.items():
        assert [m["round"] for m in rounds] == list(range(12)), name
        assert sum(m["peer_samples"] for m in rounds) > 0, "the swarm trained together"
        assert rounds[-1]["rejected"] == 0, "nobody's round is a lie"
        kept = sorted(key for key in hub.payloads if key[1] == name)  # the hub keeps its last 8 rounds
        assert [key[2] for key in kept] == list(range(4, 12))
        for key in kept:
            batch = wire.decode(hub.payloads[key])
            assert [g.prompt_id for g in batch.groups] == assigned_prompt_ids(0, name, key[2], 2, TASK.num_train)


def test_a_silent_identity_is_never_waited_for(tmp_path, make_policy):
    """It heartbeats and never publishes: it costs no waiting at all."""
    hub = InMemoryHub()
    lines = _run_together(
        tmp_path, make_policy, hub, ["a", "b"], 6, "node.gather_timeout_s=20",
        before=lambda run: hub.join("silent", run, PeerLedger()).membership.announce(NodeStatus(round=0)),
    )
    for rounds in lines.values():
        assert max(m["gather_s"] for m in rounds[1:]) < 3.0, [m["gather_s"] for m in rounds]


def test_a_peer_that_stops_delivering_is_waited_for_at_most_max_missed_rounds(tmp_path, make_policy):
    hub = InMemoryHub()
    slow_wait = ["node.wait_share=100", "node.gather_timeout_s=0.5"]  # every wait runs to the 0.5 s cap
    with (
        assemble(_config(tmp_path, "a", *slow_wait), policy=make_policy(), join=lambda r, standing: hub.join("a", r, standing)) as a,
        assemble(_config(tmp_path, "b"), policy=make_policy(), join=lambda r, standing: hub.join("b", r, standing)) as b,
    ):
        for round_ in range(3):  # b delivers and earns a's waiting
            b.produce(round_)
            a.consume(round_, a.produce(round_))
        assert a.ledger.earned(b.peer_id)
        waits = []
        for round_ in range(3, 7):  # b goes silent but stays live
            record = a.consume(round_, a.produce(round_))
            waits.append(record.timings["gather_s"])  # the wait alone: the step's time varies with the machine's load
        assert not a.ledger.earned(b.peer_id)
        assert sum(w > 0.4 for w in waits) == 2, waits  # max_missed = 2 waits, then none
        assert max(waits) < 2.0, "each wait is capped"
        b.produce(7)  # it delivers again: waited for again
        a.consume(7, a.produce(7))
        assert a.ledger.earned(b.peer_id) and a.ledger.total == 0


def test_a_round_waits_at_most_its_share_of_the_node_s_own_time(tmp_path, make_policy):
    hub = InMemoryHub()
    with (
        assemble(_config(tmp_path, "a", "node.wait_share=0.25"), policy=make_policy(),
                 join=lambda r, standing: hub.join("a", r, standing)) as a,
        assemble(_config(tmp_path, "b"), policy=make_policy(), join=lambda r, standing: hub.join("b", r, standing)) as b,
    ):
        b.produce(0)
        a.run_round(0)  # b delivered: waited for from now on
        records = [a.run_round(r) for r in range(1, 5)]  # b never delivers again
        for record in records:
            own_s = record.timings["round_s"] - record.timings["gather_s"]
            assert record.timings["gather_s"] <= 0.25 * max(own_s, 0.2) + 0.15, record.timings


def test_a_three_times_slower_peer_is_used_in_most_rounds_and_never_struck(tmp_path, make_policy):
    """b finishes a round while a finishes three: a spreads each of b's batches over the rounds
    until b's next is due, so it learns from b in most rounds; b uses a's newest batch; a's
    own rounds and prompts are its own; nobody is struck for being slow or fast."""
    hub = InMemoryHub()
    half = ["node.own_share=0.5", "rollout.prompts_per_round=6", "trust.likelihood_gate=false"]
    with (
        assemble(_config(tmp_path, "a", *half), policy=make_policy(), join=lambda r, standing: hub.join("a", r, standing)) as a,
        assemble(_config(tmp_path, "b", *half), policy=make_policy(), join=lambda r, standing: hub.join("b", r, standing)) as b,
    ):
        fast, slow = [], []
        for round_ in range(12):
            if round_ % 3 == 0:
                state = b.produce(round_ // 3)
            fast.append(a.run_round(round_))
            if round_ % 3 == 2:
                slow.append(b.consume(round_ // 3, state))
        used = [r.peer_samples > 0 for r in fast[3:]]
        assert sum(used) / len(used) >= 0.8, [r.peer_samples for r in fast]
        assert all(r.peer_samples > 0 for r in slow[1:]), [r.peer_samples for r in slow]
        assert max(r.peer_lag for r in slow[1:] if r.peer_lag is not None) <= 1
        assert a.ledger.total == 0 and b.ledger.total == 0
