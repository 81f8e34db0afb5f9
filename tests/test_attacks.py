"""Liveness attacks and unequal peers, with in-memory peers (fast, exact).

There is no shared round to capture: each node counts its own rounds, and a peer's claims and
batches change only which fresh samples it may learn from, never how many rounds a node
trains, which prompts it gets, or when it stops. Waiting is bounded by the node's own time.
"""

from __future__ import annotations

import statistics
import threading

import pytest

from swarmnode.assemble import assemble
from swarmnode.loop.ledger import PeerLedger
from swarmnode.ops.metrics import read_metrics, round_lines
from swarmnode.protocol import wire
from swarmnode.protocol.batches import assigned_prompt_ids
from swarmnode.protocol.records import NodeStatus
from swarmnode.settings.config import load_config
from swarmnode.swarm.base import NO_WAIT, GatherWait, SwarmLink
from swarmnode.swarm.local import InMemoryHub
from swarmnode.tasks import ArithmeticTask
from tests.test_intake import FAR_RULES_OFF

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


OVERRUN_S = 10.0  # how far past its deadline a gather may end: an exchange that ignored it, not a busy machine


def _recording_waits(link: SwarmLink, waits: list[tuple[GatherWait, set[str]]]) -> SwarmLink:
    """`link`, its exchange's gathers recorded in `waits`: (the wait the round asked for, the
    peers whose batches it got). What a round waited for is the node's rule, not the clock's."""
    gather = link.exchange.gather

    def recorded(wait: GatherWait = NO_WAIT):
        found = gather(wait)
        waits.append((wait, {item.peer_id for item in found}))
        return found

    link.exchange.gather = recorded
    return link


def _run_together(tmp_path, make_policy, hub, names, rounds, *sets, before=None, waits=None):
    """Run honest nodes to `rounds` in threads; their metrics lines per name. `before(run)`
    runs once, with the honest run id, before any node starts its rounds. `waits`, if given:
    name -> a list that gets each of the node's gathers (_recording_waits)."""
    errors = []
    ready = threading.Barrier(len(names))
    once = threading.Lock()
    done: list[bool] = []

    def join(name, run, standing):
        with once:
            if before is not None and not done:
                before(run)
                done.append(True)
        link = hub.join(name, run, standing)
        return link if waits is None else _recording_waits(link, waits[name])

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
    """It heartbeats and never publishes: it costs no waiting at all. No round waits for it by
    name, and the one wait for anyone (before a first delivery, up to the 20 s cap) ends with
    the honest peer's batch: read from the waits the rounds asked for, not from a clock."""
    hub = InMemoryHub()
    waits = {"a": [], "b": []}
    lines = _run_together(
        tmp_path, make_policy, hub, ["a", "b"], 6, "node.gather_timeout_s=20",
        before=lambda run: hub.join("silent", run, PeerLedger()).membership.announce(NodeStatus(round=0)),
        waits=waits,
    )
    for name, rounds in lines.items():
        assert [m["round"] for m in rounds] == list(range(6)), name
        assert len(waits[name]) == 6, name
        assert all("silent" not in wait.wait_for for wait, _ in waits[name]), (name, waits[name])
        for wait, delivered in waits[name]:
            if wait.wait_for_any:  # only while nobody had delivered: ended by a batch, not by the cap
                assert delivered, (name, waits[name])


