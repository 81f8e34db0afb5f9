import json
import threading

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from safetensors import SafetensorError

from swarmnode.assemble import compose_node, run_id_for
from swarmnode.learn.sample import OWN
from swarmnode.loop.ledger import PeerLedger
from swarmnode.model import checkpoint
from swarmnode.model.batching import OutOfMemory
from swarmnode.model.families import Families, tokenizer_document
from swarmnode.model.hub_tokenizers import HubTokenizers
from swarmnode.model.policy import Policy
from swarmnode.model.tiny import TINY_LLAMA_SPEC, build_model, build_tokenizer
from swarmnode.ops.exporter import metrics_page
from swarmnode.ops.metrics import MetricsLog, eval_lines, read_metrics, round_lines
from swarmnode.ops.reporting import make_reporters
from swarmnode.protocol import wire
from swarmnode.protocol.batches import assigned_prompt_ids, batch_split
from swarmnode.protocol.records import NodeStatus
from swarmnode.rollout.hf import HFGenerator
from swarmnode.settings.config import LoraSettings, ReportSettings, TrainSettings, load_config
from swarmnode.swarm.local import InMemoryHub, solo_link
from swarmnode.tasks import ArithmeticTask
from tests.test_intake import FAR_RULES_OFF


def _config(tmp_path, name, **sets):
    overrides = [
        f"node.run_dir={tmp_path / name}",
        "rollout.group_size=4",
        "rollout.prompts_per_round=3",
        "rollout.max_new_tokens=8",
        "node.eval_size=8",
        "node.checkpoint_every=0",
        "loss.filter_g=5",
    ] + [f"{k}={v}" for k, v in sets.items()]
    return load_config(None, overrides)


def _node(tmp_path, make_policy, name, hub=None, staleness=1, max_rejects=3, sets=None, policy=None, **policy_kwargs):
    config = _config(tmp_path, name, **{"node.staleness": staleness, "swarm.max_rejects": max_rejects, **(sets or {})})
    policy = policy or make_policy(**policy_kwargs)
    task = ArithmeticTask()
    run = run_id_for(config, task, policy)
    ledger = PeerLedger(config.swarm)
    link = hub.join(name, run, ledger) if hub else solo_link(name, run, ledger)
    return compose_node(config, policy, HFGenerator(policy, config.rollout), task, run, link, ledger)


def _llama_policy(name: str = "tiny-llama") -> Policy:
    """A small random Llama of tiny-llama's tokenizer family: another family than tiny's."""
    tokenizer = build_tokenizer(TINY_LLAMA_SPEC)
    model = build_model(tokenizer, TINY_LLAMA_SPEC, hidden_size=64, intermediate_size=128, num_hidden_layers=1)
    return Policy(model.eval(), tokenizer, name, TrainSettings(lr=1e-3), LoraSettings(rank=0),
                  use_chat_template=False, seed=0)


def _step_together(nodes, round_):
    states = [n.produce(round_) for n in nodes]
    return [n.consume(round_, s) for n, s in zip(nodes, states)]


def test_heterogeneous_nodes_train_on_each_others_samples(tmp_path, make_policy):
    hub = InMemoryHub()
    small = _node(tmp_path, make_policy, "small", hub, hidden=32, layers=1)
    large = _node(tmp_path, make_policy, "large-lora", hub, hidden=64, layers=2, lora_rank=4)
    assert small.run_id == large.run_id
    history = [_step_together([small, large], r) for r in range(3)]
    for records in history:
        for rec in records:
            assert rec.own_samples == 12
            # round 0: peers publish in the same round, so samples arrive from round 0 on
            assert rec.peer_samples == 12 and rec.peers == 1
            assert rec.wire_bytes > rec.wire_tokens * 8
    # Different models: the peer's samples are off-policy, so weights differ from 1 (their
    # mean is held at most 1 by the weight budget, swarmnode.screening).
    last = history[-1]
    assert all(abs(rec.weight_max - 1.0) > 1e-3 for rec in last)
    assert all(rec.weight_mean <= 1.0 + 1e-5 for rec in last)
    assert all(rec.weight_max <= 2.0 + 1e-6 for rec in last)
    assert any(rec.divergence_mean > 0.01 for rec in last)


