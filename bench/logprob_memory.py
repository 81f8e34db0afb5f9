"""Peak memory of the step's log-probs, whole sequences at once against chunks through the LM head.

    python bench/logprob_memory.py [--micro-batch 2] [--prompt 128] [--completion 256] [--layers 2]

A model with Qwen2.5-0.5B's width and vocabulary (151,936) but `--layers` layers, random
weights: the vocabulary is what makes [tokens x vocabulary] tensors large, the depth only adds
the same to both. One forward and backward of `completion_logprobs` per setting, each in a
fresh process; printed: that process's peak (CPU: max resident set; GPU: torch's peak
allocation) and the part above the same process after loading the model.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from swarmnode.model.policy import Policy
from swarmnode.model.tiny import build_tokenizer
from swarmnode.settings.config import LoraSettings, TrainSettings
from swarmnode.sizing.shapes import KNOWN_SHAPES

GIB = 2**30


def peak_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # KiB on Linux


def one(args: argparse.Namespace) -> dict[str, float]:
    """In this process: load, note the peak, run one forward/backward, note the peak."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-0.5B"]
    tokenizer = build_tokenizer()
    config = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device)
    settings = TrainSettings(micro_batch_size=args.micro_batch, logprob_chunk_tokens=args.chunk)
    policy = Policy(model, tokenizer, "bench", settings, LoraSettings(), use_chat_template=False,
                    compute_dtype=torch.bfloat16 if device.type == "cuda" else None, seed=0)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(10, 1000, args.prompt)) for _ in range(args.micro_batch)]
    completions = [rng.integers(10, 1000, args.completion) for _ in range(args.micro_batch)]
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    loaded = peak_bytes(device)
    policy.model.train()
    logp, mask = policy.completion_logprobs(prompts, completions, 1.0)
    (logp * mask).sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"loaded": loaded, "peak": peak_bytes(device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=-1, help=argparse.SUPPRESS)  # set in the child process
    args = parser.parse_args()
    if args.chunk >= 0:
        print(json.dumps(one(args)))
        return
    where = "GPU, torch peak allocation" if torch.cuda.is_available() else "CPU, max resident set"
    print(f"log-probs of {args.micro_batch} x {args.completion} completion tokens (prompts {args.prompt}), "
          f"vocabulary 151,936, {args.layers} layers of Qwen2.5-0.5B's width; {where}")
    full_tensor = args.micro_batch * args.completion * 151936 * 4 / GIB
    print(f"one fp32 [micro-batch x tokens x vocabulary] tensor: {full_tensor:.2f} GiB")
    rows = {}
    for chunk in (0, 128, 32):
        child = [sys.executable, __file__, f"--chunk={chunk}", f"--micro-batch={args.micro_batch}",
                 f"--prompt={args.prompt}", f"--completion={args.completion}", f"--layers={args.layers}"]
        done = subprocess.run(child, capture_output=True, text=True, check=True)
        rows[chunk] = json.loads(done.stdout.strip().splitlines()[-1])
        label = "whole sequences" if chunk == 0 else f"chunks of {chunk}"
        r = rows[chunk]
        print(f"{label:<16} peak {r['peak'] / GIB:6.2f} GiB, above the loaded model {(r['peak'] - r['loaded']) / GIB:6.2f} GiB",
              flush=True)
    saved = rows[0]["peak"] - rows[128]["peak"]
    print(f"chunks of 128 save {saved / GIB:.2f} GiB of peak ({saved / max(rows[0]['peak'] - rows[0]['loaded'], 1):.0%} "
          "of what the whole-sequence step adds)")


if __name__ == "__main__":
    main()
