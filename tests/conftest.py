"""Shared fixtures: a locally built tokenizer, small random Qwen2 policies (no downloads), and
swarm runtimes on 127.0.0.1 for the swarm tests (tests/test_swarm*.py, helpers in tests/swarm_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmnode.model.policy import Policy
from swarmnode.model.tiny import build_model, build_tokenizer
from swarmnode.settings.config import LoraSettings, SwarmSettings, TrainSettings

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PATIENT_REQUEST_S = 60.0  # how long a payload server started here waits for a request (`start_runtime`)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def make_policy(tokenizer):
    """Policy factory: random weights, sizes and LoRA rank chosen per test."""

    def make(
        hidden: int = 64,
        layers: int = 1,
        lora_rank: int = 0,
        lr: float = 1e-3,
        micro_batch: int = 64,
        name: str = "test-model",
    ) -> Policy:
        torch.manual_seed(hidden * 10 + layers)
        model = build_model(
            tokenizer,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        model.eval()
        return Policy(
            model,
            tokenizer,
            name,
            TrainSettings(lr=lr, micro_batch_size=micro_batch),
            LoraSettings(rank=lora_rank, alpha=2.0 * max(lora_rank, 1)),
            use_chat_template=False,
            seed=0,
        )

    return make


@pytest.fixture
def start_runtime(tmp_path, monkeypatch):
    """`start(name, initial_peers)`: a SwarmRuntime (p2p daemon and DHT node) listening on
    127.0.0.1 only, so its daemon maps no port on the gateway; every one started is shut down
    after the test.

    Payload servers started in these tests wait up to PATIENT_REQUEST_S for a request, not
    the node's 2 s: on a loaded machine a request took longer than that to cross the two
    daemons, the server closed the stream, and a test that asserts an answer failed on the
    timer. The timer itself is tested with its own value (test_swarm_payloads.py)."""
    from swarmnode.swarm.hivemind import payloads  # hivemind: only for the tests that start one
    from swarmnode.swarm.hivemind.runtime import SwarmRuntime

    monkeypatch.setattr(payloads, "REQUEST_TIMEOUT_S", PATIENT_REQUEST_S)

    started: list[SwarmRuntime] = []

    def start(name: str, initial_peers: list[str] | None = None) -> SwarmRuntime:
        settings = SwarmSettings(initial_peers=initial_peers or [], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        runtime = SwarmRuntime(settings, tmp_path / f"{name}.key")
        runtime.start()
        started.append(runtime)
        return runtime

    yield start
    for runtime in started:
        runtime.shutdown()


def data_path(*parts: str) -> Path:
    path = DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not found (the shared data sets live beside the project)")
    return path