def test_nodes_of_two_tokenizer_families_train_on_each_others_samples(tmp_path, make_policy):
    """tiny next to a Llama of another tokenizer: one run, and each trains on the other's
    samples, put into its own tokens by span, with no strike either way."""
    hub = InMemoryHub()
    tiny = _node(tmp_path, make_policy, "tiny", hub)
    llama_policy = _llama_policy("tiny-llama")
    llama = _node(tmp_path, make_policy, "llama", hub, policy=llama_policy)
    assert tiny.run_id == llama.run_id and tiny.policy.fingerprint != llama.policy.fingerprint
    history = [_step_together([tiny, llama], r) for r in range(3)]
    for records in history:
        for rec in records:
            # random weights now and then write a lone piece of a character: no text, left out
            assert 9 <= rec.peer_samples <= 12 and rec.peers == 1 and rec.rejected == 0
    # the other family's samples are off-policy, by span: weights away from 1, a divergence
    assert all(rec.weight_mean < 0.99 and rec.divergence_mean > 0.01 for rec in history[-1])


def test_a_node_that_does_not_know_a_peer_s_tokenizer_fetches_it_once_and_reads_its_next_batches(tmp_path, make_policy):
    """tiny knows no preset here: llama's first batch is left unread (no strike), tiny asks
    llama for the document its batch names, and from the next round on trains on its samples;
    the document is fetched once, however many batches name it."""
    hub = InMemoryHub()
    tiny = _node(tmp_path, make_policy, "tiny", hub)
    tiny.intake.families = Families(tiny.policy.tokenizer, tiny.policy.vocab_size, presets=False)
    llama_policy = _llama_policy("tiny-llama")
    llama = _node(tmp_path, make_policy, "llama", hub, policy=llama_policy)
    fetched = []
    handed_out = tiny.exchange.tokenizers

    def recording() -> list:
        documents = handed_out()
        fetched.extend(digest for digest, _ in documents)
        return documents

    tiny.exchange.tokenizers = recording
    first = _step_together([tiny, llama], 0)[0]
    assert first.peer_samples == 0 and first.rejected == 0
    assert tiny.intake.families.get(llama.intake.families.own.digest) is None
    for round_ in (1, 2):
        later = _step_together([tiny, llama], round_)[0]
        assert later.peer_samples >= 9 and later.rejected == 0
    assert fetched == [llama.intake.families.own.digest], "one fetch, then the family is known"
    assert tiny.intake.families.get(fetched[0]).fingerprint == llama.policy.fingerprint


@pytest.mark.parametrize("hub_gives", ["its document", "another document"])
def test_a_peer_s_tokenizer_is_rebuilt_from_the_hub_id_its_batch_names_and_its_sender_asked_only_when_that_fails(
        tmp_path, make_policy, hub_gives):
    """llama's batches name the hub id its tokenizer came from: tiny rebuilds the document from
    the hub and asks llama nothing; when the hub gives bytes of another digest (other library
    versions), the document is dropped and llama itself is asked, one round later."""
    hub = InMemoryHub()
    tiny = _node(tmp_path, make_policy, "tiny", hub)
    tiny.intake.families = Families(tiny.policy.tokenizer, tiny.policy.vocab_size, presets=False)
    llama_policy = _llama_policy("org/tiny-llama")
    assert llama_policy.hub_name == "org/tiny-llama"
    llama = _node(tmp_path, make_policy, "llama", hub, policy=llama_policy)
    served = {"its document": tokenizer_document(llama_policy.tokenizer),
              "another document": tokenizer_document(build_tokenizer({**TINY_LLAMA_SPEC, "vocab_size": 700}))}
    looked_up, asked_peer = [], []
    tiny.intake.hub_tokenizers = HubTokenizers(offline=False, fetch=lambda name: looked_up.append(name) or served[hub_gives])
    want = tiny.exchange.want_tokenizer
    tiny.exchange.want_tokenizer = lambda peer, digest: asked_peer.append(digest) or want(peer, digest)
    assert _step_together([tiny, llama], 0)[0].peer_samples == 0
    tiny.intake.hub_tokenizers.join()
    read = [_step_together([tiny, llama], r)[0].peer_samples for r in (1, 2)]
    assert looked_up == ["org/tiny-llama"], "the hub is asked once"
    if hub_gives == "its document":
        assert asked_peer == [] and min(read) >= 9
    else:
        assert asked_peer == [llama.intake.families.own.digest] and read[0] == 0 and read[1] >= 9
    assert tiny.intake.families.get(llama.intake.families.own.digest).fingerprint == llama.policy.fingerprint


