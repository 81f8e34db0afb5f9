"""A local node's own curves for the swarm page, read from its run dir's metrics.jsonl.

These are the node's own records (not a peer's claims): its reward, held-out accuracy, the
peers' share of what it trained on, the importance weights, what F-TIS filtered and how long
a round took, and whose samples it trained on (checked, for this node only; its MAX_SOURCES
largest sources). The file is read again only when it changed, and then only its last
TAIL_BYTES (a day's run is tens of megabytes), of which the last MAX_ROUNDS rounds are drawn.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

from swarmnode.ops.metrics import eval_lines, parse_lines, round_lines

MAX_ROUNDS = 5000  # rounds drawn: a day of 17-second rounds
TAIL_BYTES = 8 * 1024 * 1024  # what is read of the file: more than MAX_ROUNDS lines of about 1 KB
MAX_SOURCES = 64  # peers whose samples the node trained on, shown: the largest sources
METRICS_FILE = "metrics.jsonl"


class NodeCurves:
    """The curves of the node whose run dir is `run_dir`, re-read when its file changes."""

    def __init__(self, run_dir: Path, peer_id: str | None = None) -> None:
        self.path = run_dir / METRICS_FILE
        self.peer_id = peer_id
        self._stamp: tuple[float, int] | None = None
        self._curves: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any] | None:
        """The curves as the page draws them; None while the node has written nothing."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        stamp = (stat.st_mtime, stat.st_size)
        if stamp != self._stamp:
            self._stamp, self._curves = stamp, curves(tail_lines(self.path), self.peer_id)
        return self._curves


def tail_lines(path: os.PathLike[str], tail_bytes: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The JSON objects of the file's last `tail_bytes` (the first, cut line dropped); a line
    torn by a kill mid-write or not an object is left out."""
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        file.seek(max(0, size - tail_bytes))
        text = file.read().decode(errors="replace")
    return parse_lines(text.splitlines()[1:] if size > tail_bytes else text.splitlines())


def curves(lines: list[dict[str, Any]], peer_id: str | None = None) -> dict[str, Any]:
    """Series against time (the node's clock) from metrics lines, and whose samples the node
    trained on over the rounds drawn (its `samples_by_peer`: checked edges into `peer_id`)."""
    rounds = [line for line in round_lines(lines) if _number(line.get("time")) is not None][-MAX_ROUNDS:]
    evals = [line for line in eval_lines(lines) if _number(line.get("time")) is not None][-MAX_ROUNDS:]
    used: Counter[str] = Counter()
    for line in rounds:
        by_peer = line.get("samples_by_peer")
        if isinstance(by_peer, dict):
            used.update({str(peer): n for peer, n in by_peer.items() if type(n) is int and n > 0})
    trained = [(_number(line.get("own_samples")) or 0) + (_number(line.get("peer_samples")) or 0) for line in rounds]
    return {
        "peer": peer_id,
        "t": [line["time"] for line in rounds],
        "round": [_number(line.get("round")) for line in rounds],
        "reward": [_number(line.get("reward_mean")) for line in rounds],
        "peer_share": [(_number(line.get("peer_samples")) or 0) / n if n else None for line, n in zip(rounds, trained)],
        "weight_mean": [_number(line.get("weight_mean")) for line in rounds],
        "filtered_frac": [_number(line.get("filtered_frac")) for line in rounds],
        "round_s": [_number(line.get("round_s")) for line in rounds],
        "eval_t": [line["time"] for line in evals],
        "eval_acc": [_number(line.get("eval_acc")) for line in evals],
        "edges": [{"from": peer, "to": peer_id, "count": n, "checked": True}
                  for peer, n in used.most_common(MAX_SOURCES)]
        if peer_id else [],
    }


def _number(value: Any) -> float | None:
    """A finite number, else None (a line may hold NaN, which JSON cannot carry)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None
