"""Checkpoints without pickle: safetensors for weights, optimiser state and RNG, JSON for the rest.

A checkpoint is written to a temporary directory and renamed into place, so a crash mid-write
leaves the previous checkpoint intact. Writing runs off the round's path where memory allows:
`take_snapshot` copies what training changes (the trainable weights, the optimiser state, the
RNG) to host memory in the round, and a `CheckpointWriter` thread writes the copy while the
next rounds run. Frozen weights (a LoRA node's base model) are not copied: training never
changes them.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from swarmnode.model.policy import Policy
from swarmnode.protocol.records import CHECKPOINT_FORMAT as FORMAT

log = logging.getLogger(__name__)

# what a full or failing disk raises while a checkpoint is written (safetensors' error is no OSError)
DISK_ERRORS: tuple[type[Exception], ...] = (OSError, SafetensorError)
SNAPSHOT_MEMORY_SHARE = 0.5  # a snapshot may take at most this share of the host's available memory


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True).contiguous()


def _optimizer_tensors(policy: Policy) -> dict[str, torch.Tensor]:
    tensors = {}
    for index, state in policy.optimizer.state_dict()["state"].items():
        for name, value in state.items():
            tensors[f"{index}.{name}"] = _copy(torch.as_tensor(value))
    return tensors


@dataclass
class Snapshot:
    """What a checkpoint holds, taken at the end of a round; writing it needs no live tensor
    that training still changes."""

    weights: dict[str, torch.Tensor]  # the model's state dict: frozen weights shared, the rest copied
    optimizer: dict[str, torch.Tensor]
    rng: torch.Tensor
    meta: dict


def take_snapshot(policy: Policy, round_: int, extra: dict | None = None) -> Snapshot:
    frozen = {name for name, p in policy.model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    weights = {name: t if name in frozen else _copy(t) for name, t in policy.model.state_dict().items()}
    meta = {"format": FORMAT, "round": round_, "model": policy.name, "lora_rank": policy.lora_rank, **(extra or {})}
    return Snapshot(weights, _optimizer_tensors(policy), torch.get_rng_state(), meta)


def snapshot_bytes(policy: Policy) -> int:
    """Host memory a snapshot takes: the trainable weights and the optimiser state (before
    the first step, AdamW's two fp32 moments a trainable weight)."""
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    weights = sum(p.numel() * p.element_size() for p in trainable)
    state = [torch.as_tensor(v) for s in policy.optimizer.state_dict()["state"].values() for v in s.values()]
    moments = sum(t.numel() * t.element_size() for t in state) if state else 8 * sum(p.numel() for p in trainable)
    return weights + moments


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo; None where there is none (then checkpoints are written in the round)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def write_snapshot(policy: Policy, snapshot: Snapshot, directory: Path) -> None:
    """Write a snapshot as a checkpoint: staged, then renamed into place."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        policy.model.save_pretrained(staging / "model", state_dict=snapshot.weights)  # peft keeps the adapter's part
        policy.tokenizer.save_pretrained(staging / "model")
        save_file(snapshot.optimizer, str(staging / "optimizer.safetensors"))
        save_file({"torch": snapshot.rng}, str(staging / "rng.safetensors"))
        (staging / "meta.json").write_text(json.dumps(snapshot.meta, indent=1))
    except BaseException:  # a full disk: the half-written copy goes, the last checkpoint stays
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    staging.rename(directory)
    shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(policy: Policy, directory: Path, round_: int, extra: dict | None = None) -> None:
    """Write model (or adapter), optimiser, RNG and `round_` (the last finished round) now."""
    write_snapshot(policy, take_snapshot(policy, round_, extra), directory)


class CheckpointWriter:
    """Writes checkpoints in a thread of its own, one at a time. `save` returns once the
    snapshot is taken, unless it would not fit in memory (then it writes in the caller's
    thread); a save while the previous write still runs waits for that write first. `wait`
    blocks until nothing is being written."""

    def __init__(self, policy: Policy, directory: Path) -> None:
        self.policy = policy
        self.directory = directory
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.pending: Snapshot | None = None  # the snapshot being written in the background
        self.background = self._fits_in_memory()

    def _fits_in_memory(self) -> bool:
        available = available_memory_bytes()
        return available is not None and snapshot_bytes(self.policy) <= SNAPSHOT_MEMORY_SHARE * available

    def save(self, round_: int, extra: dict | None = None, wait: bool = False) -> None:
        self.wait()
        snapshot = take_snapshot(self.policy, round_, extra)
        if wait or not self.background:
            write_snapshot(self.policy, snapshot, self.directory)
            return
        self.pending = snapshot
        self._thread = threading.Thread(target=self._write, args=(snapshot,), name="checkpoint", daemon=True)
        self._thread.start()

    def _write(self, snapshot: Snapshot) -> None:
        try:
            write_snapshot(self.policy, snapshot, self.directory)
        except BaseException as err:  # reported by the next save or wait, in the node's thread
            self._error = err
        finally:
            self.pending = None

    def wait(self) -> None:
        """Block until the running write is done; raise what it failed with."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def checkpoint_present(directory: Path) -> bool:
    """Whether `directory` holds a checkpoint; a kill between the two renames of
    save_checkpoint leaves only `<directory>.old`, which is then put back."""
    old = directory.with_name(directory.name + ".old")
    if not (directory / "meta.json").exists() and (old / "meta.json").exists():
        shutil.rmtree(directory, ignore_errors=True)
        old.rename(directory)
    return (directory / "meta.json").exists()


class DamagedCheckpoint(ValueError):
    """A checkpoint whose files cannot be read back; the message says how to go on."""


def _read_meta(directory: Path) -> dict:
    try:
        meta = json.loads((directory / "meta.json").read_text())
        if not isinstance(meta, dict) or not isinstance(meta.get("round"), int):
            raise ValueError("meta.json holds no round")
        return meta
    except (OSError, ValueError) as err:
        raise _damaged(directory, err) from None


def _damaged(directory: Path, err: BaseException) -> DamagedCheckpoint:
    return DamagedCheckpoint(
        f"the checkpoint in {directory} cannot be read ({type(err).__name__}: {str(err)[:200]}): --fresh starts "
        "over in this run dir (the next checkpoint replaces it), or give another --run-dir"
    )


def load_checkpoint(policy: Policy, directory: Path) -> dict:
    """Restore weights, optimiser and RNG into `policy`; returns the checkpoint's metadata.
    DamagedCheckpoint when its files cannot be read (a disk fault, a cut copy)."""
    meta = _read_meta(directory)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{directory}: checkpoint format {meta.get('format')} != {FORMAT}")
    if meta.get("model") != policy.name or meta.get("lora_rank") != policy.lora_rank:
        raise ValueError(
            f"{directory} holds {meta.get('model')} (LoRA rank {meta.get('lora_rank')}), but this node "
            f"runs {policy.name} (LoRA rank {policy.lora_rank}); use another --run-dir"
        )
    try:
        weights: dict[str, torch.Tensor] = {}
        for file in sorted((directory / "model").glob("*.safetensors")):
            weights.update(load_file(str(file)))
        flat = load_file(str(directory / "optimizer.safetensors"))
        rng = load_file(str(directory / "rng.safetensors"))["torch"]
    except Exception as err:  # safetensors' own error type, OSError, a missing key: the files are damaged
        raise _damaged(directory, err) from None
    if not weights:
        raise _damaged(directory, FileNotFoundError("no model weights"))
    if policy.lora_rank:
        set_peft_model_state_dict(policy.model, weights)
    else:
        missing, unexpected = policy.model.load_state_dict(weights, strict=False)
        tied = {"lm_head.weight"} if policy.model.config.tie_word_embeddings else set()
        if set(missing) - tied or unexpected:
            raise ValueError(f"{directory}: weights do not fit the model ({missing}, {unexpected})")
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value.to(policy.device) if name != "step" else value
    groups = policy.optimizer.state_dict()["param_groups"]
    policy.optimizer.load_state_dict({"state": state, "param_groups": groups})
    torch.set_rng_state(rng)
    return meta
