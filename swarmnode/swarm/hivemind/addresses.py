"""Multiaddr checks, done before anything starts, with the parser hivemind ships."""

from __future__ import annotations

from hivemind.utils.multiaddr import Multiaddr

from swarmnode.settings.config import SwarmSettings


class AddressError(ValueError):
    """A multiaddr that cannot be used; the message names the setting and an example."""


def check_multiaddr(text: str, setting: str, needs_peer_id: bool = False) -> None:
    try:
        maddr = Multiaddr(text)
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
