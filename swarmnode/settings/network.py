"""Addresses every part of a node agrees on."""

from __future__ import annotations

import ipaddress

LOCAL_HOST = "127.0.0.1"  # this machine (or container) only: /health, tests, local swarms


def is_loopback(maddr: str) -> bool:
    """Whether a multiaddr listens or points on this machine only (/ip4/127.x, /ip6/::1)."""
    parts = maddr.strip("/").split("/")
    if len(parts) < 2 or parts[0] not in ("ip4", "ip6"):
        return False
    try:
        return ipaddress.ip_address(parts[1]).is_loopback
    except ValueError:
        return False


def stays_local(host_maddrs: list[str]) -> bool:
    """A node listening on loopback only: it has nothing to map on a gateway."""
    return bool(host_maddrs) and all(is_loopback(maddr) for maddr in host_maddrs)