def test_a_node_alone_does_not_wait_for_min_peers(tmp_path, make_policy):
    """`--solo` on a config that asks for peers (the demo's baseline runs): nobody can come."""
    node = _node(tmp_path, make_policy, "alone", sets={"swarm.enabled": False, "swarm.min_peers": 2,
                                                       "swarm.wait_for_peers_s": 60})
    asked = []
    node.membership.wait_for_peers = lambda wanted, timeout: asked.append(wanted) or 0
    node._wait_for_peers()
    assert asked == []
    joined = _node(tmp_path, make_policy, "joined", InMemoryHub(), sets={"swarm.min_peers": 2, "swarm.wait_for_peers_s": 0})
    joined.membership.wait_for_peers = lambda wanted, timeout: asked.append(wanted) or 0
    joined._wait_for_peers()
    assert asked == [2], "a node of a swarm still waits"


def test_own_share_splits_the_batch_between_own_and_peers_groups(tmp_path, make_policy):
    """node.own_share 1/3 of 3 groups: each of three nodes generates one group and trains on
    three, two of them its peers'; share 1 with the same peers: its own three plus as many of
    theirs by default (peers at most double a step), all six of theirs with max_peer_groups 6."""
    hub = InMemoryHub()
    third = {"node.own_share": 1 / 3, "trust.likelihood_gate": False, **dict(rule.split("=") for rule in FAR_RULES_OFF)}
    nodes = [_node(tmp_path, make_policy, name, hub, sets=third) for name in ("a", "b", "c")]
    assert batch_split(nodes[0].config) == (1, 2)
    history = [_step_together(nodes, r) for r in range(2)]
    for records in history:
        assert [(r.own_samples, r.peer_samples) for r in records] == [(4, 8)] * 3
        assert all(r.wire_tokens > 0 for r in records)
    hub2 = InMemoryHub()
    whole = {"trust.likelihood_gate": False}
    on_top = [_node(tmp_path, make_policy, f"{name}2", hub2, sets=whole) for name in ("a", "b", "c")]
    records = _step_together(on_top, 0)
    assert [(r.own_samples, r.peer_samples) for r in records] == [(12, 12)] * 3
    hub3 = InMemoryHub()
    wider = {**whole, "node.max_peer_groups": 6}
    on_top = [_node(tmp_path, make_policy, f"{name}3", hub3, sets=wider) for name in ("a", "b", "c")]
    records = _step_together(on_top, 0)
    assert [(r.own_samples, r.peer_samples) for r in records] == [(12, 24)] * 3


@pytest.mark.parametrize("on_top_step", ["batch", "own"])
def test_far_groups_on_top_train_in_the_batch_s_step_or_in_one_of_their_own(tmp_path, make_policy, on_top_step):
    """node.on_top_step: the groups intake screened on top (here, as if every peer's were) train
    in the one step with the node's own samples (batch), or in a second step after it (own); the
    round's record counts every sample either way."""
    hub = InMemoryHub()
    sets = {"trust.likelihood_gate": False, "node.on_top_step": on_top_step}
    a, b = (_node(tmp_path, make_policy, name, hub, sets=sets) for name in ("a", "b"))
    take = a.intake.take
    def all_on_top(*args, **kwargs):
        taken = take(*args, **kwargs)
        taken.on_top_from = 0
        return taken
    a.intake.take = all_on_top
    steps, train_step = [], a.policy.train_step
    a.policy.train_step = lambda samples, *rest: steps.append([s.source for s in samples]) or train_step(samples, *rest)
    states = [node.produce(0) for node in (a, b)]
    record = a.consume(0, states[0])
    own, peer = [OWN] * 12, [b.peer_id] * 12
    assert steps == ([own + peer] if on_top_step == "batch" else [own, peer])
    assert (record.own_samples, record.peer_samples) == (12, 12) and record.divergence_mean > 0


def test_a_smaller_own_share_uses_a_prefix_of_the_same_assignment():
    full = assigned_prompt_ids(0, "peer", 7, 16, 10_000)
    assert len(set(full)) == 16
    assert all(assigned_prompt_ids(0, "peer", 7, k, 10_000) == full[:k] for k in range(1, 16))
    assert assigned_prompt_ids(0, "peer", 8, 16, 10_000) != full
    assert sorted(assigned_prompt_ids(0, "peer", 7, 50, 10)) == list(range(10))  # capped by the data


def test_each_peer_batch_is_used_once_and_rounds_only_forward(tmp_path, make_policy):
    hub = InMemoryHub()
    a = _node(tmp_path, make_policy, "a", hub)
    b = _node(tmp_path, make_policy, "b", hub)
    a.produce(3)
    assert [item.round for item in b.exchange.gather()] == [3]
    assert b.exchange.gather() == []
    a.produce(1)  # an older round (a restarted peer, or a replay) after a newer one
    assert b.exchange.gather() == []
    a.produce(4)
    assert [item.round for item in b.exchange.gather()] == [4]


