"""The tiny CPU preset: the one setup every tiny run starts from.

`swarmnode join` with a tiny model and no config file trains with it, configs/tiny-cpu.yaml
writes it out for users (a test keeps the two equal), and the demo, the ablation and attack
benches and the tests start from it and say only what they change. A tiny model learns
arithmetic with it on a CPU in minutes: lr 1e-4, not the paper's 1e-6 for billions of weights.
"""

from __future__ import annotations

import copy
from typing import Any

Tree = dict[str, Any]  # section -> key -> value, as in a YAML config

TINY_CPU: Tree = {
    "model": {"name": "tiny", "device": "cpu"},
    "task": {"name": "arithmetic", "answer_format": "answer_tag", "system_prompt": ""},
    "rollout": {"group_size": 8, "prompts_per_round": 16, "max_new_tokens": 10, "temperature": 1.0},
    "loss": {"objective": "f-tis", "trunc_c": 2.0, "filter_g": 50.0},
    "train": {"lr": 1.0e-4, "micro_batch_size": 128},
    "node": {"rounds": 300, "eval_every": 100, "eval_size": 500, "checkpoint_every": 100, "run_dir": "runs/tiny"},
}


def merged(base: Tree, top: Tree) -> Tree:
    """`top` over `base`, section by section (neither is changed)."""
    result = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def tiny_cpu(changes: Tree | None = None) -> Tree:
    """The tiny preset with `changes` over it: a whole settings tree, e.g. for a config file."""
    return merged(TINY_CPU, changes or {})
