"""The trainable policy: load a model (hub id, path or the tiny preset), LoRA, log-probs, a step."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from swarmnode.learn.agreement import GradientProbe, StepAgreement, probe_parameters
from swarmnode.learn.alignment import SpanBatch
from swarmnode.learn.loss import ObjectiveStats, ObjectiveTerms, objective_terms
from swarmnode.learn.sample import OWN, Sample
from swarmnode.model.batching import AdaptiveBatch
from swarmnode.model.logprobs import chunked_logprobs, decoder_and_head, logprobs_from_logits
from swarmnode.model.tiny import TINY_PRESETS, load_tiny, tiny_path
from swarmnode.protocol.wire import HUB_NAME
from swarmnode.settings.config import LoraSettings, LossSettings, ModelSettings, TrainSettings
from swarmnode.settings.models import TINY_NAMES, resolve_model_name
from swarmnode.sizing.devices import device_of


def pick_device(requested: str) -> torch.device:
    kind, index = device_of(requested)
    return torch.device(kind, index) if kind == "cuda" else torch.device(kind)


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, requested)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Hash of the vocabulary: peers must tokenise identically for token ids to mean anything."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256("\n".join(f"{i}\t{t}" for t, i in vocab).encode())
    digest.update(f"eos={tokenizer.eos_token_id}".encode())
    return digest.hexdigest()[:16]


log = logging.getLogger(__name__)


def with_adapters(model: torch.nn.Module, lora: LoraSettings, seed: int) -> torch.nn.Module:
    """`model` wrapped in fresh LoRA adapters drawn from `seed`. peft draws them from torch's
    global generator, which nothing else seeds: left to it, every start of the same run would
    train from other adapters, and a seed would not fix a LoRA run. The global generator's
    state is put back afterwards."""
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        return get_peft_model(
            model,
            LoraConfig(
                r=lora.rank,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
                task_type="CAUSAL_LM",
            ),
        )


def inference_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of `model` with every parameter in `dtype` (tied weights stay tied).

    The parameters are cast one by one into the deep copy's memo, so the copy never holds a
    second set of fp32 weights, only the `dtype` one. Each is copied even when it is already
    in `dtype` (`Tensor.to` would return the same storage): a reference that shared the
    trained weights would move with every step, and the anchored gate with it.
    """
    memo: dict[int, Any] = {
        id(p): torch.nn.Parameter(p.detach().to(dtype, copy=True), requires_grad=False) for p in model.parameters()
    }
    clone = copy.deepcopy(model, memo)
    return clone.eval()


@torch.no_grad()
def refresh_copy(model: torch.nn.Module, clone: torch.nn.Module) -> None:
    """Copy the trained weights into an inference copy made by `inference_copy`."""
    targets = dict(clone.named_parameters())
    for name, param in model.named_parameters():
        targets[name].copy_(param)


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    stats: ObjectiveStats
    agreement: StepAgreement | None = None  # when measured: each peer's gradient against ours


def load_tokenizer(name: str, revision: str | None = None) -> PreTrainedTokenizerBase:
    """A hub id's or local directory's tokenizer, as a node loads its own: also how a node
    rebuilds a peer's from the hub id its batches name (swarmnode.model.hub_tokenizers), so
    both sides build the same document. Never runs a repository's code."""
    return AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=False)


def hub_name(name: str, revision: str | None) -> str:
    """The hub id (@revision) a model came from, which its batches name beside their tokenizer's
    digest; "" for a tiny preset, a local directory or anything else peers cannot fetch."""
    named = f"{name}@{revision}" if revision else name
    if name in TINY_NAMES or Path(name).exists() or not HUB_NAME.fullmatch(named):
        return ""
    return named


