"""Does a node learn? The tiny default, solo on CPU: held-out accuracy before and after.

    python bench/learning.py [--rounds 600] [--eval-size 500] [--objective f-tis]

Greedy pass@1 on held-out arithmetic problems (operand pairs never used in training). The
standard error is that of the paired per-problem difference, so the z-score is the gain in
units of its own noise.

The node's identity is fixed (`node.peer_id`, which seeds its sampling and its prompts), so a
run is repeatable; the last line is a digest of the trained weights, the finest check that two
runs (two machines, two kernel paths) computed the same thing.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from swarmnode.assemble import assemble
from swarmnode.settings.config import load_config

ROOT = Path(__file__).resolve().parents[1]
# Without it the identity comes from the temporary run directory, and so would the run.
PEER_ID = "learning-bench"


def parameters_digest(model: torch.nn.Module) -> str:
    """sha256 over the parameters' names and bytes, in the model's order."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(name.encode())
        digest.update(parameter.detach().float().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--objective", default="f-tis")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override")
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="swarmnode-learning-"))
    config = load_config(
        ROOT / "configs/tiny-cpu.yaml",
        [
            f"node.run_dir={run_dir}",
            f"node.peer_id={PEER_ID}",
            f"node.eval_size={args.eval_size}",
            "node.eval_every=0",
            "node.checkpoint_every=0",
            f"loss.objective={args.objective}",
            "rollout.backend=hf",
            "swarm.enabled=false",
            *args.overrides,
        ],
    )
    started = time.perf_counter()
    with assemble(config) as node:
        before = np.array(node.evaluator.scores())
        t = time.perf_counter()
        for round_ in range(args.rounds):
            record = node.run_round(round_)
            if (round_ + 1) % 100 == 0:
                print(
                    f"round {round_ + 1}: reward {record.reward_mean:.3f} ({time.perf_counter() - t:.0f} s)",
                    flush=True,
                )
        train_s = time.perf_counter() - t
        after = np.array(node.evaluator.scores())
        weights = parameters_digest(node.policy.model)
    shutil.rmtree(run_dir, ignore_errors=True)
    diff = after - before
    se = diff.std(ddof=1) / math.sqrt(len(diff))
    print(
        f"objective {args.objective}, {args.rounds} rounds of {config.rollout.prompts_per_round} "
        f"prompts x {config.rollout.group_size}, training {train_s:.0f} s, "
        f"total {time.perf_counter() - started:.0f} s"
    )
    print(
        f"held-out accuracy on {len(diff)} problems: before {before.mean():.3f}, "
        f"after {after.mean():.3f}, gain {diff.mean():+.3f} (paired SE {se:.3f}, "
        f"z = {diff.mean() / se if se else float('inf'):.1f})"
    )
    print(f"trained weights sha256 {weights}")


if __name__ == "__main__":
    main()