def test_members_of_other_runs_never_meet_in_the_hub(tmp_path, make_policy):
    hub = InMemoryHub()
    a = _node(tmp_path, make_policy, "a", hub)
    other = hub.join("other", "another-run", PeerLedger())
    other.exchange.publish(0, b"junk of another run")
    assert a.exchange.gather() == [] and "other" not in a.membership.live_peers()
    assert a.ledger.total == 0


def test_rogue_payloads_are_rejected_and_counted(tmp_path, make_policy):
    hub = InMemoryHub()
    honest = _node(tmp_path, make_policy, "honest", hub, staleness=3, max_rejects=10)
    rogue = _node(tmp_path, make_policy, "rogue", hub)
    state = rogue.produce(0)
    good = hub.payloads[(rogue.run_id, "rogue", 0)]
    batch = wire.decode(good)
    # 1: garbage bytes, 2: claims another peer's identity, 3: prompts it was not assigned,
    # 4: another run id. Each published in a round of its own and gathered in it (of a peer
    # not proven useful a gather takes only its newest batch).
    forged = wire.RolloutBatch(
        batch.run_id, "honest", 1, batch.tokenizer_digest, batch.groups
    )
    cherry = wire.RolloutBatch(
        batch.run_id,
        "rogue",
        2,
        batch.tokenizer_digest,
        [wire.CompletionGroup(g.prompt_id + 1, g.lengths, g.tokens, g.logprobs) for g in batch.groups],
    )
    other_run = wire.RolloutBatch(
        "other", "rogue", 3, batch.tokenizer_digest, batch.groups
    )
    hub.payloads.clear()
    rogue_payloads = [b"SNRB\xff\xff\xff\xff garbage", wire.encode(forged), wire.encode(cherry), wire.encode(other_run)]
    for round_, payload in enumerate(rogue_payloads):
        rogue.exchange.publish(round_, payload)
        record = honest.consume(round_, honest.produce(round_))
        assert record.peer_samples == 0
    assert honest.rejected["rogue"] == 4
    assert record.own_samples == 12 and state.payload_tokens > 0


def test_a_batch_in_a_tokenizer_we_cannot_read_is_left_unread_but_a_lie_in_one_still_counts(tmp_path, make_policy):
    """Another tokenizer is no fault: a batch in one this node does not know is not trained on
    and not counted against its sender. What holds whatever the tokenizer (its round) is still
    checked, and so are token ids against the vocabulary of a tokenizer the batch names."""
    hub = InMemoryHub()
    honest = _node(tmp_path, make_policy, "honest", hub, staleness=3, max_rejects=10)
    rogue = _node(tmp_path, make_policy, "rogue", hub)
    rogue.produce(0), rogue.produce(2)
    batch, later = (wire.decode(hub.payloads[(rogue.run_id, "rogue", r)]) for r in (0, 2))
    hub.payloads.clear()
    rogue.exchange.publish(0, wire.encode(wire.RolloutBatch(batch.run_id, "rogue", 0, "f00dfeed" * 8, batch.groups)))
    record = honest.consume(0, honest.produce(0))
    assert record.peer_samples == 0 and honest.rejected.get("rogue", 0) == 0
    assert honest.ledger.standing("rogue") == 0.0, "it taught nothing: no wait for it, its groups last"
    hub.payloads.clear()
    rogue.exchange.publish(1, wire.encode(wire.RolloutBatch(batch.run_id, "rogue", 0, "f00dfeed" * 8, batch.groups)))
    honest.consume(1, honest.produce(1))
    beyond = [wire.CompletionGroup(g.prompt_id, g.lengths, g.tokens + honest.policy.vocab_size, g.logprobs) for g in later.groups]
    rogue.exchange.publish(2, wire.encode(wire.RolloutBatch(batch.run_id, "rogue", 2, batch.tokenizer_digest, beyond)))
    honest.consume(2, honest.produce(2))
    assert honest.rejected["rogue"] == 2, "round 0 published as round 1; ids outside the vocabulary it names"


