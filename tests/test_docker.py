"""The CPU image, built from a fresh clone of this repository and run as a volunteer runs it:
the demo inside it, with no network (`make test-docker`; CI runs it after `make test`).

Docker Hub cannot be reached from this project's machines, so the image's base is Debian's
Python built with debootstrap (docker/test-base.sh) and torch's CPU wheel comes from this
machine's pip (its find-links), served to the build over loopback; everything else is the
Dockerfile as a volunteer builds it. Without an engine the test is skipped, unless
SWARMNODE_DOCKER_TEST=require (as `make test-docker` sets), where that is a failure.

The GPU image is built the same way when asked (SWARMNODE_DOCKER_GPU=1; `make test-docker-gpu`):
on the same base, with torch's wheel from this machine where it has one and vLLM from PyPI
(gigabytes), then asked by `doctor` what it has, on a machine without a GPU.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[1]
BASE = "swarmnode-test-base:bookworm"
IMAGE = "swarmnode:cpu-test"
GPU_IMAGE = "swarmnode:gpu-test"
TORCH = "torch==2.13.0+cpu"


def _engine() -> None:
    running = shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    if not running:
        reason = "no Docker engine: apt-get install docker.io debootstrap, start dockerd (as root)"
        if os.environ.get("SWARMNODE_DOCKER_TEST") == "require":
            pytest.fail(reason)
        pytest.skip(reason)


def _run(*command: str, timeout: float) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command[:3])} ... failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout + done.stderr


def _torch_wheel(folder: Path) -> Path | None:
    """torch's CPU wheel from this machine's pip, without an index (None: not here)."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-index", "-q", "-d", str(folder),
                           TORCH], capture_output=True, timeout=300)
    return folder if done.returncode == 0 else None


def _build(dockerfile: str, tag: str, tmp_path: Path, extra_args: list[str] | None = None) -> None:
    """Build `dockerfile` from a fresh clone on the test base, torch served from this machine."""
    _engine()
    if subprocess.run(["docker", "image", "inspect", BASE], capture_output=True).returncode != 0:
        _run("sh", str(ROOT / "docker" / "test-base.sh"), BASE, timeout=900)
    clone = tmp_path / "clone"
    _run("git", "clone", "-q", str(ROOT), str(clone), timeout=120)
    build = ["docker", "build", "--network", "host", "-f", dockerfile, "--build-arg", f"BASE={BASE}", "-t", tag,
             *(extra_args or [])]
    wheels = _torch_wheel(tmp_path / "wheels")
    server = None
    if wheels is not None:  # download.pytorch.org is out of reach here: serve the local wheel to the build
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(wheels))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        build += ["--build-arg", f"TORCH={TORCH} --find-links http://127.0.0.1:{server.server_address[1]}/"]
    try:
        _run(*build, str(clone), timeout=2400)
    finally:
        if server is not None:
            server.shutdown()


def test_the_cpu_image_builds_from_a_fresh_clone_and_runs_the_demo_inside(tmp_path):
    _build("docker/Dockerfile.cpu", IMAGE, tmp_path)
    said = _run("docker", "run", "--rm", "--network", "none", "--entrypoint", "swarmnode", IMAGE,
                "demo", "--dir", "/data/demo", "--rounds", "20", "--no-solo", timeout=900)
    assert "held-out accuracy" in said and "curves:" in said, said[-3000:]
    health = _run("docker", "run", "--rm", "--network", "none", "--entrypoint", "swarmnode", IMAGE, "doctor",
                  timeout=300)
    assert "tiny: found" in health, health


@pytest.mark.skipif(os.environ.get("SWARMNODE_DOCKER_GPU") != "1", reason="the GPU image only when asked: "
                    "SWARMNODE_DOCKER_GPU=1 (it downloads vLLM, gigabytes)")
def test_the_gpu_image_builds_from_a_fresh_clone_with_its_base_and_torch_as_arguments(tmp_path):
    _build("docker/Dockerfile", GPU_IMAGE, tmp_path)
    health = _run("docker", "run", "--rm", "--network", "none", "--entrypoint", "swarmnode", GPU_IMAGE, "doctor",
                  "--model", "tiny", timeout=300)
    assert "vLLM is installed" in health and "tiny: found" in health, health
    assert "no GPU: the node trains and generates on CPU" in health, health
    user = _run("docker", "run", "--rm", "--network", "none", "--entrypoint", "id", GPU_IMAGE, "-u", timeout=60)
    assert user.strip() == "1000"