def test_a_peer_that_stops_delivering_is_waited_for_at_most_max_missed_rounds(tmp_path, make_policy):
    hub = InMemoryHub()
    slow_wait = ["node.wait_share=100", "node.gather_timeout_s=0.5"]  # every wait runs to the 0.5 s cap
    waits: list[tuple[GatherWait, set[str]]] = []
    with (
        assemble(_config(tmp_path, "a", *slow_wait), policy=make_policy(),
                 join=lambda r, standing: _recording_waits(hub.join("a", r, standing), waits)) as a,
        assemble(_config(tmp_path, "b"), policy=make_policy(), join=lambda r, standing: hub.join("b", r, standing)) as b,
    ):
        for round_ in range(3):  # b delivers and earns a's waiting
            b.produce(round_)
            a.consume(round_, a.produce(round_))
        assert a.ledger.earned(b.peer_id)
        waits.clear()
        records = [a.consume(round_, a.produce(round_)) for round_ in range(3, 7)]  # b goes silent but stays live
        assert not a.ledger.earned(b.peer_id)
        assert len(waits) == 4 and not any(delivered for _, delivered in waits), waits
        assert sum(bool(wait.wait_for) for wait, _ in waits) == 2, waits  # max_missed = 2 waits, then none
        for (wait, _), record in zip(waits, records):
            if wait.wait_for:
                assert wait.wait_for == {b.peer_id}
                # each wait is capped: wait_share=100 of the round's own generation, at most gather_timeout_s
                assert wait.timeout_s == min(0.5, 100 * record.timings["generate_s"]), (wait, record.timings)
                assert record.timings["gather_s"] >= wait.timeout_s, "and, b silent, ran to its end"
                assert record.timings["gather_s"] < wait.timeout_s + OVERRUN_S, "and not past it"
            else:
                assert wait.timeout_s == 0.0, wait
        b.produce(7)  # it delivers again: waited for again
        a.consume(7, a.produce(7))
        assert a.ledger.earned(b.peer_id) and a.ledger.total == 0


def test_a_round_waits_at_most_its_share_of_the_node_s_own_time(tmp_path, make_policy):
    """The wait a round asks for is `node.wait_share` of the node's own recent round time (the
    median of its rounds so far, waiting excluded), as the node itself measured it in this run:
    on a busy machine its rounds take longer and so may its waits, in the same proportion. The
    share is compared with the wait the round asked its exchange for, not with a clock."""
    hub = InMemoryHub()
    waits: list[tuple[GatherWait, set[str]]] = []
    with (
        assemble(_config(tmp_path, "a", "node.wait_share=0.25"), policy=make_policy(),
                 join=lambda r, standing: _recording_waits(hub.join("a", r, standing), waits)) as a,
        assemble(_config(tmp_path, "b"), policy=make_policy(), join=lambda r, standing: hub.join("b", r, standing)) as b,
    ):
        b.produce(0)
        records = [a.run_round(0)]  # b delivered: waited for from now on
        records += [a.run_round(r) for r in range(1, 5)]  # b never delivers again
        assert len(waits) == 5 and waits[0][1] == {b.peer_id}
        own_s = [record.timings["round_s"] - record.timings["gather_s"] for record in records]
        waited = 0
        for r in range(1, 5):
            (wait, delivered), timings = waits[r], records[r].timings
            share_s = 0.25 * statistics.median(own_s[:r])  # its own time over its rounds before this one
            assert not delivered and wait.wait_for <= {b.peer_id}, waits[r]
            if wait.wait_for:
                waited += 1
                assert wait.timeout_s == pytest.approx(min(4.0, share_s), rel=1e-9), (wait, own_s[:r])
                assert timings["gather_s"] >= wait.timeout_s, "b silent: the wait ran to its end"
                assert timings["gather_s"] < wait.timeout_s + OVERRUN_S, "and not past it"
            else:
                assert wait.timeout_s == 0.0, wait
        assert waited >= 1, "b was waited for"


def test_a_three_times_slower_peer_is_used_in_most_rounds_and_never_struck(tmp_path, make_policy):
    """b finishes a round while a finishes three: a spreads each of b's batches over the rounds
    until b's next is due, so it learns from b in most rounds; b uses a's newest batch; a's
    own rounds and prompts are its own; nobody is struck for being slow or fast."""
    hub = InMemoryHub()
    half = ["node.own_share=0.5", "rollout.prompts_per_round=6", "trust.likelihood_gate=false", *FAR_RULES_OFF]
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
