"""One node round on a GPU, per setup: where the time goes and how much memory it takes.

    python bench/gpu_round.py                 # on a GPU: measure; on a CPU: plans and estimates only
    python bench/gpu_round.py --shapes Qwen/Qwen2.5-1.5B --rounds 3
    python bench/gpu_round.py --smoke         # the measuring code on CPU, a small shape (no figures)

Setups: every shipped config that fits this card as written, and the planner's pick for each
Qwen2.5 shape (0.5B-7B) with the paper's defaults. Each runs with random weights of the real
shape (no download) and the project's own code: HF generation of one round's sequences
(prompts of TYPICAL_PROMPT_TOKENS random tokens; random weights rarely stop early, so every
completion runs to max_new_tokens), a training step on them plus as many peer samples, and
the weight sync. Printed per setup: generate / train / sync seconds (median over rounds after
the first), generation's share of a round that trains on its own samples only (gen/rd: the
cost model of `bench/ablation.py --match time`), generation tokens/s next to plain bf16 `generate` of the same batch and length and
to the bound memory bandwidth sets (every decoding step reads every weight once), and the
start-up estimate next to the measured process peak (torch's peak reservation plus what the
CUDA context held before any tensor; a vLLM engine reserves its share up front, which torch
counts). Each setup runs with HF generation and, when vLLM imports, with vLLM as well.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from random_weights import build_random_model
from transformers import AutoModelForCausalLM, GenerationConfig

from swarmnode.learn.sample import Sample
from swarmnode.model.policy import Policy
from swarmnode.rollout import make_generator, vllm_available
from swarmnode.settings.config import Config, load_config
from swarmnode.sizing.memory import GIB, TYPICAL_PROMPT_TOKENS, estimate
from swarmnode.sizing.plan import BASE_SHAPES as PLAN_SHAPES
from swarmnode.sizing.plan import DEFAULT_CARDS_GIB, explain, make_plan
from swarmnode.sizing.shapes import KNOWN_SHAPES, ModelShape, shape_of

ROOT = Path(__file__).resolve().parents[1]
BASE_SHAPES = list(PLAN_SHAPES)
SMOKE_SHAPE = ModelShape(hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, vocab=512, tied=True)


def setups(capacity: float, shapes: list[str]) -> list[tuple[str, Config]]:
    """(label, config) for shipped configs that fit as written and the planner's picks."""
    chosen = []
    for path in sorted((ROOT / "configs").glob("qwen*.yaml")):
        config = load_config(path)
        if config.model.name not in shapes and shapes != BASE_SHAPES:
            continue
        plan = make_plan(config, shape_of(config.model.name), capacity, "hf")
        if plan.fits:
            chosen.append((path.name, config))
    for name in shapes:
        config = load_config(None, [f"model.name={name}"])
        plan = make_plan(config, shape_of(name), capacity, "hf")
        if plan.fits:
            chosen.append((f"plan: {name.split('/')[-1]}", plan.config))
    return chosen


def print_plans(shapes: list[str]) -> None:
    print("no CUDA here: plans and estimates only (measurements need a GPU)\n")
    for path in sorted((ROOT / "configs").glob("qwen*.yaml")):
        config = load_config(path)
        shape = shape_of(config.model.name)
        cells = []
        for gib in DEFAULT_CARDS_GIB:
            total = estimate(config, shape, gib * GIB, True, "hf").total / GIB
            cells.append(f"{gib:.0f} GiB: {total:5.1f}{'' if total <= gib else ' (no)'}")
        print(f"{path.name:<32} estimate as written, hf  " + "   ".join(cells))
    print()
    for name in shapes:
        for gib in DEFAULT_CARDS_GIB:
            config = load_config(None, [f"model.name={name}"])
            print(explain(config, shape_of(name), gib * GIB, "hf")[1], end="\n\n")


