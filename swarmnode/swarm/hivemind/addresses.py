"""Multiaddr checks, done before anything starts, with the parser hivemind ships.

That parser is a package of its own inside hivemind (hivemind/utils/multiaddr, vendored from
py-multiaddr). Importing it by its name imports hivemind first, and hivemind imports torch:
4 s before a typo could be reported. So it is loaded here from its directory under a name of
its own, which imports only what it needs (varint, netaddr, base58).
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from swarmnode.settings.config import SwarmSettings

_PARSER_MODULE = "_swarmnode_multiaddr"  # hivemind's multiaddr package, under its own name


@cache
def _parser() -> ModuleType:
    """hivemind's multiaddr package, loaded without importing hivemind."""
    hivemind = importlib.util.find_spec("hivemind")
    if hivemind is None or hivemind.origin is None:
        raise ImportError("hivemind is not installed")
    root = Path(hivemind.origin).parent / "utils" / "multiaddr"
    spec = importlib.util.spec_from_file_location(_PARSER_MODULE, root / "__init__.py",
                                                  submodule_search_locations=[str(root)])
    if spec is None or spec.loader is None:
        raise ImportError(f"hivemind's multiaddr parser is not at {root}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_PARSER_MODULE] = module  # its codecs import themselves relative to it
    spec.loader.exec_module(module)
    return module


HOST_PROTOCOLS = ("ip4", "ip6", "dns", "dns4", "dns6")


class AddressError(ValueError):
    """A multiaddr that cannot be used; the message names the setting and an example."""


def check_multiaddr(text: str, setting: str, needs_peer_id: bool = False) -> None:
    try:
        maddr = _parser().Multiaddr(text)
    except Exception as err:  # the multiaddr parser raises several unrelated types
        raise AddressError(f"{setting}: {text!r} is not a multiaddr ({err}); e.g. /ip4/1.2.3.4/tcp/31337") from None
    if needs_peer_id and "p2p" not in str(maddr).split("/"):
        raise AddressError(f"{setting}: {text!r} lacks /p2p/<peer id>; copy the address a node prints at start")


def check_swarm_addresses(settings: SwarmSettings, initial_peers: list[str] | None = None) -> None:
    """Every address of the settings (and extra initial peers), or AddressError for the first bad one."""
    for text in [*settings.initial_peers, *(initial_peers or [])]:
        check_multiaddr(text, "swarm.initial_peers", needs_peer_id=True)
    for text in settings.host_maddrs:
        check_multiaddr(text, "swarm.host_maddrs")
    for text in settings.announce_maddrs:
        check_multiaddr(text, "swarm.announce_maddrs")
    for text in settings.relays:
        check_multiaddr(text, "swarm.relays", needs_peer_id=True)


def tcp_endpoint(text: str) -> tuple[str, int] | None:
    """The (host, port) a multiaddr dials first over TCP (for a relayed address: the relay's),
    or None where it has no host followed by a TCP port, or does not parse."""
    try:
        parts = list(_parser().Multiaddr(text).items())
    except Exception:  # the multiaddr parser raises several unrelated types
        return None
    for (protocol, host), (transport, port) in zip(parts, parts[1:]):
        if protocol.name in HOST_PROTOCOLS and transport.name == "tcp":
            return host, int(port)
    return None
