"""Peer exchange: honest peers introduce each other without the DHT.

The DHT is the only other way peers of a run find each other, and its records live on the few
nodes nearest each shard key: DHT nodes placed next to those keys that refuse every store kept
two honest nodes from ever meeting, though one had joined through the other. So discovery has
three more paths, none of which goes through the DHT:

- the peers this node was told to join through (its initial peers) are tried as strangers;
- a peer that downloaded our batches (`PayloadServer.requesters`) is tried as a stranger;
- every few seconds the node asks peers it knows "whom do you know?" and tries whom they name.

Everything learnt here is a claim: a name is only a candidate for a stranger's download, within
the exchange's bounds on strangers (count, promised bytes, a floor rate, a growing back-off);
a peer counts once a batch it delivered passed every check, as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarmnode.swarm.hivemind.payloads import MAX_INTRODUCTIONS, FetchError, ask_whom
from swarmnode.swarm.hivemind.runtime import SwarmRuntime

log = logging.getLogger(__name__)

WHOM_INTERVAL_S = 10.0  # how often known peers are asked whom they know (every poll before anyone delivered)
WHOM_TIMEOUT_S = 5.0
ASKED_PER_TURN = 4  # peers asked 'whom do you know?' at one turn
KEPT_INTRODUCTIONS = 64  # names kept to try, newest kept
INTRODUCTION_TTL_S = 600.0
DIAL_TIMEOUT_S = 3.0


def peer_of(maddr: str) -> str | None:
    """The peer id at the end of a multiaddr (`.../p2p/<id>`), None without one."""
    parts = str(maddr).rstrip("/").split("/")
    return parts[-1] if len(parts) >= 2 and parts[-2] == "p2p" else None


class Introductions:
    """Whom this node may try as strangers besides the DHT's, and whom it introduces."""

    def __init__(self, runtime: SwarmRuntime, run_id: str, known_peers: Callable[[], list[str]]) -> None:
        self.runtime = runtime
        self.run_id = run_id
        self.known_peers = known_peers  # peers that delivered valid batches to us (the ledger's)
        self.bootstrap = [p for p in map(peer_of, runtime.initial_peers) if p and p != runtime.peer_id]
        self.introduced: OrderedDict[str, float] = OrderedDict()  # peer -> when a known peer named it
        self._addrs: dict[str, list[str]] = {}  # peer -> addresses of our connection to it (for introducing)
        self._turn = 0
        self._next_at = 0.0
        self._asked: set[str] = set()  # peers asked at least once

    def ours(self) -> list[tuple[str, list[str]]]:
        """What we answer 'whom do you know?': peers that delivered to us, with the addresses
        we reach them at (at most MAX_INTRODUCTIONS)."""
        return [(peer, self._addrs.get(peer, [])) for peer in self.known_peers()[:MAX_INTRODUCTIONS]]

    def candidates(self) -> list[str]:
        """Names to try as strangers, introduced ones first (a peer that delivered vouched for
        them), then the initial peers; not yet checked."""
        now = time.monotonic()
        for peer in [p for p, at in self.introduced.items() if now - at > INTRODUCTION_TTL_S]:
            del self.introduced[peer]
        return list(dict.fromkeys([*self.introduced, *self.bootstrap]))

    async def maybe_ask(self, anyone_delivered: bool) -> None:
        """Ask a peer whom it knows as soon as it first delivered to us, and every
        WHOM_INTERVAL_S (every call until anyone delivered) a few known and initial peers in
        turn; dial whom they name."""
        known = self.known_peers()
        first_time = [peer for peer in known if peer not in self._asked][:ASKED_PER_TURN]
        due = not anyone_delivered or time.monotonic() >= self._next_at
        if not (first_time or due):
            return
        with contextlib.suppress(Exception):  # the addresses are a courtesy to those we introduce
            self._addrs = {i.peer_id.to_base58(): [str(a) for a in i.addrs] for i in await self.runtime.p2p.list_peers()}
        asked = first_time
        askable = list(dict.fromkeys([*known, *self.bootstrap]))
        if due and askable:
            self._next_at = time.monotonic() + WHOM_INTERVAL_S
            start = (self._turn * ASKED_PER_TURN) % len(askable)
            self._turn += 1
            turn = [askable[(start + i) % len(askable)] for i in range(min(ASKED_PER_TURN, len(askable)))]
            asked = list(dict.fromkeys([*first_time, *turn]))
        self._asked.update(asked)
        answers = await asyncio.gather(*(self._ask(peer) for peer in asked))
        known = set(self.known_peers())
        for entries in answers:
            for peer, addrs in entries:
                if peer == self.runtime.peer_id or peer in known or peer in self.introduced:
                    continue
                await self._dial(peer, addrs)
                self.introduced[peer] = time.monotonic()
                while len(self.introduced) > KEPT_INTRODUCTIONS:
                    self.introduced.popitem(last=False)

    async def _ask(self, peer: str) -> list[tuple[str, list[str]]]:
        try:
            return await ask_whom(self.runtime.p2p, peer, self.run_id, WHOM_TIMEOUT_S)
        except FetchError as err:
            log.debug("asking %s whom it knows: %s", peer, err)
            return []

    async def _dial(self, peer: str, addrs: list[str]) -> None:
        """Tell the daemon where a named peer may be (best effort: it may find it by id too)."""
        try:
            maddrs = [Multiaddr(a) for a in addrs]
            if maddrs:
                await asyncio.wait_for(self.runtime.p2p._client.connect(PeerID.from_base58(peer), maddrs), DIAL_TIMEOUT_S)
        except Exception as err:  # a false name, a stale address: the download will tell
            log.debug("dialling %s, introduced: %s", peer, err)
