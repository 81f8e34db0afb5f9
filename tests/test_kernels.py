"""The pinned CPU path (swarmnode/lab/kernels.py) says which MKL branch it ran, as MKL reports it:
MKL takes a named branch such as AVX2 only on Intel CPUs, so the branch asked is not evidence."""

import subprocess
import sys

import pytest

from swarmnode.lab import kernels

PRINT_PATH = "from swarmnode.lab import kernels; print(kernels.mkl_branch()); print(kernels.kernel_path())"


def _child(env_update: dict[str, str], unset: tuple[str, ...] = ()) -> list[str]:
    """(MKL's branch, the path line) in a fresh process: MKL reads MKL_CBWR once, when it loads."""
    env = kernels.pinned_env()
    env.update(env_update)
    for name in unset:
        env.pop(name, None)
    return subprocess.run([sys.executable, "-c", PRINT_PATH], env=env, capture_output=True, text=True,
                          check=True).stdout.splitlines()


@pytest.fixture(scope="module")
def mkl_reports() -> None:
    if not kernels.can_pin() or kernels.mkl_branch() is None:
        pytest.skip("no x86-64 torch with MKL here: the branch cannot be read")


def test_the_branch_printed_is_the_one_mkl_runs(mkl_reports):
    """COMPATIBLE is taken on every x86-64 CPU and no MKL_CBWR means no reproducibility branch;
    both are what MKL itself reports, on an Intel CPU or another."""
    branch, line = _child({"MKL_CBWR": "COMPATIBLE"})
    assert branch == "COMPATIBLE" and "MKL_CBWR=COMPATIBLE," in line and "not taken" not in line
    branch, line = _child({}, unset=("MKL_CBWR",))
    assert branch == "OFF" and "MKL_CBWR unset (MKL branch OFF)" in line


def _intel_with_avx2() -> bool:
    cpuinfo = open("/proc/cpuinfo").read()
    return "GenuineIntel" in cpuinfo and " avx2" in cpuinfo


def test_mkl_takes_avx2_on_an_intel_cpu_with_it_and_auto_elsewhere(mkl_reports):
    """What MKL does with MKL_CBWR=AVX2 depends on the CPU's maker, as Intel documents: the
    line says which it did on this machine."""
    branch, line = _child({"MKL_CBWR": "AVX2"})
    if _intel_with_avx2():
        assert branch == "AVX2" and "MKL_CBWR=AVX2," in line
    else:
        assert branch == "AUTO" and "MKL branch AUTO (MKL_CBWR=AVX2 not taken on this CPU)," in line
    assert line.endswith(f" on {kernels.cpu_model()}"), "the CPU is named on every branch"


def test_the_line_names_the_cpu_and_the_libraries_that_compute(monkeypatch):
    """The pinned path built other presets on one Intel CPU than on another (docs/figures.md),
    so the line names the CPU on every branch, and the transformers release beside torch's."""
    monkeypatch.setattr(kernels, "mkl_branch", lambda: "AVX2")
    monkeypatch.setattr(kernels, "cpu_model", lambda: "Some CPU (family 6, model 167, AVX-512)")
    monkeypatch.setattr(kernels, "library_version", lambda name: {"transformers": "5.19.0"}[name])
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    line = kernels.kernel_path()
    assert line.endswith(" on Some CPU (family 6, model 167, AVX-512)") and ", transformers 5.19.0, " in line
    monkeypatch.undo()
    assert kernels.library_version("no-such-distribution-here") == "absent"


def test_a_branch_the_cpu_does_not_take_is_named_beside_the_one_asked(monkeypatch):
    """On a non-Intel CPU MKL_CBWR=AVX2 leaves MKL on AUTO: the line says both, so a table made
    there does not claim MKL's AVX2 branch."""
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    monkeypatch.setattr(kernels, "mkl_branch", lambda: "AUTO")
    assert "MKL branch AUTO (MKL_CBWR=AVX2 not taken on this CPU)" in kernels.kernel_path()
    monkeypatch.setattr(kernels, "mkl_branch", lambda: "AVX2")
    assert "MKL_CBWR=AVX2," in kernels.kernel_path()
    for spelled in ("AVX2,STRICT", "BRANCH=AVX2", "avx2"):
        monkeypatch.setenv("MKL_CBWR", spelled)
        assert f"MKL_CBWR={spelled}," in kernels.kernel_path(), "each spelling Intel documents names AVX2"
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    monkeypatch.setattr(kernels, "mkl_branch", lambda: None)
    assert "MKL_CBWR=AVX2 (branch unknown)," in kernels.kernel_path()


ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw

processor\t: 1
model name\t: something else
"""


def test_two_cpus_that_share_a_name_are_told_apart():
    """A virtual machine may call two generations of CPU 'AMD EPYC', and MKL's AUTO branch
    dispatches by the CPU: the name carries its family, model and widest vector extension."""
    assert kernels.cpu_model(ZEN4) == "AMD EPYC (family 25, model 17, AVX-512)"
    older = ZEN4.replace("model\t\t: 17", "model\t\t: 1").replace(" avx512f avx512bw", "").replace("25", "23")
    assert kernels.cpu_model(older) == "AMD EPYC (family 23, model 1, AVX2)"
    assert kernels.cpu_model("model name\t: Some CPU\n") == "Some CPU", "nothing invented where cpuinfo is silent"
