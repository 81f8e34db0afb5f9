"""The `swarmnode` command line: parses flags, builds the config, hands over.

The flags of `join` and `doctor` that set a setting are not written here: they come from
swarmnode.settings.flags, rendered from the settings' schema (each flag's help is its setting's
description), and are added to the commands' signatures (`_setting_options`).

`join` hands over to swarmnode.assemble, `status` to the swarm's status reader, `demo` to
swarmnode.demo, `health` to swarmnode.ops.health. Nothing here builds or wires parts of a node.
Each command imports its implementation when it runs (torch, transformers and hivemind take
seconds to import), so `--help`, `version` and bad flags answer at once.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from swarmnode import __version__
from swarmnode.ops.health import ASK_TIMEOUT_S, DOCKER_PORT, ask
from swarmnode.settings.flags import DOCTOR_FLAGS, JOIN_FLAGS, Flag
from swarmnode.settings.network import LOCAL_HOST
from swarmnode.swarm.hivemind import PeersFileError, read_peers_file

app = typer.Typer(
    help="swarmnode: decentralised RL post-training of language models with F-TIS.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
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
    # transformers' own switches, set through its environment variables so that this
    # parser does not import it (a second): the node imports it later and reads them
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


Command = TypeVar("Command", bound=Callable[..., Any])


def command(function: Command) -> Command:
    """`app.command()` with the docstring as prose: typer keeps a docstring's line breaks in
    the list of commands, which cut sentences in the middle of the column at 80 characters;
    joined within each paragraph, rich wraps them where the terminal does."""
    paragraphs = (inspect.getdoc(function) or "").split("\n\n")
    return app.command(help="\n\n".join(" ".join(p.split()) for p in paragraphs))(function)


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)  # a message's [brackets] stay text
    return typer.Exit(code)


@command
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


_VALUE_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "path": Path}


def _value_type(kind: str) -> Any:
    """A flag's kind (swarmnode.settings.flags) as the type typer parses: list[...] is repeatable."""
    if kind.startswith("list[") and kind.endswith("]"):
        return list[_VALUE_TYPES[kind.removeprefix("list[").removesuffix("]")]]
    return _VALUE_TYPES[kind]


def _setting_options(flags: dict[str, Flag], after: str) -> Callable[[Command], Command]:
    """Give a command an option for each flag, after its parameter `after`; the values come in
    the command's **given by parameter name, None where not given. Typer reads a command's
    parameters from its signature, so the signature is set and the options are written once."""

    def attach(command: Command) -> Command:
        keyword = inspect.Parameter.KEYWORD_ONLY
        own = [param.replace(kind=keyword) for param in inspect.signature(command, eval_str=True).parameters.values()
               if param.kind is not inspect.Parameter.VAR_KEYWORD]
        options = []
        for name, flag in flags.items():
            names = [flag.option, flag.short] if flag.short else [flag.option]
            option = typer.Option(*names, envvar=flag.envvar, help=flag.description)
            options.append(inspect.Parameter(name, keyword, default=None,
                                             annotation=Annotated[_value_type(flag.kind) | None, option]))
        at = [param.name for param in own].index(after) + 1
        command.__signature__ = inspect.Signature([*own[:at], *options, *own[at:]])  # type: ignore[attr-defined]
        return command

    return attach


def _settings_given(flags: dict[str, Flag], given: dict[str, Any]) -> dict[str, Any]:
    """The settings the flags given set, by dotted name (None: not given)."""
    return {flag.setting: _flag_value(given[name]) for name, flag in flags.items()}