def test_a_batch_must_hold_the_first_prompts_of_its_assignment_and_some(tmp_path, make_policy):
    """Any own share is accepted as the first k prompts of the peer's assignment; skipping the
    first one (cherry-picking by dropping) and an empty batch are refused and counted."""
    hub = InMemoryHub()
    honest = _node(tmp_path, make_policy, "honest", hub, staleness=3, max_rejects=10,
                   sets={"trust.likelihood_gate": False})
    peer = _node(tmp_path, make_policy, "peer", hub)
    peer.produce(0)
    peer.produce(1)
    batches = {r: wire.decode(hub.payloads[(peer.run_id, "peer", r)]) for r in (0, 1)}
    hub.payloads.clear()

    def reissue(round_, groups):
        b = batches.get(round_, batches[0])
        return wire.encode(wire.RolloutBatch(b.run_id, "peer", round_, b.tokenizer_digest, groups))

    reissued = [
        reissue(0, batches[0].groups[:2]),  # a smaller own share: fine
        reissue(1, batches[1].groups[1:]),  # its first prompt left out
        reissue(2, []),
    ]
    peer_samples = []
    for round_, payload in enumerate(reissued):  # each gathered in its round: a newcomer's newest only
        peer.exchange.publish(round_, payload)
        peer_samples.append(honest.consume(round_, honest.produce(round_)).peer_samples)
    assert honest.rejected["peer"] == 2
    assert peer_samples == [2 * 4, 0, 0], "the two groups of the prefix were trained on"


def test_a_peer_is_ignored_after_max_rejects(tmp_path, make_policy):
    hub = InMemoryHub()
    honest = _node(tmp_path, make_policy, "honest", hub, staleness=4, max_rejects=2)
    rogue = _node(tmp_path, make_policy, "rogue", hub)
    honest.ledger.delivered("rogue")  # proven useful once, so one gather hands out its every round since
    honest.ledger.screened("rogue", offered=8, useful=4, round_=0)
    rogue.produce(4)  # a valid batch for round 4
    for r in (2, 3):
        rogue.exchange.publish(r, b"not a wire message")
    record = honest.consume(4, honest.produce(4))
    assert honest.ledger.is_banned("rogue") and honest.rejected["rogue"] == 2
    assert record.peer_samples == 0, "the valid batch of a banned peer is not used either"


def test_checkpoint_resume_continues_where_it_stopped(tmp_path, make_policy):
    node = _node(tmp_path, make_policy, "solo")
    node.run(rounds=2)
    weights = [p.detach().clone() for p in node.policy.model.parameters()]
    evals = list(node.report.evals)
    timed = node.intake.costs.checkpoint_state()
    second = round_lines(read_metrics(tmp_path / "solo" / "metrics.jsonl"))[1]  # its timings rounded to 0.1 ms
    assert timed["alone_round_s"] == pytest.approx(second["generate_s"] + second["train_s"], abs=1e-3), (
        "a round alone timed from the second round (the first is warm-up): all its own, nothing on top")
    assert timed["on_top_group_s"] is None
    node.close()
    metrics = tmp_path / "solo" / "metrics.jsonl"
    with metrics.open("a") as file:
        file.write('{"kind": "round", "rou')  # a kill in the middle of a line
    again = _node(tmp_path, make_policy, "solo")
    assert again.maybe_resume() and again.next_round == 2
    assert all(torch.equal(a, b) for a, b in zip(weights, again.policy.model.parameters()))
    assert again.policy.optimizer.state_dict()["state"], "optimizer state restored"
    assert len(evals) == 2 and again.report.status(2).evals == evals, "the heartbeat's evaluations survive a restart"
    assert again.intake.costs.checkpoint_state() == timed, "and what its rounds cost (groups on top)"
    again.run(rounds=3)
    again.close()
    rounds = [m["round"] for m in round_lines(read_metrics(metrics))]
    assert rounds == [0, 1, 2], "the torn line is left out and the next one stands on its own"


