"""An ablation's runs, one (condition, seed) a child process, over the cores, resumable.

Ten seeds of a setting are hours on one core. Each run is deterministic in its inputs (seed,
member names, presets, one thread), so runs can go in parallel processes and give what they
would one after another; each child is started on the pinned kernel path (lab.kernels), writes
its run as JSON and nothing else crosses between processes. A run's file is named by a digest of
everything that shapes it, so a table started again picks up where it stopped and never reuses a
run of another shape, setting, preset or set of defaults (a condition names only what it
overrides, so a run of `f-tis` from before a default changed is another run); alone's runs are
named at the default generation share, which they do not depend on (`ablation.alone_shape`), so
tables at every `--gen-share` share them. A change to the
code that keeps the defaults keeps the names, so each run records the code it ran (a digest of
the package's source, `code_digest`) and the CPU code path it ran on (`kernels.kernel_path`:
what a run computes follows the CPU, not only MKL's branch), and the bench says which versions
or paths a table mixes: clear the runs directory to train them again under one.

    python -m swarmnode.lab.parallel JOB.json   # one run (what the parent starts)
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import torch

from swarmnode.lab.ablation import (
    ConditionRun,
    Setting,
    Shape,
    run_condition,
    run_from_json,
    setting_from_json,
)
from swarmnode.lab.kernels import kernel_path, pinned_env
from swarmnode.settings.config import Config


def defaults_digest() -> str:
    """A digest of every setting's default, which each member's configuration starts from."""
    return hashlib.sha256(Config().model_dump_json().encode()).hexdigest()


PACKAGE = Path(__file__).resolve().parents[1]  # the swarmnode package a run imports
UNRECORDED = "unrecorded"  # the code of a run written before runs recorded theirs


def child_command(spec: Path) -> list[str]:
    """How a job's process is started: `-P` keeps the working directory off its path, so it
    imports the package this process imported (child_env), not one a checkout there holds."""
    return [sys.executable, "-P", "-m", "swarmnode.lab.parallel", str(spec)]


def child_env() -> dict[str, str]:
    """A job's environment: the pinned kernels, and this process's package first on the path.
    A bench started from one tree with an environment installed from another once ran its jobs
    on the other tree's code, under names made from this one's defaults."""
    env = pinned_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PACKAGE.parent), env.get("PYTHONPATH"))))
    return env


@functools.cache
def code_digest(package: Path = PACKAGE) -> str:
    """A digest of the package's Python source (each file's path and bytes): what a run records
    of the code it ran, since a change that keeps the defaults keeps its file's name."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def recorded(jobs: list[RunJob], directory: Path, key: str) -> Counter[str]:
    """How many of the jobs' run files recorded each value of `key` (UNRECORDED for older files)."""
    return Counter(json.loads((directory / f"{job.stem()}.json").read_text()).get(key, UNRECORDED) for job in jobs)


def run_codes(jobs: list[RunJob], directory: Path) -> Counter[str]:
    """How many of the jobs' run files each code version wrote (UNRECORDED for older files)."""
    return recorded(jobs, directory, "code")


def code_line(codes: Counter[str], current: str) -> str:
    """One line on the code a table's runs were made by, and what to do when they differ."""
    if set(codes) == {current}:
        return f"code: {current[:16]}, every run"
    versions = ", ".join(f"{'this checkout' if code == current else code[:16]} ({count})"
                         for code, count in codes.most_common())
    return (f"code: runs made by {len(codes)} version(s) ({versions}), not all this checkout's {current[:16]}: "
            "a change that kept the defaults kept their names; clear --runs to train them again under one")


def kernels_line(paths: Counter[str], current: str) -> str | None:
    """One line where a table's runs were made on another CPU code path than this machine's (or
    on several), None where every run was made on this one: late rounds of pair runs were seen
    to differ between two machines (docs/figures.md)."""
    if set(paths) == {current}:
        return None
    made = "; ".join(f"{'this machine' if path == current else path} ({count})" for path, count in paths.most_common())
    return (f"kernels: runs made on {len(paths)} code path(s) ({made}), not all recorded as this machine's: figures "
            "may differ in the last digits from a table trained here; clear --runs to train them again on one")


