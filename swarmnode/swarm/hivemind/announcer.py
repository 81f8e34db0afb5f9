"""Announcing our batches to strangers: a manifest in the DHT, stored in the background.

A DHT store can take seconds when the nodes that hold the key are slow (or slow on purpose),
and a round never waits on it. Peers that know us pull directly; strangers read the manifests
every `swarm.discovery_interval_s`, so a manifest is stored at most that often, one store at a
time, and the newest replaces one not yet stored: a store asks the nodes near each of its keys,
and they answer with every record there (a crowd's too), each checked by its RSA signature. The
announced round stays served (pinned) until the next announcement is stored, however fast the
rounds go.
"""

from __future__ import annotations

import asyncio
import logging
import time

from hivemind.utils.timed_storage import get_dht_time

from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind.dht import Manifest
from swarmnode.swarm.hivemind.payloads import PayloadServer
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import ShardedFamily

log = logging.getLogger(__name__)

MANIFEST_TTL_S = 600.0
STORE_TIMEOUT_S = 10.0  # one store of our manifest, in the background


class Announcer:
    """Our newest manifest into our shards of the run's manifests, on the swarm loop."""

    def __init__(self, runtime: SwarmRuntime, server: PayloadServer, manifests: ShardedFamily, settings: SwarmSettings) -> None:
        self.runtime = runtime
        self.server = server
        self.manifests = manifests
        self.settings = settings
        self._unannounced: Manifest | None = None  # our newest manifest, not yet stored
        self._task: asyncio.Task | None = None  # the background store of our manifests
        self._next_store = 0.0  # time.monotonic() before which no manifest is stored

    def announce(self, manifest: Manifest) -> None:
        """Store `manifest` (its payload already served) when the last store is done and the
        interval passed; a newer one replaces it meanwhile."""
        self._unannounced = manifest
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._store_newest())

    async def _store_newest(self) -> None:
        """Store our newest manifest until none is waiting: one store at a time, at most one
        every discovery interval, the newest wins."""
        while self._unannounced is not None:
            await asyncio.sleep(max(0.0, self._next_store - time.monotonic()))
            manifest, self._unannounced = self._unannounced, None
            self.server.pin(manifest.round)
            self._next_store = time.monotonic() + self.settings.discovery_interval_s
            expiration = get_dht_time() + MANIFEST_TTL_S
            try:
                ok = await asyncio.wait_for(
                    self.runtime.store_owned_all(self.manifests.write_keys(), manifest.to_value(), expiration),
                    2 * STORE_TIMEOUT_S,  # a store, then perhaps a read-back
                )
            except Exception as err:  # a slow or failing DHT: the next round's manifest tries again
                log.debug("announcing round %d: %s", manifest.round, err)
                ok = False
            self.server.settle_pin(manifest.round, ok)
            if not ok:
                log.warning("could not announce round %d in the DHT; peers may miss it", manifest.round)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
