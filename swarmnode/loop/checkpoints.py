"""A node's checkpoints: the model, and what else a resumed node must keep.

A checkpoint holds the trained weights (swarmnode.model.checkpoint) and, in its meta.json, the
run id and the last round done, plus the state of each part that learned something about the
run that the weights do not hold: the anchored gate's bar (the screener), the order its peers
earned (the ledger's seniority), the share of its batch it generates and what its rounds cost
(the running seconds that price far groups on top). Each such part says
what it keeps (`checkpoint_state`) and takes it back (`restore`); a meta.json key it does not
find is state it measures afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from swarmnode.model.checkpoint import DISK_ERRORS, CheckpointWriter, checkpoint_present, load_checkpoint
from swarmnode.model.policy import Policy
from swarmnode.settings.config import NodeSettings


class Resumable(Protocol):
    """A part of a node whose state a checkpoint keeps beside the weights."""

    def checkpoint_state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Resumed:
    """Where a checkpoint leaves a node."""

    next_round: int
    written_at: str  # when the checkpoint was written, local time


class NodeCheckpoints:
    """When to checkpoint, what a checkpoint's meta.json holds, and resuming from one."""

    def __init__(
        self, writer: CheckpointWriter, policy: Policy, settings: NodeSettings, run_id: str, peer_id: str,
        parts: list[Resumable], say: Callable[[str], None],
    ) -> None:
        self.writer = writer  # off the round's path where memory allows
        self.policy = policy
        self.settings = settings
        self.run_id = run_id
        self.peer_id = peer_id
        self.parts = parts
        self.say = say  # a warning for the person running the node
        self._saved_at = time.monotonic()  # the last checkpoint, or the start

    @property
    def directory(self) -> Path:
        return self.writer.directory

    def started(self) -> None:
        """The run's rounds begin: the time to the next checkpoint counts from now."""
        self._saved_at = time.monotonic()

    def due(self, round_: int) -> bool:
        """Every `node.checkpoint_every` rounds, and whenever `node.checkpoint_every_s` passed
        since the last one (slow rounds on a big model lose minutes, not hours, to a kill)."""
        by_rounds = bool(self.settings.checkpoint_every) and (round_ + 1) % self.settings.checkpoint_every == 0
        by_time = bool(self.settings.checkpoint_every_s) and time.monotonic() - self._saved_at >= self.settings.checkpoint_every_s
        return by_rounds or by_time

    def save(self, last_round: int, wait: bool = True) -> bool:
        """Checkpoint the state after `last_round`; with `wait` False the files are written
        while the next rounds run (a kill before they are renamed into place keeps the last).
        False when the disk refused it: training goes on, the last checkpoint written stays,
        and the node says so."""
        meta: dict[str, Any] = {"run_id": self.run_id, "peer_id": self.peer_id, "time": round(time.time(), 3)}
        for part in self.parts:
            meta.update(part.checkpoint_state())
        self._saved_at = time.monotonic()
        try:
            self.writer.wait()  # the write before this one, in the background
        except DISK_ERRORS as err:
            self._not_saved(err)
        try:
            self.writer.save(last_round, meta, wait=wait)
        except DISK_ERRORS as err:  # a full or failing disk: the last checkpoint written stays, training goes on
            self._not_saved(err)
            return False
        return True

    def _not_saved(self, err: Exception) -> None:
        detail = err.strerror if isinstance(err, OSError) and err.strerror else str(err)[:200]
        self.say(
            f"warning: a checkpoint could not be written in {self.directory} ({detail}); "
            "training goes on and the last checkpoint written stays: free space on that disk, or stop and "
            "start again with another --run-dir"
        )

    def resume(self) -> Resumed | None:
        """Load the run dir's checkpoint when there is one (and `node.resume` is on), its parts'
        state with it; ValueError when it belongs to another run."""
        if not (self.settings.resume and checkpoint_present(self.directory)):
            return None
        meta = load_checkpoint(self.policy, self.directory)
        saved = meta.get("time")
        written_at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(saved)) if saved else "unknown time"
        if meta.get("run_id") != self.run_id:
            raise ValueError(
                f"{self.directory} belongs to run {meta.get('run_id')}, not {self.run_id}: "
                "the settings changed; use a new --run-dir or set node.resume=false"
            )
        for part in self.parts:
            part.restore(meta)
        return Resumed(int(meta["round"]) + 1, written_at)

    def wait(self) -> None:
        """Finish a checkpoint being written."""
        self.writer.wait()
