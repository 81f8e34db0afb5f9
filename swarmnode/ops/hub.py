"""Pushing the trained model to the Hugging Face Hub: `hub.repo_id`, `hub.push_every`.

What is pushed is the checkpoint's `model/` folder (the adapters alone for LoRA, as peft saves
them) with a model card that names the run, the node and its figures. A push runs in a thread
of its own from a snapshot of hard links, so a round never waits on the network and the next
checkpoint may replace the folder meanwhile; a failed push is a warning, never the end of a
run. The token is huggingface_hub's own (`HF_TOKEN`, or `hf auth login`).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, ModelCard, ModelCardData

from swarmnode import __version__
from swarmnode.settings.config import HubSettings

log = logging.getLogger(__name__)

CARD_TAGS = ["swarmnode", "reinforcement-learning", "grpo", "f-tis", "decentralised-training"]


@dataclass(frozen=True)
class CardFacts:
    """What the model card says about the run that made the weights."""

    model: str  # the base model: a hub id or a local path
    lora_rank: int | None
    run_id: str
    peer_id: str
    task: str
    objective: str
    rounds_done: int
    eval_before: float | None
    eval_last: float | None
    peers_learned_from: int


def model_card(facts: CardFacts, repo_id: str) -> ModelCard:
    """A card with the Hub's metadata block (base model, library, tags) and the run's figures."""
    hub_base = "/" in facts.model and not Path(facts.model).exists()  # a local preset is no hub id
    data = ModelCardData(
        base_model=facts.model if hub_base else None,
        library_name="peft" if facts.lora_rank else "transformers",
        tags=CARD_TAGS,
    )
    training = f"LoRA rank {facts.lora_rank} adapters" if facts.lora_rank else "full fine-tuning"
    before = "-" if facts.eval_before is None else f"{facts.eval_before:.3f}"
    last = "-" if facts.eval_last is None else f"{facts.eval_last:.3f}"
    text = f"""---
{data.to_yaml()}
---

# {repo_id}

{facts.model} post-trained with reinforcement learning ({training}) by a swarmnode
node in a decentralised swarm: each round
the node generated its own completions, pulled its peers' rollouts, screened them with its own
model and trained on both with the `{facts.objective}` objective.

| | |
|---|---|
| task | {facts.task} |
| rounds trained | {facts.rounds_done} |
| held-out accuracy before training | {before} |
| held-out accuracy at the last evaluation | {last} |
| peers whose samples it trained on | {facts.peers_learned_from} |
| run id | `{facts.run_id}` |
| node (peer id) | `{facts.peer_id}` |
| swarmnode version | {__version__} |

Accuracies are greedy pass@1 on the task's held-out problems, as the node measured them.
"""
    return ModelCard(text)


class HubPublisher:
    """Pushes the checkpoint's model folder, one push at a time, in the background."""

    def __init__(self, settings: HubSettings, staging: Path, api: HfApi | None = None) -> None:
        if not settings.repo_id:
            raise ValueError("hub.repo_id is not set")
        self.settings = settings
        self.repo_id = settings.repo_id
        self.staging = staging  # a snapshot of the folder being pushed
        self.api = api or HfApi(endpoint=settings.endpoint)
        self.pushed_round: int | None = None  # the last round pushed
        self._thread: threading.Thread | None = None
        self._repo_ready = False

    def due(self, round_: int) -> bool:
        every = self.settings.push_every
        return bool(every) and (round_ + 1) % every == 0

    def push(self, model_dir: Path, facts: CardFacts, wait: bool = False) -> None:
        """Push `model_dir` as it is now, with a card of `facts`. With a push still running,
        this one is skipped (the next carries newer weights), unless `wait`: the run's last."""
        if self._thread is not None and self._thread.is_alive():
            if not wait:
                log.info("a push to %s is still running: round %d is not pushed", self.repo_id, facts.rounds_done)
                return
            self._thread.join()
        _snapshot(model_dir, self.staging)
        model_card(facts, self.repo_id).save(self.staging / "README.md")
        self._thread = threading.Thread(
            target=self._upload, args=(facts.rounds_done,), name="hub-push", daemon=True
        )
        self._thread.start()
        if wait:
            self.wait()

    def wait(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _upload(self, rounds_done: int) -> None:
        try:
            if not self._repo_ready:
                self.api.create_repo(self.repo_id, private=self.settings.private, exist_ok=True)
                self._repo_ready = True
            self.api.upload_folder(
                repo_id=self.repo_id, folder_path=str(self.staging),
                commit_message=f"swarmnode: {rounds_done} rounds",
            )
        except Exception as err:  # the Hub down, no token, no rights: training goes on
            log.warning(
                "could not push to the Hub repo %s (%s); training goes on, and the model is in the "
                "run dir's checkpoint/model", self.repo_id, err,
            )
            return
        self.pushed_round = rounds_done
        log.info("pushed the model after %d rounds to %s", rounds_done, self.repo_id)


def _snapshot(source: Path, target: Path) -> None:
    """`target` becomes a copy of `source` made of hard links (no second copy of the weights
    on disk), or of real copies where links cannot be made (another file system)."""
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link_or_copy)
