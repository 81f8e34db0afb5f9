"""`swarmnode status`: read every peer's heartbeat from the DHT and show them.

Heartbeats live under one DHT key for all runs, so one command shows the whole swarm; each row
says which run the peer is in. A heartbeat older than `stale_after_s` is shown as stale; one
the peer marked 'left' as left. Records expire from the DHT a minute after the last beat.
"""

from __future__ import annotations

import json
from typing import Any

from hivemind.utils.timed_storage import get_dht_time
from rich.table import Table

from swarmnode.swarm.records import HEARTBEAT_KEY, RecordError, heartbeat_from_record
from swarmnode.swarm.runtime import SwarmRuntime


def read_heartbeats(runtime: SwarmRuntime, stale_after_s: float = 20.0) -> list[dict[str, Any]]:
    """Every valid heartbeat, newest state per peer, with 'age_s' and 'state' filled in."""
    rows = []
    for subkey, raw in runtime.get_subkeys(HEARTBEAT_KEY, timeout=30).items():
        try:
            heartbeat = heartbeat_from_record(subkey, raw)
        except RecordError:
            continue  # malformed: status shows only what a node would accept
        heartbeat["age_s"] = round(max(0.0, get_dht_time() - heartbeat["time"]), 1)
        if heartbeat.get("state") != "left" and heartbeat["age_s"] > stale_after_s:
            heartbeat["state"] = "stale"
        heartbeat.setdefault("state", "training")
        rows.append(heartbeat)
    return sorted(rows, key=lambda h: (h["run"], h["state"] != "training", h["peer"]))


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def render_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"swarmnode: {len(rows)} peer(s)", title_justify="left")
    for column, justify in [
        ("peer", "left"), ("run", "left"), ("state", "left"), ("model", "left"), ("params", "right"),
        ("train", "left"), ("backend", "left"), ("device", "left"), ("round", "right"),
        ("reward", "right"), ("eval", "right"), ("tok/s", "right"), ("pub", "right"),
        ("used", "right"), ("filtered", "right"), ("version", "left"), ("uptime", "right"),
    ]:
        table.add_column(column, justify=justify, no_wrap=column in ("peer", "run"))
    colours = {"training": "green", "stale": "yellow", "left": "dim"}
    for h in rows:
        params = h.get("params")
        lora = h.get("lora") or 0
        state = h["state"]
        table.add_row(
            f"…{h['peer'][-10:]}",
            h["run"][:8],
            f"[{colours.get(state, 'white')}]{state}[/] ({h['age_s']:.0f}s)",
            _fmt(h.get("model")),
            f"{params / 1e6:.2f}M" if isinstance(params, (int, float)) else "-",
            f"LoRA r={lora}" if lora else "full",
            _fmt(h.get("backend")),
            _fmt(h.get("device")),
            _fmt(h.get("round")),
            _fmt(h.get("reward"), ".3f"),
            _fmt(h.get("eval_acc"), ".3f"),
            _fmt(h.get("tokens_per_s"), ".0f"),
            _fmt(h.get("published")),
            _fmt(h.get("consumed")),
            _fmt(h.get("filter_rate"), ".2f"),
            _fmt(h.get("version")),
            f"{h.get('uptime_s', 0) / 60:.1f}m",
        )
    return table


def to_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps({"time": get_dht_time(), "peers": rows}, indent=1, sort_keys=True)