@dataclass(frozen=True)
class RunJob:
    """One condition of one setting for one seed, and what it ran on."""

    setting: Setting
    condition: str
    accounting: str
    seed: int
    shape: Shape
    presets: tuple[tuple[str, str], ...]  # (preset name, weights' sha256) of the members
    defaults: str = field(default_factory=defaults_digest)  # the settings' defaults it ran under

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def stem(self) -> str:
        condition = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.condition)
        return f"{self.setting.name}-{self.accounting}-{condition}-seed{self.seed}-{self.key()}"


def job_from_json(data: dict) -> RunJob:
    return RunJob(
        setting_from_json(data["setting"]),
        data["condition"], data["accounting"], data["seed"],
        Shape(**{**data["shape"], "overrides": tuple(data["shape"]["overrides"])}),
        tuple(tuple(pair) for pair in data["presets"]), data["defaults"],
    )


def run_to_json(run: ConditionRun) -> dict:
    return asdict(run)


def run_jobs(jobs: list[RunJob], directory: Path, parallel: int,
             progress: Callable[[str], None] = print) -> list[ConditionRun]:
    """Every job's run, in the order given: read where its file exists, else trained in a child
    process, `parallel` at a time. A failed child is reported with its log's last lines and
    its run left out after the others finish (RuntimeError then names them)."""
    if parallel < 1:
        raise ValueError(f"runs at once must be at least 1, not {parallel}")
    directory.mkdir(parents=True, exist_ok=True)
    pending = [job for job in jobs if not (directory / f"{job.stem()}.json").exists()]
    if len(pending) < len(jobs):
        progress(f"resuming: {len(jobs) - len(pending)} of {len(jobs)} runs already in {directory}")
    running: list[tuple[RunJob, subprocess.Popen, float, IO[str]]] = []
    failed: list[str] = []
    done = len(jobs) - len(pending)
    while pending or running:
        while pending and len(running) < parallel:
            job = pending.pop(0)
            spec = directory / f"{job.stem()}.job.json"
            spec.write_text(json.dumps(asdict(job)))
            log = (directory / f"{job.stem()}.log").open("w")
            child = subprocess.Popen(child_command(spec), stdout=log, stderr=subprocess.STDOUT, env=child_env())
            running.append((job, child, time.perf_counter(), log))
        time.sleep(0.5)
        for entry in list(running):
            job, child, started, log = entry
            if child.poll() is None:
                continue
            running.remove(entry)
            log.close()
            done += 1
            what = f"{job.setting.name}, seed {job.seed}, {job.condition}"
            if child.returncode != 0:
                tail = (directory / f"{job.stem()}.log").read_text().splitlines()[-5:]
                failed.append(what)
                progress(f"[{done}/{len(jobs)}] {what}: FAILED (exit {child.returncode}):\n    " + "\n    ".join(tail))
            else:
                progress(f"[{done}/{len(jobs)}] {what}: {time.perf_counter() - started:.0f} s")
    if failed:
        raise RuntimeError(f"{len(failed)} run(s) failed ({'; '.join(failed)}); logs in {directory}")
    return [run_from_json(json.loads((directory / f"{job.stem()}.json").read_text())) for job in jobs]


def run_one(spec: Path) -> None:
    """Train the job in `spec` and write its run beside it, whole or not at all."""
    job = job_from_json(json.loads(spec.read_text()))
    torch.set_num_threads(1)
    run = run_condition(job.setting, job.condition, job.accounting, job.seed, job.shape,
                        progress=lambda line: print(line, flush=True))
    target = spec.with_name(f"{job.stem()}.json")
    staging = target.with_suffix(".partial")
    staging.write_text(json.dumps({**run_to_json(run), "code": code_digest(), "kernels": kernel_path()}))
    os.replace(staging, target)


if __name__ == "__main__":
    run_one(Path(sys.argv[1]))
