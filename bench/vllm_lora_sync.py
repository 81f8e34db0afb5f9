"""LoRA into vLLM after each step: merged into the weights (what swarmnode does) or as an adapter.

Merged: the trainer adds B@A to the base weights and reloads every weight into the engine;
generation then runs at base-model speed. Adapter: the trainer saves the adapter and the
engine loads it under a new id; generation pays for the extra LoRA kernels.
Run in the vLLM environment:
    .venv-vllm/bin/python bench/vllm_lora_sync.py --shape Qwen/Qwen2.5-0.5B
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

from swarmnode.model.policy import Policy  # noqa: E402
from swarmnode.rollout.vllm import VLLMGenerator  # noqa: E402
from swarmnode.settings.config import Config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="tiny")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=["merged", "adapter"], required=False)
    args = parser.parse_args()
    if args.mode is None:  # one engine per process (vLLM keeps process-wide state): run both modes
        import subprocess
        import sys

        for mode in ("merged", "adapter"):
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--mode", mode], check=True)
        return

    import sys

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    sys.path.insert(0, str(Path(__file__).parent))
    from vllm_generation import build_random_model

    config = Config.model_validate({
        "model": {"name": "tiny", "device": "auto", "lora": {"rank": args.rank, "alpha": 2 * args.rank}},
        "rollout": {"group_size": args.group, "prompts_per_round": args.prompts,
                    "max_new_tokens": args.new_tokens, "max_prompt_tokens": 64},
    })
    with tempfile.TemporaryDirectory() as scratch:
        if args.shape != "tiny":
            dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
            build_random_model(args.shape, Path(scratch) / "model", dtype)
            config.model.name = str(Path(scratch) / "model")
        policy = Policy.load(config.model, config.train, seed=config.node.seed)
        with torch.no_grad():  # a non-zero adapter, as after some training
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.01)
        prompts = [policy.encode_prompt("", f"What is {a} + 5?") for a in range(args.prompts)]
        sync_s, rate = [], []
        if args.mode == "merged":
            generator = VLLMGenerator(policy, config.rollout)
            for _ in range(args.rounds + 1):
                sync_s.append(generator.sync_weights())
                t = time.perf_counter()
                groups = generator.generate(prompts, args.group)
                rate.append(sum(len(c.tokens) for g in groups for c in g) / (time.perf_counter() - t))
        else:
            on_cpu = policy.device.type == "cpu"
            llm = LLM(model=policy.source, dtype="float32" if on_cpu else "bfloat16", enforce_eager=on_cpu,
                      max_model_len=64 + args.new_tokens, enable_lora=True, max_lora_rank=args.rank,
                      max_loras=1, logprobs_mode="processed_logprobs", gpu_memory_utilization=0.3,
                      **({"kv_cache_memory_bytes": 256 * 2**20} if on_cpu else {}))
            params = SamplingParams(n=args.group, max_tokens=args.new_tokens, logprobs=0, detokenize=False)
            for step in range(args.rounds + 1):
                t = time.perf_counter()
                adapter_dir = Path(scratch) / f"adapter-{step}"
                policy.model.save_pretrained(adapter_dir)
                request = LoRARequest(f"step-{step}", step + 1, str(adapter_dir))
                batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
                llm.generate(batch[:1], SamplingParams(max_tokens=1), lora_request=request, use_tqdm=False)
                sync_s.append(time.perf_counter() - t)  # save + load (+ one 1-token request)
                t = time.perf_counter()
                outs = llm.generate(batch, params, lora_request=request, use_tqdm=False)
                rate.append(sum(len(c.token_ids) for o in outs for c in o.outputs) / (time.perf_counter() - t))
        print(f"{args.mode:8} {args.shape} LoRA r={args.rank}: sync {statistics.median(sync_s[1:]) * 1000:8.1f} ms, "
              f"generation {statistics.median(rate[1:]):8.0f} tokens/s (median of {args.rounds})", flush=True)


if __name__ == "__main__":
    main()
