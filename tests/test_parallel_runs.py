"""An ablation's runs in child processes (swarmnode/lab/parallel.py): what two processes compute
for one job is the same to the last digit, and a table started again trains nothing it has."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swarmnode.lab import parallel
from swarmnode.lab.ablation import SETTINGS, Shape
from swarmnode.lab.kernels import pinned_path
from swarmnode.lab.parallel import RunJob, run_jobs
from swarmnode.model.tiny import TINY_PRESETS, tiny_path, weights_digest
from swarmnode.settings.config import load_config

FAST = Shape(rounds=2, prompts_per_round=4, group_size=4, max_new_tokens=6, eval_size=8, eval_points=1)


def _learned(run) -> list:
    """What a run computed, without its clock readings."""
    return [(m.before, m.after, m.curve, [(r.reward_mean, r.loss, r.grad_norm, r.weight_mean, r.wire_tokens)
                                          for r in m.rounds]) for m in run.members]


def _job(seed: int) -> RunJob:
    presets = (("tiny", weights_digest(tiny_path(TINY_PRESETS["tiny"]))),)
    return RunJob(SETTINGS["same"], "f-tis", "shared", seed, FAST, presets)


def test_one_job_in_two_processes_gives_one_run_and_a_restart_trains_nothing(tmp_path, monkeypatch):
    first, second = run_jobs([_job(0)], tmp_path / "a", 1), run_jobs([_job(0), _job(1)], tmp_path / "b", 2)
    assert [r.seed for r in second] == [0, 1]
    assert _learned(first[0]) == _learned(second[0])
    assert first[0].members[0].rounds, "it trained"

    def no_process(*args, **kwargs):
        raise AssertionError("a run with a file was trained again")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    lines: list[str] = []
    again = run_jobs([_job(0), _job(1)], tmp_path / "b", 2, progress=lines.append)
    assert [parallel.run_to_json(r) for r in again] == [parallel.run_to_json(r) for r in second]
    assert lines == [f"resuming: 2 of 2 runs already in {tmp_path / 'b'}"]


def test_a_job_of_another_shape_or_preset_is_another_file():
    job = _job(0)
    assert job.stem() != RunJob(job.setting, job.condition, job.accounting, 0, Shape(rounds=3), job.presets).stem()
    assert job.stem() != RunJob(job.setting, job.condition, job.accounting, 0, FAST, (("tiny", "0" * 64),)).stem()
    assert job.stem() == parallel.job_from_json(json.loads(json.dumps(parallel.asdict(job)))).stem()


def test_a_run_from_before_a_default_changed_is_not_reused(monkeypatch):
    """`f-tis` names a condition, not what it ran under: with a default changed the same job is
    another file, so a table never mixes runs of the old defaults with the new."""
    before = _job(0)
    assert before.defaults == parallel.defaults_digest()
    monkeypatch.setattr(parallel, "Config", lambda: load_config(None, ["node.adapt_share_nats=0.5"]))
    after = _job(0)
    assert after.defaults != before.defaults and after.stem() != before.stem()


def test_a_run_records_its_code_and_a_table_of_mixed_code_says_so(tmp_path):
    """A change to the code that keeps the defaults keeps a run's file name; each run records the
    package's digest, so a table whose runs two versions made says so and how to retrain."""
    run_jobs([_job(0), _job(1)], tmp_path, 2)
    current = parallel.code_digest()
    assert parallel.run_codes([_job(0), _job(1)], tmp_path) == {current: 2}
    assert parallel.code_line(parallel.run_codes([_job(0), _job(1)], tmp_path), current) == f"code: {current[:16]}, every run"
    older = tmp_path / f"{_job(1).stem()}.json"
    data = json.loads(older.read_text())
    del data["code"]  # as a run file from before runs recorded their code
    older.write_text(json.dumps(data))
    codes = parallel.run_codes([_job(0), _job(1)], tmp_path)
    assert codes == {current: 1, parallel.UNRECORDED: 1}
    line = parallel.code_line(codes, current)
    assert "2 version(s)" in line and "this checkout (1)" in line and "unrecorded (1)" in line and "clear --runs" in line
    assert parallel.run_from_json(data) is not None, "an older file still reads"


