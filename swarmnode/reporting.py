"""Where a node's round and eval records go besides metrics.jsonl: `report.to`.

Like TRL's `report_to`: TensorBoard event files in `<run-dir>/tensorboard` (or `report.dir`)
that `tensorboard --logdir` reads; the library is an optional extra (`pip install
'swarmnode[report]'`), asked for only when a reporter is configured. Steps are rounds
finished (0 = before training), so round lines and evaluations share one axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarmnode.config import ReportSettings
from swarmnode.records import EvalRecord, RoundRecord

ROUND_SCALARS = (  # RoundRecord fields written each round, as round/<name>
    "reward_mean", "peer_reward_mean", "own_samples", "peer_samples", "peers", "gated", "filtered_frac",
    "weight_mean", "weight_max", "truncated_frac", "divergence_mean", "loss", "grad_norm", "tokens_per_s",
    "peer_age_s", "peer_lag", "rejected",
)


class ReportError(RuntimeError):
    """A reporter was asked for but cannot run here (its library is not installed)."""


class TensorBoardReporter:
    def __init__(self, directory: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
        except ImportError as err:
            raise ReportError(
                f"report.to tensorboard needs the tensorboard package: pip install 'swarmnode[report]' ({err})"
            ) from None
        self.directory = directory
        self.writer = SummaryWriter(log_dir=str(directory))

    def round(self, record: RoundRecord) -> None:
        step = record.round + 1
        for name in ROUND_SCALARS:
            value = getattr(record, name)
            if value is not None:
                self.writer.add_scalar(f"round/{name}", value, step)
        for name, seconds in record.timings.items():
            self.writer.add_scalar(f"time/{name}", seconds, step)

    def eval(self, record: EvalRecord) -> None:
        self.writer.add_scalar("eval/eval_acc", record.eval_acc, record.round + 1)
        if record.ood_acc is not None:
            self.writer.add_scalar("eval/ood_acc", record.ood_acc, record.round + 1)
        self.writer.flush()  # evaluations are rare and what people watch

    def close(self) -> None:
        self.writer.close()


class Reporters:
    """Every configured reporter; the node hands each of its records to all of them."""

    def __init__(self, reporters: list[Any] | None = None) -> None:
        self.reporters = reporters or []

    def round(self, record: RoundRecord) -> None:
        for reporter in self.reporters:
            reporter.round(record)

    def eval(self, record: EvalRecord) -> None:
        for reporter in self.reporters:
            reporter.eval(record)

    def close(self) -> None:
        for reporter in self.reporters:
            reporter.close()


def make_reporters(settings: ReportSettings, run_dir: Path) -> Reporters:
    """The reporters `report.to` names; ReportError when one cannot run here."""
    made: list[Any] = []
    for name in settings.to:
        if name == "tensorboard":
            made.append(TensorBoardReporter(Path(settings.dir) if settings.dir else run_dir / "tensorboard"))
    return Reporters(made)
