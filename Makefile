# Set-up-inclusive entry points. Torch is installed first and pinned, so a CPU machine never
# resolves a CUDA build. Elsewhere than this project's machines, add the CPU wheel index:
#   make run TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu"
PYTHON ?= python3
VENV ?= .venv
TORCH_INDEX ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0 $(TORCH_INDEX)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: setup  ## a local swarm of 3 heterogeneous tiny nodes on CPU, offline (swarmnode demo)
	$(VENV)/bin/swarmnode demo

lint: setup
	$(VENV)/bin/ruff check swarmnode tests bench

test: lint  ## ruff, then the whole test suite (slow tests included)
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/wire_codec.py
	$(PY) bench/objective_overhead.py
	$(PY) bench/learning.py
	$(PY) bench/swarm_exchange.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
