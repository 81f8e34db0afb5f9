"""Checkpoints without pickle: safetensors for weights, optimiser state and RNG, JSON for the rest.

A checkpoint is written to a temporary directory and renamed into place, so a crash mid-write
leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from swarmnode.policy import Policy
from swarmnode.records import CHECKPOINT_FORMAT as FORMAT


def _optimizer_tensors(policy: Policy) -> dict[str, torch.Tensor]:
    tensors = {}
    for index, state in policy.optimizer.state_dict()["state"].items():
        for name, value in state.items():
            tensors[f"{index}.{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
    return tensors


def save_checkpoint(policy: Policy, directory: Path, round_: int, extra: dict | None = None) -> None:
    """Write model (or adapter), optimiser, RNG and `round_` (the last finished round)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    policy.model.save_pretrained(staging / "model")
    policy.tokenizer.save_pretrained(staging / "model")
    save_file(_optimizer_tensors(policy), str(staging / "optimizer.safetensors"))
    save_file({"torch": torch.get_rng_state()}, str(staging / "rng.safetensors"))
    meta = {
        "format": FORMAT,
        "round": round_,
        "model": policy.name,
        "lora_rank": policy.lora_rank,
        **(extra or {}),
    }
    (staging / "meta.json").write_text(json.dumps(meta, indent=1))
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    staging.rename(directory)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_present(directory: Path) -> bool:
    """Whether `directory` holds a checkpoint; a kill between the two renames of
    save_checkpoint leaves only `<directory>.old`, which is then put back."""
    old = directory.with_name(directory.name + ".old")
    if not (directory / "meta.json").exists() and (old / "meta.json").exists():
        shutil.rmtree(directory, ignore_errors=True)
        old.rename(directory)
    return (directory / "meta.json").exists()


def load_checkpoint(policy: Policy, directory: Path) -> dict:
    """Restore weights, optimiser and RNG into `policy`; returns the checkpoint's metadata."""
    meta = json.loads((directory / "meta.json").read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{directory}: checkpoint format {meta.get('format')} != {FORMAT}")
    if meta["model"] != policy.name or meta["lora_rank"] != policy.lora_rank:
        raise ValueError(
            f"{directory} holds {meta['model']} (LoRA rank {meta['lora_rank']}), but this node "
            f"runs {policy.name} (LoRA rank {policy.lora_rank}); use another --run-dir"
        )
    weights: dict[str, torch.Tensor] = {}
    for file in sorted((directory / "model").glob("*.safetensors")):
        weights.update(load_file(str(file)))
    if policy.lora_rank:
        set_peft_model_state_dict(policy.model, weights)
    else:
        missing, unexpected = policy.model.load_state_dict(weights, strict=False)
        tied = {"lm_head.weight"} if policy.model.config.tie_word_embeddings else set()
        if set(missing) - tied or unexpected:
            raise ValueError(f"{directory}: weights do not fit the model ({missing}, {unexpected})")
    flat = load_file(str(directory / "optimizer.safetensors"))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value.to(policy.device) if name != "step" else value
    groups = policy.optimizer.state_dict()["param_groups"]
    policy.optimizer.load_state_dict({"state": state, "param_groups": groups})
    torch.set_rng_state(load_file(str(directory / "rng.safetensors"))["torch"])
    return meta
