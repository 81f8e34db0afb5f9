"""The `swarmnode` command line: parses flags, builds the config, hands over to the node."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from swarmnode import __version__
from swarmnode.config import Config, ConfigError, load_config

app = typer.Typer(
    help="swarmnode: decentralised RL post-training of language models with F-TIS.",
    no_args_is_help=True,
    add_completion=False,
)
# In a log file (not a terminal) lines are not wrapped at 80 columns, so peer ids and
# multiaddrs stay greppable and copyable.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 240)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
        force=True,
    )
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


@app.command()
def join(
    config_path: Annotated[
        Path | None,
        typer.Option("--config", "-c", envvar="SWARMNODE_CONFIG", help="YAML config file (see configs/)"),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(envvar="SWARMNODE_MODEL", help="'tiny', a hub id, a short name (Qwen2.5-3B) or a path"),
    ] = None,
    lora_rank: Annotated[int | None, typer.Option(help="LoRA rank; 0 = full fine-tuning")] = None,
    objective: Annotated[str | None, typer.Option(help="nois | vis | tis | f-nois | f-vis | f-tis")] = None,
    task: Annotated[str | None, typer.Option(help="arithmetic | gsm8k")] = None,
    data: Annotated[str | None, typer.Option(help="task data: a directory, a .jsonl file or hf:<id>")] = None,
    rounds: Annotated[
        int | None, typer.Option(help="rounds to run in total (a resumed run counts earlier ones)")
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="metrics, checkpoints; resumes if it holds a checkpoint")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="run seed (shared by every node of a run)")] = None,
    lr: Annotated[float | None, typer.Option(help="learning rate")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | cuda:N")] = None,
    backend: Annotated[
        str | None, typer.Option(help="generation: auto (vLLM on a GPU when installed) | hf | vllm")
    ] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="ignore an existing checkpoint in --run-dir")
    ] = False,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="any setting, e.g. --set rollout.group_size=12 (repeatable)"),
    ] = None,
    initial_peers: Annotated[
        list[str] | None,
        typer.Option(
            "--initial-peers",
            envvar="SWARMNODE_INITIAL_PEERS",
            help="multiaddr of a running node (repeatable); none = start a new swarm",
        ),
    ] = None,
    initial_peers_from: Annotated[
        Path | None,
        typer.Option(
            "--initial-peers-from",
            envvar="SWARMNODE_INITIAL_PEERS_FROM",
            help="another node's <run-dir>/swarm.json (waits for it)",
        ),
    ] = None,
    host_maddrs: Annotated[
        list[str] | None,
        typer.Option("--host-maddrs", help="listen here, e.g. /ip4/0.0.0.0/tcp/31337 (repeatable)"),
    ] = None,
    announce_maddrs: Annotated[
        list[str] | None,
        typer.Option(
            "--announce-maddrs",
            envvar="SWARMNODE_ANNOUNCE_MADDRS",
            help="public address others dial, e.g. /ip4/203.0.113.7/tcp/31337",
        ),
    ] = None,
    identity: Annotated[
        Path | None,
        typer.Option("--identity", help="private key file, created if absent (default <run-dir>/identity.key)"),
    ] = None,
    startup_timeout: Annotated[
        float | None, typer.Option(help="seconds for the p2p daemon to start and the swarm to answer")
    ] = None,
    min_peers: Annotated[
        int | None, typer.Option(help="wait for this many peers of the run before the first round")
    ] = None,
    health_port: Annotated[
        int | None, typer.Option(help="serve GET /health on 127.0.0.1:PORT (Docker's healthcheck)")
    ] = None,
    solo: Annotated[bool, typer.Option("--solo", help="train alone: no swarm, no network")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no per-round lines")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run a node: start a swarm (no --initial-peers) or join one, and train every round on your
    own and your peers' rollouts. Ctrl-C writes a checkpoint; the same --run-dir resumes."""
    _setup_logging(verbose)
    flags = {
        "model.name": model,
        "model.lora.rank": lora_rank,
        "loss.objective": objective,
        "task.name": task,
        "task.data": data,
        "node.rounds": rounds,
        "node.run_dir": str(run_dir) if run_dir else None,
        "node.seed": seed,
        "train.lr": lr,
        "model.device": device,
        "rollout.backend": backend,
        "node.resume": False if fresh else None,
        "swarm.initial_peers": initial_peers or None,
        "swarm.initial_peers_file": str(initial_peers_from) if initial_peers_from else None,
        "node.health_port": health_port,
        "swarm.host_maddrs": host_maddrs or None,
        "swarm.announce_maddrs": announce_maddrs or None,
        "swarm.identity_path": str(identity) if identity else None,
        "swarm.startup_timeout_s": startup_timeout,
        "swarm.min_peers": min_peers,
        "swarm.enabled": False if solo else None,
    }
    try:
        config = load_config(config_path, overrides, flags)
    except ConfigError as err:
        raise _fail(str(err)) from None
    summary = run_node(config, quiet, config_path)
    table = Table(title="swarmnode: run finished")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(
            key, "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        )
    Console().print(table)


@app.command()
def health(
    port: Annotated[int, typer.Option(help="the node's node.health_port")] = 8470,
    host: Annotated[str, typer.Option(help="where the node serves /health")] = "127.0.0.1",
    timeout: Annotated[float, typer.Option(help="seconds to wait for an answer")] = 5.0,
) -> None:
    """Ask a running node whether it is alive (exit 0) or stalled/unreachable (exit 1)."""
    from swarmnode.health import ask

    healthy, said = ask(host, port, timeout)
    typer.echo(said)
    raise typer.Exit(0 if healthy else 1)


@app.command()
def status(
    initial_peers: Annotated[
        list[str] | None,
        typer.Option("--initial-peers", help="multiaddr of any node of the swarm (repeatable)"),
    ] = None,
    initial_peers_from: Annotated[
        Path | None, typer.Option("--initial-peers-from", help="a node's <run-dir>/swarm.json")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
    watch: Annotated[
        float, typer.Option(help="refresh every this many seconds (0 = print once)", min=0)
    ] = 0.0,
    stale_after: Annotated[float, typer.Option(help="seconds without a heartbeat before 'stale'")] = 20.0,
    timeout: Annotated[float, typer.Option(help="seconds to reach the swarm")] = 30.0,
) -> None:
    """List the swarm's peers from their heartbeats (joins as a DHT client, stores nothing)."""
    import time

    from rich.live import Live

    from swarmnode.status import read_heartbeats, render_table, to_json
    from swarmnode.swarm.runtime import SwarmError, SwarmOptions, SwarmRuntime

    logging.basicConfig(level=logging.WARNING, handlers=[RichHandler(console=console, show_path=False)])
    initial_peers = list(initial_peers or [])
    if initial_peers_from:
        initial_peers += _peers_from_file(initial_peers_from, timeout)
    if not initial_peers:
        raise _fail("give --initial-peers MADDR (any node's address) or --initial-peers-from swarm.json")
    try:
        load_config(None, None, {"swarm.initial_peers": initial_peers})
    except ConfigError as err:
        raise _fail(str(err)) from None
    runtime = SwarmRuntime(
        SwarmOptions(initial_peers=initial_peers, startup_timeout_s=timeout, client_mode=True)
    )
    try:
        runtime.start()
    except SwarmError as err:
        raise _fail(str(err), 1) from None
    try:
        if as_json:
            while True:
                typer.echo(to_json(read_heartbeats(runtime, stale_after)))
                if not watch:
                    break
                time.sleep(watch)
        elif watch:
            with Live(render_table(read_heartbeats(runtime, stale_after)), console=Console()) as live:
                while True:
                    time.sleep(watch)
                    live.update(render_table(read_heartbeats(runtime, stale_after)))
        else:
            rows = read_heartbeats(runtime, stale_after)
            Console().print(render_table(rows) if rows else "the swarm answered but no node has a heartbeat")
    except KeyboardInterrupt:
        pass
    except TimeoutError:
        raise _fail("the swarm stopped answering", 1) from None
    finally:
        runtime.shutdown()


@app.command()
def demo(
    nodes: Annotated[int, typer.Option(help="how many node processes (kinds cycle: tiny, tiny LoRA, tiny-large)", min=2)] = 3,
    rounds: Annotated[int, typer.Option(help="rounds every node runs", min=1)] = 80,
    directory: Annotated[
        Path, typer.Option("--dir", help="demo directory (wiped first): configs, logs, metrics, curves.png")
    ] = Path("runs/demo"),
    config_path: Annotated[
        Path | None, typer.Option("--config", "-c", help="base YAML config instead of the built-in tiny one")
    ] = None,
) -> None:
    """Start a local swarm of heterogeneous tiny nodes on 127.0.0.1 (one process each), train
    them together, then print each node's held-out accuracy before and after and draw curves."""
    import yaml

    from swarmnode.demo import DEMO_BASE, Demo, DemoError

    base = DEMO_BASE
    if config_path is not None:
        try:
            load_config(config_path)  # validate before starting anything
        except ConfigError as err:
            raise _fail(str(err)) from None
        base = yaml.safe_load(config_path.read_text())
    runner = Demo(directory, nodes=nodes, rounds=rounds, base=base, console=console)
    started = time.monotonic()
    try:
        rows = runner.run()
    except DemoError as err:
        raise _fail(str(err), 1) from None
    except KeyboardInterrupt:
        raise _fail(f"interrupted; every node stopped; partial results in {directory}", 130) from None
    table = Table(title=f"swarmnode demo: held-out accuracy ({time.monotonic() - started:.0f} s)")
    for column in ("node", "kind", "rounds", "before", "after", "gain", "peer samples used", "rejected"):
        table.add_column(column, justify="left" if column in ("node", "kind") else "right")
    for row in rows:
        before, after = row["eval_before"], row["eval_after"]
        gain = f"{after - before:+.3f}" if before is not None and after is not None else "-"
        table.add_row(
            str(row["node"]), row["kind"], str(row["rounds"]),
            "-" if before is None else f"{before:.3f}", "-" if after is None else f"{after:.3f}", gain,
            str(row["peer_samples"]), str(row["rejected"]),
        )
    Console().print(table)
    console.print(f"curves: {runner.plot(directory / 'curves.png')}", highlight=False)


def run_node(config: Config, quiet: bool = False, config_path: Path | None = None) -> dict:
    """Build swarm, policy, generator, task and node from the config and run it."""
    from swarmnode.exchange import PeerLedger
    from swarmnode.metrics import LiveView
    from swarmnode.node import Node, run_id_for
    from swarmnode.policy import Policy
    from swarmnode.rollout import make_generator
    from swarmnode.tasks import make_task

    _terminate_like_ctrl_c()
    try:  # cheap local checks first, then the network, then the (possibly large) model
        task = make_task(config.task)
        ood_eval = None
        if config.task.eval_data:
            from swarmnode.tasks import Math500Eval

            ood_eval = Math500Eval(config.task.eval_data, answer_format=config.task.answer_format)
    except (FileNotFoundError, ValueError, OSError) as err:
        raise _fail(str(err)) from None
    if config.node.memory_check:
        _check_memory(config)
    runtime = _start_swarm(config, config_path) if config.swarm.enabled else None
    try:
        policy = Policy.load(config.model, config.train)
    except (FileNotFoundError, ValueError, RuntimeError, OSError) as err:
        if runtime:
            runtime.shutdown()
        raise _fail(str(err)) from None
    ledger = PeerLedger(config.swarm.max_rejects)
    exchange = None
    if runtime is not None:
        from swarmnode.swarm.exchange import HivemindExchange

        s = config.swarm
        exchange = HivemindExchange(
            runtime,
            run_id_for(config, task, policy),
            max_payload_bytes=config.wire.max_bytes,
            staleness=config.node.staleness,
            ledger=ledger,
            heartbeat_interval_s=s.heartbeat_interval_s,
            stale_after_s=s.stale_after_s,
            poll_interval_s=s.poll_interval_s,
            fetch_timeout_s=s.fetch_timeout_s,
            max_peers_per_round=s.max_peers_per_round,
        )
    try:
        generator = make_generator(config.rollout.backend, policy, config.rollout, seed=config.node.seed)
    except (RuntimeError, ValueError, OSError) as err:
        if runtime:
            runtime.shutdown()
        raise _fail(str(err)) from None
    node = Node(
        config, policy, generator, task, exchange=exchange, view=LiveView(console, quiet=quiet),
        ood_eval=ood_eval, ledger=ledger,
    )
    try:
        if node.maybe_resume():
            console.print(f"resumed from {node.checkpoint_dir} at round {node.next_round}")
    except (ValueError, OSError) as err:
        node.close()
        raise _fail(str(err)) from None
    console.print(
        f"node {node.peer_id} | model {policy.name} ({policy.num_params / 1e6:.2f} M params, "
        f"{'LoRA r=' + str(policy.lora_rank) if policy.lora_rank else 'full'}) | "
        f"task {config.task.name} | objective {config.loss.objective} | run {node.run_id} | "
        f"dir {node.run_dir}",
        highlight=False,
    )
    health = None
    if config.node.health_port:
        from swarmnode.health import HealthServer

        try:
            health = HealthServer(config.node.health_host, config.node.health_port, node.health)
        except OSError as err:
            node.close()
            raise _fail(f"cannot serve /health on {config.node.health_host}:{config.node.health_port}: {err}") from None
    try:
        summary = node.run()
    except KeyboardInterrupt:
        raise _fail(f"interrupted; checkpoint in {node.checkpoint_dir}", 130) from None
    finally:
        if health:
            health.close()
        node.close()
    summary["rounds"] = config.node.rounds
    summary["rejected"] = ledger.total
    return summary


def _check_memory(config: Config) -> None:
    """Refuse, with a suggestion, a config whose estimate exceeds the device's memory."""
    from swarmnode.memory import GIB, check_fits

    try:
        estimate, problem = check_fits(config)
    except RuntimeError as err:  # e.g. CUDA asked for but absent
        raise _fail(str(err)) from None
    if problem:
        raise _fail(problem)
    if estimate is not None:
        console.print(
            f"memory estimate: {estimate.total / GIB:.1f} GiB of {estimate.capacity / GIB:.1f} GiB ({estimate.device})",
            highlight=False,
        )


def _start_swarm(config: Config, config_path: Path | None):
    """Start the p2p daemon and DHT first, so a bad address fails before a model loads."""
    from swarmnode.swarm.identity import IdentityError
    from swarmnode.swarm.runtime import SwarmError, SwarmOptions, SwarmRuntime

    s = config.swarm
    identity = s.identity_path or Path(config.node.run_dir) / "identity.key"
    initial_peers = list(s.initial_peers)
    if s.initial_peers_file:
        initial_peers += _peers_from_file(s.initial_peers_file, s.startup_timeout_s)
    runtime = SwarmRuntime(
        SwarmOptions(
            initial_peers=initial_peers,
            host_maddrs=s.host_maddrs,
            announce_maddrs=s.announce_maddrs,
            identity_path=identity,
            startup_timeout_s=s.startup_timeout_s,
        )
    )
    with console.status("starting the p2p daemon and joining the swarm ..."):
        try:
            runtime.start()
        except (SwarmError, IdentityError) as err:
            raise _fail(str(err), 1) from None
    maddrs = runtime.visible_maddrs()
    _write_swarm_info(Path(config.node.run_dir), runtime.peer_id, maddrs)
    verb = "joined the swarm" if initial_peers else "started a new swarm"
    console.print(f"{verb} as {runtime.peer_id}; reachable at:", highlight=False)
    for maddr in maddrs:
        console.print(f"  {maddr}", highlight=False, soft_wrap=True)
    if not initial_peers and maddrs:
        public = [m for m in maddrs if "/127.0.0.1/" not in m] or maddrs
        config_flag = f"--config {config_path} " if config_path else ""
        console.print(
            f"others join with:\n  swarmnode join {config_flag}--initial-peers {public[0]}",
            highlight=False,
            soft_wrap=True,
        )
    return runtime


def _peers_from_file(path: Path, timeout_s: float) -> list[str]:
    from swarmnode.swarm.peers_file import PeersFileError, read_peers_file

    with console.status(f"waiting for {path} ..."):
        try:
            return read_peers_file(path, timeout_s)
        except PeersFileError as err:
            raise _fail(str(err), 1) from None


def _write_swarm_info(run_dir: Path, peer_id: str, maddrs: list[str]) -> None:
    """<run_dir>/swarm.json: this node's address, for scripts (and `demo`) to pass on."""
    import json
    import os

    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / "swarm.json.tmp"
    tmp.write_text(json.dumps({"peer_id": peer_id, "maddrs": maddrs, "pid": os.getpid()}))
    tmp.replace(run_dir / "swarm.json")


def _terminate_like_ctrl_c() -> None:
    """SIGTERM (docker stop, demo clean-up) takes the Ctrl-C path: checkpoint, then exit."""
    import signal

    def interrupt(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


if __name__ == "__main__":
    app()
