"""Peak GPU memory of one training step, full fine-tuning against LoRA, next to join's estimate.

    python bench/train_memory.py --shape Qwen/Qwen2.5-1.5B     (needs CUDA; random weights)
Without CUDA it prints the estimates only (the trainer's part: no vLLM share).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
from pathlib import Path

import numpy as np
import torch
from random_weights import build_random_model

from swarmnode.learn.sample import Sample
from swarmnode.model.policy import Policy
from swarmnode.protocol.wire import Completion
from swarmnode.settings.config import Config
from swarmnode.sizing.memory import GIB, TYPICAL_PROMPT_TOKENS, estimate
from swarmnode.sizing.shapes import KNOWN_SHAPES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="Qwen/Qwen2.5-1.5B")
    parser.add_argument("--samples", type=int, default=24, help="completions in the step (paper: 24)")
    parser.add_argument("--length", type=int, default=512, help="tokens per completion")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--lora-rank", type=int, default=128)
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on")
    args = parser.parse_args()

    shape = KNOWN_SHAPES[args.shape]
    on_gpu = torch.cuda.is_available()
    setups = {"full": 0, f"LoRA r={args.lora_rank} (q, v)": args.lora_rank}
    with tempfile.TemporaryDirectory() as scratch:
        if on_gpu:
            build_random_model(shape, Path(scratch), torch.bfloat16)
        for label, rank in setups.items():
            config = Config.model_validate({
                "model": {"name": scratch, "device": "cuda" if on_gpu else "cpu",
                          "lora": {"rank": rank, "alpha": 2 * max(rank, 1)}},
                "rollout": {"max_new_tokens": args.length, "backend": "hf"},
                "train": {"micro_batch_size": args.micro_batch, "gradient_checkpointing": args.checkpointing},
            })
            # the trainer's part of the estimate; the step below uses prompts of the same length
            parts = estimate(config, shape, 80 * GIB, True, "hf").parts
            trainer = sum(v for k, v in parts.items() if "generation" not in k and "CUDA" not in k)
            line = f"{label:<22} estimate {trainer / GIB:6.1f} GiB"
            if on_gpu:
                torch.cuda.reset_peak_memory_stats()
                policy = Policy.load(config.model, config.train, seed=config.node.seed)
                rng = np.random.default_rng(0)
                samples = [
                    Sample.of(list(rng.integers(10, 1000, TYPICAL_PROMPT_TOKENS)),
                                Completion(rng.integers(10, 1000, args.length).astype(np.int32), np.full(args.length, -2.0, np.float32)),
                                float(rng.choice([-1, 1])))
                    for _ in range(args.samples)
                ]
                policy.train_step(samples, config.loss, 1.0)
                policy.train_step(samples, config.loss, 1.0)  # AdamW state now exists
                torch.cuda.synchronize()
                line += f"   measured peak {torch.cuda.max_memory_allocated() / GIB:6.1f} GiB"
                del policy
                gc.collect()
                torch.cuda.empty_cache()
            print(line, flush=True)
    if not on_gpu:
        print("no CUDA here: measured peaks need a GPU")


if __name__ == "__main__":
    main()
