"""One CPU code path for figures that must read the same on every machine.

torch picks its vectorised kernels by the CPU it finds (AVX-512 on this project's machines, AVX2
on many others), and the sums they compute differ in the last bits. Measured: the tiny preset's
warm-up, run under AVX-512 and under AVX2 kernels on one machine, ends in weights with other
digests (the same under one thread or two), and a learning run's sampled tokens follow its
weights. A bench that wants its tables re-run elsewhere to print the same numbers trains in
child processes started with `pinned_env()`: AVX2 kernels for torch and MKL on every x86-64 CPU
(all since 2015 have them), one thread. On another architecture nothing is pinned, and the
bench says so beside its figures (`kernel_path`).
"""

from __future__ import annotations

import os
import platform

import torch

PINNED_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "OMP_NUM_THREADS": "1"}


def can_pin() -> bool:
    """Whether this machine takes the pinned path (x86-64 only)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def pinned_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a child process that computes as every pinned machine does."""
    env = dict(os.environ if base is None else base)
    if can_pin():
        env.update(PINNED_KERNELS)
    return env


def kernel_path() -> str:
    """The code path this process computes on, to print beside figures: torch's version, its
    kernels' instruction set and MKL's reproducibility branch."""
    return (f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()} kernels, "
            f"MKL_CBWR={os.environ.get('MKL_CBWR', 'auto')}, {platform.machine()}")
