"""The swarm layer in one process: identity, records and validators, payload exchange."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import stat
import struct
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import pytest
from cryptography.hazmat.primitives.serialization import load_ssh_public_key
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.p2p import P2P, PeerID
from hivemind.utils.crypto import RSAPublicKey
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.lab.adversary import ManyKeySigner, cheap_signer
from swarmnode.loop.ledger import PeerLedger
from swarmnode.protocol.records import (
    MAX_CLOCK_SKEW_S,
    Heartbeat,
    NodeStatus,
    RecordError,
    tokenizer_document_digest,
)
from swarmnode.settings.config import SwarmSettings, load_config
from swarmnode.swarm.base import GatherWait, SwarmLink
from swarmnode.swarm.hivemind import dht as records
from swarmnode.swarm.hivemind import fetch, payloads
from swarmnode.swarm.hivemind.connect import attach
from swarmnode.swarm.hivemind.dht import Manifest, owner_or_none, pack, payload_digest
from swarmnode.swarm.hivemind.downloads import choose_downloads
from swarmnode.swarm.hivemind.exchange import choose_pull_set, direct_pulls
from swarmnode.swarm.hivemind.fetch import fetch_payload
from swarmnode.swarm.hivemind.identity import ensure_identity, load_signing_key
from swarmnode.swarm.hivemind.payloads import (
    MAX_STREAMS_PER_PEER,
    PAYLOAD_PROTOCOL,
    PayloadServer,
)
from swarmnode.swarm.hivemind.runtime import LOOKUP_BEAM, SwarmRuntime
from swarmnode.swarm.hivemind.shards import (
    HEARTBEAT_FAMILY,
    ShardedFamily,
    ShardIndex,
    manifest_family,
    shard_key,
    shard_of,
)
from swarmnode.swarm.hivemind.status import probe, read_heartbeats

RUN = "testrun"
EVERYONES = shard_key(HEARTBEAT_FAMILY, 0, 0)  # level 0 has one shard, which every peer's records may use


def _announce(runtime: SwarmRuntime, manifest: Manifest, run: str = RUN) -> bool:
    """Store a manifest where a new node of `run` writes its own (its shards at levels 0 and 1)."""
    keys = ShardedFamily(manifest_family(run), runtime.peer_id, owner_or_none).write_keys()
    return runtime.call(runtime.store_owned_all(keys, manifest.to_value(), get_dht_time() + 60), 10)


@pytest.fixture
def start_runtime(tmp_path):
    started: list[SwarmRuntime] = []

    def start(name: str, initial_peers: list[str] | None = None) -> SwarmRuntime:
        settings = SwarmSettings(initial_peers=initial_peers or [], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        runtime = SwarmRuntime(settings, tmp_path / f"{name}.key")
        runtime.start()
        started.append(runtime)
        return runtime

    yield start
    for runtime in started:
        runtime.shutdown()


def _store_times(runtime: SwarmRuntime, family: str, monkeypatch) -> list[float]:
    """When `runtime` stores records of `family` from now on (a list that fills as it does)."""
    real_store = runtime.dht.store_many
    stored: list[float] = []

    async def counting(keys, *args, **kwargs):
        if any(key.startswith(family) for key in keys):
            stored.append(time.monotonic())
        return await real_store(keys, *args, **kwargs)

    monkeypatch.setattr(runtime.dht, "store_many", counting)
    return stored


def _link(runtime: SwarmRuntime, run: str = RUN, ledger: PeerLedger | None = None, *sets: str) -> SwarmLink:
    config = load_config(None, ["swarm.heartbeat_interval_s=0.5", "wire.max_bytes=67108864", "node.staleness=1", *sets])
    return attach(runtime, run, config, ledger or PeerLedger())


def test_identity_is_private_and_stable(tmp_path):
    path = tmp_path / "id" / "node.key"
    peer = ensure_identity(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ensure_identity(path) == peer == PeerID.from_identity(path.read_bytes()).to_base58()
    signer_marker = records.RSASignatureValidator(load_signing_key(path)).local_public_key
    assert records.owner_peer_id(signer_marker) == peer, "DHT owner key and peer id are one key"


def test_identity_file_that_is_not_a_key_is_a_clear_error(tmp_path):
    from swarmnode.swarm.hivemind.identity import IdentityError

    bad = tmp_path / "bad.key"
    bad.write_bytes(b"not a key")
    with pytest.raises(IdentityError, match="not a libp2p RSA private key"):
        ensure_identity(bad)


def test_manifest_must_be_signed_by_the_peer_it_names(tmp_path):
    marker = records.RSASignatureValidator(load_signing_key(_key(tmp_path, "a"))).local_public_key
    owner = records.owner_peer_id(marker)
    good = Manifest(owner, 3, 100, payload_digest(b"x"), 10)
    assert Manifest.from_record(marker, good.to_value(), max_bytes=1000) == good
    cases = {
        "signed by": Manifest("QmSomebodyElse", 3, 100, good.digest, 10).to_value(),
        "round": Manifest(owner, -1, 100, good.digest, 10).to_value(),
        "outside": Manifest(owner, 3, 10_000, good.digest, 10).to_value(),
        "digest": Manifest(owner, 3, 100, b"short", 10).to_value(),
        "msgpack": b"\xc1",
    }
    for reason, value in cases.items():
        with pytest.raises(RecordError, match=reason):
            Manifest.from_record(marker, value, max_bytes=1000)
    with pytest.raises(RecordError, match="not owned"):
        Manifest.from_record(b"plain subkey", good.to_value(), max_bytes=1000)


def _key(tmp_path, name):
    path = tmp_path / f"{name}.key"
    ensure_identity(path)
    return path


def test_each_distinct_record_s_signature_is_verified_once_and_a_forgery_still_fails(tmp_path, monkeypatch):
    signer = records.RememberingSignatureValidator(load_signing_key(_key(tmp_path, "a")), kept=2)
    verified = []
    real_verify = RSAPublicKey.verify
    monkeypatch.setattr(RSAPublicKey, "verify", lambda key, data, sig: verified.append(1) or real_verify(key, data, sig))
    subkey = signer.local_public_key

    def signed(value: bytes, expiration: float = 123.0) -> DHTRecord:
        return DHTRecord(b"key", subkey, signer.sign_value(DHTRecord(b"key", subkey, value, expiration)), expiration)

    record = signed(b"value")
    assert signer.validate(record) and signer.validate(record) and len(verified) == 1, "the same record: once"
    forged = DHTRecord(b"key", subkey, b"VALUE" + record.value[len(b"value"):], 123.0)
    assert not signer.validate(forged) and not signer.validate(forged)
    assert not signer.validate(DHTRecord(b"key", subkey, record.value, 124.0)), "another expiration, the old signature"
    assert len(verified) == 3
    assert signer.validate(record) and len(verified) == 4, "only the last `kept` verdicts are kept"


def test_a_flood_s_small_keys_pass_the_honest_checks_and_each_record_is_signed_by_its_owner():
    """What bench/attacks.py sybil relies on: a 1024-bit identity's record passes every check an
    honest storing node makes (hivemind takes any key size), and one process signing for many
    identities signs each record, packed subkey or suffixed, with the key it names."""
    signers = [cheap_signer() for _ in range(3)]
    many = ManyKeySigner(signers)
    honest = CompositeValidator(records.make_validators(records.RSASignatureValidator(), ShardIndex()))
    expiration = get_dht_time() + 60
    for signer in signers:
        assert load_ssh_public_key(signer.local_public_key.removeprefix(b"[owner:").removesuffix(b"]")).key_size == 1024
        for subkey in (msgpack.packb(signer.local_public_key), signer.local_public_key + b"#7"):
            record = DHTRecord(b"key", subkey, b"value", expiration)
            signed = DHTRecord(b"key", subkey, many.sign_value(record), expiration)
            assert signer.validate(signed) and many.validate(signed)
        record = DHTRecord(b"key", msgpack.packb(signer.local_public_key), pack({"v": 1}), expiration)
        assert honest.validate(DHTRecord(b"key", record.subkey, many.sign_value(record), expiration))
    stranger = DHTRecord(b"key", msgpack.packb(b"[owner:ssh-rsa AAAA]"), b"value", expiration)
    assert many.sign_value(stranger) == b"value", "a key it does not hold: left unsigned"


def test_validator_rejects_unowned_oversized_and_far_future_records():
    validator = records.SwarmRecordValidator(max_bytes=100, max_ttl_s=60)
    owned = msgpack.packb(b"[owner:ssh-rsa AAAA]")
    now = get_dht_time()
    ok = records.DHTRecord(b"k", owned, b"v" * 50, now + 30)
    assert validator.validate(ok)
    assert not validator.validate(records.DHTRecord(b"k", msgpack.packb(b"mine"), b"v", now + 30))
    assert not validator.validate(records.DHTRecord(b"k", owned, b"v" * 200, now + 30))
    assert not validator.validate(records.DHTRecord(b"k", owned, b"v", now + 10_000))


def test_an_owner_gets_one_subkey_per_key_not_one_per_suffix():
    """hivemind's signature check finds the owner marker anywhere in a subkey; a key holder
    could flood a key every node reads with `[owner:KEY]#1`, `#2`, ... Only the marker alone passes."""
    validator = records.SwarmRecordValidator()
    now = get_dht_time()
    marker = b"[owner:ssh-rsa AAAA]"
    assert validator.validate(records.DHTRecord(b"k", msgpack.packb(marker), b"v", now + 30))
    for subkey in (marker + b"#1", b"x" + marker, marker * 2, b"[owner:]"):
        assert not validator.validate(records.DHTRecord(b"k", msgpack.packb(subkey), b"v", now + 30)), subkey
    assert not validator.validate(records.DHTRecord(b"k", msgpack.packb(marker.decode()), b"v", now + 30)), "a str"
    assert not validator.validate(records.DHTRecord(b"k", b"\xc1" + marker, b"v", now + 30)), "not msgpack"
    assert not validator.validate(records.DHTRecord(b"k", msgpack.packb(b"[owner:" + b"A" * 2000 + b"]"), b"v", now + 30))


def test_forged_and_oversized_writes_are_refused(start_runtime):
    honest = start_runtime("honest")
    rogue = start_runtime("rogue", honest.visible_maddrs())
    assert honest.store_owned(EVERYONES, pack({"who": "honest"}), 60)
    victim_subkey = honest.signer.local_public_key
    forged = rogue.call(
        rogue.dht.store(EVERYONES, pack({"who": "rogue"}), get_dht_time() + 60, subkey=victim_subkey),
        timeout=10,
    )
    assert forged is False
    # a signature copied from elsewhere does not verify either
    fake = pack({"who": "rogue"}) + b"[signature:" + b"A" * 344 + b"]"
    assert not rogue.call(rogue.dht.store(EVERYONES, fake, get_dht_time() + 60, subkey=victim_subkey), 10)
    assert not rogue.store_owned(EVERYONES, b"x" * 10_000, 60), "oversized"
    assert not rogue.store_owned(EVERYONES, pack({}), 100_000), "expires too late"
    assert not rogue.call(rogue.dht.store("unowned", pack({}), get_dht_time() + 60), 10), "unowned key"
    values = {records.owner_peer_id(k): records.unpack(v) for k, v in rogue.get_subkeys(EVERYONES).items()}
    assert values == {honest.peer_id: {"who": "honest"}}


def test_a_record_is_stored_only_in_its_owners_shard(start_runtime):
    """Storing nodes check the shard: an identity cannot write into every shard of a level (and
    so cannot fill the shards honest peers hash into), whichever node it stores through."""
    honest = start_runtime("honest")
    rogue = start_runtime("rogue", honest.visible_maddrs())
    honest.shards.add(manifest_family(RUN))
    rogue.shards.add(manifest_family(RUN))
    for family in (HEARTBEAT_FAMILY, manifest_family(RUN)):
        for level in (1, 5, 12):
            own = shard_of(rogue.peer_id, level)
            other = (own + 1) % 2**level
            assert rogue.store_owned(shard_key(family, level, own), pack({"n": level}), 60), (family, level)
            assert not rogue.store_owned(shard_key(family, level, other), pack({"n": level}), 60), (family, level)
            assert honest.get_subkeys(shard_key(family, level, other)) == {}


def test_a_dictionary_larger_than_16_kib_comes_back_whole(start_runtime):
    """The guide's DHT crash line: several peers' ~4 KiB records under one key (about 20 KB)."""
    first = start_runtime("n0")
    nodes = [first] + [start_runtime(f"n{i}", first.visible_maddrs()) for i in range(1, 5)]
    value = pack({"pad": "x" * 3900})
    assert all(node.store_owned("big", value, 60) for node in nodes)
    found = nodes[-1].get_subkeys("big")
    assert len(found) == 5 and sum(len(v) for v in found.values()) > 16 * 1024


def test_a_narrow_lookup_finds_every_record_in_a_swarm_wider_than_its_beam(start_runtime):
    """Reads and stores follow only the LOOKUP_BEAM nodes nearest a key (hivemind's default
    asks about every node of a small swarm on every read). In a swarm of more nodes than that,
    every record is still found by every node, several keys in one lookup, and a read asks
    fewer than all the other nodes."""
    first = start_runtime("n0")
    nodes = [first] + [start_runtime(f"n{i}", first.visible_maddrs()) for i in range(1, LOOKUP_BEAM + 6)]
    keys = [shard_key(HEARTBEAT_FAMILY, 0, 0), "also"]
    for node in nodes:
        assert node.call(node.store_owned_all(keys, pack({"who": node.peer_id}), get_dht_time() + 60), 30)
    everyone = {node.peer_id for node in nodes}
    for reader in nodes:
        for items in reader.call(reader.read_owned_many(keys, timeout_s=20), 30):
            assert {records.owner_peer_id(subkey) for subkey, _ in items} == everyone
        asked = set()
        real_find = reader.dht.protocol.call_find

        async def counted(peer, keys_, real_find=real_find, asked=asked):  # noqa: ANN001, ANN202
            asked.add(peer)
            return await real_find(peer, keys_)

        reader.dht.protocol.call_find = counted
        reader.call(reader.read_owned_many(keys[:1], timeout_s=20), 30)
        reader.dht.protocol.call_find = real_find
        assert 0 < len(asked) < len(nodes) - 1, f"a read asked {len(asked)} of {len(nodes) - 1} nodes"


@pytest.mark.parametrize("size_mb", [2, 20])
def test_payloads_travel_peer_to_peer(start_runtime, size_mb):
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ex_a, ex_b = _link(a).exchange, _link(b).exchange
    payload = os.urandom(size_mb << 20)
    ex_a.publish(0, payload, tokens=len(payload) // 8)
    started = time.monotonic()
    got = ex_b.gather(GatherWait(timeout_s=30, wait_for={a.peer_id}))
    assert [(g.peer_id, g.round) for g in got] == [(a.peer_id, 0)]
    assert got[0].payload == payload and time.monotonic() - started < 30
    assert ex_b.gather(GatherWait(timeout_s=0.5)) == [], "each batch is handed out once"
    started = time.monotonic()
    ex_a.linger(0, {b.peer_id}, timeout_s=10)
    assert time.monotonic() - started < 2, "b fetched it: a finishing node need not wait"
    ex_a.linger(0, {b.peer_id, "QmNobody"}, timeout_s=0.5)
    assert time.monotonic() - started >= 0.5


def test_lying_peers_are_counted_and_unreachable_ones_are_not(start_runtime):
    honest = start_runtime("honest")
    rogue = start_runtime("rogue", honest.visible_maddrs())
    ledger = PeerLedger(SwarmSettings(max_rejects=10))
    ex = _link(honest, ledger=ledger).exchange
    ex.live_peers = tuple  # the rogue is found through its manifests only, not its heartbeat,
    ex.met_directly = list  # nor because it asked us for batches
    rogue_ex = _link(rogue).exchange
    # 1: content that does not match the signed digest
    rogue_ex.server.put(0, b"A" * 1000)
    lie = Manifest(rogue.peer_id, 0, 1000, payload_digest(b"B" * 1000), 1)
    assert _announce(rogue, lie)
    assert ex.gather(GatherWait(timeout_s=3, wait_for={rogue.peer_id})) == []
    assert ledger.counts[rogue.peer_id] == 1
    # 2: a manifest announcing more than this node accepts (counted once, however often read)
    big = Manifest(rogue.peer_id, 1, 1 << 40, payload_digest(b""), 1)
    assert _announce(rogue, big)
    assert ex.gather(GatherWait(timeout_s=2, wait_for={rogue.peer_id})) == []
    assert ledger.counts[rogue.peer_id] == 2
    # 3: announced, then gone: not the peer's fault, nothing counted
    good = b"C" * 1000
    rogue_ex.server.put(2, good)
    assert _announce(rogue, Manifest(rogue.peer_id, 2, 1000, payload_digest(good), 1))
    rogue.shutdown()
    assert ex.gather(GatherWait(timeout_s=3, wait_for={rogue.peer_id})) == []
    assert ledger.counts[rogue.peer_id] == 2


def _handed_out_tokenizers(exchange, within_s: float = 10.0) -> list[tuple[str, bytes]]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if got := exchange.tokenizers():
            return got
        time.sleep(0.05)
    return []


def test_a_tokenizer_document_is_fetched_once_checked_against_its_digest_and_bounded_in_size_and_time(
    start_runtime, monkeypatch
):
    monkeypatch.setattr(payloads, "TOKENIZER_EVERY_S", 0.0)  # each of this test's requests answered
    server_side = start_runtime("server")
    asker = start_runtime("asker", server_side.visible_maddrs())
    ledger = PeerLedger(SwarmSettings(max_rejects=10))
    ex = _link(asker, ledger=ledger).exchange
    served = _link(server_side).exchange
    document = os.urandom(300_000)
    digest = tokenizer_document_digest(document)
    served.offer_tokenizer(digest, document)
    with pytest.raises(fetch.FetchError, match="not serve its tokenizer to us now"):  # a stranger that never read our batch: not now
        asker.call(fetch.fetch_tokenizer(asker.p2p, server_side.peer_id, RUN, digest), timeout=15)
    served.publish(0, b"a batch", tokens=1)
    assert [g.round for g in ex.gather(GatherWait(timeout_s=30, wait_for={server_side.peer_id}))] == [0]
    ex.want_tokenizer(server_side.peer_id, digest)  # as a node does on reading a batch in a tokenizer it lacks
    assert _handed_out_tokenizers(ex) == [(digest, document)]
    requests = []
    real_serve = served.server._serve_tokenizer

    async def counting(*args):
        requests.append(args[2])
        await real_serve(*args)

    served.server._serve_tokenizer = counting
    ex.want_tokenizer(server_side.peer_id, digest)  # named again by a later batch: cached, not fetched
    assert _handed_out_tokenizers(ex, within_s=1.0) == [] and requests == []
    # other bytes under a digest: refused, and a strike (the stream binds the bytes to their sender)
    promised = tokenizer_document_digest(b"promised")
    served.offer_tokenizer(promised, b"other bytes")
    ex.want_tokenizer(server_side.peer_id, promised)
    deadline = time.monotonic() + 10
    while ledger.counts[server_side.peer_id] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ledger.counts[server_side.peer_id] == 1 and ex.tokenizers() == [] and requests == [promised]
    # larger than the receiver takes: refused before it is read, no strike (an honest one may be large)
    with pytest.raises(fetch.FetchError, match="above 1000") as refused:
        asker.call(fetch.fetch_tokenizer(asker.p2p, server_side.peer_id, RUN, digest, max_bytes=1000), timeout=15)
    assert not refused.value.misbehaved
    # a peer that never answers costs the fetch its deadline only

    async def silent(*args):
        await asyncio.sleep(30)

    served.server._serve_tokenizer = silent
    started = time.monotonic()
    with pytest.raises(fetch.FetchError) as stalled:
        asker.call(fetch.fetch_tokenizer(asker.p2p, server_side.peer_id, RUN, digest, timeout_s=1.0), timeout=15)
    assert stalled.value.slow and not stalled.value.misbehaved and time.monotonic() - started < 5
    assert ledger.counts[server_side.peer_id] == 1


def test_a_dht_lookup_that_never_answers_costs_a_gather_its_deadline_only(start_runtime, monkeypatch):
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ex_a, ex_b = _link(a).exchange, _link(b).exchange
    ex_a.live_peers = tuple  # b is found through its manifest only, not through its heartbeat ...
    ex_a.met_directly = list  # ... nor because it asked a, its initial peer, for batches
    real_get = a.dht.get_many

    async def hangs(*args, **kwargs):
        await asyncio.sleep(3600)

    monkeypatch.setattr(a.dht, "get_many", hangs)
    ex_b.publish(0, b"D" * 100, 1)
    started = time.monotonic()
    assert ex_a.gather(GatherWait(timeout_s=1.0, wait_for={b.peer_id})) == []
    assert time.monotonic() - started < 3
    monkeypatch.setattr(a.dht, "get_many", real_get)  # the DHT answers again: so does the exchange
    assert [item.payload for item in ex_a.gather(GatherWait(timeout_s=10, wait_for={b.peer_id}))] == [b"D" * 100]


def test_peers_with_a_delivery_record_are_pulled_directly_while_the_dht_hangs(start_runtime, monkeypatch):
    """Once a peer delivered, its newer batches are asked of it directly every poll: a DHT
    that stops answering (or a flood under the run's keys) does not touch that exchange."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ledger = PeerLedger()
    ex_a, ex_b = _link(a, ledger=ledger).exchange, _link(b).exchange
    ex_b.publish(0, b"found in the DHT", 1)
    assert [i.payload for i in ex_a.gather(GatherWait(timeout_s=15, wait_for={b.peer_id}))] == [b"found in the DHT"]
    ledger.delivered(b.peer_id)  # what the node's intake records for a valid batch
    for _ in range(ledger.max_missed):  # a slower peer: waited for in vain, no longer waited for
        ledger.missed(b.peer_id)
    assert not ledger.earned(b.peer_id)
    assert ex_a.pull_set() == [b.peer_id], "late is no reason to stop asking"

    async def hangs(*args, **kwargs):
        await asyncio.sleep(3600)

    monkeypatch.setattr(a.dht, "get_many", hangs)
    for round_ in (1, 2):
        ex_b.publish(round_, f"direct {round_}".encode(), 1)
        got = ex_a.gather(GatherWait(timeout_s=10, wait_for={b.peer_id}))
        assert [(i.round, i.payload) for i in got] == [(round_, f"direct {round_}".encode())]
    assert ex_a.gather(GatherWait(timeout_s=1, wait_for={b.peer_id})) == [], "nothing newer: nothing handed out twice"


def test_a_slow_dht_lookup_does_not_hold_up_the_direct_pulls(start_runtime, monkeypatch):
    """The background poller asks known peers every poll while a DHT lookup for new peers
    hangs beside it: b's newer batch is in a's hands within a second without a round
    waiting for it (a lookup takes up to LOOKUP_TIMEOUT_S; discovery here runs non-stop)."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ledger = PeerLedger()
    ex_a = _link(a, RUN, ledger, "swarm.discovery_interval_s=0.01").exchange
    ex_b = _link(b).exchange
    ex_b.publish(0, b"found in the DHT", 1)
    assert [i.payload for i in ex_a.gather(GatherWait(timeout_s=15, wait_for={b.peer_id}))] == [b"found in the DHT"]
    ledger.delivered(b.peer_id)
    ledger.screened(b.peer_id, 8, 4, 0)  # useful: asked every poll

    async def hangs(*args, **kwargs):
        await asyncio.sleep(3600)

    monkeypatch.setattr(a.dht, "get_many", hangs)
    time.sleep(1.0)  # a lookup is hanging now
    for round_ in (1, 2, 3):
        ex_b.publish(round_, f"direct {round_}".encode(), 1)
        time.sleep(1.0)
        got = ex_a.gather(GatherWait(timeout_s=0, wait_for=set()))
        assert [(i.round, i.payload) for i in got] == [(round_, f"direct {round_}".encode())]


def test_a_peer_seen_in_heartbeats_is_pulled_directly_while_its_manifests_stay_hidden(start_runtime, monkeypatch):
    """A new peer is found from the run's heartbeats as well as from manifests: with every DHT
    lookup of node a hanging (its manifests never found), b's batch still arrives once a
    has seen b's heartbeat, and not before."""
    hub = start_runtime("hub")  # both join through a third node: neither talks to the other first
    a = start_runtime("a", hub.visible_maddrs())
    b = start_runtime("b", hub.visible_maddrs())
    ex_a, ex_b = _link(a).exchange, _link(b).exchange
    seen: list[str] = []
    ex_a.live_peers = lambda: seen
    ex_a.met_directly = list  # b, which sees a's heartbeat, asks a for batches: not this path

    async def hangs(*args, **kwargs):
        await asyncio.sleep(3600)

    monkeypatch.setattr(a.dht, "get_many", hangs)
    ex_b.publish(0, b"heard of by heartbeat", 1)
    assert ex_a.gather(GatherWait(timeout_s=1.5, wait_for={b.peer_id})) == [], "no manifest, no heartbeat: not found"
    seen.append(b.peer_id)
    assert [i.payload for i in ex_a.gather(GatherWait(timeout_s=10, wait_for={b.peer_id}))] == [b"heard of by heartbeat"]


def test_peers_not_proven_useful_are_asked_a_few_a_poll_in_turn():
    """Identities that deliver junk cost few requests: every useful peer is asked each poll,
    the rest two a poll in turn, so each of sixteen is still asked every eighth poll, and one
    or two (an honest peer whose batch taught nothing) every poll."""
    junk = [f"junk{i}" for i in range(16)]
    standing = {"useful": 0.4, "new": None, **dict.fromkeys(junk, 0.0)}
    pull_set = ["useful", "new", *junk]
    asked = Counter()
    for poll in range(17 * 8):
        chosen = direct_pulls(pull_set, standing, poll)
        assert "useful" in chosen and len(chosen) == 1 + 2
        asked.update(chosen)
    assert asked["useful"] == 17 * 8 and {asked[p] for p in ["new", *junk]} == {16}
    assert direct_pulls(["useful", "new", "junk0"], standing, 5) == ["useful", "new", "junk0"]


def test_peers_not_proven_useful_whose_groups_are_held_are_not_asked():
    """A crowd of useless identities whose groups the node still holds costs no requests: only
    the useful peer and those held nothing of are asked, in turn as before."""
    junk = [f"junk{i}" for i in range(16)]
    standing = {"useful": 0.4, "new": None, **dict.fromkeys(junk, 0.0)}
    held = frozenset(["new", *junk[:15], "useful"])
    for poll in range(8):
        assert direct_pulls(["useful", "new", *junk], standing, poll, held) == ["useful", "junk15"]


def test_a_useless_peer_is_asked_for_more_only_once_its_groups_are_used(start_runtime):
    """The polls leave a peer whose samples taught nothing alone while the node holds its
    groups unused (its newer batch would only wait behind them), and ask it again once the
    node's gather says it holds none: a useless identity costs a download per batch the node
    used, not two requests a poll."""
    honest = start_runtime("honest")
    junk = start_runtime("junk", honest.visible_maddrs())
    ledger = PeerLedger()
    ledger.delivered(junk.peer_id)
    ledger.screened(junk.peer_id, offered=8, useful=0, round_=0)
    asked = []

    async def nothing_newer(info, reader, writer):
        (length,) = struct.unpack(">I", await reader.readexactly(4))
        request = msgpack.unpackb(await reader.readexactly(length))
        if "whom" in request:  # asked whom it knows (peer exchange, its own pace): nobody
            writer.write(struct.pack(">BI", payloads.NOTHING_NEWER, 0))
        else:
            asked.append(request)
            writer.write(struct.pack(">BQQ", payloads.NOTHING_NEWER, 0, 0))
        await writer.drain()
        writer.close()

    junk.call(junk.p2p.add_binary_stream_handler(PAYLOAD_PROTOCOL, nothing_newer), timeout=10)
    ex = _link(honest, ledger=ledger).exchange
    held = frozenset({junk.peer_id})
    assert ex.gather(GatherWait(timeout_s=0, held=held)) == []
    deadline = time.monotonic() + 10
    while honest.call(_copy_inflight(ex), timeout=5) and time.monotonic() < deadline:
        time.sleep(0.05)  # a pull started before the gather above finishes first
    asked.clear()
    time.sleep(2.0)
    assert asked == [], "held: not asked in eight polls"
    assert ex.gather(GatherWait(timeout_s=0)) == []  # the node used what it held of the peer
    while len(asked) < 2 and time.monotonic() < deadline + 20:
        time.sleep(0.05)
    assert len(asked) >= 2, "nothing held: asked every poll (the only peer not proven useful)"


def test_a_held_peer_s_manifest_waits_like_its_direct_pull(start_runtime):
    """A known peer outside the pull set (more known peers than swarm.max_pull_peers) is found
    through its manifests. While the node holds its groups unused and it is not proven useful,
    its new manifest is skipped too, not only its direct pull; once nothing of it is held, or
    once it proved useful, its manifest is fetched."""
    honest = start_runtime("honest")
    junk = start_runtime("junk", honest.visible_maddrs())
    ledger = PeerLedger()
    ledger.delivered(junk.peer_id)
    ledger.screened(junk.peer_id, offered=8, useful=0, round_=0)
    ex = _link(honest, ledger=ledger).exchange
    manifest = Manifest(junk.peer_id, 1000, 4096, b"d" * 32, 100)

    async def parse() -> Manifest | None:  # on the exchange's loop, as its polls run it
        return ex._parse(junk.signer.local_public_key, manifest.to_value(), pulled=set())

    ex.gather(GatherWait(timeout_s=0, held=frozenset({junk.peer_id})))
    assert honest.call(parse(), timeout=5) is None, "held and useless: its manifest waits"
    ex.gather(GatherWait(timeout_s=0))
    assert honest.call(parse(), timeout=5) == manifest, "nothing held: fetched"
    ledger.screened(junk.peer_id, offered=8, useful=8, round_=0)
    ex.gather(GatherWait(timeout_s=0, held=frozenset({junk.peer_id})))
    assert honest.call(parse(), timeout=5) == manifest, "proven useful: fetched while held"


async def _copy_inflight(exchange) -> list:
    """The exchange's downloads in flight, read on its loop."""
    return list(exchange.downloads.running)


def test_a_pull_set_too_small_for_every_known_peer_leaves_none_out_for_good():
    """Seventeen known peers, a set of sixteen: the useful one is always in, and the ties
    among the rest (all scored 0: a crowd of useless identities and one unlucky honest peer)
    fall differently at each poll, so every one of them is asked."""
    known = [f"junk{i}" for i in range(16)] + ["unlucky", "useful"]
    standing = {peer: 0.0 for peer in known} | {"useful": 0.5}
    rng = random.Random(0)
    sets = [choose_pull_set(known, standing, 16, rng) for _ in range(40)]
    assert all(len(chosen) == 16 and chosen[0] == "useful" for chosen in sets)
    assert set().union(*sets) == set(known)
    assert sum("unlucky" in chosen for chosen in sets) >= 20


def test_publishing_never_waits_on_a_dht_store_and_the_newest_manifest_wins(start_runtime, monkeypatch):
    """A store that hangs (DHT nodes slow on purpose) holds no round: publish returns at once,
    and once the DHT answers again the newest batch is what peers find."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ex_a, ex_b = _link(a).exchange, _link(b).exchange
    ex_a.live_peers = tuple  # b is found through its manifest only, not through its heartbeat,
    ex_a.met_directly = list  # nor because it asked a, its initial peer, for batches
    real_store = b.dht.store_many
    release = asyncio.Event()
    manifest_stalled = threading.Event()

    async def stalls(keys, *args, **kwargs):
        if any(key.startswith(f"{ex_b.manifests.family}/") for key in keys):  # not a heartbeat's store
            manifest_stalled.set()
        await release.wait()
        return await real_store(keys, *args, **kwargs)

    monkeypatch.setattr(b.dht, "store_many", stalls)
    started = time.monotonic()
    ex_b.publish(0, b"round 0", 1)
    publish_s = time.monotonic() - started
    # round 0's store is under way before rounds 1 and 2 come, so which round the stalled store
    # holds is not a race: 1 and 2 both wait behind it, and only the newer of them is announced
    assert manifest_stalled.wait(5), "round 0's manifest never reached the DHT store"
    started = time.monotonic()
    for round_ in (1, 2):
        ex_b.publish(round_, f"round {round_}".encode(), 1)
    assert publish_s + time.monotonic() - started < 1, "three publishes with the store stalled"
    assert ex_a.gather(GatherWait(timeout_s=1.0, wait_for={b.peer_id})) == [], "nothing announced yet"
    b.loop.call_soon_threadsafe(release.set)
    got: dict[int, bytes] = {}
    deadline = time.monotonic() + 15
    while 2 not in got and time.monotonic() < deadline:
        got |= {item.round: item.payload for item in ex_a.gather(GatherWait(timeout_s=1.0, wait_for={b.peer_id}))}
    assert got.get(2) == b"round 2"
    assert 1 not in got, "round 1 was superseded before it was announced"


def test_the_announced_round_stays_served_however_many_rounds_follow():
    server = PayloadServer(RUN, keep_rounds=3)
    for r in range(10):
        server.put(r, f"round {r}".encode())
        if r == 2:
            server.pin(2)
    assert sorted(server._payloads) == [2, 7, 8, 9], "the pinned round and the 3 newest"
    server.pin(9)
    server.settle_pin(9, stored=True)  # the DHT now names round 9, not round 2
    server.put(10, b"round 10")
    assert sorted(server._payloads) == [7, 8, 9, 10], "round 2, no longer pinned, goes as any other"
    server.pin(10)
    server.settle_pin(10, stored=False)  # the DHT still names round 9
    for r in (11, 12, 13):
        server.put(r, f"round {r}".encode())
    assert sorted(server._payloads) == [9, 11, 12, 13], "a failed store leaves the older pin"


def test_manifests_are_stored_once_a_discovery_interval_and_a_stranger_still_fetches(start_runtime, monkeypatch):
    """Fast rounds do not mean a DHT store each: the first manifest goes out at once, the next
    no sooner than `swarm.discovery_interval_s` later, with the newest round; a stranger that
    reads the first one fetches its round although many rounds followed it."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    ex_a, ex_b = _link(a).exchange, _link(b).exchange
    # the manifest path alone: a direct pull of b, once a sees its heartbeat, would fetch the
    # newest round, and whether it comes first is a race the machine's load decides
    ex_a.live_peers = tuple
    ex_a.met_directly = list  # nor a pull of b because b asked a for batches
    stored = _store_times(b, manifest_family(RUN), monkeypatch)  # heartbeats are stored too
    started = time.monotonic()
    for round_ in range(12):
        ex_b.publish(round_, f"round {round_}".encode(), 1)
        time.sleep(0.05)
    first = ex_a.gather(GatherWait(timeout_s=10, wait_for={b.peer_id}))
    assert [(item.round, item.payload) for item in first] == [(0, b"round 0")], "the first round, still served"
    interval = b.settings.discovery_interval_s
    deadline = time.monotonic() + interval + 10
    while len(stored) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(stored) == 2 and stored[1] - stored[0] >= interval - 0.05, (stored, started)
    got = {item.round for item in ex_a.gather(GatherWait(timeout_s=5, wait_for={b.peer_id}))}
    assert got and max(got) == 11, "then the newest"


def test_a_round_waiting_for_a_known_peer_asks_it_at_once_not_at_the_next_poll(start_runtime):
    """With polls 10 s apart (and the DHT read as rarely), a round that waits for a peer that
    delivered before still gets that peer's new batch within a fraction of a second."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    slow_polls = ("swarm.poll_interval_s=10", "swarm.discovery_interval_s=60")
    ex_a, ex_b = _link(a, RUN, None, *slow_polls).exchange, _link(b, RUN, None, *slow_polls).exchange
    ex_b.publish(0, b"round 0", 1)
    # found at a's second or third poll (a's first ran before b was attached): two chances, so a
    # slow lookup or direct pull at one of them does not fail the test's setup
    first = ex_a.gather(GatherWait(timeout_s=25, wait_for={b.peer_id}))
    assert [item.round for item in first] == [0], "found through the DHT or a direct pull"
    ex_a.ledger.delivered(b.peer_id)  # what the node's intake says of a batch that passed its checks
    ex_a.ledger.screened(b.peer_id, 8, 8, 0)  # ... and of samples that proved useful
    time.sleep(0.5)  # the poller's first ask, right after the delivery, has come and gone
    ex_b.publish(1, b"round 1", 1)
    started = time.monotonic()
    got = ex_a.gather(GatherWait(timeout_s=3, wait_for={b.peer_id}))
    assert [item.round for item in got] == [1] and time.monotonic() - started < 1.5


def test_idle_payload_streams_from_one_identity_block_no_one(start_runtime):
    """An identity that opens many streams and says nothing holds MAX_STREAMS_PER_PEER of them
    for REQUEST_TIMEOUT_S at most, and no serving slot: an honest download goes straight through."""
    a = start_runtime("a")
    rogue = start_runtime("rogue", a.visible_maddrs())
    b = start_runtime("b", a.visible_maddrs())
    ex_a = _link(a).exchange
    payload = b"E" * 100
    ex_a.publish(0, payload, 1)

    async def open_idle(count: int) -> list:
        streams = []
        for _ in range(count):
            streams.append(await rogue.p2p.call_binary_stream_handler(PeerID.from_base58(a.peer_id), PAYLOAD_PROTOCOL))
        return streams

    idle = rogue.call(open_idle(16), timeout=30)
    assert len(idle) == 16
    time.sleep(0.3)
    assert a.call(_open_streams(ex_a.server), timeout=5) <= MAX_STREAMS_PER_PEER
    started = time.monotonic()
    fetched = b.call(fetch_payload(b.p2p, a.peer_id, RUN, 0, len(payload), payload_digest(payload), 10), timeout=15)
    assert fetched == fetch.Batch(0, payload)
    assert time.monotonic() - started < 2.0


async def _open_streams(server) -> int:
    return sum(server._open.values())


def test_streams_over_the_limit_are_held_not_closed_so_reopening_them_gains_nothing(start_runtime, monkeypatch):
    """Closing a stream over a requester's limit at once let one identity re-open sixteen in a
    loop, a stream a moment (4x the honest round): they are held unread for TARPIT_S instead,
    and past MAX_HELD_PER_PEER the requester's connection is dropped."""
    monkeypatch.setattr("swarmnode.swarm.hivemind.payloads.MAX_HELD_PER_PEER", 8)
    monkeypatch.setattr("swarmnode.swarm.hivemind.payloads.REQUEST_TIMEOUT_S", 30.0)  # served ones stay open meanwhile
    a = start_runtime("a")
    rogue = start_runtime("rogue", a.visible_maddrs())
    ex_a = _link(a).exchange

    async def open_and_watch(count: int, watch_s: float) -> tuple[int, list]:
        """Open `count` silent streams; how many the server closed within `watch_s`, and the
        streams (kept by the caller: a collected writer closes its stream)."""
        streams, refused = [], 0
        for _ in range(count):
            try:
                streams.append(await rogue.p2p.call_binary_stream_handler(PeerID.from_base58(a.peer_id), PAYLOAD_PROTOCOL))
            except Exception:  # its connection was dropped: the stream never opened
                refused += 1
        await asyncio.sleep(watch_s)
        return refused + sum(reader.at_eof() or bool(reader.exception()) for _, reader, _ in streams), streams

    closed, first = rogue.call(open_and_watch(MAX_STREAMS_PER_PEER + 8, 1.0), timeout=30)
    assert closed == 0, "over the limit, held: nothing to re-open"
    assert ex_a.server.tarpitted == 8
    more, _ = rogue.call(open_and_watch(4, 1.0), timeout=30)
    # past the held cap the next one is closed at once and the connection dropped, which resets its
    # served streams too: what it opens after reconnecting is served (and judged) afresh
    assert more >= 1, "past the held cap: closed at once"
    assert len(first) == MAX_STREAMS_PER_PEER + 8, "all of the first ones opened"
    assert a.call(_dropped(ex_a.server), timeout=5) == {rogue.peer_id}, "and its connection dropped"


async def _dropped(server) -> set[str]:
    return set(server._dropped_at)


def test_a_stranger_seen_in_heartbeats_that_cuts_a_transfer_is_not_asked_again(start_runtime):
    """A peer known only from its heartbeat is asked directly in turn, until it cuts a
    transfer: then it is asked no more (its manifests still lead to it, within the strangers'
    bound), so a cutting identity costs one max-size read, not one a turn."""
    honest = start_runtime("honest")
    rogue = start_runtime("rogue", honest.visible_maddrs())
    ledger = PeerLedger()
    ex = _link(honest, ledger=ledger).exchange
    ex.live_peers = lambda: [rogue.peer_id]
    asked = []

    async def cut(info, reader, writer):
        (length,) = struct.unpack(">I", await reader.readexactly(4))
        asked.append(msgpack.unpackb(await reader.readexactly(length)))
        writer.write(struct.pack(">BQQ", payloads.OK, 5, 1000) + bytes(999))
        await writer.drain()
        writer.close()

    rogue.call(rogue.p2p.add_binary_stream_handler(PAYLOAD_PROTOCOL, cut), timeout=10)
    time.sleep(3)  # a dozen polls
    assert len(asked) == 1 and ledger.has_cut(rogue.peer_id), asked
    assert ledger.counts[rogue.peer_id] == 0, "a crash looks the same: no strike"


def test_a_cut_transfer_is_not_retried_and_costs_standing_not_a_strike(start_runtime):
    honest = start_runtime("honest")
    rogue = start_runtime("rogue", honest.visible_maddrs())
    ledger = PeerLedger(SwarmSettings(max_missed=2))
    ledger.delivered(rogue.peer_id)  # it delivered before: waited for, fetched first
    ex = _link(honest, ledger=ledger).exchange
    size, streams = 1 << 20, []

    async def cut(info, reader, writer):
        (length,) = struct.unpack(">I", await reader.readexactly(4))
        request = msgpack.unpackb(await reader.readexactly(length))
        streams.append(("after", request["after"]) if "after" in request else ("round", request["round"]))
        if "after" in request:  # asked directly: the newest, round 5
            writer.write(struct.pack(">BQQ", payloads.OK, 5, size) + bytes(size - 1))
        else:
            writer.write(struct.pack(">BQ", payloads.OK, size) + bytes(size - 1))
        await writer.drain()
        writer.close()

    rogue.call(rogue.p2p.add_binary_stream_handler(PAYLOAD_PROTOCOL, cut), timeout=10)
    for r in (1, 2):
        assert _announce(rogue, Manifest(rogue.peer_id, r, size, b"d" * 32, 1))
        assert ex.gather(GatherWait(timeout_s=2, wait_for={rogue.peer_id})) == []
    assert len(streams) == len(set(streams)) >= 2, ("nothing cut is asked for again", streams)
    assert ledger.counts[rogue.peer_id] == 0, "a crash looks the same: no strike"
    assert not ledger.earned(rogue.peer_id), "no longer waited for, fetched first or asked directly"
    assert ex.pull_set() == []


def _manifest(peer: str, round_: int, size: int) -> Manifest:
    return Manifest(peer, round_, size, b"d" * 32, 1)


def test_downloads_one_per_peer_and_strangers_bounded_in_count_and_bytes():
    mib = 1 << 20
    known = {"friend"}.__contains__
    strangers = [_manifest(f"s{i}", 0, 32 * mib) for i in range(8)]
    chosen = choose_downloads(
        [_manifest("friend", 0, 32 * mib), _manifest("friend", 1, mib), *strangers], {}, known, 64, 64 * mib
    )
    assert [(m.peer_id, m.round) for m in chosen] == [("friend", 0), ("s0", 0), ("s1", 0)]
    running = {"s0": 32 * mib}
    assert [m.peer_id for m in choose_downloads(strangers, running, known, 64, 64 * mib)] == ["s1"]
    small = [_manifest(f"t{i}", 0, 1024) for i in range(8)]
    assert len(choose_downloads(small, {}, known, 3, 64 * mib)) == 3


def test_a_node_with_fast_rounds_stores_a_heartbeat_once_an_interval_not_once_a_round(start_runtime, monkeypatch):
    """Forty rounds in two seconds announce forty statuses; the DHT gets a heartbeat about
    once a `swarm.heartbeat_interval_s`, and peers still see the newest round."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    watcher, beating = _link(a).membership, _link(b).membership
    stored = _store_times(b, HEARTBEAT_FAMILY, monkeypatch)
    started = time.monotonic()
    for round_ in range(40):
        beating.announce(NodeStatus(round=round_))
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    interval = beating.settings.heartbeat_interval_s
    assert len(stored) <= 2 * (elapsed / interval + 1), (len(stored), elapsed, interval)
    deadline = time.monotonic() + 10
    while watcher.live_peers().get(b.peer_id, NodeStatus()).round != 39 and time.monotonic() < deadline:
        watcher.wait_for_peers(1, timeout_s=0)
        time.sleep(0.2)
    assert watcher.live_peers()[b.peer_id].round == 39


def test_heartbeats_show_live_peers_of_the_run_only(start_runtime):
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    c = start_runtime("c", a.visible_maddrs())
    ex_a, ex_b = _link(a).membership, _link(b).membership
    other = _link(c, run="another-run").membership
    ex_b.announce(NodeStatus(round=7, model="tiny"))
    other.announce(NodeStatus(round=9))
    assert ex_a.wait_for_peers(1, timeout_s=10) == 1
    deadline = time.monotonic() + 10
    while ex_a.live_peers().get(b.peer_id, NodeStatus()).round != 7 and time.monotonic() < deadline:
        time.sleep(0.2)
        ex_a.wait_for_peers(1, timeout_s=0)
    assert set(ex_a.live_peers()) == {b.peer_id}
    assert (ex_a.live_peers()[b.peer_id].round, ex_a.live_peers()[b.peer_id].model) == (7, "tiny")
    ex_b.close()  # says goodbye: no longer waited for
    ex_a.wait_for_peers(1, timeout_s=0)
    assert ex_a.live_peers() == {}


def test_any_one_listed_bootstrap_peer_is_enough_and_losing_it_ends_nothing(start_runtime, tmp_path):
    """A list whose first entry is dead still joins through the second; once joined, the
    swarm outlives its bootstrap node: the others keep finding and pulling each other's
    batches through the DHT's routing table."""
    dead = f"/ip4/127.0.0.1/tcp/9/p2p/{ensure_identity(tmp_path / 'dead.key')}"
    boot = start_runtime("boot")
    b = start_runtime("b", [dead, *boot.visible_maddrs()])
    c = start_runtime("c", [dead, *boot.visible_maddrs()])
    ex_b, ex_c = _link(b).exchange, _link(c).exchange
    ex_b.publish(0, b"before", 1)
    assert [i.payload for i in ex_c.gather(GatherWait(timeout_s=15, wait_for={b.peer_id}))] == [b"before"]
    boot.shutdown()
    ex_b.publish(1, b"after", 1)
    got = ex_c.gather(GatherWait(timeout_s=30, wait_for={b.peer_id}))
    assert [i.payload for i in got] == [b"after"], "b and c exchange without the bootstrap node"


def test_a_node_that_lost_every_dht_peer_rejoins_when_its_bootstrap_node_returns(tmp_path):
    """The bootstrap node goes down and comes back at the same address: the node it left alone
    dials it again by itself (`swarm.rejoin_interval_s`) and the two share records again."""
    port = _free_port()
    boot_maddrs = [f"/ip4/127.0.0.1/tcp/{port}"]

    def boot() -> SwarmRuntime:
        runtime = SwarmRuntime(SwarmSettings(host_maddrs=boot_maddrs), tmp_path / "boot.key")
        runtime.start()
        return runtime

    first = boot()
    settings = SwarmSettings(initial_peers=first.visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                             rejoin_interval_s=0.5)
    node = SwarmRuntime(settings, tmp_path / "node.key")
    node.start()
    again = None
    try:
        assert node.dht_peer_count() == 1
        first.shutdown()
        deadline = time.monotonic() + 20
        while node.dht_peer_count() and time.monotonic() < deadline:
            node.get_subkeys("anything", timeout=10)  # a lookup that finds the peer gone drops it
            time.sleep(0.2)
        assert node.dht_peer_count() == 0, "alone"
        again = boot()
        assert again.store_owned("swarmnode/test/back", b"v", 60)
        deadline = time.monotonic() + 20
        while not node.get_subkeys("swarmnode/test/back") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert list(node.get_subkeys("swarmnode/test/back").values()) == [b"v"]
        assert node.dht_peer_count() == 1
    finally:
        node.shutdown()
        if again is not None:
            again.shutdown()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_identity_in_use_says_to_give_each_node_its_own_run_dir():
    runtime = SwarmRuntime.__new__(SwarmRuntime)  # only the message: no daemon
    runtime.initial_peers = ["/ip4/127.0.0.1/tcp/1/p2p/QmPeer"]
    hint = runtime._hint("Identity QmX is already taken by another peer")
    assert "own --run-dir" in hint and "firewall" not in hint


def test_daemons_started_at_once_each_get_a_session_of_their_own(start_runtime):
    """Ctrl-C to a node's process group must not reach its daemon before the farewell; many
    runtimes starting at once in one process (the bench's identities) must all start."""
    with ThreadPoolExecutor(max_workers=4) as starting:
        runtimes = list(starting.map(start_runtime, ["r0", "r1", "r2", "r3"]))
    for runtime in runtimes:
        daemon = runtime.p2p._child.pid  # hivemind's handle on the p2pd process
        assert os.getsid(daemon) == daemon != os.getsid(0), "the daemon leads a session of its own"
    assert not asyncio.run(_session_of_a_plain_spawn()), "other spawns are untouched"


async def _session_of_a_plain_spawn() -> bool:
    child = await asyncio.subprocess.create_subprocess_exec("sleep", "30")  # alive while asked (asyncio reaps at exit)
    try:
        return os.getsid(child.pid) == child.pid
    finally:
        child.kill()
        await child.wait()


@pytest.mark.parametrize(
    "request_,status,round_",
    [
        ({"run": RUN, "after": -1}, payloads.OK, 2),  # the newest
        ({"run": RUN, "after": 2}, payloads.NOTHING_NEWER, 0),
        ({"run": RUN, "after": 2**63}, payloads.NOTHING_NEWER, 0),
        # other runs are not served, and told so apart from 'nothing newer': a node of another
        # run (a shared bootstrap node) never counts as a peer of ours for min_peers
        ({"run": "another run", "after": -1}, payloads.NOT_FOUND, 0),
        ({"run": RUN, "after": "zero"}, payloads.NOT_FOUND, None),  # not a round: asked as neither
        ({"run": RUN, "after": None, "round": 1}, payloads.OK, None),
    ],
)
def test_odd_direct_pull_requests_get_a_plain_answer(start_runtime, request_, status, round_):
    server_side = start_runtime("server")
    asker = start_runtime("asker", server_side.visible_maddrs())
    server = PayloadServer(RUN, keep_rounds=5)
    server_side.call(server.register(server_side.p2p), timeout=10)
    for r in range(3):
        server.put(r, f"round {r}".encode())

    async def ask() -> tuple[int, int | None]:
        _, reader, writer = await asker.p2p.call_binary_stream_handler(
            PeerID.from_base58(server_side.peer_id), PAYLOAD_PROTOCOL
        )
        packed = msgpack.packb(request_)
        writer.write(struct.pack(">I", len(packed)) + packed)
        await writer.drain()
        if isinstance(request_.get("after"), int):
            answer, rnd, _ = struct.unpack(">BQQ", await reader.readexactly(17))
            return answer, rnd
        answer, _ = struct.unpack(">BQ", await reader.readexactly(9))
        return answer, None

    answer, rnd = asker.call(ask(), timeout=15)
    assert answer == status and (round_ is None or rnd == round_)


def _daemon_flags(runtime: SwarmRuntime) -> list[str]:
    """The p2pd process's command line, as the kernel has it."""
    pid = runtime.p2p._child.pid  # hivemind's handle on the p2pd process
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_a_node_on_loopback_maps_no_port_on_the_gateway(start_runtime):
    """A local run (every host address loopback: tests, benches, the demo) never asks the
    network's gateway for a port mapping: its p2p daemon runs with port mapping off."""
    flags = _daemon_flags(start_runtime("local"))
    assert "-natPortMap=0" in flags and "-natPortMap=1" not in flags, flags


@pytest.mark.parametrize("hosts,mapping,expected", [
    (["/ip4/127.0.0.1/tcp/0"], True, False),
    (["/ip6/::1/tcp/0"], True, False),
    (["/ip4/0.0.0.0/tcp/31337"], True, True),
    (["/ip4/0.0.0.0/tcp/31337"], False, False),
    (["/ip4/127.0.0.1/tcp/0", "/ip4/0.0.0.0/tcp/1"], True, True),
])
def test_port_mapping_is_asked_for_only_by_a_node_listening_beyond_loopback(tmp_path, monkeypatch, hosts, mapping, expected):
    asked = {}

    async def create(**kwargs):  # the daemon is never started: nothing leaves this machine
        asked.update(kwargs)

    monkeypatch.setattr(P2P, "create", create)
    settings = SwarmSettings(host_maddrs=hosts, port_mapping=mapping)
    asyncio.run(SwarmRuntime(settings, tmp_path / "k.key")._create_p2p(settings))
    assert asked["nat_port_map"] is expected


def _store_heartbeat(runtime: SwarmRuntime, ahead_s: float, run: str = RUN) -> None:
    """One heartbeat of `runtime`'s identity, dated `ahead_s` past now, stored once (a ghost's)."""
    heartbeat = Heartbeat(
        round=99_999, model="Qwen2.5-72B-Instruct", eval_acc=0.991, peer=runtime.peer_id, run=run,
        time=get_dht_time() + ahead_s, reach="direct",
    )
    keys = ShardedFamily(HEARTBEAT_FAMILY, runtime.peer_id, owner_or_none).write_keys()
    assert runtime.call(runtime.store_owned_all(keys, pack(heartbeat.model_dump()), get_dht_time() + 600), 10)


def _read(membership, seconds: float = 0.0) -> set[str]:
    """The live peers after a read (and after `seconds` of reads)."""
    deadline = time.monotonic() + seconds
    while True:
        membership.wait_for_peers(1_000, timeout_s=0)
        if time.monotonic() >= deadline:
            return set(membership.live_peers())
        time.sleep(0.2)


def test_a_heartbeat_dated_ahead_of_our_clock_is_refused(start_runtime):
    """A year ahead, it would never look stale: neither live, nor waited for, nor in `status`."""
    a = start_runtime("a")
    ghost = start_runtime("ghost", a.visible_maddrs())
    watcher = _link(a).membership
    _store_heartbeat(ghost, ahead_s=365 * 24 * 3600.0)
    assert _read(watcher, 2.0) == set()
    assert ghost.peer_id not in {row.heartbeat.peer for row in read_heartbeats(a, stale_after_s=20.0)}


def test_a_ghost_is_gone_within_stale_after_by_our_own_clock(start_runtime):
    """A heartbeat stored once, dated within the allowed skew ahead (so its claimed time stays
    fresh for a while), counts until `stale_after_s` of our clock has passed without a newer
    one, then never again while the same record sits in the DHT; a peer that keeps beating stays."""
    a = start_runtime("a")
    ghost = start_runtime("ghost", a.visible_maddrs())
    honest = start_runtime("honest", a.visible_maddrs())
    watcher = _link(a, RUN, None, "swarm.stale_after_s=2").membership
    beating = _link(honest, RUN, None, "swarm.heartbeat_interval_s=0.5").membership
    beating.announce(NodeStatus(round=1))
    _store_heartbeat(ghost, ahead_s=MAX_CLOCK_SKEW_S - 5)
    deadline = time.monotonic() + 10
    while _read(watcher) != {ghost.peer_id, honest.peer_id} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _read(watcher) == {ghost.peer_id, honest.peer_id}, "both count at first"
    assert _read(watcher, 4.0) == {honest.peer_id}, "the ghost's record did not move on: gone"


def test_status_shows_who_answered_apart_from_what_they_claim(start_runtime):
    """A throwaway identity stores one glowing heartbeat and exits: `status` still lists its
    claims, but only the live peer answered a direct request."""
    a = start_runtime("a")
    honest = start_runtime("honest", a.visible_maddrs())
    _link(honest).membership.announce(NodeStatus(round=3))
    ghost = start_runtime("ghost", a.visible_maddrs())
    _store_heartbeat(ghost, ahead_s=0.0)
    ghost.shutdown()
    reader = start_runtime("reader", a.visible_maddrs())
    deadline = time.monotonic() + 15
    rows: dict = {}
    while set(rows) != {honest.peer_id, ghost.peer_id} and time.monotonic() < deadline:
        rows = {row.heartbeat.peer: row for row in read_heartbeats(reader, stale_after_s=20.0)}
        time.sleep(0.3)
    checked = {row.heartbeat.peer: row for row in probe(reader, list(rows.values()))}
    assert checked[ghost.peer_id].heartbeat.eval_acc == 0.991, "its claims are shown ..."
    assert checked[ghost.peer_id].answered_ms is None, "... and that it did not answer"
    assert checked[honest.peer_id].answered_ms is not None and checked[honest.peer_id].reached == "local"
    assert checked[honest.peer_id].to_json()["checked"]["reached"] == "local"


def test_peers_meet_through_each_other_when_every_dht_store_is_refused(start_runtime, monkeypatch):
    """An eclipse of the DHT's shard keys (their nearest nodes refuse every store) left two
    honest nodes, one joined through the other, strangers for good. Without the DHT: b pulls
    from a, its initial peer, a from b that downloaded from it, and c, joined through b, meets
    a because b, asked whom it knows, names it."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())
    c = start_runtime("c", b.visible_maddrs())

    async def refused(*args, **kwargs) -> bool:
        return False

    links = {}
    for name, runtime in (("a", a), ("b", b), ("c", c)):
        monkeypatch.setattr(runtime, "store_owned_all", refused)
        links[name] = _link(runtime, RUN, PeerLedger())
    deadline = time.monotonic() + 30
    met: dict[str, set[str]] = {name: set() for name in links}
    ids = {"a": a.peer_id, "b": b.peer_id, "c": c.peer_id}
    round_ = 0
    while time.monotonic() < deadline and any(len(m) < 2 for m in met.values()):
        round_ += 1
        for name, link in links.items():
            link.exchange.publish(round_, f"{name} round {round_}".encode(), 1)
        for name, link in links.items():
            for item in link.exchange.gather(GatherWait(timeout_s=0.2)):
                link.exchange.ledger.delivered(item.peer_id)  # what the intake says of a checked batch
                met[name].add(item.peer_id)
    assert {name: met[name] for name in links} == {n: set(ids.values()) - {ids[n]} for n in links}
    assert all(not link.membership.live_peers() for link in links.values()), "nobody was found through the DHT"


def test_min_peers_counts_peers_met_without_the_dht(start_runtime, monkeypatch):
    """With every DHT store refused nobody is live in heartbeats, and a node waited out
    swarm.wait_for_peers_s though it had joined through a live peer. b counts a, its initial
    peer, once a answered; a counts b, which asked it for a batch."""
    a = start_runtime("a")
    b = start_runtime("b", a.visible_maddrs())

    async def refused(*args, **kwargs) -> bool:
        return False

    links = {}
    for name, runtime in (("a", a), ("b", b)):
        monkeypatch.setattr(runtime, "store_owned_all", refused)
        links[name] = _link(runtime, RUN, PeerLedger())
    started = time.monotonic()
    assert links["b"].membership.wait_for_peers(1, timeout_s=20) == 1
    assert links["a"].membership.wait_for_peers(1, timeout_s=20) == 1, "b asked a for its batches"
    assert time.monotonic() - started < 20
    assert not links["a"].membership.live_peers() and not links["b"].membership.live_peers()
    lone = start_runtime("lone")
    monkeypatch.setattr(lone, "store_owned_all", refused)
    assert _link(lone, RUN, PeerLedger()).membership.wait_for_peers(1, timeout_s=2) == 0, "nobody met: nobody counted"


def test_a_node_of_another_run_answers_no_liveness_probe_and_earns_no_strike(start_runtime):
    other_run = start_runtime("other")
    asker = start_runtime("asker", other_run.visible_maddrs())
    server = PayloadServer("another run", keep_rounds=5)
    other_run.call(server.register(other_run.p2p), timeout=10)
    assert asker.call(fetch.answers(asker.p2p, other_run.peer_id, RUN, 5.0), timeout=15) is None
    with pytest.raises(fetch.FetchError) as refused:
        asker.call(fetch.fetch_newest(asker.p2p, other_run.peer_id, RUN, -1, 1 << 20, 5.0), timeout=15)
    assert not refused.value.misbehaved
    assert asker.call(fetch.answers(asker.p2p, other_run.peer_id, "another run", 5.0), timeout=15) is not None
