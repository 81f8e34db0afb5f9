"""Generation with Hugging Face `generate`, recording each sampled token's log-prob.

`generate` does not return log-probs without keeping every step's full score matrix
(vocabulary x batch x steps, gigabytes for a real model). Instead a logits processor applies
the sampling warpers itself, keeps only the current step's log-softmax, and at the next step
reads off the log-prob of the token that was actually sampled.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import numpy as np
import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from swarmnode.model.batching import AdaptiveBatch
from swarmnode.model.policy import Policy, inference_copy, refresh_copy
from swarmnode.protocol.wire import Completion
from swarmnode.settings.config import RolloutSettings


class SampledLogprobRecorder(LogitsProcessor):
    """Applies temperature/top-k/top-p and records log pi_gen of each sampled token."""

    def __init__(self, temperature: float, top_k: int, top_p: float) -> None:
        self.warpers: list[LogitsProcessor] = [TemperatureLogitsWarper(temperature)]
        if top_k:
            self.warpers.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))
        self.previous: torch.Tensor | None = None
        self.recorded: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._record_last(input_ids[:, -1])
        scores = scores.float()
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        self.previous = torch.log_softmax(scores, dim=-1)
        return scores

    def _record_last(self, sampled: torch.Tensor) -> None:
        if self.previous is not None:
            self.recorded.append(self.previous.gather(1, sampled[:, None]).squeeze(1))
            self.previous = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """Log-probs [B, steps] once generation ended (the last step is read here)."""
        self._record_last(sequences[:, -1])
        return torch.stack(self.recorded, dim=1)


class HFGenerator:
    """Samples with the trainer's model, or with a bf16 copy of it when the trained weights are
    fp32 under autocast (autocast re-casts every weight at every decoding step: on an H100,
    324 tokens/s against 962 for plain bf16 `generate` on a 1.5B model; docs/gpu.md)."""

    name = "hf"

    def __init__(self, policy: Policy, settings: RolloutSettings, seed: int = 0) -> None:
        """`seed` starts this generator's own random stream (node.seed with the node's
        identity, rollout.base.sampling_seed): sampling is
        reproducible and independent of whatever else in the process draws random numbers
        (other nodes in one process, the trainer)."""
        self.policy = policy
        self.settings = settings
        self.batch = AdaptiveBatch("rollout.batch_size", settings.batch_size)
        self.adaptive = (self.batch,)
        self.seed = seed
        self._rng_states: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        use_copy = settings.hf_inference_copy and policy.autocast and not policy.lora_rank
        self.copy = inference_copy(policy.model, policy.compute_dtype) if use_copy else None

    def sync_weights(self) -> float:
        """Refresh the bf16 copy from the trained weights (a device-local cast); 0 without one."""
        if self.copy is None:
            return 0.0
        started = time.perf_counter()
        refresh_copy(self.policy.model, self.copy)
        return time.perf_counter() - started

    def close(self) -> None:
        """Drop the copy; the policy is the caller's."""
        self.copy = None

    def generate(self, prompts: list[list[int]], group_size: int) -> list[list[Completion]]:
        flat = [prompt for prompt in prompts for _ in range(group_size)]
        with self._own_random_stream():
            completions = self._batched(flat, True)
        return [completions[i : i + group_size] for i in range(0, len(flat), group_size)]

    @contextlib.contextmanager
    def _own_random_stream(self) -> Iterator[None]:
        """Sample from this generator's stream; the process's global RNG is left as it was."""
        devices = [self.policy.device] if self.policy.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if self._rng_states is None:
                torch.manual_seed(self.seed)
            else:
                torch.set_rng_state(self._rng_states[0])
                for device, state in zip(devices, self._rng_states[1]):
                    torch.cuda.set_rng_state(state, device)
            yield
            self._rng_states = (torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices])

    def greedy(self, prompts: list[list[int]]) -> list[Completion]:
        return self._batched(prompts, False)

    def _batched(self, prompts: list[list[int]], do_sample: bool) -> list[Completion]:
        """In batches of rollout.batch_size; out of memory halves it (kept for later rounds)."""
        completions: list[Completion] = []
        start = 0
        while start < len(prompts):
            size = self.batch.value
            try:
                completions += self._sample(prompts[start : start + size], do_sample)
            except torch.OutOfMemoryError:
                self.batch.halve_after_oom(
                    "in generation: batch",
                    "out of GPU memory generating even one sequence: lower rollout.max_new_tokens, "
                    "use LoRA or a smaller model (swarmnode plan --model ... shows what fits)",
                )
                continue
            start += size
        return completions

    @torch.no_grad()
    def _sample(self, prompts: list[list[int]], do_sample: bool) -> list[Completion]:
        tokenizer = self.policy.tokenizer
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding: generation continues at the end
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        s = self.settings
        recorder = SampledLogprobRecorder(s.temperature if do_sample else 1.0, s.top_k, s.top_p)
        # Temperature, top-k and top-p are applied by the recorder, so the log-probs see them;
        # generate's own warpers are switched off.
        sampling = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if do_sample else {}
        config = GenerationConfig(
            do_sample=do_sample,
            max_new_tokens=s.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            **sampling,
        )
        model = self.copy if self.copy is not None else self.policy.model
        model.eval()
        with contextlib.nullcontext() if self.copy is not None else self.policy.compute():
            sequences = model.generate(
                input_ids=input_ids.to(self.policy.device),
                attention_mask=attention.to(self.policy.device),
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]),
            )
        generated = sequences[:, width:].cpu()
        logprobs = recorder.finish(sequences).float().cpu()
        result = []
        for row in range(len(prompts)):
            tokens = generated[row].numpy()
            eos_at = np.flatnonzero(tokens == eos)
            length = int(eos_at[0]) + 1 if eos_at.size else len(tokens)
            result.append(
                Completion(
                    tokens=tokens[:length].astype(np.int32),
                    logprobs=logprobs[row, :length].numpy().astype(np.float32),
                    finished=bool(eos_at.size),
                )
            )
        return result
