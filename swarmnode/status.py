"""How `swarmnode status` shows peers: a rich table, or JSON for scripts."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.table import Table

COLUMNS = [  # (title, justify); `filtered_frac` keeps the metric's one name
    ("peer", "left"), ("run", "left"), ("state", "left"), ("model", "left"), ("params", "right"),
    ("train", "left"), ("backend", "left"), ("device", "left"), ("round", "right"),
    ("reward", "right"), ("eval_acc", "right"), ("tok/s", "right"), ("published", "right"),
    ("consumed", "right"), ("filtered_frac", "right"), ("reach", "left"), ("version", "left"), ("uptime", "right"),
]
STATE_COLOURS = {"training": "green", "stale": "yellow", "left": "dim"}


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def render_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"swarmnode: {len(rows)} peer(s)", title_justify="left")
    for column, justify in COLUMNS:
        table.add_column(column, justify=justify, no_wrap=column in ("peer", "run"))
    for h in rows:
        params, lora, state = h.get("params"), h.get("lora") or 0, h["state"]
        table.add_row(
            f"…{h['peer'][-10:]}",
            h["run"][:8],
            f"[{STATE_COLOURS.get(state, 'white')}]{state}[/] ({h['age_s']:.0f}s)",
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
            _fmt(h.get("filtered_frac"), ".2f"),
            _fmt(h.get("reach")),
            _fmt(h.get("version")),
            f"{h.get('uptime_s', 0) / 60:.1f}m",
        )
    return table


def to_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps({"time": time.time(), "peers": rows}, indent=1, sort_keys=True)
