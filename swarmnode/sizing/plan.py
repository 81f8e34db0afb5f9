"""Choose what fits a GPU: full fine-tuning or LoRA, checkpointing, micro-batch, generation batch
and vLLM's share, from the model's shape and the card's memory, before any weights load.

The planner walks a ladder from the most capable setup down (full fine-tuning without
checkpointing and large micro-batches first, LoRA with checkpointing and micro-batch 1 last)
and takes the first rung whose estimate (swarmnode.sizing.memory, an upper bound) leaves MARGIN of the
card free. Settings the user gave are never changed: a rung only fills in the rest. When the
user's settings cannot fit on any rung, the plan says so and shows the nearest plan that does.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from swarmnode.settings.config import Config, LoraSettings
from swarmnode.settings.defaults import LORA_LR
from swarmnode.sizing.devices import cuda_available, device_of, resolve_backend, vllm_installed
from swarmnode.sizing.memory import GIB, MemoryEstimate, device_capacity, estimate, vllm_engine_bytes
from swarmnode.sizing.shapes import KNOWN_SHAPES, ModelShape, shape_of

MARGIN = 0.08  # share of the card a plan leaves free
LORA_RANK = 128  # the paper's LoRA setup: r = 128 on q_proj and v_proj, alpha = 2r
LORA_TARGETS = LoraSettings().target_modules  # the paper's targets are the setting's default
# rollout settings a nearest plan keeps: the run id's sampling settings and the batch
_KEPT_ROLLOUT = ("group_size", "prompts_per_round", "max_new_tokens", "temperature", "top_k", "top_p")
VLLM_HEADROOM = 1.25  # vLLM's share: this times its weights plus one round of KV cache


@dataclass(frozen=True)
class Rung:
    """One candidate setup."""

    lora: bool
    checkpointing: bool
    micro_batch: int

    def describe(self) -> str:
        kind = f"LoRA r={LORA_RANK}" if self.lora else "full fine-tuning"
        return f"{kind}, checkpointing {'on' if self.checkpointing else 'off'}, micro-batch {self.micro_batch}"


def _ladder(lora: bool) -> list[Rung]:
    """Micro-batches of 4 or more keep the GPU busy in the step, so checkpointing (one more
    forward) comes before going below 4; below that, smaller first without, then with it."""
    return [
        Rung(lora, False, 8), Rung(lora, False, 4), Rung(lora, True, 8), Rung(lora, True, 4),
        Rung(lora, False, 2), Rung(lora, True, 2), Rung(lora, False, 1), Rung(lora, True, 1),
    ]


LADDER = _ladder(False) + _ladder(True)  # full fine-tuning whenever it fits at all


@dataclass
class Plan:
    """The chosen settings (dotted key -> value), the config they give, and why."""

    rung: Rung | None
    settings: dict[str, Any]
    config: Config
    estimate: MemoryEstimate
    capacity: float
    backend: str
    reasons: list[str] = field(default_factory=list)
    fits: bool = True

    def describe(self, model: str, shape: ModelShape) -> str:
        lines = [
            f"plan for {model} ({shape.num_params / 1e9:.2f} B params) on a {self.capacity / GIB:.1f} GiB GPU, "
            f"{self.backend} generation:"
        ]
        c = self.config
        training = f"LoRA r={c.model.lora.rank} on {', '.join(c.model.lora.target_modules)}" if c.model.lora.rank else "full fine-tuning"
        lines.append(f"  training        {training}, lr {c.train.lr:g}")
        lines.append(f"  checkpointing   {'on' if c.train.gradient_checkpointing else 'off'}")
        lines.append(f"  micro-batch     {c.train.micro_batch_size}")
        if self.backend == "vllm":
            lines.append(f"  vLLM share      {c.rollout.vllm_fraction(True):.2f} of the GPU")
        else:
            lines.append(f"  generation      batch {c.rollout.batch_size}")
        lines.append(
            f"  estimate        {self.estimate.total / GIB:.1f} GiB of {self.capacity / GIB:.1f} GiB "
            f"(the plan keeps {MARGIN:.0%} free)"
        )
        lines += [f"  why: {reason}" for reason in self.reasons]
        if self.settings:
            lines.append("  as settings: " + " ".join(f"--set {shlex.quote(f'{k}={_yaml(v)}')}" for k, v in self.settings.items()))
        return "\n".join(lines)


def make_plan(config: Config, shape: ModelShape, capacity: float, backend: str) -> Plan:
    """The first rung that fits with the user's settings kept; if none does, a Plan with
    fits=False and the smallest estimate tried (see nearest_plan for one that fits)."""
    budget = (1 - MARGIN) * capacity
    smallest: dict[bool, tuple[float, Rung, int]] = {}  # per mode (LoRA?): least memory tried, at which chunk
    last: tuple[Config, MemoryEstimate] | None = None
    for rung, chunk in _candidates(config, backend):
        if not _compatible(rung, config):
            continue
        settings = _settings(config, shape, capacity, backend, rung, keep=config.given, chunk=chunk)
        candidate = _apply(config, settings)
        est = estimate(candidate, shape, capacity, True, backend)
        if not est.problems and est.total <= budget:
            why = _reasons(smallest, config.given, rung)
            if rung.lora and "train.lr" in config.given and "model.lora.rank" not in config.given:
                why.append(f"train.lr {config.train.lr:g} was given and is kept; LoRA adapters usually need more "
                           f"(the presets use {LORA_LR:g})")
            if chunk < _round_sequences(config):
                why.append(f"HF generation in chunks of {chunk} sequences: a whole round's "
                           f"{_round_sequences(config)} at once would not fit")
            return Plan(rung, settings, candidate, est, capacity, backend, why)
        if rung.lora not in smallest or est.total < smallest[rung.lora][0]:
            smallest[rung.lora] = (est.total, rung, chunk)
        if last is None or est.total < last[1].total:
            last = (candidate, est)
    candidate, est = last if last else (config, estimate(config, shape, capacity, True, backend))
    chosen = sorted(k for k in config.given if k != "model.name")  # the model is what is being planned
    why = [f"nothing fits with the settings given ({', '.join(chosen)})" if chosen else "nothing fits"]
    why += _reasons(smallest, frozenset()) + est.problems
    return Plan(None, {}, candidate, est, capacity, backend, why, fits=False)


def nearest_plan(config: Config, shape: ModelShape, capacity: float, backend: str) -> Plan:
    """The plan when only the model, task, batch and the sampling settings of the run id are kept
    from what the user gave (training and memory settings are free to change)."""
    kept = {k for k in config.given if k.split(".")[0] in ("model", "task") and not k.startswith("model.lora")}
    kept |= {k for k in config.given if k.startswith("rollout.") and k.split(".")[1] in _KEPT_ROLLOUT}
    free = config.model_copy(deep=True)
    free.given = frozenset(kept)
    return make_plan(free, shape, capacity, backend)


def _reasons(smallest: dict[bool, tuple[float, Rung, int]], given: frozenset[str], chosen: Rung | None = None) -> list[str]:
    """Why the plan is not a more capable one: every mode tried before, at its smallest (and
    the HF generation batch it was tried with); for the chosen mode, its smallest setting tried."""
    reasons = []
    for lora, (needed, rung, chunk) in sorted(smallest.items()):
        mode = "LoRA" if lora else "full fine-tuning"
        setting = f"{rung.describe().split(', ', 1)[1]}, generation batch {chunk}"
        if chosen is not None and lora == chosen.lora:
            reasons.append(f"{mode} with {setting} needs {needed / GIB:.1f} GiB, more than {1 - MARGIN:.0%} of the card")
        else:
            reasons.append(f"{mode} needs at least {needed / GIB:.1f} GiB ({setting}), more than {1 - MARGIN:.0%} of the card")
    if not smallest:
        reasons.append("the first choice fits: full fine-tuning, no checkpointing, micro-batch 8")
    kept = sorted(k for k in given if k.startswith(("train.", "model.lora.", "rollout.")))
    if kept:
        reasons.append("kept as given: " + ", ".join(kept))
    return reasons


def _candidates(config: Config, backend: str) -> list[tuple[Rung, int]]:
    """(rung, generation chunk) in the order tried: full fine-tuning before LoRA; within each,
    every rung with a whole round's generation at once before any rung with a smaller chunk."""
    return [
        (rung, chunk)
        for mode in (_ladder(False), _ladder(True))
        for chunk in _generation_chunks(config, backend)
        for rung in mode
    ]


