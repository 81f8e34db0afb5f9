"""Generation throughput, vLLM against Hugging Face, same prompts and lengths; log-prob agreement.

Run in the vLLM environment:  .venv-vllm/bin/python bench/vllm_generation.py
On a GPU, a Qwen2.5-1.5B-shaped model with random weights (nothing to download):
    python bench/vllm_generation.py --shape Qwen/Qwen2.5-1.5B --new-tokens 256
Rounds alternate between the backends so machine noise hits both; medians are reported.
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

from swarmnode.model.policy import Policy
from swarmnode.rollout.hf import HFGenerator
from swarmnode.rollout.vllm import VLLMGenerator
from swarmnode.settings.config import Config
from swarmnode.sizing.shapes import KNOWN_SHAPES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="tiny", help="'tiny' (the preset) or a hub id of a known shape")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    config = Config.model_validate({
        "model": {"name": "tiny", "device": args.device},
        "rollout": {"group_size": args.group, "prompts_per_round": args.prompts, "max_new_tokens": args.new_tokens,
                    "temperature": 1.0, "batch_size": args.prompts * args.group, "max_prompt_tokens": 64},
    })
    with tempfile.TemporaryDirectory() as scratch:
        if args.shape != "tiny":
            device = torch.device("cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu")
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            print(f"building a random {args.shape}-shaped model in {scratch} ...", flush=True)
            build_random_model(KNOWN_SHAPES[args.shape], Path(scratch), dtype)
            config.model.name = scratch
        policy = Policy.load(config.model, config.train, seed=config.node.seed)
        prompts = [policy.encode_prompt("", f"What is {a} + {a * 7 % 90}?") for a in range(args.prompts)]
        started = time.perf_counter()
        fast = VLLMGenerator(policy, config.rollout, seed=0)
        print(f"model {args.shape}: {policy.num_params / 1e6:.1f} M params on {policy.device}; "
              f"vLLM engine start {time.perf_counter() - started:.1f} s", flush=True)
        plain = HFGenerator(policy, config.rollout)
        rates: dict[str, list[float]] = {"hf": [], "vllm": []}
        syncs = []
        for round_ in range(args.rounds + 1):  # round 0 warms both up and is not counted
            for name, generator in (("hf", plain), ("vllm", fast)) if round_ % 2 else (("vllm", fast), ("hf", plain)):
                if policy.device.type == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                groups = generator.generate(prompts, args.group)
                if policy.device.type == "cuda":
                    torch.cuda.synchronize()
                tokens = sum(len(c.tokens) for g in groups for c in g)
                if round_:
                    rates[name].append(tokens / (time.perf_counter() - t))
            syncs.append(fast.sync_weights())
        hf, vl = statistics.median(rates["hf"]), statistics.median(rates["vllm"])
        print(f"{args.prompts} prompts x {args.group} completions, up to {args.new_tokens} new tokens, "
              f"{args.rounds} rounds (median):")
        print(f"  hf   {hf:10.0f} tokens/s")
        print(f"  vllm {vl:10.0f} tokens/s   ratio vllm/hf {vl / hf:.2f}")
        print(f"  weight sync into vLLM: {statistics.median(syncs) * 1000:.1f} ms (median)")
        groups = fast.generate(prompts, args.group)
        flat = [(p, c) for p, g in zip(prompts, groups) for c in g]
        with torch.no_grad():
            logp, _ = policy.completion_logprobs([p for p, _ in flat], [c.tokens for _, c in flat], 1.0)
        gaps = np.concatenate([np.abs(logp[i, : len(c.logprobs)].float().cpu().numpy() - c.logprobs)
                               for i, (_, c) in enumerate(flat)])
        print(f"  log pi_vllm vs trainer ({policy.compute_dtype}): mean |diff| {gaps.mean():.2e}, "
              f"max {gaps.max():.2e} over {gaps.size} tokens")
        fast.close()


if __name__ == "__main__":
    main()
