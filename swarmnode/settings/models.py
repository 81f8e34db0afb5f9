"""Model names: what a user may write after --model, and what it resolves to.

The tiny presets are built locally (swarmnode.model.tiny) and never fetched; a short Qwen
name gains its organisation; hub ids and local paths pass through. No torch here.
"""

from __future__ import annotations

from pathlib import Path

TINY_NAMES = ("tiny", "tiny-large", "tiny-add", "tiny-llama", "tiny-chain")  # built locally (swarmnode.model.tiny), never fetched
GYM_PRESETS = ("tiny-chain",)  # presets warmed up on a reasoning-gym dataset: building them needs reasoning-gym
SHORT_NAME_ORGS = {"qwen": "Qwen"}


def resolve_model_name(name: str) -> str:
    """'Qwen2.5-3B' -> 'Qwen/Qwen2.5-3B'; hub ids, local paths and the tiny presets pass through."""
    if name in TINY_NAMES or "/" in name or Path(name).exists():
        return name
    for prefix, org in SHORT_NAME_ORGS.items():
        if name.lower().startswith(prefix):
            return f"{org}/{name}"
    return name
