"""One CPU code path for figures that must read the same on every machine.

torch picks its vectorised kernels by the CPU it finds (AVX-512 on some of this project's
machines, AVX2 on others), and the sums they compute differ in the last bits. Measured: the tiny
preset's warm-up, run under AVX-512 and under AVX2 kernels on one machine, ends in weights with
other digests (the same under one thread or two), and a learning run's sampled tokens follow its
weights. A bench that wants its tables re-run elsewhere to print the same numbers trains in
child processes started with `pinned_env()`: torch's AVX2 kernels on every x86-64 CPU that has
them (most since 2013-2015; not some Pentiums and Celerons), MKL's AVX2 branch, one thread. On
another architecture nothing is pinned, and the bench says so beside its figures (`kernel_path`).

MKL, whose SGEMM is every matrix product on this path (the only MKL or oneDNN call a learning
run makes, by MKL_VERBOSE and ONEDNN_VERBOSE), honours a named branch only on Intel CPUs: Intel
documents that elsewhere it takes only AUTO or COMPATIBLE, and on an AMD EPYC `MKL_CBWR=AVX2`
leaves it on AUTO (MKL_VERBOSE prints `CNR:AUTO`), which dispatches by the CPU it finds. So on a
non-Intel CPU the pinned path is torch's, not MKL's. Nor does the path make every CPU compute
alike: an Intel Xeon (family 6, model 167) on MKL's AVX2 branch builds other presets than the
Intel that shipped them, and no branch, COMPATIBLE included (the one Intel documents as the same
on its CPUs and others), made it compute as an AMD did (docs/figures.md, "An Intel Xeon builds
other presets"). So `kernel_path` prints the branch MKL took, read from MKL itself, and the CPU,
and a table says when its runs were made on more than one path.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

PINNED_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "OMP_NUM_THREADS": "1"}
# mkl_cbwr.h: what mkl_cbwr_get(MKL_CBWR_BRANCH) returns, by branch
MKL_BRANCHES = {0: "OFF", 1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2",
                9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1"}
MKL_CBWR_BRANCH = 1


def can_pin() -> bool:
    """Whether this machine takes the pinned path (x86-64 only)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def pinned_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a child process that computes as every pinned machine does."""
    env = dict(os.environ if base is None else base)
    if can_pin():
        env.update(PINNED_KERNELS)
    return env


@functools.cache
def mkl_branch() -> str | None:
    """The reproducibility branch MKL runs in this process, as MKL reports it (not as
    MKL_CBWR asked), or None where it cannot be read from torch's libtorch_cpu.so (no MKL in it,
    MKL linked apart, or another platform's library name)."""
    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        get = library.mkl_serv_cbwr_get  # the symbol behind mkl_cbwr_get, exported by torch's static MKL
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    code = get(MKL_CBWR_BRANCH)
    return MKL_BRANCHES.get(code, f"branch {code}")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name, with its family, model and widest vector extension where Linux's
    /proc/cpuinfo gives them (else what platform says): MKL's AUTO branch dispatches by the CPU,
    so two machines on AUTO compute alike only on alike CPUs, and a virtual machine's name alone
    (`AMD EPYC`) does not tell two generations apart."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if not key.strip():
            break  # the first processor's block is enough
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    details = [f"family {fields['cpu family']}, model {fields['model']}"] if "cpu family" in fields and "model" in fields else []
    flags = set(fields.get("flags", "").split())
    widest = next((label for flag, label in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags), None)
    if widest:
        details.append(widest)
    return f"{name} ({', '.join(details)})" if details else name


def asked_branch(value: str) -> str:
    """The branch an MKL_CBWR value names ('AVX2,STRICT', 'BRANCH=AVX2' and 'avx2' all AVX2;
    the deprecated SSE3 is SSE2)."""
    branch = value.split(",")[0].strip().upper().removeprefix("BRANCH=")
    return "SSE2" if branch == "SSE3" else branch


def kernel_path() -> str:
    """The code path this process computes on, to print beside figures: torch's and transformers'
    versions, torch's kernels' instruction set, the MKL branch it runs (with the one asked where
    MKL took another) and the CPU. The CPU is always named: on an Intel Xeon (family 6, model 167)
    the pinned path built other presets than the Intel that shipped them (docs/figures.md, "An
    Intel Xeon builds other presets"), so one path computes other bits on another CPU."""
    asked = os.environ.get("MKL_CBWR")
    taken = mkl_branch()
    if asked is None:
        mkl = f"MKL_CBWR unset (MKL branch {taken or 'unknown'})"
    elif taken is None:
        mkl = f"MKL_CBWR={asked} (branch unknown)"
    elif taken == asked_branch(asked):
        mkl = f"MKL_CBWR={asked}"
    else:
        mkl = f"MKL branch {taken} (MKL_CBWR={asked} not taken on this CPU)"
    return (f"torch {torch.__version__}, transformers {library_version('transformers')}, "
            f"{torch.backends.cpu.get_cpu_capability()} kernels, {mkl}, {platform.machine()} on {cpu_model()}")


def library_version(name: str) -> str:
    """An installed distribution's version, read without importing it ('absent' where none is)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def pinned_path() -> str:
    """The path a child started with `pinned_env()` computes on, as it prints it: MKL reads its
    branch when it loads, so this process, started otherwise, cannot say it of itself."""
    child = subprocess.run([sys.executable, "-c", "from swarmnode.lab.kernels import kernel_path; print(kernel_path())"],
                           env=pinned_env(), capture_output=True, text=True, check=True)
    return child.stdout.strip()
