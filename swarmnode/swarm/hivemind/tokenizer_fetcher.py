"""Fetching peers' tokenizer documents over the payload protocol, in the background.

A node that reads a batch in a tokenizer it does not know asks the batch's sender for that
tokenizer's document, as the rule in swarmnode.swarm.tokenizer_wants allows: one fetch at a
time, within its bounds. A fetched document hashes to its digest (fetch.fetch_tokenizer checks);
bytes that do not are a lie, a strike. Documents fetched wait here until the round loop takes
them (`take`), from its own thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from swarmnode.protocol.records import short_peer
from swarmnode.swarm.base import PeerStanding
from swarmnode.swarm.hivemind.fetch import FetchError, fetch_tokenizer
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.tokenizer_wants import TokenizerWants

log = logging.getLogger(__name__)


class TokenizerFetcher:
    """Wanted tokenizer documents, fetched one at a time on the swarm loop."""

    def __init__(self, runtime: SwarmRuntime, run_id: str, ledger: PeerStanding) -> None:
        self.runtime = runtime
        self.run_id = run_id
        self.ledger = ledger
        self._wants = TokenizerWants()  # on the swarm loop
        self._task: asyncio.Task | None = None
        self._lock = threading.Lock()
        self._ready: list[tuple[str, bytes]] = []  # fetched, not yet taken

    def want(self, peer_id: str, digest: str) -> None:
        """From any thread: `peer_id` sent a batch in the tokenizer `digest`."""
        try:
            self.runtime.loop.call_soon_threadsafe(self._want, peer_id, digest)
        except RuntimeError:  # the swarm loop closed (shutting down): nothing to fetch for
            log.debug("not fetching tokenizer %s: the swarm is closed", digest[:16])

    def take(self) -> list[tuple[str, bytes]]:
        """From any thread: the (digest, document) fetched since the last call."""
        with self._lock:
            fetched, self._ready = self._ready, []
        return fetched

    def _want(self, peer_id: str, digest: str) -> None:
        self._wants.want(peer_id, digest)
        self._next()

    def _next(self) -> None:
        """Start the next fetch the rule allows (one at a time)."""
        job = self._wants.next(self.ledger.known)
        if job is None:
            return
        peer, digest = job
        self._task = asyncio.create_task(fetch_tokenizer(self.runtime.p2p, peer, self.run_id, digest))
        self._task.add_done_callback(lambda done: self._settled(peer, digest, done))

    def _settled(self, peer: str, digest: str, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        err = task.exception()
        if err is None:
            with self._lock:
                self._ready.append((digest, task.result()))
        else:
            if isinstance(err, FetchError) and err.misbehaved:
                self.ledger.reject(peer, f"tokenizer document: {err}")
            log.info("could not fetch tokenizer %s from %s: %s", digest[:16], short_peer(peer), err)
        self._wants.settle(err is None)
        self._next()

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
