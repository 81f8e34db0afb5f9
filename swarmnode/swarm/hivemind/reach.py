"""How peers can reach this node: directly, through a relay, or not at all (behind NAT).

Most home GPUs sit behind NAT: they can dial out, but nobody can dial in, so peers could pull
their rollouts only over connections the volunteer happened to open. libp2p's answer is circuit
relay v2: the node reserves a slot on a public peer (a relay; the initial peers by default,
`swarm.relays` otherwise) and announces a `/p2p-circuit` address through it. What the node can
tell about itself before it starts decides what it asks the daemon for: a public address means
serving as a relay for others, no public address (and auto relay on) means using one.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Literal

from swarmnode.settings.config import SwarmSettings

Reach = Literal["direct", "relayed", "private", "local"]
PROBE_ADDRESS = ("192.0.2.1", 9)  # TEST-NET-1: connecting a UDP socket sends nothing, it picks a route

ADVICE: dict[str, str] = {
    "direct": "peers dial this node at its public address",
    "relayed": "peers reach this node through a relay (/p2p-circuit): slower than direct; forward a port and "
    "set --announce-maddrs for a direct path",
    "private": "no public address and no relay yet: peers can pull from this node only over connections it "
    "opened itself. Forward a TCP port and set --announce-maddrs /ip4/<public ip>/tcp/<port>, or keep "
    "swarm.auto_relay on (a relay reservation is made in the background)",
    "local": "loopback only: peers on this machine only",
}


def _ip_of(maddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    parts = str(maddr).split("/")
    for proto in ("ip4", "ip6"):
        if proto in parts and parts.index(proto) + 1 < len(parts):
            try:
                return ipaddress.ip_address(parts[parts.index(proto) + 1])
            except ValueError:
                return None
    return None


def default_route_ip() -> ipaddress.IPv4Address | None:
    """The address this host sends from by default, or None without a route (offline)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(PROBE_ADDRESS)
            return ipaddress.ip_address(probe.getsockname()[0])
    except OSError:
        return None


def listen_ips(settings: SwarmSettings) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses peers would dial: the announced ones, else the listening ones (an
    unspecified 0.0.0.0 stands for the default-route address)."""
    ips = []
    for maddr in settings.announce_maddrs or settings.host_maddrs:
        ip = _ip_of(maddr)
        if ip is not None and ip.is_unspecified:
            ip = default_route_ip()
        if ip is not None:
            ips.append(ip)
    return ips


def forced_reachability(settings: SwarmSettings) -> str | None:
    """What to tell the daemon's AutoNAT up front: 'public' for a node with a public address
    (it then serves as a relay for others at once), 'private' for one without any while auto
    relay is on (it then reserves a relay slot at once, instead of after AutoNAT's probes); none
    for loopback-only nodes (one machine: nothing to relay)."""
    ips = listen_ips(settings)
    if any(ip.is_global for ip in ips):
        return "public"
    if settings.auto_relay and ips and not all(ip.is_loopback for ip in ips):
        return "private"
    return None


def classify(visible_maddrs: list[str], announced: list[str]) -> Reach:
    """How peers reach us, from the addresses the daemon reports (and those we announce)."""
    addresses = [*announced, *visible_maddrs]
    if any(_ip_of(m) is not None and _ip_of(m).is_global and "p2p-circuit" not in str(m) for m in addresses):
        return "direct"
    if any("p2p-circuit" in str(m) for m in visible_maddrs):
        return "relayed"
    ips = [_ip_of(m) for m in addresses]
    if ips and all(ip is not None and ip.is_loopback for ip in ips):
        return "local"
    return "private"
