"""Where a node's round and eval records go besides metrics.jsonl: `report.to`.

Like TRL's `report_to`: TensorBoard event files in `<run-dir>/tensorboard` (or `report.dir`)
that `tensorboard --logdir` reads, a Weights & Biases run, a trackio run. Each library is an
optional extra (`pip install 'swarmnode[report]'`, `'swarmnode[wandb]'`, `'swarmnode[trackio]'`),
imported only when its reporter is configured. Steps are rounds finished (0 = before
training), so round lines and evaluations share one axis. W&B and trackio runs get the
node's whole config and its facts (peer id, run id, model) and resume the same run after a
restart of the same node.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from swarmnode.ops.lines import EvalRecord, RoundRecord, round_metrics
from swarmnode.settings.config import ReportSettings
from swarmnode.tasks.base import fingerprint_of

ROUND_SCALARS = tuple(round_metrics("report"))  # RoundRecord fields written each round, as round/<name>


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
        self._writer_of = SummaryWriter
        self.writer = SummaryWriter(log_dir=str(directory))

    def restart_at(self, step: int) -> None:
        """Steps from `step` on are done again (a restart after the last checkpoint): TensorBoard
        drops what earlier files logged from there, so no curve doubles back."""
        self.writer.close()
        self.writer = self._writer_of(log_dir=str(self.directory), purge_step=step)

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


class TrackerReporter:
    """A W&B or trackio run: both libraries take `init(project, name, config, resume)` and a
    run's `log(metrics, step)` and `finish()`."""

    EXTRAS = {"wandb": "wandb", "trackio": "trackio"}

    def __init__(
        self, library: str, project: str, name: str, config: dict[str, Any], run_key: str, run_dir: Path
    ) -> None:
        try:
            module = importlib.import_module(library)
        except ImportError as err:
            raise ReportError(
                f"report.to {library} needs the {library} package: pip install 'swarmnode[{self.EXTRAS[library]}]' ({err})"
            ) from None
        kwargs: dict[str, Any] = {"project": project, "name": name, "config": config, "resume": "allow"}
        if library == "wandb":
            kwargs["id"] = run_key  # the same node resumes its own W&B run after a restart
            kwargs["dir"] = str(run_dir)  # wandb's files beside the node's, not in the working dir
        try:
            self.run = module.init(**kwargs)
        except Exception as err:  # a tracker that cannot start (no login, no disk) stops nothing else
            raise ReportError(f"report.to {library}: could not start a run ({err})") from None
        self.library = library

    def round(self, record: RoundRecord) -> None:
        metrics = {f"round/{name}": getattr(record, name) for name in ROUND_SCALARS}
        metrics.update({f"time/{name}": seconds for name, seconds in record.timings.items()})
        self.run.log({k: v for k, v in metrics.items() if v is not None}, step=record.round + 1)

    def eval(self, record: EvalRecord) -> None:
        metrics = {"eval/eval_acc": record.eval_acc}
        if record.ood_acc is not None:
            metrics["eval/ood_acc"] = record.ood_acc
        self.run.log(metrics, step=record.round + 1)

    def close(self) -> None:
        self.run.finish()


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

    def restart_at(self, step: int) -> None:
        """Steps from `step` on are logged again; reporters that can forget them do (TensorBoard).
        W&B and trackio resume their run by id and keep what they had."""
        for reporter in self.reporters:
            if hasattr(reporter, "restart_at"):
                reporter.restart_at(step)

    def close(self) -> None:
        for reporter in self.reporters:
            reporter.close()


def make_reporters(settings: ReportSettings, run_dir: Path, facts: dict[str, Any] | None = None) -> Reporters:
    """The reporters `report.to` names; ReportError when one cannot run here. `facts` (the
    node's peer id, run id, model and config) name and describe W&B and trackio runs."""
    facts = facts or {}
    made: list[Any] = []
    try:
        for name in settings.to:
            if name == "tensorboard":
                made.append(TensorBoardReporter(Path(settings.dir) if settings.dir else run_dir / "tensorboard"))
            else:
                peer = str(facts.get("peer_id", ""))
                model = str(facts.get("model", "node")).rsplit("/", 1)[-1]
                run_name = settings.name or (f"{model}-{peer[-6:]}" if peer else model)
                run_key = fingerprint_of(str(run_dir.resolve()), peer)[:16]
                made.append(TrackerReporter(name, settings.project, run_name, facts, run_key, run_dir))
    except ReportError:
        Reporters(made).close()
        raise
    return Reporters(made)
