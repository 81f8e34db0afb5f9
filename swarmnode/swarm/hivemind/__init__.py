"""The swarm over hivemind: what the composition root, the commands and the checks use of it.

Inside, each module has one job: the runtime (the DHT node and the p2p daemon on a loop of
their own), identities, records and shards in the DHT, the payload protocol (payloads serves,
fetch asks), downloads, announcing, introductions, the exchange and membership built on them,
and the light parts (addresses, swarm files, reach) that a command reads before any of that
starts. The face names what is used from outside. Each name loads its module on first use, so
a command that only checks an address or reads a swarm file does not import hivemind and
torch, which take seconds.
"""

# ruff: noqa: F401  (the names under TYPE_CHECKING are the face's, loaded by __getattr__)
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_FACE = {  # name -> the module of this package that holds it
    "attach": "connect", "announce_address": "connect", "identity_path_of": "connect",
    "initial_peers_of": "connect", "start_runtime": "connect",
    "SwarmError": "runtime", "SwarmRuntime": "runtime",
    "IdentityError": "identity",
    "open_status_client": "status", "peer_rows": "status",
    "AddressError": "addresses", "check_multiaddr": "addresses", "check_swarm_addresses": "addresses",
    "tcp_endpoint": "addresses",
    "PeersFileError": "swarm_file", "read_peers_file": "swarm_file", "swarm_file_peer_id": "swarm_file",
    "ADVICE": "reach", "listen_ips": "reach",
}
__all__ = sorted(_FACE)

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from swarmnode.swarm.hivemind.addresses import (
        AddressError,
        check_multiaddr,
        check_swarm_addresses,
        tcp_endpoint,
    )
    from swarmnode.swarm.hivemind.connect import (
        announce_address,
        attach,
        identity_path_of,
        initial_peers_of,
        start_runtime,
    )
    from swarmnode.swarm.hivemind.identity import IdentityError
    from swarmnode.swarm.hivemind.reach import ADVICE, listen_ips
    from swarmnode.swarm.hivemind.runtime import SwarmError, SwarmRuntime
    from swarmnode.swarm.hivemind.status import open_status_client, peer_rows
    from swarmnode.swarm.hivemind.swarm_file import PeersFileError, read_peers_file, swarm_file_peer_id


def __getattr__(name: str) -> Any:
    """A name of the face, from its module (imported now if it was not)."""
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
