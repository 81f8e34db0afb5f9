"""The declared seams between the round loop and the swarm (swarmnode.swarm.base): the
peers' standing an exchange reads, and the one wait rule every exchange stops on."""

from __future__ import annotations

import threading

from swarmnode.loop.ledger import PeerLedger
from swarmnode.loop.waiting import WaitRule
from swarmnode.settings.config import SwarmSettings, load_config
from swarmnode.swarm.base import GatherWait, PeerStanding
from swarmnode.swarm.local import InMemoryHub


def test_a_wait_is_satisfied_by_every_peer_waited_for_and_by_anyone_when_asked():
    assert GatherWait().satisfied(set())
    assert not GatherWait(wait_for=frozenset({"a", "b"})).satisfied({"a"})
    assert GatherWait(wait_for=frozenset({"a", "b"})).satisfied({"a", "b", "c"})
    assert not GatherWait(wait_for_any=True).satisfied(set())
    assert GatherWait(wait_for_any=True).satisfied({"x"})
    assert GatherWait(wait_for={"a"}).wait_for == frozenset({"a"}), "any collection becomes a frozenset"


def _pair(hub: InMemoryHub) -> tuple[PeerLedger, object, object]:
    ledger = PeerLedger()
    receiver = hub.join("me", "run", ledger).exchange
    sender = hub.join("peer", "run", PeerLedger()).exchange
    return ledger, receiver, sender


def test_the_in_memory_hub_holds_back_an_unproven_peer_the_node_holds_unused():
    hub = InMemoryHub()
    ledger, receiver, sender = _pair(hub)
    sender.publish(0, b"r0")
    assert [item.round for item in receiver.gather(GatherWait(held=frozenset({"peer"})))] == [], (
        "never screened, held unused: its newer batch would only wait behind the one held"
    )
    assert [item.round for item in receiver.gather()] == [0], "no longer held: handed out"
    sender.publish(1, b"r1")
    ledger.delivered("peer")
    ledger.screened("peer", offered=8, useful=4, round_=0)
    assert [item.round for item in receiver.gather(GatherWait(held=frozenset({"peer"})))] == [1], (
        "a peer proven useful is fetched even while its groups wait in the pool"
    )


def test_the_in_memory_hub_hands_out_an_unproven_peer_s_newest_batch_and_a_proven_peer_s_every_one():
    hub = InMemoryHub()
    ledger, receiver, sender = _pair(hub)
    for round_ in range(3):
        sender.publish(round_, b"r%d" % round_)
    assert [item.round for item in receiver.gather()] == [2], (
        "not proven useful: its newest only, as the hivemind exchange asks it for its newest"
    )
    for round_ in range(3, 6):
        sender.publish(round_, b"r%d" % round_)
    ledger.delivered("peer")
    ledger.screened("peer", offered=8, useful=4, round_=2)
    assert [item.round for item in receiver.gather()] == [3, 4, 5], "proven useful: every round since, to catch up"


def test_the_in_memory_hub_hands_out_nothing_of_a_banned_peer():
    hub = InMemoryHub()
    ledger, receiver, sender = _pair(hub)
    for _ in range(SwarmSettings().max_rejects):
        ledger.reject("peer", "bad data")
    sender.publish(0, b"junk")
    assert receiver.gather(GatherWait(timeout_s=0.2, wait_for_any=True)) == []


def test_a_held_back_peer_does_not_satisfy_a_wait_for_anyone():
    hub = InMemoryHub()
    _, receiver, sender = _pair(hub)
    sender.publish(0, b"r0")
    assert receiver.gather(GatherWait(timeout_s=0.2, wait_for_any=True, held=frozenset({"peer"}))) == []


def test_the_ledger_is_a_peer_standing():
    view: PeerStanding = PeerLedger()  # what the exchanges are given
    assert view.known_peers() == [] and not view.ever_delivered()


def test_the_standing_is_read_and_written_from_two_threads_at_once():
    """The round loop writes while the swarm thread reads (whom to poll, whom to fetch): no
    read may raise on a dict that grows under it, nor see a record half written."""
    ledger = PeerLedger(SwarmSettings(max_rejects=1_000_000))
    errors: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        try:
            for k in range(20_000):
                peer = f"p{k}"
                ledger.delivered(peer)
                ledger.screened(peer, 4, k % 5, k)
                ledger.missed(f"p{k // 2}")
                if k % 7 == 0:
                    ledger.cut(peer)
                if k % 11 == 0:
                    ledger.reject(peer, "bad")
        except BaseException as err:  # surfaced below
            errors.append(err)
        finally:
            stop.set()

    def read() -> None:
        try:
            while not stop.is_set():
                known = ledger.known_peers()
                assert all(ledger.has_delivered(peer) for peer in known)
                ledger.ever_delivered()
                ledger.expected({"p1", "p2"})
                for peer in known[-50:]:
                    ledger.standing(peer), ledger.is_banned(peer), ledger.has_cut(peer)
                ledger.total  # noqa: B018 (a read under the lock)
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=write), threading.Thread(target=read), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(ledger.known_peers()) > 0


def test_the_wait_for_a_first_batch_stops_after_max_missed_vain_rounds_for_good():
    """Silent identities keep a node from ever hearing from anyone: it waits for a first batch
    at most `swarm.max_missed` rounds, and a round in between that did not wait (the pool
    could fill the share) does not arm the wait again."""
    config = load_config(None, ["swarm.max_missed=2", "node.gather_timeout_s=8"])
    rule = WaitRule(config)

    def plan(short: bool) -> GatherWait:
        wait = rule.plan(short=short, live={"silent"}, earned=set(), pooled=set(), ever_delivered=False,
                         held=frozenset(), generate_s=1.0)
        rule.settle(wait, delivered=set())
        return wait

    assert plan(True).wait_for_any and plan(True).wait_for_any
    assert not plan(False).wait_for_any, "nothing to wait for this round"
    assert not plan(True).wait_for_any and not plan(True).wait_for_any, "two vain waits: no more"
    assert plan(True).timeout_s == 0.0


def test_a_peer_that_answered_before_the_first_round_arms_the_wait_for_a_first_batch():
    """A fast node whose peer answered while it waited for `swarm.min_peers`, but whose
    heartbeat it has not read yet, still waits for a first batch; nobody met, no wait."""
    config = load_config(None, ["swarm.max_missed=2", "node.gather_timeout_s=8"])
    unmet, met = WaitRule(config), WaitRule(config)
    met.answered_at_start(1)
    kwargs = dict(short=True, live=set(), earned=set(), pooled=set(), ever_delivered=False,
                  held=frozenset(), generate_s=1.0)
    assert not unmet.plan(**kwargs).wait_for_any and unmet.plan(**kwargs).timeout_s == 0.0
    wait = met.plan(**kwargs)
    assert wait.wait_for_any and wait.timeout_s == 8.0
    assert not met.plan(**{**kwargs, "ever_delivered": True}).wait_for_any, "someone delivered: no wait for anyone"
