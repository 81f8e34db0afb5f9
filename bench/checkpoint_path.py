"""How long a checkpoint holds up the round: written in the round against written in the background.

    python bench/checkpoint_path.py [--shape Qwen/Qwen2.5-0.5B] [--lora-rank 0] [--tries 3]

A model of the shape (random weights, fp32 on this machine's device) takes two training steps,
so AdamW's state exists; then each try times `CheckpointWriter.save` in the round (wait) and
off it (the snapshot only), and how long the background write took. Printed: medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from random_weights import build_random_model

from swarmnode.learn.sample import Sample
from swarmnode.model.checkpoint import CheckpointWriter, snapshot_bytes
from swarmnode.model.policy import Policy
from swarmnode.protocol.wire import Completion
from swarmnode.settings.config import Config
from swarmnode.sizing.memory import GIB
from swarmnode.sizing.shapes import KNOWN_SHAPES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="Qwen/Qwen2.5-0.5B")
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args()

    on_gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as scratch:
        build_random_model(KNOWN_SHAPES[args.shape], Path(scratch) / "model", torch.float32)
        config = Config.model_validate({
            "model": {"name": str(Path(scratch) / "model"), "device": "cuda" if on_gpu else "cpu",
                      "lora": {"rank": args.lora_rank, "alpha": 2 * max(args.lora_rank, 1)}},
            "rollout": {"max_new_tokens": 16, "backend": "hf"},
            "train": {"micro_batch_size": 2},
        })
        policy = Policy.load(config.model, config.train, seed=config.node.seed)
        rng = np.random.default_rng(0)
        samples = [
            Sample.of(list(rng.integers(10, 1000, 16)),
                        Completion(rng.integers(10, 1000, 16).astype(np.int32), np.full(16, -2.0, np.float32)),
                        float(rng.choice([-1, 1])))
            for _ in range(4)
        ]
        for _ in range(2):
            policy.train_step(samples, config.loss, 1.0)
        writer = CheckpointWriter(policy, Path(scratch) / "checkpoint")
        print(f"{args.shape}, {'LoRA r=' + str(args.lora_rank) if args.lora_rank else 'full'}, "
              f"{policy.device}: snapshot {snapshot_bytes(policy) / GIB:.2f} GiB; "
              f"{'background' if writer.background else 'in the round (not enough memory)'} by default", flush=True)
        in_round, off_path, write = [], [], []
        for attempt in range(args.tries):
            t = time.perf_counter()
            writer.save(attempt, wait=True)
            in_round.append(time.perf_counter() - t)
            t = time.perf_counter()
            writer.save(attempt, wait=False)
            off_path.append(time.perf_counter() - t)
            writer.wait()
            write.append(time.perf_counter() - t)
        print(f"checkpoint in the round: {statistics.median(in_round):.2f} s; in the background: "
              f"{statistics.median(off_path):.2f} s in the round (the snapshot), "
              f"{statistics.median(write):.2f} s until written; median of {args.tries}")


if __name__ == "__main__":
    main()
