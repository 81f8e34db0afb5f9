"""The composition root: from a Config to a running node and back down.

`assemble` builds the parts in the order that fails cheapest first (task and data, memory
estimate, swarm addresses and daemon, then the model), wires them into a Node, and yields it.
Everything it opened is registered on one ExitStack as soon as it exists, so every way out
(a failure halfway, Ctrl-C, a normal end) closes exactly what was opened, newest first: the
/health server, the node's metrics, the generator, the swarm seams (a farewell heartbeat), the
p2p daemon. The CLI, bench scripts and tests all build nodes here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from swarmnode import __version__
from swarmnode.loop.checkpoints import NodeCheckpoints
from swarmnode.loop.evaluation import Evaluator
from swarmnode.loop.intake import Intake
from swarmnode.loop.ledger import PeerLedger
from swarmnode.loop.node import Node
from swarmnode.loop.report import NodeReport
from swarmnode.model.batching import OutOfMemory
from swarmnode.model.checkpoint import CheckpointWriter, checkpoint_present
from swarmnode.model.policy import Policy
from swarmnode.ops.cores import CoreShare
from swarmnode.ops.exporter import metrics_page
from swarmnode.ops.health import HealthServer
from swarmnode.ops.hub import HubPublisher
from swarmnode.ops.metrics import LiveView, MetricsLog
from swarmnode.ops.reporting import ReportError, Reporters, make_reporters
from swarmnode.ops.rundir import RunDirBusy, locked, node_log
from swarmnode.protocol.records import run_id
from swarmnode.rollout import make_generator
from swarmnode.rollout.base import Generator, sampling_seed
from swarmnode.settings.config import Config
from swarmnode.sizing.memory import GIB, check_fits
from swarmnode.sizing.plan import plan_for_device
from swarmnode.swarm.base import PeerStanding, SwarmLink
from swarmnode.swarm.hivemind import (
    AddressError,
    IdentityError,
    PeersFileError,
    SwarmError,
    SwarmRuntime,
    announce_address,
    attach,
    identity_path_of,
    initial_peers_of,
    start_runtime,
)
from swarmnode.swarm.local import solo_link
from swarmnode.tasks import Math500Eval, Task, make_task
from swarmnode.tasks.base import fingerprint_of

# How a caller supplies its own peers (tests, bench/): given the run id and the node's
# ledger (which the exchange reads), both seams.
JoinPeers = Callable[[str, PeerStanding], SwarmLink]


class AssemblyError(RuntimeError):
    """A node could not be built; the message says what to change. `exit_code` 2 = settings,
    1 = the network or another process (the CLI exits with it)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def assemble(
    config: Config,
    view: LiveView | None = None,
    config_path: Path | None = None,
    *,
    join: JoinPeers | None = None,
    policy: Policy | None = None,
    task: Task | None = None,
) -> Iterator[Node]:
    """A node built from `config`, ready to `run()`; everything is closed when the block ends.

    `join` replaces the swarm (e.g. an InMemoryHub's members); `policy` replaces loading the
    configured model (tests use small random ones); `task` is the one preflight already made
    from `config.task` (else it is made here). Failures raise AssemblyError.
    """
    view = view or LiveView(quiet=True)
    with contextlib.ExitStack() as stack:
        run_dir = Path(config.node.run_dir)
        try:
            stack.enter_context(locked(run_dir))  # first: a second node here changes nothing
        except RunDirBusy as err:
            raise AssemblyError(str(err), 1) from None
        stack.enter_context(node_log(run_dir))
        if config.node.memory_check and policy is None:
            config = _plan_memory(config, view)
        task, ood_eval = _task(config, task)
        runtime = None
        if join is None and config.swarm.enabled:
            runtime = _start_swarm(config, view, config_path)
            stack.callback(runtime.shutdown)
        policy = policy or _load_policy(config)
        run = run_id_for(config, task, policy)
        ledger = PeerLedger(config.swarm)
        link = _link(config, run, ledger, runtime, join)
        stack.callback(link.membership.close)
        stack.callback(link.exchange.close)
        seed = sampling_seed(config.node.seed, link.exchange.peer_id)
        generator = _guard(lambda: make_generator(config.rollout.backend, policy, config.rollout, seed=seed))
        stack.callback(generator.close)
        facts = {
            "peer_id": link.exchange.peer_id, "run_id": run, "model": policy.name,
            "lora_rank": policy.lora_rank, "version": __version__, "config": config.model_dump(mode="json"),
        }
        reporters = _guard(lambda: make_reporters(config.report, run_dir, facts), ReportError)
        stack.callback(reporters.close)
        publisher = HubPublisher(config.hub, run_dir / "hub-upload") if config.hub.repo_id else None
        node = compose_node(
            config, policy, generator, task, run, link, ledger, view=view, ood_eval=ood_eval,
            reporters=reporters, publisher=publisher,
        )
        stack.callback(node.close)
        if _guard(node.maybe_resume, ValueError, OSError):
            redone = node.metrics.forget_from(node.next_round)  # rounds logged after the checkpoint are done again
            if redone:
                reporters.restart_at(node.next_round + 1)
            view.say(
                f"resumed from {node.checkpoint_dir}: {node.next_round} round(s) done "
                f"(checkpoint of {node.resumed_at}), going on with round {node.next_round + 1}"
                + (f"; {redone} line(s) logged after it dropped from metrics.jsonl" if redone else "")
            )
        elif (kept := node.metrics.set_aside()) is not None:  # a start from round 1 over an earlier start's lines
            reporters.restart_at(0)
            why = "--fresh" if checkpoint_present(node.checkpoint_dir) else f"no checkpoint in {node.checkpoint_dir}"
            view.say(f"{why}: starting over from round 1 (the earlier start's lines are in {kept.name})")
        view.say(
            f"node {node.peer_id} | model {policy.name} ({policy.num_params / 1e6:.2f} M params, "
            f"{'LoRA r=' + str(policy.lora_rank) if policy.lora_rank else 'full'}) | "
            f"task {config.task.name} | objective {config.loss.objective} | run {node.run_id} | "
            f"dir {node.run_dir}"
        )
        if config.node.health_port:
            health = _serve_health(config, node)
            stack.callback(health.close)
        yield node


