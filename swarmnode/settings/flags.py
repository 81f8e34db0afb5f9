"""The settings `swarmnode join` takes as flags, each with its description, declared once.

The config's fields (swarmnode.settings.config) take their description from here and the
CLI its help text, so a flag's help is always its setting's description. Nothing here imports
pydantic: the CLI reads this module to draw `--help` at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmnode.settings.registry import BACKENDS, GYM_PREFIX, OBJECTIVES, TASKS


@dataclass(frozen=True)
class Flag:
    setting: str  # the dotted setting the flag sets
    description: str


JOIN_FLAGS: dict[str, Flag] = {  # parameter name of `join` -> what it sets
    "model": Flag(
        "model.name",
        "'tiny', 'tiny-large', 'tiny-add' or 'tiny-llama' (built locally), a hub id (Qwen/Qwen2.5-3B), a short name "
        "(Qwen2.5-3B) or a local directory",
    ),
    "lora_rank": Flag("model.lora.rank", "LoRA rank; 0 trains all weights"),
    "objective": Flag("loss.objective", OBJECTIVES.cli_help()),
    "task": Flag("task.name", f"{TASKS.cli_help()} | {GYM_PREFIX}<dataset> (reasoning-gym) | an installed plug-in"),
    "data": Flag("task.data", "gsm8k: a directory or .jsonl file, or hf:openai/gsm8k (arithmetic makes its own)"),
    "rounds": Flag("node.rounds", "this node's rounds in total (a resumed run counts the earlier ones)"),
    "run_dir": Flag("node.run_dir", "metrics, checkpoints, identity, node.log; resumes from a checkpoint there"),
    "seed": Flag("node.seed", "draws this node's prompts and sampling (each with its identity, so peers draw apart) and new LoRA adapters"),
    "lr": Flag("train.lr", "learning rate (AdamW)"),
    "device": Flag("model.device", "auto | cpu | cuda | cuda:N"),
    "backend": Flag("rollout.backend", f"generation: {BACKENDS.cli_help()} (auto: vLLM on a GPU when it imports, else hf)"),
    "initial_peers": Flag("swarm.initial_peers", "multiaddrs of running peers; empty = start a new swarm"),
    "initial_peers_from": Flag(
        "swarm.initial_peers_file",
        "read initial peers from another node's swarm.json (waits for it) or from a bootstrap list "
        "(one multiaddr a line, # comments); any one reachable peer is enough",
    ),
    "host_maddrs": Flag("swarm.host_maddrs", "where to listen; /ip4/0.0.0.0/tcp/31337 for a fixed public port"),
    "announce_maddrs": Flag("swarm.announce_maddrs", "public addresses to advertise (behind NAT or in Docker)"),
    "identity": Flag(
        "swarm.identity_path",
        "private key file, created if absent (it fixes the peer id); None = <run_dir>/identity.key",
    ),
    "startup_timeout": Flag("swarm.startup_timeout_s", "seconds for the p2p daemon to start and an initial peer to answer"),
    "min_peers": Flag("swarm.min_peers", "wait for this many peers of the run before round 1"),
    "health_port": Flag("node.health_port", "serve GET /health and GET /metrics (Prometheus) on this port; 0 = off"),
}
_BY_SETTING = {flag.setting: flag.description for flag in JOIN_FLAGS.values()}


def flag_description(setting: str) -> str:
    """The description of a setting that `join` takes as a flag."""
    return _BY_SETTING[setting]