def _round_sequences(config: Config) -> int:
    return config.rollout.prompts_per_round * config.rollout.group_size


def _generation_chunks(config: Config, backend: str) -> list[int]:
    """HF generation batches to try on a rung, largest first: a whole round, then halves down to
    one group (smaller would leave the GPU idle; training is what should give way first). One
    entry for vLLM (it schedules its own batches) or when the user set rollout.batch_size."""
    sequences = _round_sequences(config)
    if backend == "vllm" or "rollout.batch_size" in config.given:
        return [sequences]
    chunks = [sequences]
    while chunks[-1] > config.rollout.group_size:
        chunks.append(max(config.rollout.group_size, -(-chunks[-1] // 2)))
    return chunks


def _settings(
    config: Config, shape: ModelShape, capacity: float, backend: str, rung: Rung, keep: frozenset[str], chunk: int
) -> dict[str, Any]:
    """What this rung sets, generating `chunk` sequences at a time (HF), leaving out every key in `keep`."""
    chosen: dict[str, Any] = {
        "model.lora.rank": LORA_RANK if rung.lora else 0,
        "train.gradient_checkpointing": rung.checkpointing,
        "train.micro_batch_size": rung.micro_batch,
    }
    if rung.lora:
        chosen["model.lora.alpha"] = 2.0 * LORA_RANK
        chosen["model.lora.target_modules"] = list(LORA_TARGETS)
        chosen["train.lr"] = LORA_LR
    if backend == "vllm":
        compute = 2
        needed = VLLM_HEADROOM * vllm_engine_bytes(config, shape, compute)
        chosen["rollout.vllm_memory_fraction"] = round(min(0.9, max(0.1, needed / capacity)), 2)
    else:
        chosen["rollout.batch_size"] = chunk
    if "model.lora.rank" in keep:  # the user's own LoRA: their alpha and targets too
        chosen.pop("model.lora.alpha", None)
        chosen.pop("model.lora.target_modules", None)
    return {k: v for k, v in chosen.items() if k not in keep}


def _compatible(rung: Rung, config: Config) -> bool:
    """A rung that contradicts what the user chose (LoRA or not, checkpointing) is skipped."""
    given = config.given
    if "model.lora.rank" in given and rung.lora != bool(config.model.lora.rank):
        return False
    return "train.gradient_checkpointing" not in given or rung.checkpointing == config.train.gradient_checkpointing


def _apply(config: Config, settings: dict[str, Any]) -> Config:
    updated = config.model_copy(deep=True)
    for dotted, value in settings.items():
        section_path, key = dotted.rsplit(".", 1)
        section: Any = updated
        for part in section_path.split("."):
            section = getattr(section, part)
        setattr(section, key, value)
    updated.given = config.given
    return updated


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def explain(config: Config, shape: ModelShape, capacity: float, backend: str) -> tuple[Plan, str]:
    """The plan for this card and the text that presents it: the plan, or why the user's
    settings cannot fit and the nearest plan that does."""
    model = config.model.name
    plan = make_plan(config, shape, capacity, backend)
    if plan.fits:
        return plan, plan.describe(model, shape)
    settings = " with the settings given" if config.given - {"model.name"} else ""
    lines = [
        f"{model}{settings} does not fit a {capacity / GIB:.1f} GiB GPU "
        f"({backend} generation); at its smallest it needs about {plan.estimate.total / GIB:.1f} GiB:",
        plan.estimate.describe(),
        *[f"  why: {reason}" for reason in plan.reasons],
    ]
    nearest = nearest_plan(config, shape, capacity, backend)
    if nearest.fits:
        lines += ["the nearest plan that fits:", nearest.describe(model, shape)]
    elif backend == "vllm":
        lines.append("no plan fits with vLLM on this card; try --backend hf (no engine share) or a smaller model")
    else:
        lines.append("no plan fits this card; try a smaller model")
    return plan, "\n".join(lines)


class NoPlanFits(RuntimeError):
    """The user's settings cannot fit this GPU; the message shows the nearest plan that does."""


def plan_for_device(config: Config) -> tuple[Config, str | None]:
    """On a GPU with a known model shape: the planned config and its description (NoPlanFits
    when the user's settings cannot fit). Elsewhere: the config unchanged and None."""
    kind, index = device_of(config.model.device)
    shape = shape_of(config.model.name, config.model.revision)
    if kind != "cuda" or shape is None:
        return config, None
    capacity = device_capacity(True, index)
    plan, text = explain(config, shape, capacity, resolve_backend(config.rollout.backend, kind))
    if not plan.fits:
        raise NoPlanFits(text + "\n(to start anyway: --set node.memory_check=false)")
    return plan.config, text


class PlanError(ValueError):
    """`swarmnode plan` cannot plan: unknown model shape or backend."""


DEFAULT_CARDS_GIB = (24.0, 48.0, 80.0)
BASE_SHAPES = ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-7B")


@dataclass
class PlanReport:
    text: str
    all_fit: bool


def plan_report(config: Config, cards_gib: list[float] | None, backend: str) -> PlanReport:
    """Plans for each card size (this machine's GPU, or 24/48/80 GiB when none is given and
    none is here), as `swarmnode plan` prints them."""
    shape = shape_of(config.model.name, config.model.revision)
    if shape is None:
        known = ", ".join(name.split("/")[-1] for name in KNOWN_SHAPES if name.count("-") == 1)
        raise PlanError(
            f"no shape for {config.model.name!r}: give a local model directory (with config.json), "
            f"a hub id that can be reached, or a built-in shape ({known})"
        )
    if backend not in ("auto", "hf", "vllm"):
        raise PlanError(f"backend {backend!r}: choose hf, vllm or auto")
    assumed = ""
    if backend == "auto":
        backend = "vllm" if vllm_installed() else "hf"
        assumed = (
            "generation: vllm (auto: vLLM is installed; --backend hf plans Hugging Face generation)"
            if backend == "vllm" else
            "generation: hf (auto: vLLM is not installed; --backend vllm plans with it)"
        )
    if cards_gib and min(cards_gib) <= 0:
        raise PlanError(f"--gpu-gib {min(cards_gib):g}: a GPU's memory in GiB is a positive number")
    if cards_gib:
        capacities = [gib * GIB for gib in cards_gib]
    elif cuda_available():
        capacities = [device_capacity(True, 0)]
    else:
        capacities = [gib * GIB for gib in DEFAULT_CARDS_GIB]
    texts, all_fit = [], True
    for capacity in capacities:
        plan, text = explain(config, shape, capacity, backend)
        texts.append(text)
        all_fit &= plan.fits
    return PlanReport("\n\n".join([assumed, *texts] if assumed else texts), all_fit)
