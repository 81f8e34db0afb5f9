"""The built-in `tiny` preset: a small Qwen2 model that runs and learns offline on a CPU.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on arithmetic text (digits
split one per token), the model a 2-layer Qwen2 with random weights, warmed up by a short
supervised phase on the arithmetic task so that it starts with partial accuracy and GRPO has
reward variance to learn from.

The presets ship built (presets/, PRESET_DIGESTS): a warm-up computed on another CPU's kernels
ends in other weights (lab.kernels), so figures measured on presets built on each machine could
not be compared between machines. A spec with no shipped build is built once and cached, keyed
by everything that shapes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from swarmnode.tasks.arithmetic import ArithmeticTask
from swarmnode.tasks.gym import ReasoningGymTask

log = logging.getLogger(__name__)

EOS = "<|endoftext|>"
WEIGHTS = "model.safetensors"
TINY_SPEC: dict = {
    "version": 1,
    "vocab_size": 384,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "warmup_steps": 550,
    "warmup_batch": 64,
    "warmup_lr": 1e-3,
    "seed": 1234,
}


# A second size for heterogeneous local swarms (demo, tests): same tokenizer, so same run.
TINY_LARGE_SPEC: dict = {
    **TINY_SPEC,
    "hidden_size": 192,
    "intermediate_size": 384,
    "num_hidden_layers": 3,
    # measured: 550 steps at 1e-3 left it at 5 % greedy accuracy, 700 at 5e-4 at 67 %
    "warmup_steps": 700,
    "warmup_lr": 5e-4,
}
# Another expertise: the tiny shape warmed up on addition alone, so on subtraction it starts
# far from the others and its samples are off-policy for them (and theirs for it).
TINY_ADD_SPEC: dict = {**TINY_SPEC, "warmup_operations": "+"}
# Another family: a Llama with a tokenizer of its own, which keeps multi-digit numbers together
# and marks spaces as sentencepiece does, so it shares few token boundaries with tiny's by
# accident; bytes it has no token for fall back to byte tokens, so any text encodes.
# Measured (greedy, 200 held-out problems): 18 % after 1100 warm-up steps at 1e-3, 4.5 % after
# 550; the Llama shape with tiny's tokenizer reaches 19 % and tiny 41.5 %: whole-number tokens
# and this shape generalise less to held-out pairs, so it starts as the weaker peer.
TINY_LLAMA_SPEC: dict = {
    **TINY_SPEC, "architecture": "llama", "tokenizer": "numbers", "vocab_size": 768, "warmup_steps": 1100,
}
# A reasoning-gym learner: tiny's shape and tokenizer (so tiny's family), warmed up on
# reasoning-gym's chain_sum with two terms of at most two digits, whose questions wrap the sum in
# a sentence ("State the final answer to the following arithmetic problem: 98 + 93 ="). tiny
# itself answers none of them (0 of 300): reinforcement learning needs some reward to start from.
TINY_CHAIN_SPEC: dict = {
    **TINY_SPEC, "warmup_task": "rg:chain_sum", "warmup_options": {"min_terms": 2, "max_terms": 2, "max_digits": 2},
}
TINY_PRESETS: dict[str, dict] = {
    "tiny": TINY_SPEC, "tiny-large": TINY_LARGE_SPEC, "tiny-add": TINY_ADD_SPEC, "tiny-llama": TINY_LLAMA_SPEC,
    "tiny-chain": TINY_CHAIN_SPEC,
}
# Where the presets ship, built by `python bench/presets.py --ship` on the pinned kernels, and the
# sha256 of each one's model.safetensors: a test holds the files to these, benches print them.
SHIPPED = Path(__file__).resolve().parent / "presets"
PRESET_DIGESTS: dict[str, str] = {
    "tiny": "0409036b6e92547c34fa91826dc29786864bf393ff4badaa51c20ad1960701f2",
    "tiny-large": "7e64a98dcc5b3849912bedb14f2a562957aa2e26da021eaa1bc1219c2501570e",
    "tiny-add": "f2eecc6a50ba58e0f90e7f3a8c93ea51263eb48fc1d375037e7a1dd17be6dc57",
    "tiny-llama": "4b65cc611ebca4b64394d4eb38fea22dd537846312278b0bc98e5057ddc5bfec",
    "tiny-chain": "04fabc089dfaa0dff4656b273b96989cae8a806d7600e044d8dc20be76b7509c",
}
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]  # sentencepiece's byte-fallback vocabulary


def _spec_key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def build_tokenizer(spec: dict = TINY_SPEC) -> PreTrainedTokenizerFast:
    """BPE over arithmetic text; '<answer>' tags are single tokens. The default is byte-level
    with one token per digit; `"tokenizer": "numbers"` is sentencepiece-like (spaces as '▁',
    numbers merged, byte fallback)."""
    task = ArithmeticTask(seed=spec["seed"])
    corpus = []
    for i in range(4000):
        problem = task.train_problem(i)
        corpus.append(f"{problem.question}\n{task.target(problem)}")
    if spec.get("tokenizer") == "numbers":
        tokenizer = Tokenizer(models.BPE(byte_fallback=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
        tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="never")])
        trainer = trainers.BpeTrainer(
            vocab_size=spec["vocab_size"],
            special_tokens=[EOS, *BYTE_TOKENS],
            initial_alphabet=["▁", *map(chr, range(33, 127))],  # printable ASCII whole, the rest by bytes
            show_progress=False,
        )
    else:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=spec["vocab_size"],
            special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in ("<answer>", "</answer>")])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)


def build_model(tokenizer: PreTrainedTokenizerFast, spec: dict = TINY_SPEC, **overrides: int) -> PreTrainedModel:
    """A randomly initialised Qwen2 (or Llama, by the spec's architecture) sized by the spec
    (overrides make other sizes for tests)."""
    sizes = {
        k: spec[k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        )
    }
    sizes.update(overrides)
    ids = {"bos_token_id": tokenizer.eos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    torch.manual_seed(spec["seed"])
    if spec.get("architecture") == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), tie_word_embeddings=True, **ids, **sizes))
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, **ids, **sizes))


def supervised_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    progress: Callable[[int, float], None] | None = None,
    operations: str = "+-",
    task: ArithmeticTask | ReasoningGymTask | None = None,
    max_operand: int = 99,
) -> None:
    """Teacher-forced training on 'question -> <answer>x</answer><eos>', loss on the answer
    (arithmetic problems of `operations` with operands up to `max_operand`, or `task`'s
    training problems)."""
    task = task or ArithmeticTask(seed=seed + 1, max_operand=max_operand, operations=operations)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    eos = tokenizer.eos_token_id
    model.train()
    for step in range(steps):
        problems = [task.train_problem(rng.randrange(task.num_train)) for _ in range(batch)]
        prompts = tokenizer([f"{p.question}\n" for p in problems])["input_ids"]
        targets = [t + [eos] for t in tokenizer([f"<answer>{p.answer}</answer>" for p in problems])["input_ids"]]
        width = max(len(p) + len(t) for p, t in zip(prompts, targets))
        ids = torch.full((batch, width), eos, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, (p, t) in enumerate(zip(prompts, targets)):
            ids[row, : len(p) + len(t)] = torch.tensor(p + t)
            labels[row, len(p) : len(p) + len(t)] = torch.tensor(t)
            attention[row, : len(p) + len(t)] = 1
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress(step + 1, float(loss.detach()))
    model.eval()


def cache_dir() -> Path:
    """Where built presets live: $SWARMNODE_CACHE, else ~/.cache/swarmnode."""
    return Path(os.environ.get("SWARMNODE_CACHE", Path.home() / ".cache" / "swarmnode"))


def shipped_dir(spec: dict) -> Path:
    """Where the package ships the build of `spec` (if it ships one)."""
    return SHIPPED / f"tiny-{_spec_key(spec)}"


def tiny_path(spec: dict = TINY_SPEC) -> Path:
    """The shipped build of `spec` where there is one, else its place in the cache."""
    shipped = shipped_dir(spec)
    return shipped if (shipped / WEIGHTS).exists() else cache_dir() / shipped.name


def weights_digest(path: Path) -> str:
    """sha256 of a built preset's weights file: equal digests, equal weights."""
    return hashlib.sha256((path / WEIGHTS).read_bytes()).hexdigest()


def ensure_tiny(spec: dict = TINY_SPEC) -> Path:
    """The preset's directory: shipped, cached, or built now (about half a minute on 2 cores)."""
    path = tiny_path(spec)
    if path.parent == SHIPPED or (path / "done").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    build_tiny(spec, staging)
    try:
        os.rename(staging, path)
    except OSError:  # another process finished first; theirs is as good as ours
        shutil.rmtree(staging, ignore_errors=True)
    return path


def build_tiny(spec: dict, directory: Path) -> None:
    """Build the preset into `directory` (which exists): tokenizer, warmed-up weights, its spec."""
    started = time.monotonic()
    log.info("building the tiny preset in %s", directory)
    tokenizer = build_tokenizer(spec)
    model = build_model(tokenizer, spec)

    def report(step: int, loss: float) -> None:
        if step % 50 == 0 or step == spec["warmup_steps"]:
            log.info("tiny warm-up step %d/%d loss %.3f", step, spec["warmup_steps"], loss)

    supervised_warmup(
        model,
        tokenizer,
        spec["warmup_steps"],
        spec["warmup_batch"],
        spec["warmup_lr"],
        spec["seed"],
        report,
        operations=spec.get("warmup_operations", "+-"),
        task=ReasoningGymTask(spec["warmup_task"], spec.get("warmup_options")) if "warmup_task" in spec else None,
        max_operand=spec.get("warmup_max_operand", 99),
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "spec.json").write_text(json.dumps(spec, indent=1))
    (directory / "done").write_text("ok\n")
    log.info("tiny preset ready in %.1f s", time.monotonic() - started)


def load_tiny(spec: dict = TINY_SPEC) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    path = ensure_tiny(spec)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, tokenizer
