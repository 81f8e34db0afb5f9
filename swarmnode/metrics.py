"""Per-round metrics: one JSON line per round on disk, and a compact live line in the terminal."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console


class MetricsLog:
    """Appends one JSON object per line and flushes it, so a crash loses at most a line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps(clean, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class LiveView:
    """One short line per round; rich keeps it readable in a terminal and plain in a log."""

    def __init__(self, console: Console | None = None, quiet: bool = False) -> None:
        self.console = console or Console(stderr=True)
        self.quiet = quiet

    def round(self, m: dict[str, Any], total_rounds: int) -> None:
        if self.quiet:
            return
        acc = f" [bold]eval {m['eval_acc']:.3f}[/]" if m.get("eval_acc") is not None else ""
        self.console.print(
            f"[cyan]round {m['round'] + 1}/{total_rounds}[/] reward {m['reward_mean']:.3f} "
            f"own {m['own_samples']} peer {m['peer_samples']} filtered {m['filtered']} "
            f"w {m['weight_mean']:.3f}/{m['weight_max']:.2f} "
            f"{m['round_s']:.2f}s{acc}",
            highlight=False,
        )

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text, highlight=False)
