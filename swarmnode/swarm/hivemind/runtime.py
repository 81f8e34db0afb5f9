"""A hivemind DHT node and its libp2p daemon, run in this process on a private event loop.

hivemind.DHT runs its node in a forked process fed through a pipe, and that pipe breaks on
values above about 16 KiB (docs/design.md). Running DHTNode on our own plain asyncio
loop, in a background thread, has no pipe at all, does not fork (safe next to CUDA), and lets
the payload handlers share the DHT's daemon. The round loop calls the blocking methods here.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from hivemind.dht.node import DHTNode
from hivemind.dht.protocol import ValidationError
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator
from hivemind.p2p import P2P, P2PDaemonError, PeerID
from hivemind.utils.logging import use_hivemind_log_handler
from hivemind.utils.multiaddr import Multiaddr
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.settings.config import SwarmSettings
from swarmnode.settings.network import stays_local
from swarmnode.swarm.hivemind.bound_ids import IdBinding, bind_ids, bound_id, is_bound
from swarmnode.swarm.hivemind.dht import RememberingSignatureValidator, make_validators, subkey_items
from swarmnode.swarm.hivemind.identity import ensure_identity, load_signing_key
from swarmnode.swarm.hivemind.reach import forced_reachability
from swarmnode.swarm.hivemind.shards import ShardIndex

log = logging.getLogger(__name__)
T = TypeVar("T")
# hivemind's lines go through the node's own handlers (the terminal's format, under the
# spinner rather than through it, and node.log) instead of a handler of hivemind's own; its
# chatter below a warning only with --verbose (the root logger at DEBUG)
use_hivemind_log_handler("nowhere")
if not logging.getLogger().isEnabledFor(logging.DEBUG):
    logging.getLogger("hivemind").setLevel(logging.WARNING)

# A lookup follows this many of the nodes nearest a key. hivemind's default is its bucket size
# (20): in a swarm of a few dozen nodes a read then asks nearly every node, and validates
# every record of every answer (an RSA verification each), which made DHT reads most of a
# node's CPU under a crowd of identities. Records live on the DHTNode's num_replicas (5)
# nodes nearest their key, and stores and reads both look with this beam, so both find them.
LOOKUP_BEAM = 8
BOOTSTRAP_TIMEOUT_S = 10.0  # the longest a start waits for its initial peers' DHT answers and its first lookup


class SwarmError(RuntimeError):
    """The swarm could not be started or reached; the message says what to check."""


_DAEMON_OWN_SESSION = contextvars.ContextVar("swarmnode_daemon_own_session", default=False)
_SPAWN_LOCK = threading.Lock()


@contextlib.contextmanager
def _daemon_in_its_own_session() -> Iterator[None]:
    """Start hivemind's p2p daemon in a session of its own. Ctrl-C in a terminal signals the
    whole foreground process group: the daemon would close at once, and the node's last
    heartbeat and clean shutdown would meet a dead daemon (11 s of timeouts and tracebacks).
    In its own session the daemon is stopped by the node, after its farewell; it still ends
    with the node on kill -9 (it exits when its parent's pipes close). hivemind spawns it with
    asyncio's create_subprocess_exec and exposes no option for this, so that function is
    wrapped once per process, and the wrapper adds `start_new_session` only inside this
    block's task (a context variable: other tasks, threads and runtimes starting at the same
    time are untouched)."""
    with _SPAWN_LOCK:
        spawn = asyncio.subprocess.create_subprocess_exec
        if not getattr(spawn, "swarmnode_wrapped", False):

            async def in_own_session(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
                if _DAEMON_OWN_SESSION.get():
                    kwargs.setdefault("start_new_session", True)
                return await spawn(*args, **kwargs)

            in_own_session.swarmnode_wrapped = True  # type: ignore[attr-defined]
            asyncio.subprocess.create_subprocess_exec = in_own_session
    token = _DAEMON_OWN_SESSION.set(True)
    try:
        yield
    finally:
        _DAEMON_OWN_SESSION.reset(token)


class SwarmRuntime:
    """Owns the event loop thread, the p2p daemon and the DHT node; blocking calls into them."""

    def __init__(
        self,
        settings: SwarmSettings,
        identity_path: Path | None = None,
        initial_peers: list[str] | None = None,
        client_mode: bool = False,
    ) -> None:
        """`identity_path` None: a throwaway identity in a temporary directory (status, tests). `initial_peers` None: the
        settings' own. `client_mode`: read the DHT, store nothing for others (status)."""
        self.settings = settings
        self.identity_path = identity_path
        self.initial_peers = list(settings.initial_peers if initial_peers is None else initial_peers)
        self.client_mode = client_mode
        self.loop = asyncio.new_event_loop()  # plain asyncio, never uvloop
        self._thread = threading.Thread(target=self._run_loop, name="swarm-loop", daemon=True)
        self.p2p: P2P | None = None
        self.dht: DHTNode | None = None
        self.signer: RememberingSignatureValidator | None = None
        self.id_binding: IdBinding | None = None  # the DHT contacts refused for an unbound id
        self.shards = ShardIndex()  # shard keys this node's DHT checks records against
        self.peer_id = ""
        self._rejoiner: asyncio.Task | None = None
        self._first_lookup: asyncio.Task | None = None  # held, so a lookup that outlives the start is not collected

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        """Start the daemon and join (or found) the DHT; raises SwarmError with a hint."""
        timeout_s = self.settings.startup_timeout_s
        if self.identity_path is None:
            # A throwaway identity is still one RSA key for both the peer id and the DHT signer,
            # so what it writes names the peer that signed it.
            self._scratch = tempfile.TemporaryDirectory(prefix="swarmnode-identity-")
            self.identity_path = Path(self._scratch.name) / "identity.key"
        created = not self.identity_path.exists()
        ensure_identity(self.identity_path)
        self.signer = RememberingSignatureValidator(load_signing_key(self.identity_path))
        self._thread.start()
        try:
            self.call(self._start(), timeout=timeout_s + 5)
        except (TimeoutError, P2PDaemonError, RuntimeError, OSError, ValueError) as err:
            self.shutdown()
            if created:  # a join that never happened leaves no identity behind; a kept one stays
                self.identity_path.unlink(missing_ok=True)
            reason = f"no answer within {timeout_s:.0f} s" if isinstance(err, TimeoutError) else str(err)
            raise SwarmError(self._hint(reason)) from None

    async def _start(self) -> None:
        s = self.settings
        with _daemon_in_its_own_session():
            self.p2p = await self._create_p2p(s)
        self.peer_id = self.p2p.peer_id.to_base58()
        self.dht = await DHTNode.create(  # alone: it meets its initial peers once its ids are bound
            p2p=self.p2p,
            node_id=bound_id(self.p2p.peer_id),
            client_mode=self.client_mode,
            record_validator=CompositeValidator(make_validators(self.signer, self.shards)),
            cache_locally=True,
        )
        self.id_binding = bind_ids(self.dht.protocol)
        if self.initial_peers:
            await self._bootstrap(min(s.startup_timeout_s, BOOTSTRAP_TIMEOUT_S))
            self._rejoiner = asyncio.create_task(self._rejoin_when_alone())

    async def _bootstrap(self, timeout_s: float) -> None:
        """hivemind's bootstrap, run once contacts are checked (swarm.hivemind.bound_ids): ping
        the initial peers (each checks that it can reach us back and that our clocks agree),
        then look up our own id to fill the routing table. RuntimeError when none answered, or
        none answered with an id bound to its key."""
        peers = [PeerID.from_base58(Multiaddr(maddr)["p2p"]) for maddr in self.initial_peers]
        started = time.monotonic()
        pings = [asyncio.create_task(self.dht.protocol.call_ping(peer, validate=True, strict=True)) for peer in peers]
        done, late = await asyncio.wait(pings, timeout=timeout_s)
        for ping in late:
            ping.cancel()
        answers: dict[PeerID, DHTID] = {}
        for peer, ping in zip(peers, pings):
            if ping not in done:
                continue
            try:
                node_id = ping.result()
            except ValidationError as err:  # it cannot reach us back, or our clocks disagree
                raise RuntimeError(str(err)) from None
            if node_id is not None:
                answers[peer] = node_id
        if not answers:
            raise RuntimeError("none of the initial peers answered a DHT ping")
        if not any(is_bound(node_id, peer) for peer, node_id in answers.items()):
            raise RuntimeError(
                "the initial peers answered, but none has a DHT id derived from its key: they run a swarmnode "
                "older than DHT namespace v4 (update them), or are not swarmnode nodes"
            )
        remaining_s = max(0.0, timeout_s - (time.monotonic() - started))
        self._first_lookup = asyncio.create_task(self.dht.find_nearest_nodes([self.dht.node_id]))
        await asyncio.wait([self._first_lookup], timeout=remaining_s)  # a late one goes on filling the table

    def dht_peer_count(self) -> int:
        """Peers in the DHT's routing table now (hivemind drops those that stop answering)."""
        return len(self.dht.protocol.routing_table.peer_id_to_uid) if self.dht is not None else 0

    async def _rejoin_when_alone(self) -> None:
        """Every `swarm.rejoin_interval_s`: a node whose routing table has emptied (its bootstrap
        peers went down, or its network did) dials its initial peers again and refills the table
        from them, so a swarm whose bootstrap node restarts comes back together by itself."""
        while True:
            await asyncio.sleep(self.settings.rejoin_interval_s)
            if self.dht_peer_count() > 0:
                continue
            for maddr in self.initial_peers:
                try:
                    await asyncio.wait_for(self._dial(maddr), timeout=self.settings.rejoin_interval_s)
                except Exception as err:  # down still: the next check tries again
                    log.debug("rejoining through %s: %s", maddr, err)
            if self.dht_peer_count() > 0:
                log.info("lost every DHT peer; rejoined through the initial peers (%d now)", self.dht_peer_count())
                await self.dht.find_nearest_nodes([self.dht.node_id])

    async def _dial(self, maddr: str) -> None:
        address = Multiaddr(maddr)
        peer = PeerID.from_base58(address["p2p"])
        transport = address.decapsulate(Multiaddr(f"/p2p/{address['p2p']}"))  # the daemon wants it without /p2p
        await self.p2p._client.connect(peer, [transport])  # hivemind exposes no public connect
        await self.dht.protocol.call_ping(peer)  # on an answer, hivemind adds it to the routing table

    async def _create_p2p(self, s: SwarmSettings) -> P2P:
        return await P2P.create(
            initial_peers=self.initial_peers or None,
            host_maddrs=s.host_maddrs,
            announce_maddrs=s.announce_maddrs or None,
            identity_path=str(self.identity_path) if self.identity_path else None,
            startup_timeout=s.startup_timeout_s,
            dht_mode="client" if self.client_mode else "server",
            use_auto_relay=s.auto_relay and not self.client_mode,
            nat_port_map=s.port_mapping and not stays_local(s.host_maddrs),
            trusted_relays=s.relays or None,
            force_reachability=None if self.client_mode else forced_reachability(s),
        )

    def _hint(self, reason: str) -> str:
        peers = self.initial_peers
        if "already taken" in reason:  # hivemind's check that no running peer has our key
            return (
                f"{reason}: another running node uses this identity key (a copied run dir, or "
                "--identity shared). Give each node its own --run-dir (or --identity)"
            )
        if peers:
            return (
                f"could not join the swarm through {', '.join(peers)}: {reason}. Check that a node is "
                "running there, that the address ends in /p2p/<peer id> and is reachable from here "
                "(firewall, NAT: the peer needs --announce-maddrs with its public address), and that "
                "clocks agree within a few seconds"
            )
        return f"could not start the p2p daemon: {reason}. Check --host-maddrs (is the port free?)"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run a coroutine on the swarm loop and wait for it; TimeoutError after `timeout`."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def visible_maddrs(self) -> list[str]:
        if self.p2p is None:
            return []
        maddrs = self.call(self.p2p.get_visible_maddrs(), timeout=10)
        return [str(m) for m in maddrs]

    # -- DHT records -------------------------------------------------------------------------

    def store_owned(self, key: str, value: bytes, ttl_s: float, timeout: float = 10.0) -> bool:
        """Store `value` under our own subkey of `key`; signed, so only we can overwrite it."""
        return self.call(self.store_owned_all([key], value, get_dht_time() + ttl_s), timeout)

    async def store_owned_all(self, keys: list[str], value: bytes, expiration: float) -> bool:
        """Store under our own subkey of each key in one lookup (a sharded record's levels);
        True when every key holds it. hivemind answers with the last replica's verdict, which
        is False when a peer's lookup had already cached the record there; so a False is
        checked by reading the key back."""
        subkey = self.signer.local_public_key
        stored = await self.dht.store_many(
            keys, [value] * len(keys), expiration, subkeys=[subkey] * len(keys), beam_size=LOOKUP_BEAM
        )
        unsure = [key for key in keys if not stored[key, subkey]]
        if not unsure:
            return True
        return all(dict(items).get(subkey) == value for items in await self.read_owned_many(unsure))

    async def read_owned_many(self, keys: list[str], timeout_s: float = 5.0) -> list[list[tuple[Any, Any]]]:
        """The (subkey, value) pairs under each of `keys`, looked up together (hivemind asks a
        node for several keys in one request). A key whose lookup fails or takes over
        `timeout_s` reads as empty; the others keep what they found, so one slow key (an
        empty one is looked up until the beam is exhausted) costs a read nothing else, and a
        slow or failing DHT read never stops the caller."""
        if not keys:
            return []
        deadline = time.monotonic() + timeout_s
        try:
            futures = await asyncio.wait_for(self._get_latest(keys, return_futures=True), timeout_s)
        except Exception as err:  # timeouts, dead DHT nodes, a daemon going down
            log.debug("reading %s: %s", keys, err)
            return [[] for _ in keys]
        _, unfinished = await asyncio.wait(set(futures.values()), timeout=max(0.0, deadline - time.monotonic()))
        for future in unfinished:
            future.cancel()  # hivemind stops looking for that key
        return [_items_of(futures[key]) for key in keys]

    def get_subkeys(self, key: str, timeout: float = 10.0) -> dict[Any, Any]:
        """All live subkey -> value pairs of a dictionary key (empty when none)."""

        async def fetch() -> dict[Any, Any]:
            return dict(subkey_items((await self._get_latest([key]))[key]))

        return self.call(fetch(), timeout)

    async def _get_latest(self, keys: list[str], return_futures: bool = False) -> dict[Any, Any]:
        """hivemind's lookup of the newest copy of each key among the LOOKUP_BEAM nodes nearest it."""
        return await self.dht.get_many(
            keys, sufficient_expiration_time=float("inf"), beam_size=LOOKUP_BEAM, return_futures=return_futures
        )

    def shutdown(self) -> None:
        """Stop the DHT node and the daemon, then the loop; safe to call twice."""
        if self.loop.is_closed():
            return

        async def stop() -> None:
            if self.dht is not None:
                await self.dht.shutdown()
            if self.p2p is not None:
                await self.p2p.shutdown()
            current = asyncio.current_task()
            pending = [t for t in asyncio.all_tasks() if t is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        if self._thread.is_alive():
            try:
                self.call(stop(), timeout=10)
            except Exception as err:  # shutting down: report, never raise
                log.debug("swarm shutdown: %s", err)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


def _items_of(future: asyncio.Future) -> list[tuple[Any, Any]]:
    """A finished lookup's (subkey, value) pairs; none when it failed or was cancelled."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return []
    return subkey_items(future.result())
