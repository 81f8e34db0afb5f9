"""What `swarmnode status` reads: every peer's heartbeat in the DHT, with its age and state.

Heartbeats live under one DHT key for all runs, so one read shows the whole swarm; each row
says which run the peer is in. A heartbeat older than `stale_after_s` is shown as stale; one
the peer marked 'left' as left. Records expire from the DHT a minute after the last beat.
"""

from __future__ import annotations

import logging
from typing import Any

from hivemind.utils.timed_storage import get_dht_time

from swarmnode.config import SwarmSettings
from swarmnode.records import RecordError
from swarmnode.swarm.hivemind.dht import HEARTBEAT_KEY, heartbeat_from_record
from swarmnode.swarm.hivemind.runtime import SwarmRuntime

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def open_status_client(initial_peers: list[str], timeout_s: float) -> SwarmRuntime:
    """A DHT client on a throwaway identity: reads the swarm, stores nothing, listens on
    loopback only. Raises SwarmError when no initial peer answers; the caller shuts it down."""
    logging.getLogger("hivemind").setLevel(logging.WARNING)  # the daemon's start-up chatter is not status
    settings = SwarmSettings(initial_peers=initial_peers, host_maddrs=LOOPBACK, startup_timeout_s=timeout_s)
    runtime = SwarmRuntime(settings, client_mode=True)
    runtime.start()
    return runtime


def read_heartbeats(runtime: SwarmRuntime, stale_after_s: float) -> list[dict[str, Any]]:
    """Every valid heartbeat as a row, with 'age_s' and the shown 'state' (training, stale, left)."""
    rows = []
    for subkey, raw in runtime.get_subkeys(HEARTBEAT_KEY, timeout=30).items():
        try:
            heartbeat = heartbeat_from_record(subkey, raw)
        except RecordError:
            continue  # malformed: status shows only what a node would accept
        row = heartbeat.model_dump()
        row["age_s"] = round(max(0.0, get_dht_time() - heartbeat.time), 1)
        if heartbeat.state != "left" and row["age_s"] > stale_after_s:
            row["state"] = "stale"
        rows.append(row)
    return sorted(rows, key=lambda h: (h["run"], h["state"] != "training", h["peer"]))
