"""The swarm's DHT runtime in one process: identities, signed and sharded records, the p2p daemon.

The other concerns of the swarm layer have files of their own: tests/test_swarm_payloads.py
(the payload protocol), tests/test_swarm_exchange.py (whom the exchange asks, and when),
tests/test_swarm_strangers.py (what lying, cutting and unknown peers cost),
tests/test_swarm_membership.py (joining, heartbeats, status) and tests/test_swarm_discovery.py
(peers that meet without the DHT); what they share is in tests/swarm_helpers.py.
"""

from __future__ import annotations

import asyncio
import os
import stat
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
from swarmnode.protocol.records import RecordError
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind import dht as records
from swarmnode.swarm.hivemind.dht import Manifest, pack, payload_digest
from swarmnode.swarm.hivemind.identity import ensure_identity, load_signing_key
from swarmnode.swarm.hivemind.runtime import LOOKUP_BEAM, SwarmRuntime
from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, ShardIndex, manifest_family, shard_key, shard_of
from tests.swarm_helpers import EVERYONES, RUN


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

