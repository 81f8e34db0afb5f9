"""The settings a node starts from, chosen by the model it names.

`--model tiny` (and no config file) starts from the tiny CPU preset (swarmnode.settings.presets,
written out as configs/tiny-cpu.yaml). Naming a real model instead starts from the paper's GSM8K
setup (arXiv 2605.22537, read beside the authors' code; docs/gpu.md says setting by setting whose
choice each is): their task (<think>..</think><answer>..</answer>, graded by math-verify), group 12,
12 prompts a round (with one peer's 12 groups, their update of 24 prompts x 12), 512 new tokens,
lr 1e-6 for full weights and 1e-4 for LoRA, Adam betas (0.9, 0.999); the loss settings' own
defaults, in swarmnode.settings.config, are the paper's text: F-TIS, C = 2, g = 50, k3 divergence.
Memory settings are left to the planner (swarmnode.sizing.plan). Anything the user sets, in a
file, with --set or a flag, wins over these.
"""

from __future__ import annotations

from typing import Any

from swarmnode.settings.models import TINY_NAMES, resolve_model_name
from swarmnode.settings.presets import tiny_cpu

PAPER_GSM8K: dict[str, Any] = {
    "task": {"name": "gsm8k", "answer_format": "think_answer", "grader": "math-verify"},
    "rollout": {"group_size": 12, "prompts_per_round": 12, "max_new_tokens": 512, "temperature": 1.0},
    "train": {"lr": 1.0e-6, "adam_betas": [0.9, 0.999]},
    "node": {"rounds": 50, "eval_every": 10, "eval_size": 200, "checkpoint_every": 5},
}
LORA_LR = 1.0e-4  # the authors' rate for LoRA adapters; the paper's 1e-6 is for full weights


def defaults_for(model_name: str) -> dict[str, Any]:
    """A settings tree (section -> key -> value) to start from for this model."""
    name = resolve_model_name(model_name)
    if name in TINY_NAMES:
        return tiny_cpu()
    short = name.rstrip("/").split("/")[-1].lower()
    tree = {section: dict(values) for section, values in PAPER_GSM8K.items()}
    tree["node"]["run_dir"] = f"runs/{short}"
    return tree
