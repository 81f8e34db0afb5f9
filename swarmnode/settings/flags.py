"""`swarmnode join`'s flags that set a setting, and which of them `swarmnode doctor` takes.

GENERATED from the schema (swarmnode/settings/config.py) by `python -m swarmnode.settings.reference`
(`make reference`): do not edit. A flag is declared on its setting's field there (`join_flag`),
and its help is the setting's description. Nothing here imports pydantic: the CLI reads this
module to draw `--help` at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    option: str  # --lora-rank
    setting: str  # the dotted setting it sets
    kind: str  # its value: str, int, float, path or list[...] of one of those (repeatable)
    description: str  # the setting's description, the flag's help
    short: str | None = None  # -x
    envvar: str | None = None  # an environment variable that sets it too
    doctor: bool = False  # `swarmnode doctor` takes it too


JOIN_FLAGS: dict[str, Flag] = {  # the command's parameter (the option in snake case) -> the flag, in the schema's order
    "model": Flag(
        option="--model",
        setting="model.name",
        kind="str",
        description="'tiny', 'tiny-large', 'tiny-add', 'tiny-llama' or 'tiny-chain' (built locally; tiny-chain needs reasoning-gym), a hub id (Qwen/Qwen2.5-3B), a short name (Qwen2.5-3B) or a local directory",
        envvar="SWARMNODE_MODEL",
        doctor=True,
    ),
    "device": Flag(
        option="--device",
        setting="model.device",
        kind="str",
        description="auto | cpu | cuda | cuda:N",
        doctor=True,
    ),
    "lora_rank": Flag(
        option="--lora-rank",
        setting="model.lora.rank",
        kind="int",
        description="LoRA rank; 0 trains all weights",
    ),
    "task": Flag(
        option="--task",
        setting="task.name",
        kind="str",
        description="arithmetic | gsm8k | rg:<dataset> (reasoning-gym) | an installed plug-in",
        doctor=True,
    ),
    "data": Flag(
        option="--data",
        setting="task.data",
        kind="str",
        description="gsm8k: a directory or .jsonl file, or hf:openai/gsm8k (arithmetic makes its own)",
        doctor=True,
    ),
    "backend": Flag(
        option="--backend",
        setting="rollout.backend",
        kind="str",
        description="generation: auto | hf | vllm (auto: vLLM on a GPU when it imports, else hf)",
        doctor=True,
    ),
    "objective": Flag(
        option="--objective",
        setting="loss.objective",
        kind="str",
        description="nois | vis | tis | f-nois | f-vis | f-tis",
    ),
    "lr": Flag(
        option="--lr",
        setting="train.lr",
        kind="float",
        description="learning rate (AdamW)",
    ),
    "rounds": Flag(
        option="--rounds",
        setting="node.rounds",
        kind="int",
        description="this node's rounds in total (a resumed run counts the earlier ones)",
    ),
    "seed": Flag(
        option="--seed",
        setting="node.seed",
        kind="int",
        description="draws this node's prompts and sampling (each with its identity, so peers draw apart) and new LoRA adapters",
    ),
    "run_dir": Flag(
        option="--run-dir",
        setting="node.run_dir",
        kind="path",
        description="metrics, checkpoints, identity, node.log; resumes from a checkpoint there",
        doctor=True,
    ),
    "health_port": Flag(
        option="--health-port",
        setting="node.health_port",
        kind="int",
        description="serve GET /health and GET /metrics (Prometheus) on this port; 0 = off",
    ),
    "initial_peers": Flag(
        option="--initial-peers",
        setting="swarm.initial_peers",
        kind="list[str]",
        description="multiaddrs of running peers; empty = start a new swarm",
        envvar="SWARMNODE_INITIAL_PEERS",
    ),
    "host_maddrs": Flag(
        option="--host-maddrs",
        setting="swarm.host_maddrs",
        kind="list[str]",
        description="where to listen; /ip4/0.0.0.0/tcp/31337 for a fixed public port",
    ),
    "initial_peers_from": Flag(
        option="--initial-peers-from",
        setting="swarm.initial_peers_file",
        kind="path",
        description="read initial peers from another node's swarm.json (waits for it) or from a bootstrap list (one multiaddr a line, # comments); any one reachable peer is enough",
        envvar="SWARMNODE_INITIAL_PEERS_FROM",
    ),
    "announce_maddrs": Flag(
        option="--announce-maddrs",
        setting="swarm.announce_maddrs",
        kind="list[str]",
        description="public addresses to advertise (behind NAT or in Docker)",
        envvar="SWARMNODE_ANNOUNCE_MADDRS",
    ),
    "identity": Flag(
        option="--identity",
        setting="swarm.identity_path",
        kind="path",
        description="private key file, created if absent (it fixes the peer id); None = <run_dir>/identity.key",
    ),
    "startup_timeout": Flag(
        option="--startup-timeout",
        setting="swarm.startup_timeout_s",
        kind="float",
        description="seconds for the p2p daemon to start and an initial peer to answer",
    ),
    "min_peers": Flag(
        option="--min-peers",
        setting="swarm.min_peers",
        kind="int",
        description="wait for this many peers of the run before round 1",
    ),
}
DOCTOR_FLAGS = {name: flag for name, flag in JOIN_FLAGS.items() if flag.doctor}
