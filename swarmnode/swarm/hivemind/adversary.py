"""Peers that lie about liveness, for tests and bench/attacks.py: each is a real hivemind
identity that heartbeats under an honest run id and misbehaves in one way.

- `far`: claims a round far ahead and delivers nothing (once made nodes skip rounds);
- `silent`: claims the honest round and never publishes (tries to make nodes wait);
- `mute`: publishes manifests, then accepts the download and never answers;
- `drip`: publishes manifests and serves its payload a few bytes a second;
- `cut`: publishes manifests of a large payload (32 MiB) and closes after all but its last byte;
- `idle`: opens IDLE_STREAMS payload streams to every honest node and says nothing, again
  every IDLE_REOPEN_S (tries to take every serving slot).
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time

from hivemind.p2p import PeerID
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.config import SwarmSettings
from swarmnode.records import Heartbeat
from swarmnode.swarm.hivemind.dht import (
    HEARTBEAT_KEY,
    Manifest,
    heartbeat_from_record,
    manifest_key,
    pack,
    subkey_items,
)
from swarmnode.swarm.hivemind.payloads import OK, PROTOCOL
from swarmnode.swarm.hivemind.runtime import SwarmRuntime

log = logging.getLogger(__name__)

ATTACKS = ("far", "silent", "mute", "drip", "cut", "idle")
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
FAKE_PAYLOAD_BYTES = 4096
CUT_PAYLOAD_BYTES = 32 * 1024 * 1024
SERVES = ("mute", "drip", "cut")  # attacks that announce batches and answer downloads badly
IDLE_STREAMS = 16
IDLE_REOPEN_S = 10.0


class LivenessAttacker:
    """One lying identity; `start()` joins and begins, `stop()` leaves."""

    def __init__(self, attack: str, initial_peers: list[str], run_id: str | None = None, beat_s: float = 1.0) -> None:
        if attack not in ATTACKS:
            raise ValueError(f"unknown attack {attack!r}; choose from {', '.join(ATTACKS)}")
        self.attack = attack
        self.run_id = run_id
        self.beat_s = beat_s
        self.runtime = SwarmRuntime(SwarmSettings(initial_peers=initial_peers, host_maddrs=LOOPBACK))
        self._task: asyncio.Task | None = None
        self._announced = 0  # the last round it announced a batch of
        self._idle: list[asyncio.StreamWriter] = []  # streams it holds open and says nothing on
        self._reopen_at = 0.0

    def start(self) -> None:
        self.runtime.start()
        if self.attack in SERVES:
            self.runtime.call(self.runtime.p2p.add_binary_stream_handler(PROTOCOL, self._serve_badly), timeout=10)
        self._task = self.runtime.call(_spawn(self._loop()), timeout=5)

    def stop(self) -> None:
        self.runtime.shutdown()

    async def _loop(self) -> None:
        while True:
            try:
                await self._act()
            except Exception as err:  # keep lying through DHT hiccups
                log.debug("attacker %s: %s", self.attack, err)
            await asyncio.sleep(self.beat_s)

    async def _act(self) -> None:
        honest = await self._honest_heartbeats()
        if self.run_id is None and honest:
            self.run_id = honest[0].run
        if self.run_id is None:
            return
        current = max((hb.round for hb in honest), default=0)
        claimed = 1_000_000 if self.attack == "far" else current
        beat = Heartbeat(peer=self.runtime.peer_id, run=self.run_id, time=get_dht_time(), round=claimed, model="evil")
        await self.runtime.dht.store(
            HEARTBEAT_KEY, pack(beat.model_dump()), get_dht_time() + 60, subkey=self.runtime.signer.local_public_key
        )
        if self.attack == "idle" and time.monotonic() >= self._reopen_at:
            self._reopen_at = time.monotonic() + IDLE_REOPEN_S
            for stream in self._idle:
                stream.close()
            self._idle = [
                writer for beat in honest for _ in range(IDLE_STREAMS)
                for _, _, writer in [await self.runtime.p2p.call_binary_stream_handler(PeerID.from_base58(beat.peer), PROTOCOL)]
            ]
        if self.attack in SERVES:  # announce a new batch of its own every beat
            self._announced += 1
            manifest = Manifest(self.runtime.peer_id, self._announced, self._payload_bytes, os.urandom(32), 100)
            await self.runtime.dht.store(
                manifest_key(self.run_id), manifest.to_value(), get_dht_time() + 120,
                subkey=self.runtime.signer.local_public_key,
            )

    async def _honest_heartbeats(self) -> list[Heartbeat]:
        beats = []
        for subkey, raw in subkey_items(await self.runtime.dht.get(HEARTBEAT_KEY, latest=True)):
            try:
                beat = heartbeat_from_record(subkey, raw)
            except ValueError:
                continue
            if beat.peer != self.runtime.peer_id and beat.model != "evil" and beat.state != "left":
                beats.append(beat)
        return beats

    @property
    def _payload_bytes(self) -> int:
        return CUT_PAYLOAD_BYTES if self.attack == "cut" else FAKE_PAYLOAD_BYTES

    async def _serve_badly(self, info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read(1024)
            if self.attack == "mute":
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
        finally:
            writer.close()


async def _send_zeros(writer: asyncio.StreamWriter, count: int) -> None:
    chunk = bytes(1 << 20)
    for offset in range(0, count, len(chunk)):
        writer.write(chunk[: min(len(chunk), count - offset)])
        await writer.drain()


async def _spawn(coro) -> asyncio.Task:  # noqa: ANN001
    return asyncio.create_task(coro)