def test_checkpoints_come_by_time_as_well_as_by_rounds(tmp_path, make_policy):
    node = _node(tmp_path, make_policy, "solo", sets={"node.checkpoint_every": 0, "node.checkpoint_every_s": 60})
    assert not node.checkpoints.due(0)
    node.checkpoints._saved_at -= 61  # a minute of slow rounds since the last checkpoint
    assert node.checkpoints.due(0)
    node.save(0)
    assert not node.checkpoints.due(1), "the clock starts again at each checkpoint"
    node.close()


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_a_checkpoint_is_written_beside_the_next_rounds_and_holds_the_state_it_was_taken_at(
    tmp_path, make_policy, monkeypatch, lora_rank
):
    node = _node(tmp_path, make_policy, "solo", lora_rank=lora_rank)
    assert node.checkpoints.writer.background, "a tiny model's copy fits in memory"
    node.run_round(0)
    started, release = threading.Event(), threading.Event()
    real_write = checkpoint.write_snapshot

    def slow_write(policy, snapshot, directory):
        started.set()
        assert release.wait(30)
        real_write(policy, snapshot, directory)

    monkeypatch.setattr(checkpoint, "write_snapshot", slow_write)
    trainable = {n for n, p in node.policy.model.named_parameters() if p.requires_grad}
    taken = {n: p.detach().clone() for n, p in node.policy.model.named_parameters() if n in trainable}
    node.save(0, wait=False)
    assert started.wait(10) and not (node.checkpoint_dir / "meta.json").exists(), "still being written"
    frozen = {n: p for n, p in node.policy.model.named_parameters() if n not in trainable}
    snapshot_weights = node.checkpoints.writer.pending.weights
    assert all(snapshot_weights[n].data_ptr() == p.data_ptr() for n, p in frozen.items()), "frozen: not copied"
    node.run_round(1)  # the next round runs while the write waits
    with torch.no_grad():  # and training changes the weights in place (a round of a random model may not)
        for name, param in node.policy.model.named_parameters():
            if name in trainable:
                param.add_(1.0)
    release.set()
    node.checkpoints.wait()
    node.close()
    again = _node(tmp_path, make_policy, "solo", lora_rank=lora_rank)
    assert again.maybe_resume() and again.next_round == 1, "the checkpoint of round 1, as taken"
    restored = dict(again.policy.model.named_parameters())
    assert all(torch.equal(taken[n], restored[n].detach()) for n in trainable)
    again.close()


def test_a_checkpoint_too_big_for_the_memory_left_is_written_in_the_round(tmp_path, make_policy, monkeypatch):
    monkeypatch.setattr(checkpoint, "available_memory_bytes", lambda: 1024)
    node = _node(tmp_path, make_policy, "solo")
    assert not node.checkpoints.writer.background
    node.run_round(0)
    node.save(0, wait=False)
    assert (node.checkpoint_dir / "meta.json").exists(), "written before save returned"
    node.close()


def test_a_kill_between_the_renames_of_a_checkpoint_loses_nothing(tmp_path, make_policy):
    node = _node(tmp_path, make_policy, "solo")
    node.run(rounds=2)
    node.close()
    node.checkpoint_dir.rename(node.checkpoint_dir.with_name("checkpoint.old"))  # what such a kill leaves
    again = _node(tmp_path, make_policy, "solo")
    assert again.maybe_resume() and again.next_round == 2 and again.resumed_at not in (None, "unknown time")
    again.close()


