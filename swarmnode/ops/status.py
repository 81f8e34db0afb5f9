"""How `swarmnode status` shows peers: a rich table, or JSON for scripts."""

from __future__ import annotations

import json
import time
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from swarmnode.protocol.records import EVAL_HISTORY, Heartbeat, PeerRow, claimed_use_of, short_peer

COLUMNS = [  # (title, justify, in the narrow table); `filtered_frac` keeps the metric's one name
    ("peer", "left", True), ("run", "left", True), ("answered", "left", True), ("state", "left", True),
    ("model", "left", True), ("family", "left", False),
    ("params", "right", False), ("train", "left", True), ("backend", "left", False), ("device", "left", False),
    ("round", "right", True), ("reward", "right", False), ("eval_acc", "right", True), ("tok/s", "right", False),
    ("published", "right", False), ("consumed", "right", False), ("used yours", "right", False),
    ("you used", "right", False), ("filtered_frac", "right", False),
    ("reach", "left", False), ("version", "left", False), ("uptime", "right", False),
]
BESIDE_A_NODE = ("used yours", "you used")  # columns shown only by a status run beside a node (its run dir)
CAPTION = ("answered: checked by this status (a direct request, and its path); the rest is each peer's claim; "
           "state: training only for a peer that answered (silent: claims it, did not answer)")

STATE_COLOURS = {"training": "green", "stale": "yellow", "left": "dim", "silent": "red"}


SPARKS = "▁▂▃▄▅▆▇█"
NARROW_EVALS = 4  # evaluations drawn in 80 columns (--wide and --json: all a heartbeat carries)
FLAT_BELOW = 0.01  # accuracies this close together are drawn flat, not as noise blown up


def sparkline(values: list[float]) -> str:
    """The last evaluations at a glance, scaled between their own lowest and highest (a
    change under FLAT_BELOW is drawn flat); empty for fewer than two."""
    if len(values) < 2:
        return ""
    low, high = min(values), max(values)
    if high - low < FLAT_BELOW:
        return SPARKS[0] * len(values)
    return "".join(SPARKS[round((v - low) / (high - low) * (len(SPARKS) - 1))] for v in values)


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def _cells(row: PeerRow, wide: bool, you: Heartbeat | None = None) -> dict[str, str]:
    h = row.heartbeat
    mine = you is not None and h.peer == you.peer
    return {
        "peer": escape(short_peer(h.peer)),
        "run": escape(h.run[:8]),
        "answered": _answered(row),
        "state": f"[{STATE_COLOURS.get(row.state, 'white')}]{row.state}[/] {row.age_s:.0f}s",
        # in 80 columns the hub's organisation can go: the model's own name says what it is
        "model": escape(_fmt(h.model) if wide else _fmt(h.model).rsplit("/", 1)[-1]),
        "family": escape(_fmt(h.tokenizer and h.tokenizer[:8])),
        "params": f"{h.params / 1e6:.2f}M" if h.params is not None else "-",
        "train": f"LoRA r={h.lora}" if h.lora else "full",
        "backend": escape(_fmt(h.backend)),
        "device": escape(_fmt(h.device)),
        "round": _fmt(h.round),
        "reward": _fmt(h.reward, ".3f"),
        "eval_acc": " ".join(filter(None, [
            _fmt(h.eval_acc, ".3f"), sparkline(h.evals[-(EVAL_HISTORY if wide else NARROW_EVALS):]),
        ])),
        "tok/s": _fmt(h.tokens_per_s, ".0f"),
        "published": _fmt(h.published),
        "consumed": _fmt(h.consumed),
        # its claim of our completions it trained on (at most what we published), and our own count of its
        "used yours": "you" if mine else _fmt(you and min(h.used.get(you.peer, 0), you.published)),
        "you used": "-" if mine or you is None else _fmt(you.used.get(h.peer, 0)),
        "filtered_frac": _fmt(h.filtered_frac, ".2f"),
        "reach": escape(_fmt(h.reach)),
        "version": escape(_fmt(h.version)),
        "uptime": f"{h.uptime_s / 60:.1f}m",
    }


def _answered(row: PeerRow) -> str:
    """What this reader checked: the answer's time and path, 'no', or '-' (not asked)."""
    if row.answered_ms is not None:
        took = f"{row.answered_ms:.0f}ms" if row.answered_ms < 1000 else f"{row.answered_ms / 1000:.1f}s"
        return f"{took} {row.reached or ''}".strip()
    return "[red]no[/]" if row.asked else "-"


def contribution(rows: list[PeerRow], me: str | None) -> str | None:
    """'Is my node counted and useful?' for the node `me` (status run beside it): what it
    published, what the other live peers claim to have trained on (their claims, each at
    most what it published), and whose samples it trained on (its own count)."""
    you = next((row.heartbeat for row in rows if row.heartbeat.peer == me), None)
    if you is None:
        return None
    others = [row.heartbeat for row in rows if row.heartbeat.peer != me and row.state != "left"]
    claimed, claimants = claimed_use_of(you.peer, others, you.published)
    return (f"you ({short_peer(you.peer)}): published {you.published} completions, {claimants} peer(s) claim to have "
            f"trained on {claimed} of them; you trained on {you.consumed} of your peers' completions")


def render_table(rows: list[PeerRow], wide: bool = False, me: str | None = None) -> Table:
    """The peers as a table: by default the columns that fit 80 characters (peer, whether
    it answered us and by which path, then its claims: state, model, training, round,
    held-out accuracy with its last evaluations drawn), `wide` for every column (with the
    reach it claims).
    One run shows in the title instead of a column; so does the number of families (the
    tokenizers peers claim) when there are several, which `wide` names row by row."""
    runs = sorted({row.heartbeat.run for row in rows})
    one_run = len(runs) == 1
    families = len({row.heartbeat.tokenizer for row in rows})
    title = (f"swarmnode: {len(rows)} peer(s)" + (f" of {families} families" if families > 1 else "")
             + (f" in run {escape(runs[0][:16])}" if one_run else ""))
    said = contribution(rows, me)
    if said:
        title += "\n" + escape(said)
    you = next((row.heartbeat for row in rows if row.heartbeat.peer == me), None)
    shown = [(name, justify) for name, justify, narrow in COLUMNS
             if (wide or narrow) and not (name == "run" and one_run and not wide)
             and not (name in BESIDE_A_NODE and you is None)]
    table = Table(title=title, title_justify="left", caption=CAPTION, caption_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column, justify in shown:
        table.add_column(column, justify=justify, no_wrap=column in ("peer", "run", "answered", "state", "eval_acc"),
                         min_width=10 if column == "model" else None,
                         overflow="fold" if column == "model" else "ellipsis")
    for row in rows:
        cells = _cells(row, wide, you)
        table.add_row(*(cells[name] for name, _ in shown))
    return table


def to_json(rows: list[PeerRow]) -> str:
    return json.dumps({"time": time.time(), "peers": [row.to_json() for row in rows]}, indent=1, sort_keys=True)