def run(
    config: Config, view: LiveView | None = None, config_path: Path | None = None, task: Task | None = None
) -> dict[str, Any]:
    """Assemble, run every round, take everything down; the run's summary."""
    with assemble(config, view, config_path, task=task) as node:
        cores = CoreShare(node.view.say)
        cores.update()  # before the first evaluation, which is the first heavy work
        node.between_rounds.append(cores.update)
        try:
            summary = node.run()
        except OutOfMemory as err:
            saved = f"; checkpoint of the last finished round in {node.checkpoint_dir}" if node.next_round else ""
            raise AssemblyError(f"{err}{saved}", 1) from None
        summary["rounds"] = config.node.rounds
        summary["rejected"] = node.ledger.total
        return summary


def compose_node(
    config: Config,
    policy: Policy,
    generator: Generator,
    task: Task,
    run_id: str,
    link: SwarmLink,
    ledger: PeerLedger,
    *,
    view: LiveView | None = None,
    ood_eval: Any = None,
    reporters: Reporters | None = None,
    publisher: HubPublisher | None = None,
) -> Node:
    """A Node wired from its parts: the ledger the link's exchange reads (`ledger`), the
    intake, evaluator, metrics file, its report and its checkpoints. The caller closes the
    link, the generator, the reporters and the node."""
    run_dir = Path(config.node.run_dir)
    exchange, membership = link.exchange, link.membership
    view = view or LiveView(quiet=True)
    if config.trust.likelihood_gate and config.trust.anchor:
        policy.keep_reference()  # before any checkpoint is loaded: the weights the run started from
    intake = Intake(config, policy, task, run_id, exchange, membership, ledger)
    # a resumed node keeps the anchored gate's bar, the order its peers earned, its share of the
    # batch and what its rounds cost
    keeps = [intake.screener, ledger, intake.share, intake.costs]
    return Node(
        config, policy, generator, task,
        run_id=run_id,
        link=link,
        ledger=ledger,
        intake=intake,
        evaluator=Evaluator(task, policy, generator, config.node.eval_size, ood_eval),
        metrics=MetricsLog(run_dir / "metrics.jsonl"),
        report=NodeReport(config, policy, generator.name, run_id, exchange.peer_id, ledger, membership),
        checkpoints=NodeCheckpoints(
            CheckpointWriter(policy, run_dir / "checkpoint"), policy, config.node, run_id, exchange.peer_id, keeps,
            view.say,
        ),
        view=view,
        reporters=reporters or Reporters(),
        publisher=publisher,
    )


def run_id_for(config: Config, task: Task, policy: Policy) -> str:
    """The run id of a node with this config, task and policy (see protocol.records.run_id)."""
    return run_id(config, task.fingerprint, policy.use_chat_template)