@command
@_setting_options(JOIN_FLAGS, after="config_path")
def join(
    config_path: Annotated[
        Path | None,
        typer.Option("--config", "-c", envvar="SWARMNODE_CONFIG", help="YAML config file (see configs/)"),
    ] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="ignore an existing checkpoint in --run-dir (node.resume=false)")
    ] = False,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="any setting, e.g. --set rollout.group_size=12 (repeatable)"),
    ] = None,
    solo: Annotated[bool, typer.Option("--solo", help="train alone: no swarm, no network (swarm.enabled=false)")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no per-round lines")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    **given: Any,
) -> None:
    """Run a node: start a swarm (no --initial-peers) or join one, and train every round on your
    own and your peers' rollouts. Ctrl-C writes a checkpoint; the same --run-dir resumes."""
    from swarmnode.settings.config import ConfigError, load_config

    _setup_logging(verbose)
    flags = _settings_given(JOIN_FLAGS, given)
    flags["node.resume"] = False if fresh else None
    flags["swarm.enabled"] = False if solo else None
    from swarmnode.ops.rundir import log_failure

    try:
        config = load_config(config_path, overrides, flags)
    except ConfigError as err:
        if given["run_dir"] is not None:  # the run dir the person named: its node.log says why too
            log_failure(given["run_dir"], str(err))
        raise _fail(str(err)) from None
    from swarmnode.ops.preflight import PreflightError, preflight

    try:
        checked = preflight(config)
    except PreflightError as err:
        log_failure(config.node.run_dir, str(err))
        raise _fail(str(err)) from None
    for note in checked.notes:
        console.print(note, markup=False, highlight=False)
    # the node's implementation takes seconds to import: only once the config is checked
    from swarmnode import assemble
    from swarmnode.ops.metrics import LiveView

    _terminate_like_ctrl_c()
    try:
        summary = assemble.run(config, LiveView(console, quiet=quiet), config_path, task=checked.task)
    except assemble.AssemblyError as err:
        raise _fail(str(err), err.exit_code) from None
    except KeyboardInterrupt:  # the node said what it saved
        raise typer.Exit(130) from None
    table = Table(title="swarmnode: run finished")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(
            key, "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        )
    Console().print(table)


def _flag_value(value: object) -> object:
    """A flag's value as a setting: paths as text, an empty repeatable flag as not given."""
    if isinstance(value, Path):
        return str(value)
    return value or None if isinstance(value, list) else value


@command
def plan(
    model: Annotated[
        str | None,
        typer.Option(help="a short name (Qwen2.5-3B), a hub id or a local directory; none = every Qwen2.5 size"),
    ] = None,
    gpu_gib: Annotated[
        list[float] | None,
        typer.Option("--gpu-gib", help="GPU memory in GiB (repeatable); default: this GPU, else 24, 48 and 80"),
    ] = None,
    backend: Annotated[str, typer.Option(help="generation: hf or vllm (auto: vllm when it imports)")] = "auto",
    config_path: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML config whose settings the plan keeps")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="a setting the plan keeps, e.g. --set model.lora.rank=64")
    ] = None,
) -> None:
    """Show what `join` would run on a GPU of this size: full or LoRA, checkpointing,
    micro-batch, generation batch or vLLM share, and the memory estimate. Needs no GPU and
    downloads nothing for the built-in Qwen2.5 shapes."""
    from swarmnode.ops.preflight import Preflight, PreflightError, check_model, hub_offline, needs_no_hub
    from swarmnode.settings.config import ConfigError, load_config
    from swarmnode.sizing.plan import BASE_SHAPES, PlanError, plan_report

    all_fit = True
    for name in [model] if model else list(BASE_SHAPES):
        try:
            config = load_config(config_path, overrides, {"model.name": name})
            if not needs_no_hub(config.model):  # the shape comes from the model's config.json
                check_model(config.model, Preflight(offline=hub_offline()))
            shown = plan_report(config, gpu_gib, backend)
        except (ConfigError, PlanError, PreflightError) as err:
            raise _fail(str(err)) from None
        typer.echo(shown.text + "\n")
        all_fit &= shown.all_fit
    if not all_fit:
        raise typer.Exit(1)


@command
@_setting_options(DOCTOR_FLAGS, after="config_path")
def doctor(
    config_path: Annotated[
        Path | None, typer.Option("--config", "-c", envvar="SWARMNODE_CONFIG", help="YAML config file (see configs/)")
    ] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="any setting, as join takes it")] = None,
    **given: Any,
) -> None:
    """Check, without joining, what this machine can run with these settings (the same as
    join's): device, generation, the hub, model, data, memory, run dir and disk; each finding
    with what the node will do and the fix. Exit 1 when something would stop the node."""
    from swarmnode.ops.doctor import BLOCKING, FINE, examine
    from swarmnode.settings.config import ConfigError, load_config

    try:
        config = load_config(config_path, overrides, _settings_given(DOCTOR_FLAGS, given))
    except ConfigError as err:
        raise _fail(str(err)) from None
    findings = examine(config)
    table = Table(title="swarmnode doctor", title_justify="left", show_header=False, box=None, pad_edge=False)
    marks = {FINE: "[green]ok[/]", BLOCKING: "[bold red]stop[/]"}
    for finding in findings:
        table.add_row(marks.get(finding.verdict, "[yellow]note[/]"), finding.check, escape(finding.said))
    console.print(table)
    if any(f.verdict == BLOCKING for f in findings):
        raise typer.Exit(1)


@command
def health(
    port: Annotated[int, typer.Option(help="the node's node.health_port")] = DOCKER_PORT,
    host: Annotated[str, typer.Option(help="where the node serves /health")] = LOCAL_HOST,
    timeout: Annotated[float, typer.Option(help="seconds to wait for an answer")] = ASK_TIMEOUT_S,
) -> None:
    """Ask a running node whether it is alive (exit 0) or stalled/unreachable (exit 1)."""
    healthy, said = ask(host, port, timeout)
    typer.echo(said)
    raise typer.Exit(0 if healthy else 1)