def memory_bandwidth(device: torch.device) -> float:
    """Bytes/s of a device-local copy of 1 GiB (read + write), median of 5."""
    src = torch.empty(GIB // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t)
    del src, dst
    return 2 * (GIB // 2) / statistics.median(times)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_generate_tokens_per_s(directory: Path, device: torch.device, prompts: torch.Tensor, new_tokens: int) -> float:
    """Hugging Face `generate` on the bf16 model itself, sampling, same batch and length."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device).eval()
    config = GenerationConfig(do_sample=True, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    mask = torch.ones_like(prompts)  # equal lengths, no padding
    with torch.no_grad():
        warm_up = GenerationConfig(max_new_tokens=2, pad_token_id=0)
        model.generate(prompts[:, :8], attention_mask=mask[:, :8], generation_config=warm_up)
        sync(device)
        started = time.perf_counter()
        model.generate(prompts, attention_mask=mask, generation_config=config)
        sync(device)
    elapsed = time.perf_counter() - started
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return prompts.shape[0] * new_tokens / elapsed


def measure(label: str, config: Config, shape: ModelShape, args: argparse.Namespace, device: torch.device,
            capacity: float, bandwidth: float, backend: str) -> str:
    rollout = config.rollout
    if args.max_new_tokens:
        rollout.max_new_tokens = args.max_new_tokens
    with tempfile.TemporaryDirectory() as scratch:
        build_random_model(shape, Path(scratch), torch.bfloat16)
        config.model.name, config.model.device = scratch, str(device)
        config.rollout.backend = backend
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            free, total = torch.cuda.mem_get_info(device)
            context = total - free - torch.cuda.memory_reserved(device)  # CUDA context, other processes
        policy = Policy.load(config.model, config.train, seed=config.node.seed)
        generator = make_generator(backend, policy, rollout, seed=0)
        rng = np.random.default_rng(0)
        count = rollout.prompts_per_round
        prompts = [list(rng.integers(10, min(shape.vocab, 1000), TYPICAL_PROMPT_TOKENS)) for _ in range(count)]
        timings: dict[str, list[float]] = {"generate": [], "train": [], "sync": []}
        tokens = 0
        for _ in range(args.rounds):
            sync(device)
            t = time.perf_counter()
            groups = generator.generate(prompts, rollout.group_size)
            sync(device)
            timings["generate"].append(time.perf_counter() - t)
            completions = [(p, c) for p, g in zip(prompts, groups) for c in g]
            tokens = sum(len(c.tokens) for _, c in completions)
            samples = [
                Sample.of(p, c, float(rng.choice([-1.0, 1.0])), source)
                for source in ("", "peer") for p, c in completions  # own samples and as many peers'
            ]
            t = time.perf_counter()
            policy.train_step(samples, config.loss, rollout.temperature)
            sync(device)
            timings["train"].append(time.perf_counter() - t)
            timings["sync"].append(generator.sync_weights())
        later = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in timings.items()}
        gen_tps = tokens / later["generate"]
        peak = float("nan")
        if device.type == "cuda":
            peak = (torch.cuda.max_memory_reserved(device) + context) / GIB
        est = estimate(config, shape, capacity, device.type == "cuda", backend).total / GIB
        batch = count * rollout.group_size if backend == "vllm" else min(count * rollout.group_size, rollout.batch_size)
        generator.close()
        del generator, policy
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        input_ids = torch.tensor([p for p in prompts for _ in range(rollout.group_size)][:batch], device=device)
        plain = plain_generate_tokens_per_s(Path(scratch), device, input_ids, rollout.max_new_tokens)
    bound = batch * bandwidth / (2 * shape.num_params)
    round_s = sum(later.values())
    return (f"{label + ' ' + backend:<34} {later['generate']:7.2f} {later['train']:6.2f} {later['sync']:5.2f} {round_s:7.2f} "
            f"{gen_share_alone(later):6.2f} "
            f"{gen_tps:8.0f} {plain:8.0f} {gen_tps / plain:5.2f} {bound:8.0f} {est:7.1f} {peak:7.1f} {est / peak:6.2f}")


def gen_share_alone(seconds: dict[str, float]) -> float:
    """Generation's share of a round that trains on its own samples only: the measured step
    trains on as many peers' samples besides, so its own half is counted (a step's time grows
    with its samples). This is the cost model's `--gen-share` in bench/ablation.py."""
    own_train = seconds["train"] / 2
    return seconds["generate"] / (seconds["generate"] + own_train + seconds["sync"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=BASE_SHAPES, choices=sorted(KNOWN_SHAPES))
    parser.add_argument("--rounds", type=int, default=3, help="rounds per setup (the first is a warm-up)")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="override the setups' length (0 = theirs)")
    parser.add_argument("--smoke", action="store_true", help="run the measuring code on CPU with a small shape")
    parser.add_argument("--only", nargs="+", default=[], metavar="TEXT",
                        help="setups whose label contains one of these (e.g. 'plan: Qwen2.5-3B' qwen2.5-3b.yaml)")
    parser.add_argument("--card-gib", type=float, default=0.0,
                        help="plan for and cap this process at a card of this size (e.g. 80 on a 141 GB H200)")
    args = parser.parse_args()
    if args.smoke:
        device, capacity = torch.device("cpu"), 24 * GIB
        config = load_config(None, ["rollout.group_size=2", "rollout.prompts_per_round=2", "train.micro_batch_size=2"])
        runs = [("smoke (small shape, CPU)", config, SMOKE_SHAPE)]
        args.max_new_tokens = args.max_new_tokens or 8
    elif not torch.cuda.is_available():
        print_plans(args.shapes)
        return
    else:
        device = torch.device("cuda")
        capacity = float(torch.cuda.get_device_properties(device).total_memory)
        if args.card_gib:  # a smaller card: the planner plans for it and torch refuses to go past it
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.card_gib * GIB / capacity), torch.cuda.current_device())
            capacity = min(capacity, args.card_gib * GIB)
        runs = [(label, config, shape_of(config.model.name)) for label, config in setups(capacity, args.shapes)
                if not args.only or any(text in label for text in args.only)]
    bandwidth = memory_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}: {capacity / GIB:.1f} GiB, copy bandwidth {bandwidth / 1e9:.0f} GB/s; "
          f"{args.rounds} rounds per setup, medians after the first")
    print(f"{'setup, backend':<34} {'gen s':>7} {'train':>6} {'sync':>5} {'round':>7} {'gen/rd':>6} {'tok/s':>8} {'bf16':>8} {'ratio':>5} "
          f"{'bound':>8} {'est GiB':>7} {'peak':>7} {'est/pk':>6}")
    backends = ["hf"] + (["vllm"] if vllm_available() else [])
    for label, config, shape in runs:
        for backend in backends:
            try:
                print(measure(label, config.model_copy(deep=True), shape, args, device, capacity, bandwidth, backend),
                      flush=True)
            except torch.OutOfMemoryError as err:
                print(f"{label + ' ' + backend:<34} out of memory: {str(err).splitlines()[0]}", flush=True)
                gc.collect()
                torch.cuda.empty_cache()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
