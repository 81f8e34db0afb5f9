"""Liveness attacks on the round clock and on waiting, with in-memory peers (fast, exact)."""

from __future__ import annotations

import threading
import time

from swarmnode.assemble import assemble
from swarmnode.config import load_config
from swarmnode.metrics import read_metrics, round_lines
from swarmnode.records import NodeStatus
from swarmnode.swarm.local import InMemoryHub


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


def _run_together(tmp_path, make_policy, hub, names, rounds, *sets):
    """Run honest nodes to `rounds` in threads; their metrics lines per name."""
    errors = []

    def run(name):
        try:
            with assemble(_config(tmp_path, name, *sets), policy=make_policy(), join=lambda run: hub.join(name)) as node:
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


def test_identities_that_claim_a_far_round_change_nothing(tmp_path, make_policy):
    """Two identities heartbeat round 1,000,000 and deliver nothing: every honest round is trained."""
    hub = InMemoryHub()
    for liar in ("liar-1", "liar-2"):
        hub.join(liar).membership.announce(NodeStatus(round=1_000_000))
    lines = _run_together(tmp_path, make_policy, hub, ["a", "b"], 12)
    for name, rounds in lines.items():
        assert [m["round"] for m in rounds] == list(range(12)), name
        assert sum(m["peer_samples"] for m in rounds) > 0, "the honest pair trained together"
        assert rounds[-1]["rejected"] >= 2, "each liar's unbacked claim was counted"


def test_a_silent_identity_is_never_waited_for(tmp_path, make_policy):
    """It heartbeats the honest round and never publishes: it costs no waiting at all."""
    hub = InMemoryHub()
    hub.join("silent").membership.announce(NodeStatus(round=0))
    lines = _run_together(tmp_path, make_policy, hub, ["a", "b"], 6, "node.gather_timeout_s=20")
    for rounds in lines.values():
        assert max(m["gather_s"] for m in rounds[1:]) < 3.0, [m["gather_s"] for m in rounds]


def test_a_peer_that_stops_delivering_is_waited_for_at_most_max_missed_rounds(tmp_path, make_policy):
    hub = InMemoryHub()
    with (
        assemble(_config(tmp_path, "a", "swarm.min_deadline_s=0.5"), policy=make_policy(), join=lambda r: hub.join("a")) as a,
        assemble(_config(tmp_path, "b"), policy=make_policy(), join=lambda r: hub.join("b")) as b,
    ):
        for round_ in range(3):  # b delivers and earns a's waiting
            b.produce(round_)
            a.consume(round_, a.produce(round_))
        assert a.ledger.earned(b.peer_id)
        waits = []
        for round_ in range(3, 7):  # b goes silent but stays live
            state = a.produce(round_)
            started = time.monotonic()
            a.consume(round_, state)
            waits.append(time.monotonic() - started)
        assert not a.ledger.earned(b.peer_id)
        assert sum(w > 0.4 for w in waits) == 2, waits  # max_missed = 2 waits, then none
        assert max(waits) < 4.0, "the deadline adapts to past deliveries, below gather_timeout_s"
        b.produce(7)  # it delivers again: waited for again
        a.consume(7, a.produce(7))
        assert a.ledger.earned(b.peer_id)


def test_a_node_catches_up_only_to_rounds_peers_proved(tmp_path, make_policy):
    hub = InMemoryHub(keep_rounds=100)
    with (
        assemble(_config(tmp_path, "ahead"), policy=make_policy(), join=lambda r: hub.join("ahead")) as ahead,
        assemble(_config(tmp_path, "late", "node.max_catch_up=15"), policy=make_policy(), join=lambda r: hub.join("late")) as late,
    ):
        for round_ in range(40, 43):
            ahead.produce(round_)
        ahead.membership.announce(ahead.status(43))
        assert late.clock.next_round(0) == 0, "a claim alone moves nothing; it starts a probe"
        assert late.clock.next_round(1) == 16, "proved round 42: jump, bounded by max_catch_up"
        assert late.clock.next_round(16) == 31, "one bounded step at a time"
        assert late.clock.next_round(31) == 43
        assert late.clock.next_round(43) == 43


def test_one_delivering_liar_is_outvoted_by_honest_proofs(tmp_path, make_policy):
    hub = InMemoryHub(keep_rounds=10_000)
    names = ["a", "b", "liar", "me"]
    nodes = {}
    with (
        assemble(_config(tmp_path, "a"), policy=make_policy(), join=lambda r: hub.join("a")) as nodes["a"],
        assemble(_config(tmp_path, "b"), policy=make_policy(), join=lambda r: hub.join("b")) as nodes["b"],
        assemble(_config(tmp_path, "liar"), policy=make_policy(), join=lambda r: hub.join("liar")) as nodes["liar"],
        assemble(_config(tmp_path, "me"), policy=make_policy(), join=lambda r: hub.join("me")) as nodes["me"],
    ):
        for name in names[:2]:
            nodes[name].produce(9)
            nodes[name].membership.announce(nodes[name].status(10))
        nodes["liar"].produce(5000)  # a valid batch for a far round, and a claim to match
        nodes["liar"].membership.announce(nodes["liar"].status(5001))
        me = nodes["me"]
        me.clock.next_round(0)
        assert me.clock.next_round(1) == 10, "lower median of proofs 9, 9, 5000: the honest round"
        assert me.ledger.proven_round("liar") == 5000
        assert me.clock.next_round(10) == 10


def test_a_peer_whose_claim_contradicts_its_delivery_is_counted(tmp_path, make_policy):
    hub = InMemoryHub()
    with (
        assemble(_config(tmp_path, "a"), policy=make_policy(), join=lambda r: hub.join("a")) as a,
        assemble(_config(tmp_path, "b"), policy=make_policy(), join=lambda r: hub.join("b")) as b,
    ):
        b.produce(0)
        b.membership.announce(b.status(500))  # delivers round 0, claims 500
        record = a.consume(0, a.produce(0))
        assert record.peer_samples > 0 and a.ledger.counts[b.peer_id] == 1
