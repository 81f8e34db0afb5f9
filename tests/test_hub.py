"""Pushing the model to the Hub, through huggingface_hub's own client, to a local fake Hub that
answers the calls a push makes (create the repo, ask upload modes, commit)."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from swarmnode.assemble import compose_node, run_id_for
from swarmnode.loop.ledger import PeerLedger
from swarmnode.ops.hub import CardFacts, HubPublisher
from swarmnode.rollout.hf import HFGenerator
from swarmnode.settings.config import ConfigError, HubSettings, load_config
from swarmnode.swarm.local import solo_link
from swarmnode.tasks import ArithmeticTask


class FakeHub:
    """Records what each commit carried; `fail` makes every call answer 500."""

    def __init__(self) -> None:
        self.commits: list[dict[str, bytes]] = []
        self.created: list[dict] = []
        self.validated: list[str] = []
        self.unexpected: list[str] = []
        self.fail = False
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if hub.fail:
                    return self._answer(500, {"error": "the Hub is down"})
                if self.path == "/api/repos/create":
                    request = json.loads(body)
                    hub.created.append(request)
                    repo = f"{request['organization'] or 'me'}/{request['name']}"
                    return self._answer(200, {"url": f"{hub.endpoint}/{repo}"})
                if self.path == "/api/validate-yaml":  # the client has the Hub check a README's metadata
                    hub.validated.append(json.loads(body)["content"])
                    return self._answer(200, {"warnings": []})
                if "/preupload/" in self.path:
                    files = json.loads(body)["files"]
                    return self._answer(200, {"files": [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
                    ]})
                if "/commit/" in self.path:
                    files = {}
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    hub.commits.append(files)
                    repo = "/".join(self.path.split("/")[3:5])  # /api/models/<namespace>/<name>/commit/main
                    return self._answer(200, {"commitUrl": f"{hub.endpoint}/{repo}/commit/{'1' * 40}",
                                              "commitOid": "1" * 40})
                hub.unexpected.append(f"POST {self.path}")
                self._answer(404, {"error": "not here"})

            def do_GET(self) -> None:
                hub.unexpected.append(f"GET {self.path}")
                self._answer(404, {"error": "not here"})

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def fake_hub(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    hub = FakeHub()
    yield hub
    hub.server.shutdown()


def _facts(rounds_done: int = 3) -> CardFacts:
    return CardFacts(model="Qwen/Qwen2.5-1.5B", lora_rank=16, run_id="run123", peer_id="QmNode", task="gsm8k",
                     objective="f-tis", rounds_done=rounds_done, eval_before=0.5, eval_last=0.625, peers_learned_from=2)


def test_a_push_sends_the_folder_and_a_model_card_and_a_failed_push_only_warns(fake_hub, tmp_path, caplog):
    model = tmp_path / "checkpoint" / "model"
    model.mkdir(parents=True)
    (model / "adapter_model.safetensors").write_bytes(b"weights")
    (model / "adapter_config.json").write_text("{}")
    publisher = HubPublisher(HubSettings(repo_id="me/swarm", endpoint=fake_hub.endpoint), tmp_path / "staging")
    publisher.push(model, _facts(), wait=True)
    assert fake_hub.unexpected == [] and fake_hub.created[0]["name"] == "swarm"
    assert fake_hub.created[0]["visibility"] == "private"
    [files] = fake_hub.commits
    assert files["adapter_model.safetensors"] == b"weights" and "adapter_config.json" in files
    card = files["README.md"].decode()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["base_model"] == "Qwen/Qwen2.5-1.5B" and meta["library_name"] == "peft" and "swarmnode" in meta["tags"]
    assert "`run123`" in card and "0.625" in card and "LoRA rank 16" in card
    assert publisher.pushed_round == 3
    fake_hub.fail = True
    publisher.push(model, _facts(rounds_done=4), wait=True)
    assert publisher.pushed_round == 3 and "could not push" in caplog.text and "checkpoint/model" in caplog.text


def test_push_every_needs_a_repo():
    with pytest.raises(ConfigError, match="hub.repo_id"):
        load_config(None, ["hub.push_every=10"])


def test_a_node_pushes_on_schedule_and_at_the_end(fake_hub, tmp_path, make_policy):
    config = load_config(None, [
        f"node.run_dir={tmp_path / 'run'}", "model.device=cpu", "task.system_prompt=''", "rollout.backend=hf",
        "rollout.group_size=4", "rollout.max_new_tokens=8", "rollout.prompts_per_round=2", "node.eval_size=4",
        "node.checkpoint_every=0", "swarm.enabled=false", "hub.repo_id=me/tiny-swarm", "hub.push_every=2",
        f"hub.endpoint={fake_hub.endpoint}",
    ])
    policy, task = make_policy(), ArithmeticTask()
    run = run_id_for(config, task, policy)
    publisher = HubPublisher(config.hub, tmp_path / "run" / "hub-upload")
    ledger = PeerLedger(config.swarm)
    node = compose_node(config, policy, HFGenerator(policy, config.rollout), task, run, solo_link("solo", run, ledger),
                        ledger, publisher=publisher)
    node.run(rounds=3)
    node.close()
    assert len(fake_hub.commits) == 2, "after round 2, and at the end (round 3)"
    for files in fake_hub.commits:
        assert "model.safetensors" in files and "config.json" in files and "README.md" in files
    card = fake_hub.commits[-1]["README.md"].decode()
    assert "| rounds trained | 3 |" in card and f"`{run}`" in card
    assert yaml.safe_load(card.split("---")[1])["library_name"] == "transformers"
