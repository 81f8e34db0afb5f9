"""Per-round metrics: one JSON line per round on disk, and a compact live line in the terminal."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console

from swarmnode.ops.lines import EvalRecord, RoundRecord, finite_or_none, is_eval, is_round
from swarmnode.ops.rundir import VIEW_LOGGER
from swarmnode.protocol.records import RecordError

log = logging.getLogger(__name__)
_file_log = logging.getLogger(VIEW_LOGGER)  # <run-dir>/node.log while a node runs (swarmnode.ops.rundir)


class MetricsLog:
    """Appends one JSON object per line and flushes it, so a crash loses at most a line. Each
    line carries the wall-clock `time` (Unix seconds) it was written at, so the lines of nodes
    that count their own rounds at their own speed can be laid side by side."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.lost = 0  # lines that could not be written (a full disk): said once, training goes on
        self.closed = False
        self._file: TextIO | None = self._open()

    def _open(self) -> TextIO:
        """The file for appending; a line cut short (a kill, a full disk) is ended first, so the
        next line stands on its own."""
        torn = self.path.exists() and self.path.stat().st_size > 0 and _last_byte(self.path) != b"\n"
        file = self.path.open("a", encoding="utf-8")
        if torn:
            file.write("\n")
        return file

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: finite_or_none(v) for k, v in record.items()}
        clean.setdefault("time", round(time.time(), 3))
        line = json.dumps(clean, sort_keys=True) + "\n"
        try:
            if self._file is None:  # the last write failed: a fresh handle, whose buffer holds no lost line
                self._file = self._open()
            self._file.write(line)
            self._file.flush()
        except OSError as err:
            if not self.lost:
                log.warning("cannot write %s (%s): training goes on without these lines; free space on that disk",
                            self.path, err.strerror or err)
            self.lost += 1
            self._drop_handle()

    def _drop_handle(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):  # closing flushes what the disk refused: refused again
                self._file.close()
        self._file = None

    def forget_from(self, round_: int) -> int:
        """Drop the lines of rounds `round_` and later (and, from round 0, the evaluation before
        it), which a restart does again: the file never holds a round twice. Rewritten whole,
        then renamed over the old one, so a crash leaves one or the other; the number of
        lines dropped."""
        self._drop_handle()
        kept, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines(keepends=True):
            try:
                logged = json.loads(line).get("round")
            except (ValueError, AttributeError):  # a torn line: kept as it was
                logged = None
            if isinstance(logged, int) and (logged >= round_ or (round_ == 0 and logged == -1)):
                dropped += 1
            else:
                kept.append(line)
        if dropped:
            staging = self.path.with_suffix(".jsonl.tmp")
            with staging.open("w", encoding="utf-8") as rewritten:
                rewritten.write("".join(kept))
                rewritten.flush()
                os.fsync(rewritten.fileno())  # on disk before it replaces the old file
            os.replace(staging, self.path)
        self._file = self._open()
        return dropped

    def set_aside(self) -> Path | None:
        """A start from round 1 over a file that holds rounds (no checkpoint, or --fresh):
        the file moves to metrics.<time>.jsonl, kept whole, and a new one begins; the path it
        moved to, or None when it held no round."""
        if not any(line.startswith("{") and '"round"' in line for line in self.path.read_text(encoding="utf-8").splitlines()):
            return None
        self._drop_handle()
        kept = self.path.with_name(f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
        os.replace(self.path, kept)
        self._file = self._open()
        return kept

    def close(self) -> None:
        self._drop_handle()
        self.closed = True


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as file:
        file.seek(-1, 2)
        return file.read(1)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The lines of a metrics.jsonl; a line torn by a kill mid-write is left out."""
    return parse_lines(path.read_text(errors="replace").splitlines())


def parse_lines(texts: list[str]) -> list[dict[str, Any]]:
    """The JSON objects among metrics lines; a torn line, or one that is no object, is left out."""
    lines = []
    for text in texts:
        with contextlib.suppress(ValueError):
            line = json.loads(text)
            if isinstance(line, dict):
                lines.append(line)
    return lines


def read_records(path: Path) -> tuple[list[RoundRecord], list[EvalRecord]]:
    """The round and eval records of a metrics.jsonl (none when it is not there yet), typed,
    from one read; lines of another version are left out."""
    lines = read_metrics(path) if path.exists() else []
    return _typed(lines, RoundRecord.from_json), _typed(lines, EvalRecord.from_json)


def read_rounds(path: Path) -> list[RoundRecord]:
    return read_records(path)[0]


def read_evals(path: Path, phase: str | None = None) -> list[EvalRecord]:
    """The evaluations of a metrics.jsonl, optionally of one phase."""
    return [e for e in read_records(path)[1] if phase is None or e.phase == phase]


def _typed(lines: list[dict[str, Any]], parse: Callable[[dict[str, Any]], Any]) -> list[Any]:
    typed = []
    for line in lines:
        with contextlib.suppress(RecordError):
            typed.append(parse(line))
    return typed


def round_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The training rounds of a metrics.jsonl (RoundRecord lines)."""
    return [line for line in lines if is_round(line)]


def eval_lines(lines: list[dict[str, Any]], phase: str | None = None) -> list[dict[str, Any]]:
    """The evaluations of a metrics.jsonl (EvalRecord lines), optionally of one phase."""
    return [line for line in lines if is_eval(line, phase)]


ETA_WEIGHT = 0.2  # how far one round's wall time moves the per-round estimate behind the ETA


class LiveView:
    """One short line per round; rich keeps it readable in a terminal and plain in a log."""

    def __init__(
        self, console: Console | None = None, quiet: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.console = console or Console(stderr=True)
        self.quiet = quiet
        self.clock = clock
        self._last_at: float | None = None
        self._per_round_s: float | None = None  # moving mean of the wall time between rounds

    def round(self, m: RoundRecord, total_rounds: int) -> None:
        head = f"round {m.round + 1}/{total_rounds}"
        round_s = m.timings.get("round_s", 0.0)
        took = f"{round_s:.0f}s" if round_s >= 10 else f"{round_s:.1f}s"
        rest = (  # within 80 columns up to 1000 rounds, 3-digit sample counts and 2-digit filter counts
            f"reward {m.reward_mean:.3f} own {m.own_samples} peer {m.peer_samples}"
            + (f" filt {m.filtered}" if m.filtered else "")
            + f" w {m.weight_mean:.2f}/{m.weight_max:.1f} {took} eta {format_duration(self._eta(m, total_rounds))}"
        )
        _file_log.info(f"{head} {rest}")
        if not self.quiet:
            self.console.print(f"[cyan]{head}[/] {rest}", highlight=False)

    def _eta(self, m: RoundRecord, total_rounds: int) -> float:
        """Seconds until the last round, from the wall time between rounds (evaluations and
        checkpoints included); the first round after a start is judged by its own time."""
        now = self.clock()
        gap = m.timings.get("round_s", 0.0) if self._last_at is None else now - self._last_at
        self._last_at = now
        self._per_round_s = gap if self._per_round_s is None else self._per_round_s + ETA_WEIGHT * (gap - self._per_round_s)
        return max(0, total_rounds - (m.round + 1)) * self._per_round_s

    def note(self, text: str) -> None:
        _file_log.info(text)
        if not self.quiet:
            self.console.print(text, highlight=False, markup=False)  # text, never markup: '[wandb]' stays

    def say(self, text: str) -> None:
        """Start-up messages (addresses, the join command): shown even when quiet."""
        _file_log.info(text)
        self.console.print(text, highlight=False, soft_wrap=True, markup=False)

    @contextlib.contextmanager
    def busy(self, text: str) -> Iterator[None]:
        """A spinner while something slow runs (daemon start, waiting for a file)."""
        with self.console.status(text):
            yield


def format_duration(seconds: float) -> str:
    """2h05m, 3m12s, 45s: short enough for the live line."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