class Policy:
    """A causal LM with its tokenizer and optimiser; the only code that runs backward()."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        name: str,
        train: TrainSettings,
        lora: LoraSettings,
        use_chat_template: bool = True,
        source: str | None = None,
        revision: str | None = None,
        compute_dtype: torch.dtype | None = None,
        *,
        seed: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.source = source or name  # what another loader (vLLM) opens: local dir or hub id
        self.revision = revision
        self.hub_name = hub_name(self.source, revision)
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 2048))
        weights_dtype = next(model.parameters()).dtype
        # Forward passes run in compute_dtype; weights (the optimiser's copy) may be wider.
        self.compute_dtype = compute_dtype or weights_dtype
        self.autocast = self.compute_dtype != weights_dtype
        self.train_settings = train
        self.micro_batch = AdaptiveBatch("train.micro_batch_size", train.micro_batch_size)
        self.use_chat_template = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
        self.num_params = sum(p.numel() for p in model.parameters())
        self.lora_rank = lora.rank or None
        if lora.rank:
            model = with_adapters(model, lora, seed)
        if train.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = model
        self.reference: torch.nn.Module | None = None  # full fine-tuning's frozen start: keep_reference()
        self.device = next(model.parameters()).device
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=train.lr,
            weight_decay=train.weight_decay,
            betas=tuple(train.adam_betas),
        )
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer of {name} has no EOS token")

    @classmethod
    def load(cls, settings: ModelSettings, train: TrainSettings, *, seed: int) -> Policy:
        """Load weights and tokenizer for the settings' model name; `seed` draws the LoRA
        adapters' initial weights."""
        hf_logging.disable_progress_bar()  # per-round lines are ours; loading bars clutter them
        name = resolve_model_name(settings.name)
        device = pick_device(settings.device)
        dtype = pick_dtype(settings.dtype, device)
        weights_dtype = master_dtype(dtype, bool(settings.lora.rank), train.master_weights)
        if name in TINY_NAMES:
            model, tokenizer = load_tiny(TINY_PRESETS[name])
            source = str(tiny_path(TINY_PRESETS[name]))  # built by load_tiny
        else:
            source = name
            tokenizer = load_tokenizer(name, settings.revision)
            model = AutoModelForCausalLM.from_pretrained(name, revision=settings.revision, dtype=weights_dtype)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = model.to(device=device, dtype=weights_dtype)
        return cls(
            model, tokenizer, name, train, settings.lora, settings.use_chat_template,
            source=source, revision=settings.revision, compute_dtype=dtype, seed=seed,
        )

    def compute(self) -> contextlib.AbstractContextManager:
        """Context for forward passes: autocast to compute_dtype when weights are kept wider."""
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def merged_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights under the base checkpoint's names, LoRA deltas merged in (for vLLM)."""
        if not self.lora_rank:
            yield from self.model.named_parameters()
            return
        base = self.model.get_base_model()
        lora_layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
        with torch.no_grad():
            for name, param in base.named_parameters():
                if ".lora_" in name:
                    continue
                module_name, marker, leaf = name.partition(".base_layer.")
                if not marker:
                    yield name, param
                elif leaf == "weight":
                    delta = lora_layers[module_name].get_delta_weight("default")
                    yield f"{module_name}.weight", param + delta.to(param.dtype)
                else:
                    yield f"{module_name}.{leaf}", param

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def encode_prompt(self, system: str, question: str) -> list[int]:
        """Token ids of the prompt, through the chat template when the model has one."""
        if self.use_chat_template:
            messages = [{"role": "user", "content": question}]
            if system:
                messages.insert(0, {"role": "system", "content": system})
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = f"{system}\n{question}\n" if system else f"{question}\n"
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, token_ids: np.ndarray | list[int]) -> str:
        return self.tokenizer.decode(list(map(int, token_ids)), skip_special_tokens=True)

    def completion_logprobs(
        self,
        prompts: list[list[int]],
        completions: list[np.ndarray],
        temperature: float,
        model: torch.nn.Module | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi_theta of each completion token at `temperature`, shape [B, T], plus mask;
        under `model` instead when given (the reference).

        The mask comes from lengths, never from token ids, so an EOS equal to the pad token
        keeps its log-prob.
        """
        model = self.model if model is None else model
        lengths = [len(c) for c in completions]
        width = max(len(p) + n for p, n in zip(prompts, lengths))
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, (prompt, completion) in enumerate(zip(prompts, completions)):
            sequence = list(prompt) + [int(t) for t in completion]
            input_ids[row, : len(sequence)] = torch.tensor(sequence)
            attention[row, : len(sequence)] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        longest = max(lengths)
        steps = torch.arange(longest, device=self.device)
        starts = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        positions = (starts[:, None] + steps[None, :]).clamp(max=width - 1)  # states that predict each token
        targets = input_ids.gather(1, (positions + 1).clamp(max=width - 1))
        chunk = self.train_settings.logprob_chunk_tokens
        with self.compute():
            if chunk:
                body, head = decoder_and_head(model)
                hidden = body(input_ids=input_ids, attention_mask=attention).last_hidden_state
                picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
                logp = chunked_logprobs(picked, targets, head, temperature, chunk)
            else:  # whole sequences: [B, T, V] logits at once (faster for small vocabularies)
                logits = model(input_ids=input_ids, attention_mask=attention).logits
                picked = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))
                logp = logprobs_from_logits(picked, targets, temperature)
        mask = steps[None, :] < torch.tensor(lengths, device=self.device)[:, None]
        return logp * mask, mask

    def keep_reference(self) -> None:
        """Keep the weights as they are now as the reference that screening is anchored to
        (swarmnode.screening): nothing a peer sends can move it. A LoRA model's frozen base is
        one already, at no cost; full fine-tuning keeps a frozen copy in the compute dtype
        (the memory planner counts it). Called before a checkpoint is loaded, so a resumed
        run keeps the weights it started from."""
        if not self.lora_rank and self.reference is None:
            self.reference = inference_copy(self.model, self.compute_dtype)

    @property
    def has_reference(self) -> bool:
        """Whether `reference_logprobs` can answer: a LoRA model, or a reference kept."""
        return bool(self.lora_rank) or self.reference is not None

    @torch.no_grad()
    def reference_logprobs(
        self, prompts: list[list[int]], completions: list[np.ndarray], temperature: float
    ) -> list[np.ndarray]:
        """log pi_ref of each completion's tokens: the LoRA base with its adapters off, or
        the frozen copy kept by `keep_reference`."""
        if self.lora_rank:
            with self.model.disable_adapter():
                return self.token_logprobs(prompts, completions, temperature)
        if self.reference is None:
            raise RuntimeError("no reference kept: call keep_reference() first")
        return self.token_logprobs(prompts, completions, temperature, model=self.reference)

    @torch.no_grad()
    def token_logprobs(
        self, prompts: list[list[int]], completions: list[np.ndarray], temperature: float,
        model: torch.nn.Module | None = None,
    ) -> list[np.ndarray]:
        """log pi_theta (or `model`'s) of each completion's tokens, no gradient, micro-batched
        (for screening); out of memory halves the micro-batch, as in the step."""
        out: list[np.ndarray] = []
        start = 0
        while start < len(completions):
            size = self.micro_batch.value
            chunk = completions[start : start + size]
            try:
                logp, _ = self.completion_logprobs(prompts[start : start + size], chunk, temperature, model)
            except torch.OutOfMemoryError:
                self.micro_batch.halve_after_oom(
                    "scoring peers' samples: micro-batch",
                    "out of GPU memory scoring one peer sample: see `swarmnode plan`",
                )
                continue
            rows = logp.float().cpu().numpy()
            out += [rows[i, : len(c)].copy() for i, c in enumerate(chunk)]
            start += size
        return out

    def train_step(
        self, samples: list[Sample], objective: LossSettings, temperature: float, measure_agreement: bool = False
    ) -> StepResult:
        """One optimiser step over all samples, micro-batched so memory stays bounded.

        `measure_agreement`: the samples go by source (ours in two halves, then each peer's), and
        the step also returns how each peer's gradient agrees with ours (learn.agreement); the
        update is the same sum. Out of memory: the micro-batch is halved (and kept so for later
        steps) and the step starts over; at micro-batch 1, OutOfMemory says what to change.
        """
        while True:
            try:
                return self._step(samples, objective, temperature, measure_agreement)
            except torch.OutOfMemoryError:
                self.optimizer.zero_grad(set_to_none=True)
                self.micro_batch.halve_after_oom(
                    "in the training step: micro-batch",
                    "out of GPU memory in the training step at micro-batch 1: use LoRA "
                    "(--lora-rank 128), train.gradient_checkpointing=true, a lower "
                    "rollout.max_new_tokens or a smaller model (swarmnode plan --model ... shows what fits)",
                )

    def _step(self, samples: list[Sample], objective: LossSettings, temperature: float, measure: bool) -> StepResult:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = len(samples)
        parts: list[ObjectiveTerms] = []
        loss_value = 0.0
        segments = by_source(samples) if measure else [(OWN, samples)]
        probe = GradientProbe(probe_parameters(list(self.model.parameters()))) if measure else None
        gradients: list[tuple[str, torch.Tensor]] = []
        for source, segment in segments:
            for start in range(0, len(segment), self.micro_batch.value):
                terms = self._backward(segment[start : start + self.micro_batch.value], objective, temperature, total)
                loss_value += float(terms.loss_sum.detach()) / total
                parts.append(terms)
            if probe is not None:
                gradients.append((source, probe.take()))
        agreement = None  # by_source puts our two halves first
        if probe is not None:
            agreement = StepAgreement.of(gradients[0][1], gradients[1][1], dict(gradients[2:]))
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.train_settings.max_grad_norm))
        self.optimizer.step()
        self.model.eval()
        return StepResult(loss=loss_value, grad_norm=grad_norm, stats=ObjectiveStats.combine(parts), agreement=agreement)

    def _backward(self, chunk: list[Sample], objective: LossSettings, temperature: float, total: int) -> ObjectiveTerms:
        """Accumulate one micro-batch's share of the step's gradient."""
        logp, mask = self.completion_logprobs([s.prompt_ids for s in chunk], [s.tokens for s in chunk], temperature)
        gen = torch.zeros_like(logp)  # the generators' log-probs per token (a row by span leaves it unread)
        for row, sample in enumerate(chunk):
            if sample.logprobs is not None:
                gen[row, : len(sample.logprobs)] = torch.tensor(np.array(sample.logprobs, dtype=np.float32))
        advantages = torch.tensor([s.advantage for s in chunk], device=self.device)
        scales = torch.tensor([s.weight_scale for s in chunk], device=self.device)
        spans = None  # a sample in our tokens but another generator's needs every row by span
        if any(s.by_span for s in chunk):
            spans = SpanBatch.of([s.gen_spans() for s in chunk], logp.shape[1], self.device)
        terms = objective_terms(logp, gen, mask, advantages, objective, weight_scale=scales, spans=spans)
        (terms.loss_sum / total).backward()
        return terms


def by_source(samples: list[Sample]) -> list[tuple[str, list[Sample]]]:
    """Our own samples in two halves (the yardstick's two batches), then each peer's, in the
    order they first appear; our halves are empty where we have under two samples."""
    own = [s for s in samples if s.source == OWN]
    half = len(own) // 2
    peers: dict[str, list[Sample]] = {}
    for sample in samples:
        if sample.source != OWN:
            peers.setdefault(sample.source, []).append(sample)
    return [(OWN, own[:half]), (OWN, own[half:]), *peers.items()]


def master_dtype(compute: torch.dtype, lora: bool, setting: str) -> torch.dtype:
    """dtype of the weights the optimiser updates.

    Full fine-tuning in bf16 loses every Adam update smaller than bf16's spacing (2^-8 of the
    weight): at lr 1e-6 that is nearly all of them, so by default the trained weights stay fp32
    and forward passes autocast. LoRA adapters are fp32 already (peft), the frozen base is not
    updated, so it stays in the compute dtype.
    """
    if lora or setting == "model" or compute == torch.float32:
        return compute
    return torch.float32