@pytest.mark.parametrize("damage", ["meta.json", "optimizer.safetensors", "model"])
def test_a_damaged_checkpoint_is_refused_with_the_way_on_and_fresh_starts_over(tmp_path, make_policy, damage):
    node = _node(tmp_path, make_policy, "solo")
    node.run(rounds=1)
    node.close()
    target = node.checkpoint_dir / damage
    if target.is_dir():
        for file in target.glob("*.safetensors"):
            file.write_bytes(file.read_bytes()[:40])  # a cut copy
    else:
        target.write_bytes(target.read_bytes()[: len(target.read_bytes()) // 2])
    again = _node(tmp_path, make_policy, "solo")
    with pytest.raises(checkpoint.DamagedCheckpoint, match="cannot be read .*--fresh starts over.*another --run-dir"):
        again.maybe_resume()
    again.close()
    fresh = _node(tmp_path, make_policy, "solo", sets={"node.resume": False})
    assert not fresh.maybe_resume()
    fresh.run(rounds=1)
    fresh.close()
    assert _node(tmp_path, make_policy, "solo").maybe_resume(), "the next checkpoint replaced the damaged one"


def test_a_checkpoint_that_cannot_be_written_is_said_and_training_goes_on(tmp_path, make_policy, monkeypatch, caplog):
    node = _node(tmp_path, make_policy, "solo", sets={"node.checkpoint_every": 1})
    node.run(rounds=1)
    kept = (node.checkpoint_dir / "meta.json").read_text()
    said = []
    node.checkpoints.say = said.append  # where a checkpoint says it could not be written
    real_save = checkpoint.save_file

    def full_disk(tensors, path, *args, **kwargs):  # what safetensors raises on a full disk: no OSError
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    node.publisher = pushes = _Pushes(every=1)
    node.run(rounds=3)  # two more rounds, each checkpointed in the background, then the last save
    assert [m["round"] for m in round_lines(read_metrics(node.metrics.path))] == [0, 1, 2]
    assert said and all("No space left on device" in line and "training goes on" in line for line in said)
    assert (node.checkpoint_dir / "meta.json").read_text() == kept, "the last good checkpoint stays"
    assert not node.checkpoint_dir.with_name("checkpoint.tmp").exists(), "the half-written copy is gone"
    assert pushes.pushed == [], "nothing pushed that was not written"
    node.publisher = None
    monkeypatch.setattr(checkpoint, "save_file", real_save)
    node.save(2)
    assert json.loads((node.checkpoint_dir / "meta.json").read_text())["round"] == 2, "space again: saved again"
    node.close()


class _Pushes:
    """A Hub publisher that records what it was asked to push."""

    def __init__(self, every: int) -> None:
        self.every, self.pushed, self.repo_id = every, [], "me/model"

    def due(self, round_: int) -> bool:
        return (round_ + 1) % self.every == 0

    def push(self, folder, facts, wait: bool = False) -> None:
        self.pushed.append(facts.rounds_done)


def test_metrics_lines_that_cannot_be_written_are_said_once_and_the_log_goes_on(tmp_path, caplog):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"kind": "round", "round": 0})

    class Full:  # a full disk: the first half of a line reaches the file, then the write fails
        def write(self, text):
            with log.path.open("a") as file:
                file.write(text[: len(text) // 2])

        def flush(self):
            raise OSError(28, "No space left on device")

        def close(self):
            raise OSError(28, "No space left on device")

    log._file = Full()
    log.write({"kind": "round", "round": 1})
    log.write({"kind": "round", "round": 2})  # the disk has room again: a fresh handle
    log._file = Full()
    log.write({"kind": "round", "round": 3})
    log.close()
    assert log.lost == 2
    assert sum("No space left on device" in r.getMessage() for r in caplog.records) == 1, "said once"
    assert [m["round"] for m in read_metrics(log.path)] == [0, 2], "a cut line never swallows the next one"


def test_resume_refuses_a_checkpoint_of_another_model(tmp_path, make_policy):
    node = _node(tmp_path, make_policy, "solo", lora_rank=0)
    node.run(rounds=1)
    node.close()
    other = _node(tmp_path, make_policy, "solo", lora_rank=4)
    with pytest.raises(ValueError, match="LoRA rank"):
        other.maybe_resume()


def test_round_metrics_are_logged_as_json_lines(tmp_path, make_policy):
    node = _node(tmp_path, make_policy, "solo")
    summary = node.run(rounds=2)
    node.close()
    lines = read_metrics(tmp_path / "solo" / "metrics.jsonl")
    assert 0.0 <= summary["eval_before"] <= 1.0 and 0.0 <= summary["eval_after"] <= 1.0
    expected = {
        "round",
        "reward_mean",
        "own_samples",
        "peer_samples",
        "filtered",
        "weight_mean",
        "weight_max",
        "truncated_frac",
        "divergence_mean",
        "wire_bytes",
        "wire_tokens",
        "generate_s",
        "train_s",
        "round_s",
    }
    assert lines[0]["kind"] == "start" and lines[0]["next_round"] == 0, "a (re)start marks itself"
    assert eval_lines(lines, "before") == [lines[1]] and lines[1]["eval_acc"] == summary["eval_before"]
    assert expected <= set(lines[2]) and round_lines(lines) == lines[2:4]
    assert eval_lines(lines, "after") == [lines[-1]] and lines[-1]["eval_acc"] == summary["eval_after"]
    assert np.isclose(lines[2]["weight_mean"], 1.0, atol=1e-3)  # solo: all on-policy
    assert all(isinstance(line["time"], float) for line in lines), "every line carries the wall-clock time"


def test_prometheus_metrics_report_the_last_round_and_the_totals(tmp_path, make_policy):
    node = _node(tmp_path, make_policy, "solo")
    node.run(rounds=2)
    node.close()
    families = {f.name: f for f in text_string_to_metric_families(metrics_page(node.report.snapshot)().decode())}
    value = {name: family.samples[0].value for name, family in families.items()}
    assert value["swarmnode_round"] == 1 and value["swarmnode_own_samples"] == node.report.last_record.own_samples
    assert value["swarmnode_published"] == node.report.published > 0, "a counter of what was published"
    assert value["swarmnode_eval_acc"] == node.report.last_eval
    assert families["swarmnode_published"].type == "counter" and families["swarmnode_round"].type == "gauge"


def test_tensorboard_event_files_are_read_back_by_tensorboard(tmp_path, make_policy):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    node = _node(tmp_path, make_policy, "solo")
    node.reporters = make_reporters(ReportSettings(to=["tensorboard"]), tmp_path / "solo")
    node.run(rounds=2)
    node.reporters.close()
    node.close()
    events = EventAccumulator(str(tmp_path / "solo" / "tensorboard"))
    events.Reload()
    rewards = events.Scalars("round/reward_mean")
    assert [e.step for e in rewards] == [1, 2]
    lines = round_lines(read_metrics(tmp_path / "solo" / "metrics.jsonl"))
    assert np.allclose([e.value for e in rewards], [line["reward_mean"] for line in lines], atol=1e-6)
    assert [e.step for e in events.Scalars("eval/eval_acc")] == [0, 2], "before training, after round 2"
    assert "time/round_s" in events.Tags()["scalars"]


def test_ood_evaluation_is_scored_with_math_verify(tmp_path, make_policy):
    from swarmnode.tasks import Math500Eval
    from tests.conftest import data_path

    ood = Math500Eval(str(data_path("math500")), answer_format="answer_tag")
    node = _node(tmp_path, make_policy, "solo")
    node.evaluator.ood = ood
    summary = node.run(rounds=1)
    node.close()
    assert summary["ood_before"] == 0.0 and summary["ood_after"] == 0.0  # random model: nothing right
    problems = ood.eval_problems(3)
    assert [ood.reward(f"<answer>{p.answer}</answer>", p) for p in problems] == [1.0, 1.0, 1.0]


def test_cli_rejects_a_missing_ood_file(tmp_path):
    from typer.testing import CliRunner

    from swarmnode.cli import app

    result = CliRunner().invoke(
        app, ["join", "--set", f"task.eval_data={tmp_path / 'nope'}", "--run-dir", str(tmp_path / "r")]
    )
    assert result.exit_code == 2 and "does not exist" in " ".join(result.output.split())


def test_out_of_memory_at_the_smallest_batch_leaves_a_checkpoint(tmp_path, make_policy, monkeypatch):
    node = _node(tmp_path, make_policy, "oom")
    real, steps = node.policy.train_step, []

    def step(*args):
        steps.append(1)
        if len(steps) == 3:
            raise OutOfMemory("out of GPU memory in the training step at micro-batch 1 (simulated)")
        return real(*args)

    monkeypatch.setattr(node.policy, "train_step", step)
    with pytest.raises(OutOfMemory):
        node.run(rounds=5)
    meta = json.loads((node.checkpoint_dir / "meta.json").read_text())
    assert meta["round"] == 1, "the last finished round is saved; a restart resumes from it"


def test_an_out_of_memory_halving_is_written_as_a_line_and_leaves_the_config_alone(tmp_path, make_policy, monkeypatch):
    node = _node(tmp_path, make_policy, "halving", micro_batch=8)
    real, calls = node.policy.completion_logprobs, []

    def flaky(prompts, completions, temperature, model=None):
        calls.append(len(prompts))
        if len(prompts) > 4 and len(calls) < 20:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(prompts, completions, temperature, model)

    monkeypatch.setattr(node.policy, "completion_logprobs", flaky)
    node.run(rounds=2)
    node.close()
    halved = [line for line in read_metrics(node.metrics.path) if line.get("kind") == "halved"]
    assert [(line["round"], line["setting"], line["value"]) for line in halved] == [(0, "train.micro_batch_size", 4)]
    assert node.policy.train_settings.micro_batch_size == 8 and node.policy.micro_batch.value == 4


def test_each_node_sees_the_other_use_its_rollouts_within_five_rounds_and_a_liar_s_claim_is_capped(tmp_path, make_policy):
    """Heartbeats carry each node's own count of every peer's completions it trained on; a
    node's /metrics sums what live peers claim of its own, each claim at most what it
    published; a claim of a billion changes nothing else (nothing reads it but the display)."""
    hub = InMemoryHub()
    a, b = (_node(tmp_path, make_policy, name, hub) for name in ("a", "b"))
    for round_ in range(5):
        _step_together([a, b], round_)
        for node in (a, b):
            node.membership.announce(node.report.status(round_))
    for node, other in ((a, b), (b, a)):
        snap = node.report.snapshot()
        assert snap["claimants"] == 1 and 0 < snap["claimed_used"] == other.report.used_by_peer[node.peer_id] <= node.report.published
        assert snap["info"] == {"peer_id": node.peer_id, "model": node.policy.name, "run_id": node.run_id}
    liar = hub.join("liar", a.run_id, PeerLedger())
    liar.membership.announce(NodeStatus(used={"a": 10**9}))
    snap = a.report.snapshot()
    assert snap["claimants"] == 2 and snap["claimed_used"] == b.report.used_by_peer["a"] + a.report.published
    page = metrics_page(a.report.snapshot)().decode()
    assert 'swarmnode_node_info{model="test-model",peer_id="a"' in page and "swarmnode_claimed_used" in page