@command
def status(
    initial_peers: Annotated[
        list[str] | None,
        typer.Option("--initial-peers", help="multiaddr of any node of the swarm (repeatable)"),
    ] = None,
    initial_peers_from: Annotated[
        Path | None, typer.Option("--initial-peers-from", help="a node's <run-dir>/swarm.json or a bootstrap list")
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="a local node's run dir: reach the swarm through its swarm.json (default: the current dir)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="every column (the default fits 80 characters)")] = False,
    watch: Annotated[
        float, typer.Option(help="refresh every this many seconds (0 = print once)", min=0)
    ] = 0.0,
    stale_after: Annotated[
        float | None, typer.Option(help="seconds without a heartbeat before 'stale' (default swarm.stale_after_s)")
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds to reach the swarm")] = 30.0,
    serve: Annotated[
        str | None,
        typer.Option(
            "--serve", metavar="[HOST:]PORT",
            help="serve the swarm in a browser instead (peers, each node's curves, who trains on whose, totals); "
            "PORT alone listens on 127.0.0.1, 0 picks a free port",
        ),
    ] = None,
) -> None:
    """List the swarm's peers from their heartbeats (joins as a DHT client, stores nothing).
    Run in a node's run dir (or with --run-dir) it needs no address; with --serve the page
    draws that node's own curves too."""
    from rich.live import Live

    from swarmnode.ops.node_curves import NodeCurves
    from swarmnode.ops.status import render_table, to_json
    from swarmnode.ops.status_page import AddressError as PageAddressError
    from swarmnode.ops.status_page import SwarmPage, parse_address, run_page
    from swarmnode.ops.status_page import serve as listen
    from swarmnode.settings.config import SwarmSettings
    from swarmnode.swarm.hivemind import (
        AddressError,
        SwarmError,
        check_multiaddr,
        open_status_client,
        peer_rows,
        swarm_file_peer_id,
    )

    logging.basicConfig(level=logging.WARNING, handlers=[RichHandler(console=console, show_path=False)])
    stale_after = SwarmSettings().stale_after_s if stale_after is None else stale_after
    try:
        page_address = parse_address(serve) if serve is not None else None
    except PageAddressError as err:
        raise _fail(str(err)) from None
    initial_peers = list(initial_peers or [])
    local = local_swarm_file(run_dir)
    me = swarm_file_peer_id(local) if local else None  # beside a node: what its peers say of it
    if initial_peers_from or (local and not initial_peers):
        initial_peers += _peers_from_file(initial_peers_from or local, timeout)
    if not initial_peers:
        raise _fail(
            "give --initial-peers MADDR (any node's address), --initial-peers-from swarm.json, or run it in "
            "(or give --run-dir) a running node's run dir"
        )
    try:
        for maddr in initial_peers:
            check_multiaddr(maddr, "--initial-peers", needs_peer_id=True)
    except AddressError as err:
        raise _fail(str(err)) from None
    page = server = None
    if page_address is not None:  # listening before joining: a port in use fails at once
        page = SwarmPage(NodeCurves(local.parent, me) if local else None)
        try:
            server = listen(page, page_address)
        except PageAddressError as err:
            raise _fail(str(err), 1) from None
    try:
        runtime = open_status_client(initial_peers, timeout)
    except SwarmError as err:
        if server is not None:
            server.server_close()
        raise _fail(str(err), 1) from None
    try:
        if page is not None and server is not None:
            run_page(page, server, page_address, lambda first: peer_rows(runtime, stale_after, first),
                     lambda said: console.print(said, highlight=False, soft_wrap=True))
        elif as_json:
            while True:
                typer.echo(to_json(peer_rows(runtime, stale_after)))
                if not watch:
                    break
                time.sleep(watch)
        elif watch:
            with Live(render_table(peer_rows(runtime, stale_after), wide, me), console=_status_console(wide)) as live:
                while True:
                    time.sleep(watch)
                    live.update(render_table(peer_rows(runtime, stale_after), wide, me))
        else:
            rows = peer_rows(runtime, stale_after)
            _status_console(wide).print(render_table(rows, wide, me) if rows else "the swarm answered but no node has a heartbeat")
    except KeyboardInterrupt:
        pass
    except TimeoutError:
        raise _fail("the swarm stopped answering", 1) from None
    finally:
        runtime.shutdown()


WIDE_STATUS_COLUMNS = 240  # --wide's table is drawn whole at up to this width; a narrower terminal wraps it


def _status_console(wide: bool, terminal: Console | None = None) -> Console:
    """80 columns' table by default; --wide draws every column whole, however wide the terminal."""
    terminal = terminal or Console()
    return Console(file=terminal.file, width=max(terminal.width, WIDE_STATUS_COLUMNS)) if wide else terminal


@command
def demo(
    nodes: Annotated[int, typer.Option(help="how many node processes (kinds cycle: tiny, tiny LoRA, tiny-llama)", min=2)] = 3,
    rounds: Annotated[int, typer.Option(help="rounds every node runs", min=1)] = 80,
    directory: Annotated[
        Path, typer.Option("--dir", help="demo directory (wiped first): configs, logs, metrics, curves.png")
    ] = Path("runs/demo"),
    config_path: Annotated[
        Path | None, typer.Option("--config", "-c", help="base YAML config instead of the built-in tiny one")
    ] = None,
    solo: Annotated[
        bool, typer.Option(help="then train each node's config alone, the baseline in the table and curves "
                           "(about doubles the time)")
    ] = True,
) -> None:
    """Start a local swarm of heterogeneous tiny nodes on 127.0.0.1 (one process each), train
    them together, then each alone, and print each node's held-out accuracy before, after and
    alone, and draw curves."""
    import yaml

    from swarmnode.demo import DEMO_BASE, DEMO_NOISE, Demo, DemoError
    from swarmnode.settings.config import ConfigError, load_config

    base = DEMO_BASE
    if config_path is not None:
        try:
            load_config(config_path)  # validate before starting anything
        except ConfigError as err:
            raise _fail(str(err)) from None
        base = yaml.safe_load(config_path.read_text())
    runner = Demo(directory, nodes=nodes, rounds=rounds, base=base, console=console, solo=solo)
    started = time.monotonic()
    try:
        rows = runner.run()
    except DemoError as err:
        raise _fail(str(err), 1) from None
    except KeyboardInterrupt:
        raise _fail(f"interrupted; every node stopped; partial results in {directory}", 130) from None
    sizes = sorted({row["eval_size"] for row in rows if row["eval_size"]})
    on = f" on {'/'.join(map(str, sizes))} problems" if sizes else ""
    table = Table(title=f"swarmnode demo: held-out accuracy{on}, greedy ({time.monotonic() - started:.0f} s)")
    baseline = ("alone", "joining, same rounds", "joining, same GPU time") if solo else ()
    for column in ("node", "kind", "rounds", "before", "after", "gain", *baseline, "peer samples, all rounds", "gated",
                   "rejected"):
        table.add_column(column, justify="left" if column in ("node", "kind") else "right")
    for row in rows:
        before, after, alone = row["eval_before"], row["eval_after"], row["alone_after"]
        timed = row["equal_time"]
        equal = "-" if timed is None else f"{timed[1]:+.3f} ({timed[0]:.0f})"
        against_alone = (_accuracy(alone), _difference(after, alone), equal) if solo else ()
        table.add_row(
            str(row["node"]), row["kind"], str(row["rounds"]), _accuracy(before), _accuracy(after),
            _difference(after, before), *against_alone,
            str(row["peer_samples"]), _share(row["gated"], row["gated"] + row["peer_samples"]), str(row["rejected"]),
        )
    Console(width=None if sys.stdout.isatty() else 160).print(table)  # a log or pipe: no wrapped cells
    if solo:
        console.print(DEMO_NOISE, highlight=False)
    console.print(f"curves: {runner.plot(directory / 'curves.png')}", highlight=False)


def _accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _difference(value: float | None, baseline: float | None) -> str:
    return "-" if value is None or baseline is None else f"{value - baseline:+.3f}"


def _share(part: int, whole: int) -> str:
    return f"{part} ({part / whole:.0%})" if whole else "0"


def local_swarm_file(run_dir: Path | None) -> Path | None:
    """The swarm.json of a node's run dir: `run_dir`'s, else the current directory's, if there."""
    path = (run_dir or Path.cwd()) / "swarm.json"
    if run_dir is not None and not path.exists():
        raise _fail(f"{path} does not exist: is a node running with --run-dir {run_dir}?")
    return path if path.exists() else None


def _peers_from_file(path: Path, timeout_s: float) -> list[str]:
    with console.status(f"waiting for {path} ..."):
        try:
            return read_peers_file(path, timeout_s)
        except PeersFileError as err:
            raise _fail(str(err), 1) from None


def _terminate_like_ctrl_c() -> None:
    """SIGTERM (docker stop, demo clean-up) takes the Ctrl-C path: checkpoint, then exit."""

    def interrupt(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


if __name__ == "__main__":
    app()
