"""The `swarmnode` command line: parses flags, builds the config, hands over to the node."""

from __future__ import annotations

import logging
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
console = Console(stderr=True)


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
        Path | None, typer.Option("--config", "-c", help="YAML config file (see configs/)")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="'tiny', a hub id, a short name (Qwen2.5-3B) or a path")
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
    fresh: Annotated[
        bool, typer.Option("--fresh", help="ignore an existing checkpoint in --run-dir")
    ] = False,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="any setting, e.g. --set rollout.group_size=12 (repeatable)"),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no per-round lines")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run a node. With no peers (this issue's only mode) it trains alone."""
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
        "node.resume": False if fresh else None,
    }
    try:
        config = load_config(config_path, overrides, flags)
    except ConfigError as err:
        raise _fail(str(err)) from None
    summary = run_node(config, quiet)
    table = Table(title="swarmnode: run finished")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(
            key, "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        )
    Console().print(table)


def run_node(config: Config, quiet: bool = False) -> dict:
    """Build policy, generator, task and node from the config and run it."""
    from swarmnode.metrics import LiveView
    from swarmnode.node import Node
    from swarmnode.policy import Policy
    from swarmnode.rollout import make_generator
    from swarmnode.tasks import make_task

    try:
        task = make_task(config.task)
        policy = Policy.load(config.model, config.train)
    except (FileNotFoundError, ValueError, RuntimeError, OSError) as err:
        raise _fail(str(err)) from None
    ood_eval = None
    if config.task.eval_data:
        from swarmnode.tasks import Math500Eval

        try:
            ood_eval = Math500Eval(config.task.eval_data, answer_format=config.task.answer_format)
        except (FileNotFoundError, ValueError) as err:
            raise _fail(str(err)) from None
    generator = make_generator(config.rollout.backend, policy, config.rollout)
    node = Node(config, policy, generator, task, view=LiveView(console, quiet=quiet), ood_eval=ood_eval)
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
    try:
        summary = node.run()
    except KeyboardInterrupt:
        raise _fail(f"interrupted; checkpoint in {node.checkpoint_dir}", 130) from None
    finally:
        node.close()
    summary["rounds"] = config.node.rounds
    return summary


if __name__ == "__main__":
    app()