def test_a_run_records_its_kernel_path_and_a_table_made_on_another_says_so(tmp_path):
    """What a run computes follows the CPU (docs/figures.md, "An Intel Xeon builds other presets"),
    so a run records the path it computed on, and a table whose runs another machine made (or a
    run from before runs recorded it) says so."""
    run_jobs([_job(0), _job(1)], tmp_path, 2)
    here = pinned_path()
    paths = parallel.recorded([_job(0), _job(1)], tmp_path, "kernels")
    assert paths == {here: 2}
    assert parallel.kernels_line(paths, here) is None, "every run made here: nothing to say"
    other = tmp_path / f"{_job(1).stem()}.json"
    data = json.loads(other.read_text())
    data["kernels"] = ("torch 2.13.0+cpu, transformers 5.19.0, AVX2 kernels, MKL_CBWR=AVX2, x86_64 on "
                       "Some CPU (family 6, model 167, AVX-512) (another machine)")
    other.write_text(json.dumps(data))
    line = parallel.kernels_line(parallel.recorded([_job(0), _job(1)], tmp_path, "kernels"), here)
    assert "2 code path(s)" in line and "this machine (1)" in line and "another machine) (1)" in line
    del data["kernels"]
    other.write_text(json.dumps(data))
    assert "unrecorded (1)" in parallel.kernels_line(parallel.recorded([_job(0), _job(1)], tmp_path, "kernels"), here)


def test_the_code_digest_follows_every_source_file(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "notes.md").write_text("not code")
    before = parallel.code_digest.__wrapped__(package)
    (package / "notes.md").write_text("still not code")
    assert parallel.code_digest.__wrapped__(package) == before
    (package / "sub" / "b.py").write_text("y = 3\n")
    assert parallel.code_digest.__wrapped__(package) != before
    assert len(parallel.code_digest()) == 64


def test_a_failed_run_is_named_with_its_log_and_the_others_still_finish(tmp_path):
    broken = RunJob(SETTINGS["same"], "f-tis:no.such=1", "shared", 0, FAST, ())
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="1 run"):
        run_jobs([broken, _job(0)], tmp_path, 2, progress=lines.append)
    assert any("FAILED" in line for line in lines)
    assert (tmp_path / f"{_job(0).stem()}.json").exists(), "the good run was kept for the restart"


def test_no_runs_at_once_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        run_jobs([_job(0)], tmp_path / "runs", 0)
    assert not (tmp_path / "runs").exists()


def test_a_job_imports_the_package_of_the_bench_that_started_it_whatever_its_working_directory(tmp_path):
    """A checkout in the working directory (another version of the package) is not what a job
    runs: it runs the code the bench imported and named its runs by."""
    decoy = tmp_path / "swarmnode"
    (decoy / "lab").mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    (decoy / "lab" / "__init__.py").write_text("")
    (decoy / "lab" / "parallel.py").write_text("raise SystemExit('the decoy ran')\n")
    command = parallel.child_command(tmp_path / "no-such-spec.json")
    probe = [*command[:-3], "-c", "import swarmnode.lab.parallel as p; print(p.__file__)"]
    imported = subprocess.run(probe, cwd=tmp_path, env=parallel.child_env(), capture_output=True, text=True,
                              check=True).stdout.strip()
    assert Path(imported) == Path(parallel.__file__).resolve()
    unpinned = subprocess.run([sys.executable, "-m", "swarmnode.lab.parallel"], cwd=tmp_path, capture_output=True,
                              text=True)
    assert "the decoy ran" in unpinned.stderr, "without -P the working directory's copy is imported"
