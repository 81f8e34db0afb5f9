"""Peers that lie about liveness, for tests and bench/attacks.py: each is a real hivemind
identity that heartbeats under an honest run id and misbehaves in one way.

- `far`: claims a round far ahead and delivers nothing (once made nodes skip rounds);
- `silent`: claims the honest round and never publishes (tries to make nodes wait);
- `mute`: publishes manifests, then accepts the download and never answers;
- `drip`: publishes manifests and serves its payload a few bytes a second;
- `cut`: publishes manifests of a large payload (32 MiB) and closes after all but its last byte;
- `starve`: like `mute`, each manifest promising 32 MiB (tries to hold the strangers' download
  budget; bench/attacks.py runs it as a crowd of identities);
- `hog`: announces nothing, downloads every honest node's newest batch each beat (so it is the
  newest in their lists of peers that asked them, tried as strangers before the heartbeats'),
  and answers their asks back with silence (tries to hold the places a node asks strangers in,
  so an honest newcomer is not heard; run as a crowd);
- `idle`: opens IDLE_STREAMS payload streams to every honest node and says nothing, again
  every IDLE_REOPEN_S (tries to take every serving slot);
- `churn`: keeps IDLE_STREAMS payload streams open to every honest node, each re-opened the
  moment it is closed (tries to cost the honest node a stream a moment);
- `late`: publishes a valid batch every beat and serves each one LATE_STEP_S later than the
  one before (tries to make nodes wait for a peer with a delivery record);
- `crowd`: publishes a valid batch of CROWD_GROUPS useless groups every beat (one honest
  completion of another prompt, repeated: every sample the same reward, a zero advantage),
  to take the peers' share of honest batches.

`late` and `crowd` make their batches valid from an honest one: they download an honest
peer's batch once and reuse its header and completions under their own prompt assignment,
which they compute from the run's seed and training-set size (`seed`, `num_train`: public).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time

import msgpack
import numpy as np
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import PeerID
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.protocol import wire
from swarmnode.protocol.batches import assigned_prompt_ids
from swarmnode.protocol.records import Heartbeat, RecordError
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind.dht import Manifest, heartbeat_from_record, owner_or_none, pack, payload_digest
from swarmnode.swarm.hivemind.fetch import fetch_next, fetch_payload
from swarmnode.swarm.hivemind.payloads import OK, PROTOCOL, PayloadServer
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, ShardedFamily, manifest_family

log = logging.getLogger(__name__)

ATTACKS = ("far", "silent", "mute", "starve", "hog", "drip", "cut", "idle", "churn", "late", "crowd")
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
FAKE_PAYLOAD_BYTES = 4096
CUT_PAYLOAD_BYTES = 32 * 1024 * 1024
SERVES = ("mute", "starve", "hog", "drip", "cut")  # attacks that answer downloads badly
ANNOUNCES = ("mute", "starve", "drip", "cut")  # ... and announce batches to be downloaded
IDLE_STREAMS = 16
IDLE_REOPEN_S = 10.0
VALID = ("late", "crowd")  # attacks that publish batches an honest node accepts
LATE_STEP_S = 0.25  # each batch of `late` is served this much later than its previous one
CROWD_GROUPS = 16
READ_SHARDS = 64  # it reads widely: its own cost is no concern of an attacker
CHEAP_KEY_BITS = 1024  # the smallest RSA key the cryptography library makes


class LivenessAttacker:
    """One lying identity; `start()` joins and begins, `stop()` leaves."""

    def __init__(
        self, attack: str, initial_peers: list[str], run_id: str | None = None, beat_s: float = 1.0,
        seed: int = 0, num_train: int = 0,
    ) -> None:
        if attack not in ATTACKS:
            raise ValueError(f"unknown attack {attack!r}; choose from {', '.join(ATTACKS)}")
        if attack in VALID and num_train <= 0:
            raise ValueError(f"{attack!r} publishes valid batches: give the run's seed and num_train")
        self.attack = attack
        self.run_id = run_id
        self.beat_s = beat_s
        self.seed, self.num_train = seed, num_train
        self.server: PayloadServer | None = None
        self._template: wire.RolloutBatch | None = None  # an honest batch whose header and text it reuses
        self.runtime = SwarmRuntime(SwarmSettings(initial_peers=initial_peers, host_maddrs=LOOPBACK))
        self._task: asyncio.Task | None = None
        self._announced = 0  # the last round it announced a batch of
        self._idle: list[asyncio.StreamWriter] = []  # streams it holds open and says nothing on
        self._churning: set[str] = set()  # honest peers its churning streams run against
        self.reopened = 0  # streams `churn` opened again after the honest node closed them
        self._reopen_at = 0.0
        self._heartbeats: ShardedFamily | None = None  # made once the daemon gave it a peer id
        self._manifests: ShardedFamily | None = None

    def start(self) -> None:
        self.runtime.start()
        self._heartbeats = ShardedFamily(HEARTBEAT_FAMILY, self.runtime.peer_id, owner_or_none)
        if self.attack in SERVES:
            self.runtime.call(self.runtime.p2p.add_binary_stream_handler(PROTOCOL, self._serve_badly), timeout=10)
        if self.attack in VALID:
            handler = self._serve_late if self.attack == "late" else None
            self.server = PayloadServer(self.run_id or "", keep_rounds=4)
            self.runtime.call(self.runtime.p2p.add_binary_stream_handler(PROTOCOL, handler or self.server.handle), timeout=10)
        self._task = self.runtime.call(_spawn(self._loop()), timeout=5)

    def stop(self) -> None:
        self.runtime.shutdown()

    async def _loop(self) -> None:
        while True:
            try:
                await self._act()
            except (TypeError, AttributeError, NameError):  # a bug in this kit: said loudly, not lied through
                log.exception("attacker %s stopped", self.attack)
                raise
            except Exception as err:  # keep lying through DHT hiccups
                log.debug("attacker %s: %s", self.attack, err)
            await asyncio.sleep(self.beat_s)

    async def _act(self) -> None:
        honest = await self._honest_heartbeats()
        if self.run_id is None and honest:
            self.run_id = honest[0].run
        if self.run_id is None:
            return
        if self._manifests is None:
            self._manifests = ShardedFamily(manifest_family(self.run_id), self.runtime.peer_id, owner_or_none)
        current = max((hb.round for hb in honest), default=0)
        claimed = 1_000_000 if self.attack == "far" else current
        beat = Heartbeat(peer=self.runtime.peer_id, run=self.run_id, time=get_dht_time(), round=claimed, model="evil")
        await self.runtime.store_owned_all(self._heartbeats.write_keys(), pack(beat.model_dump()), get_dht_time() + 60)
        if self.attack == "idle" and time.monotonic() >= self._reopen_at:
            self._reopen_at = time.monotonic() + IDLE_REOPEN_S
            for stream in self._idle:
                stream.close()
            self._idle = [
                writer for beat in honest for _ in range(IDLE_STREAMS)
                for _, _, writer in [await self.runtime.p2p.call_binary_stream_handler(PeerID.from_base58(beat.peer), PROTOCOL)]
            ]
        if self.attack == "churn":
            for beat in honest:
                if beat.peer not in self._churning:
                    self._churning.add(beat.peer)
                    for _ in range(IDLE_STREAMS):
                        asyncio.create_task(self._churn(beat.peer))
        if self.attack == "hog":
            await asyncio.gather(*(self._download_newest(beat.peer) for beat in honest))
        if self.attack in ANNOUNCES:  # announce a new batch of its own every beat
            self._announced += 1
            manifest = Manifest(self.runtime.peer_id, self._announced, self._payload_bytes, os.urandom(32), 100)
            await self._announce(manifest)
        if self.attack in VALID:
            await self._publish_valid(honest)

    async def _churn(self, peer: str) -> None:
        """One stream to `peer`, silent, opened again as soon as the peer closes it."""
        while True:
            try:
                _, reader, writer = await self.runtime.p2p.call_binary_stream_handler(PeerID.from_base58(peer), PROTOCOL)
                await reader.read(1)  # returns when the honest node closes the stream
                writer.close()
                self.reopened += 1
            except Exception as err:  # refused or dropped: try again at once, as an attacker would
                log.debug("churn to %s: %s", peer, err)
                await asyncio.sleep(0.01)

    async def _download_newest(self, peer: str) -> None:
        """`peer`'s newest batch, as any peer may ask it: we become the newest peer that asked."""
        with contextlib.suppress(Exception):
            await fetch_next(self.runtime.p2p, peer, self.run_id, -1, wire.WireSettings().max_bytes, timeout_s=5.0)

    async def _announce(self, manifest: Manifest) -> None:
        await self.runtime.store_owned_all(self._manifests.write_keys(), manifest.to_value(), get_dht_time() + 120)

    async def _publish_valid(self, honest: list[Heartbeat]) -> None:
        """A batch of its own round, valid by every check a receiver makes, with nothing to learn."""
        if self._template is None:
            self._template = await self._honest_batch({beat.peer for beat in honest})
            if self._template is None:
                return
        self._announced += 1
        count = CROWD_GROUPS if self.attack == "crowd" else len(self._template.groups)
        ids = assigned_prompt_ids(self.seed, self.runtime.peer_id, self._announced, count, self.num_train)
        donors = self._template.groups
        batch = wire.RolloutBatch(
            run_id=self.run_id, peer_id=self.runtime.peer_id, round=self._announced,
            tokenizer_digest=self._template.tokenizer_digest,
            groups=[_junk_group(i, donors[n % len(donors)]) if self.attack == "crowd" else
                    wire.CompletionGroup(i, donors[n % len(donors)].lengths, donors[n % len(donors)].tokens,
                                         donors[n % len(donors)].logprobs)
                    for n, i in enumerate(ids)],
        )
        payload = wire.encode(batch)
        self.server.run_id = self.run_id
        self.server.put(self._announced, payload)
        await self._announce(Manifest(self.runtime.peer_id, self._announced, len(payload), payload_digest(payload),
                                      batch.num_tokens))

    async def _honest_batch(self, honest_peers: set[str]) -> wire.RolloutBatch | None:
        """An honest peer's newest batch, downloaded as any peer may."""
        found = await self._manifests.read(self.runtime.read_owned_many, READ_SHARDS)
        for subkey, raw in found.items:
            try:
                manifest = Manifest.from_record(subkey, raw, wire.WireSettings().max_bytes)
            except RecordError:  # other liars
                continue
            if manifest.peer_id not in honest_peers:
                continue
            batch = await fetch_payload(self.runtime.p2p, manifest.peer_id, self.run_id, manifest.round,
                                        manifest.size, manifest.digest, timeout_s=10)
            return wire.decode(batch.payload)
        return None

    async def _serve_late(self, info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(LATE_STEP_S * self._announced)
        await self.server.handle(info, reader, writer)

    async def _honest_heartbeats(self) -> list[Heartbeat]:
        beats = []
        for subkey, raw in (await self._heartbeats.read(self.runtime.read_owned_many, READ_SHARDS)).items:
            try:
                beat = heartbeat_from_record(subkey, raw)
            except ValueError:
                continue
            if beat.peer != self.runtime.peer_id and beat.model != "evil" and beat.state != "left":
                beats.append(beat)
        return beats

    @property
    def _payload_bytes(self) -> int:
        return CUT_PAYLOAD_BYTES if self.attack in ("cut", "starve") else FAKE_PAYLOAD_BYTES

    async def _serve_badly(self, info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read(1024)
            if self.attack in ("mute", "starve", "hog"):
                await asyncio.sleep(3600)
            writer.write(struct.pack(">BQ", OK, self._payload_bytes))
            if self.attack == "cut":
                await _send_zeros(writer, self._payload_bytes - 1)
                return
            started = time.monotonic()
            while time.monotonic() - started < 3600:
                writer.write(b"x" * 8)
                await writer.drain()
                await asyncio.sleep(1.0)
        except ConnectionError:
            pass  # the downloader gave up: what a drip is meant to cause
        except asyncio.CancelledError:
            pass  # the identity stops: its held streams end quietly (the daemon's client reports each otherwise)
        finally:
            writer.close()


def _junk_group(prompt_id: int, donor: wire.CompletionGroup) -> wire.CompletionGroup:
    """A valid group with nothing to learn: the donor's first completion as every completion,
    so every sample gets the same reward and a zero advantage."""
    first = int(donor.lengths[0])
    count = len(donor.lengths)
    return wire.CompletionGroup(
        prompt_id, np.full(count, first, dtype=np.int64), np.tile(donor.tokens[:first], count),
        np.tile(donor.logprobs[:first], count),
    )


async def _send_zeros(writer: asyncio.StreamWriter, count: int) -> None:
    chunk = bytes(1 << 20)
    for offset in range(0, count, len(chunk)):
        writer.write(chunk[: min(len(chunk), count - offset)])
        await writer.drain()


async def _spawn(coro) -> asyncio.Task:  # noqa: ANN001
    return asyncio.create_task(coro)


def cheap_signer(bits: int = CHEAP_KEY_BITS) -> RSASignatureValidator:
    """An identity with a small RSA key. hivemind's signature check takes a key of any size,
    and a 1024-bit key is about five times quicker to make than hivemind's own 2048-bit one, so
    this is what an attacker making tens of thousands of identities would use."""
    key = RSAPrivateKey.__new__(RSAPrivateKey)  # hivemind's constructor always makes 2048 bits
    key._private_key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    return RSASignatureValidator(key)


class ManyKeySigner(RecordValidatorBase):
    """Signs each record with the key its subkey names: one process, many identities."""

    def __init__(self, signers: list[RSASignatureValidator]) -> None:
        self.signers = {s.local_public_key: s for s in signers}
        self.check = RSASignatureValidator()

    def validate(self, record: DHTRecord) -> bool:
        # An attacker checks nothing it reads. Its stores' lookups bring back every record
        # already under a key, and verifying them all made a flood's writes slow down as the
        # shards filled.
        return True

    def sign_value(self, record: DHTRecord) -> bytes:
        """Signed by the key the subkey is (one lookup, for floods of many identities), else by
        the first key the subkey contains (a suffixed subkey, `[owner:KEY]#i`)."""
        signer = None
        with contextlib.suppress(TypeError, ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            signer = self.signers.get(msgpack.unpackb(record.subkey))  # a record carries its subkey packed
        if signer is None:
            signer = next((s for marker, s in self.signers.items() if marker in record.subkey), None)
        return record.value if signer is None else signer.sign_value(record)

    def strip_value(self, record: DHTRecord) -> bytes:
        return self.check.strip_value(record)

    @property
    def priority(self) -> int:
        return 10

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False