def solo_peer_id(config: Config) -> str:
    """A node without a swarm: the configured id, else one derived from its run dir."""
    return config.node.peer_id or f"local-{fingerprint_of(str(config.node.run_dir))[:8]}"


# -- the steps ---------------------------------------------------------------------------------


def _guard(build: Callable[[], Any], *errors: type[BaseException]) -> Any:
    """Run a build step; its expected failures become AssemblyError (exit 2)."""
    expected = errors or (RuntimeError, ValueError, OSError)
    try:
        return build()
    except expected as err:
        raise AssemblyError(str(err)) from None


def _task(config: Config, made: Task | None = None) -> tuple[Task, Math500Eval | None]:
    def build() -> tuple[Task, Math500Eval | None]:
        task = made if made is not None else make_task(config.task)
        ood = None
        if config.task.eval_data:
            ood = Math500Eval(config.task.eval_data, answer_format=config.task.answer_format)
        return task, ood

    return _guard(build, FileNotFoundError, ValueError, OSError, RuntimeError)  # e.g. hub data without `datasets`


def _plan_memory(config: Config, view: LiveView) -> Config:
    """On a GPU: the planner's config (settings the user gave kept), or a refusal showing the
    nearest plan that fits. On CPU: refuse, with a suggestion, what exceeds the RAM."""
    planned, text = _guard(lambda: plan_for_device(config), RuntimeError)  # NoPlanFits included
    if text is not None:
        view.say(text)
        return planned
    _check_memory(config, view)
    return config


def _check_memory(config: Config, view: LiveView) -> None:
    """Refuse, with a suggestion, a config whose estimate exceeds the device's memory."""
    estimate, problem = _guard(lambda: check_fits(config), RuntimeError)
    if problem:
        raise AssemblyError(problem)
    if estimate is not None:
        view.say(
            f"memory estimate: {estimate.total / GIB:.1f} GiB of {estimate.capacity / GIB:.1f} GiB ({estimate.device})"
        )


def _start_swarm(config: Config, view: LiveView, config_path: Path | None) -> SwarmRuntime:
    """Daemon and DHT first, so a bad address fails before a model loads."""
    try:
        with view.busy("reading initial peers ..."):
            initial_peers = initial_peers_of(config)
    except AddressError as err:
        raise AssemblyError(f"invalid configuration: {err}") from None
    except PeersFileError as err:
        raise AssemblyError(str(err), 1) from None
    restarted = identity_path_of(config).exists()  # this node ran here before, under this peer id
    try:
        with view.busy("starting the p2p daemon and joining the swarm ..."):
            runtime = start_runtime(config, initial_peers)
    except (SwarmError, IdentityError) as err:
        raise AssemblyError(str(err), 1) from None
    try:
        maddrs = announce_address(config, runtime)
    except BaseException:
        runtime.shutdown()
        raise
    verb = ("joined the swarm" if initial_peers else
            "back with no initial peers (others rejoin through this node)" if restarted else "started a new swarm")
    view.say(f"{verb} as {runtime.peer_id}; reachable at:")
    for maddr in maddrs:
        view.say(f"  {maddr}")
    if not initial_peers and maddrs:
        public = [m for m in maddrs if "/127.0.0.1/" not in m] or maddrs
        config_flag = f"--config {config_path} " if config_path else ""
        view.say(
            f"others join with:\n  swarmnode join {config_flag}--initial-peers {public[0]}\n"
            "  (on this machine, each node also needs its own --run-dir)"
        )
    return runtime


def _load_policy(config: Config) -> Policy:
    return _guard(
        lambda: Policy.load(config.model, config.train, seed=config.node.seed),
        FileNotFoundError, ValueError, RuntimeError, OSError,
    )


def _link(
    config: Config, run_id: str, ledger: PeerLedger, runtime: SwarmRuntime | None, join: JoinPeers | None
) -> SwarmLink:
    if join is not None:
        return join(run_id, ledger)
    if runtime is not None:
        return attach(runtime, run_id, config, ledger)
    return solo_link(solo_peer_id(config), run_id, ledger)


def _serve_health(config: Config, node: Node) -> HealthServer:
    host, port = config.node.health_host, config.node.health_port
    try:
        return HealthServer(host, port, node.report.health, metrics=metrics_page(node.report.snapshot))
    except OSError as err:
        raise AssemblyError(f"cannot serve /health on {host}:{port}: {err}") from None
