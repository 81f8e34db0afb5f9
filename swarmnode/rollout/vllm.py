"""Generation with vLLM colocated with the trainer, fed the trainer's weights after every step.

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a weight sync is a
tensor copy inside one address space: no inter-process transfer and no serialisation.
Log-probs are taken after temperature (and top-k/top-p when set), the same distribution the
tokens were drawn from, which is what the importance weight pi_theta / pi_gen needs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import numpy as np
import torch

from swarmnode.model.policy import Policy
from swarmnode.protocol.wire import Completion
from swarmnode.settings.config import RolloutSettings
from swarmnode.sizing.shapes import ModelShape

log = logging.getLogger(__name__)

# Must be set before vllm is imported: the engine core then lives in this process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MIN_KV_CACHE_BYTES = 64 * 2**20


def kv_cache_bytes(policy: Policy, settings: RolloutSettings, max_len: int) -> int:
    """KV cache for one round's sequences at full length, twice over.

    On CPU vLLM would size its cache as a share of RAM minus this whole process's resident
    memory (trainer included), which goes negative for a second engine or a big trainer; an
    explicit size is predictable.
    """
    if settings.vllm_kv_cache_gib:
        return int(settings.vllm_kv_cache_gib * 2**30)
    element = 4 if engine_dtype(policy) == "float32" else 2
    per_token = ModelShape.from_hf_config(policy.model.config).kv_bytes_per_token(element)
    sequences = settings.prompts_per_round * settings.group_size
    return max(MIN_KV_CACHE_BYTES, 2 * sequences * max_len * per_token)


def engine_dtype(policy: Policy) -> str:
    """bf16 on GPU unless the model is configured otherwise; fp32 on CPU."""
    if policy.device.type == "cpu":
        return "float32"
    return {torch.float32: "float32", torch.float16: "float16"}.get(policy.compute_dtype, "bfloat16")


def _retie_output_head(model: torch.nn.Module) -> bool:
    """Re-derive the output head from the (tied) embedding after a reload.

    vLLM's in-place reload re-processes only the layers it loaded weights into. With tied
    embeddings (Qwen2.5 up to 3B) the LM head is a second module sharing the embedding's
    weight, and on CPU it keeps a packed copy made at start-up: without this it would go on
    scoring with the old embedding. Returns whether a head was refreshed.
    """
    head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if head is None or embed is None or not hasattr(head, "quant_method"):
        return False
    if getattr(getattr(model, "config", None), "tie_word_embeddings", True):
        head.weight = embed.weight
    head.quant_method.process_weights_after_loading(head)
    return True


class VLLMGenerator:
    """Samples with a vLLM engine that holds a copy of the policy's current weights."""

    name = "vllm"

    def __init__(self, policy: Policy, settings: RolloutSettings, seed: int = 0) -> None:
        from vllm import LLM

        self.policy = policy
        self.settings = settings
        self.adaptive = ()  # vLLM plans its own batches
        on_cpu = policy.device.type == "cpu"
        fraction = settings.vllm_fraction(not on_cpu)
        max_len = settings.vllm_max_model_len or min(
            policy.max_positions, settings.max_new_tokens + settings.max_prompt_tokens
        )
        engine_memory: dict = {"gpu_memory_utilization": fraction}
        if on_cpu or settings.vllm_kv_cache_gib:
            engine_memory["kv_cache_memory_bytes"] = kv_cache_bytes(policy, settings, max_len)
        started = time.perf_counter()
        self.llm = LLM(
            model=policy.source,
            revision=policy.revision,
            dtype=engine_dtype(policy),
            **engine_memory,
            max_model_len=max_len,
            enforce_eager=on_cpu,  # no CUDA graphs or compilation on CPU
            logprobs_mode="processed_logprobs",  # after temperature/top-k/top-p: log pi_gen
            seed=seed,
            enable_prefix_caching=True,  # the G samples of a prompt share its prefix
        )
        self.max_model_len = max_len
        self.start_s = time.perf_counter() - started
        self.sync_s = 0.0
        log.info("vLLM engine ready in %.1f s (memory share %.2f, max length %d)", self.start_s, fraction, max_len)
        self.sync_weights()  # the policy may differ from the files (LoRA init, resumed checkpoint)

    def sync_weights(self) -> float:
        """Copy the policy's current weights (LoRA merged in) into the engine; seconds taken."""
        started = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._weights()})
        self.llm.apply_model(_retie_output_head)
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        self.sync_s = time.perf_counter() - started
        return self.sync_s

    def close(self) -> None:
        """Free the engine and vLLM's process-wide parallel state (one engine per process)."""
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        engine = getattr(self.llm, "llm_engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            engine.engine_core.shutdown()
        del self.llm
        cleanup_dist_env_and_memory()

    def _weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.policy.merged_weights():
            yield name, tensor.detach()

    def generate(self, prompts: list[list[int]], group_size: int) -> list[list[Completion]]:
        from vllm import SamplingParams

        s = self.settings
        params = SamplingParams(
            n=group_size,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            max_tokens=s.max_new_tokens,
            logprobs=0,  # just the sampled token's log-prob
            stop_token_ids=[self.policy.tokenizer.eos_token_id],
            detokenize=False,
        )
        outputs = self._run(prompts, params)
        return [[_completion(c, with_logprobs=True) for c in out.outputs] for out in outputs]

    def greedy(self, prompts: list[list[int]]) -> list[Completion]:
        from vllm import SamplingParams

        params = SamplingParams(
            temperature=0.0,
            max_tokens=self.settings.max_new_tokens,
            stop_token_ids=[self.policy.tokenizer.eos_token_id],
            detokenize=False,
        )
        return [_completion(out.outputs[0], with_logprobs=False) for out in self._run(prompts, params)]

    def _run(self, prompts: list[list[int]], params):  # noqa: ANN001, ANN202
        from vllm.inputs import TokensPrompt

        room = self.max_model_len - self.settings.max_new_tokens
        longest = max(len(p) for p in prompts)
        if longest > room:
            raise ValueError(
                f"a prompt of {longest} tokens leaves no room for {self.settings.max_new_tokens} new "
                f"tokens in vLLM's max length {self.max_model_len}: raise rollout.max_prompt_tokens"
            )
        batch = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        return self.llm.generate(batch, params, use_tqdm=False)


def _completion(output, with_logprobs: bool) -> Completion:  # noqa: ANN001
    tokens = np.asarray(output.token_ids, dtype=np.int32)
    if with_logprobs:
        logprobs = np.array(
            [step[token].logprob for step, token in zip(output.logprobs, output.token_ids)], dtype=np.float32
        )
    else:
        logprobs = np.zeros(len(tokens), dtype=np.float32)
    return Completion(tokens=tokens, logprobs=logprobs, finished=output.finish_reason == "stop")
