"""Peer exchange: honest peers introduce each other without the DHT.

The DHT is the only other way peers of a run find each other, and its records live on the few
nodes nearest each shard key: DHT nodes placed next to those keys that refuse every store kept
two honest nodes from ever meeting, though one had joined through the other. So discovery has
three more paths, none of which goes through the DHT:

- the peers this node was told to join through (its initial peers) are tried as strangers;
- a peer of our run that asked us for batches (`PayloadServer.requesters`) is tried as a stranger;
- every few seconds the node asks peers it knows "whom do you know?" and tries whom they name.

Everything learnt here is a claim: a name is only a candidate for a stranger's download, within
the exchange's bounds on strangers (count, promised bytes, a floor rate, a growing back-off);
a peer counts once a batch it delivered passed every check, as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarmnode.bounded import note_newest
from swarmnode.swarm.hivemind.fetch import FetchError, ask_whom
from swarmnode.swarm.hivemind.payloads import MAX_INTRODUCTIONS, WHOM_EVERY_S
from swarmnode.swarm.hivemind.runtime import SwarmRuntime

log = logging.getLogger(__name__)

WHOM_INTERVAL_S = 10.0  # how often known peers are asked whom they know (every poll before anyone delivered)
WHOM_TIMEOUT_S = 5.0
ASKED_PER_TURN = 4  # peers asked 'whom do you know?' at one turn
KEPT_INTRODUCTIONS = 64  # names kept to try, newest kept
INTRODUCTION_TTL_S = 600.0
DIAL_TIMEOUT_S = 3.0
DIALS_PER_NAME = 2  # addresses dialled for one introduced peer
SCOPES = ("loopback", "private", "global")  # an address of a wider scope than the introducer's is not dialled


def scope_of(maddr: str) -> str | None:
    """loopback, private or global for an /ip4 or /ip6 address; None for anything else (a DNS
    name, a link-local or multicast address, a relay circuit): never dialled on a peer's word."""
    parts = str(maddr).split("/")
    if "p2p-circuit" in parts or len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return None
    try:
        ip = ipaddress.ip_address(parts[2])
    except ValueError:
        return None
    if ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        return None
    return "loopback" if ip.is_loopback else "private" if ip.is_private else "global"


def widest_scope(addrs: list[str]) -> str:
    """The widest scope of the addresses we reach a peer at (global when none is known)."""
    scopes = [scope for scope in map(scope_of, addrs) if scope]
    return max(scopes, key=SCOPES.index) if scopes else "global"


def within(maddr: str, scope: str) -> bool:
    """An address a peer reached over `scope` may make us dial: one of that scope, or wider;
    so a peer on the internet cannot make us probe our own network or machine."""
    mine = scope_of(maddr)
    return mine is not None and SCOPES.index(mine) >= SCOPES.index(scope)


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
        # known peers asked since they first delivered: asked before (as an initial peer), a peer
        # had nothing for us, since it introduces only to those that downloaded from it
        self._asked_since_known: set[str] = set()

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
        first_time = [peer for peer in known if peer not in self._asked_since_known][:ASKED_PER_TURN]
        due = time.monotonic() >= self._next_at
        if not (first_time or due):
            return
        with contextlib.suppress(Exception):  # the addresses are a courtesy to those we introduce
            self._addrs = {i.peer_id.to_base58(): [str(a) for a in i.addrs] for i in await self.runtime.p2p.list_peers()}
        asked = first_time
        askable = list(dict.fromkeys([*known, *self.bootstrap]))
        if due and askable:  # before anyone delivered, as often as a peer answers us (WHOM_EVERY_S)
            self._next_at = time.monotonic() + (WHOM_INTERVAL_S if anyone_delivered else WHOM_EVERY_S)
            start = (self._turn * ASKED_PER_TURN) % len(askable)
            self._turn += 1
            turn = [askable[(start + i) % len(askable)] for i in range(min(ASKED_PER_TURN, len(askable)))]
            asked = list(dict.fromkeys([*first_time, *turn]))
        self._asked_since_known = (self._asked_since_known | set(asked)) & set(known)  # bounded by the known
        answers = await asyncio.gather(*(self._ask(peer) for peer in asked))
        known = set(self.known_peers())
        named: dict[str, list[str]] = {}
        for introducer, entries in zip(asked, answers):
            scope = widest_scope(self._addrs.get(introducer, []))
            for peer, addrs in entries:
                if peer != self.runtime.peer_id and peer not in known and peer not in self.introduced:
                    named[peer] = [a for a in addrs if within(a, scope)][:DIALS_PER_NAME]
        await asyncio.gather(*(self._dial(peer, addrs) for peer, addrs in named.items()))  # one deadline for all
        for peer in named:
            note_newest(self.introduced, peer, time.monotonic(), KEPT_INTRODUCTIONS)

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
