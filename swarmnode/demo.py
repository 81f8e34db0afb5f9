"""`swarmnode demo`: a local swarm of heterogeneous tiny nodes, one process each, on 127.0.0.1.

The demo only orchestrates: every node is a real `swarmnode join` process with its own config
file, identity and run directory under the demo directory, exchanging rollouts over hivemind
exactly as nodes on different machines would. The demo watches their metrics files, then
prints each node's held-out accuracy before and after and draws the curves. Unless told not
to, it then trains each node's config alone (`--solo`, the same rounds and batch) so the
curves answer "did joining help?". Every process it starts lives in its own process group and
is stopped on exit, Ctrl-C or failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarmnode.model.tiny import TINY_PRESETS, ensure_tiny
from swarmnode.ops.lines import EvalRecord, RoundRecord
from swarmnode.ops.metrics import read_records
from swarmnode.ops.rundir import LOG_FILE
from swarmnode.settings.network import LOCAL_HOST
from swarmnode.settings.presets import merged, tiny_cpu
from swarmnode.sizing.cost import CostModel

# Node kinds cycled through: full fine-tuning next to LoRA, and a model of another
# architecture and tokenizer family (its samples read by span, swarmnode.learn.alignment).
NODE_KINDS: list[dict[str, Any]] = [
    {"label": "tiny full", "model": {"name": "tiny"}},
    {"label": "tiny LoRA r=16", "model": {"name": "tiny", "lora": {"rank": 16}}, "train": {"lr": 3e-4}},
    {"label": "tiny-llama full", "model": {"name": "tiny-llama"}},
]

# The demo's base settings: the tiny CPU preset, with shorter rounds so that three processes
# can share two cores, and the swarm on loopback.
DEMO_BASE: dict[str, Any] = tiny_cpu({
    "rollout": {"prompts_per_round": 8},
    "train": {"micro_batch_size": 256},
    "node": {"eval_size": 300, "checkpoint_every": 50, "gather_timeout_s": 20.0},
    "swarm": {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "wait_for_peers_s": 180.0},
})


# What the demo's comparison with alone can say, printed under its table.
DEMO_NOISE = (
    "joining, same GPU time: the gain where the swarm node has spent the modelled GPU time (in brackets, in "
    "rounds alone) of its config alone (generation 93 % of a round, swarmnode.sizing.cost), read off both curves "
    "(the third panel of curves.png). One run of one seed: seed to seed such a gain spreads by about 0.05 (20 "
    "seeds, docs/figures.md), so one under about 0.1 says nothing either way; docs/figures.md has the tables "
    "over seeds."
)

# What a node process printed (with -q: little beyond a fatal error or a crash's traceback);
# the node's own log is <node dir>/run/node.log.
CONSOLE_FILE = "console.log"


class DemoError(RuntimeError):
    pass


def _logs_of(node: DemoNode) -> str:
    """Where a failed node says why: its own log, and its console for what came before it."""
    return f"{node.directory / 'run' / LOG_FILE} (and {node.directory / CONSOLE_FILE})"


@dataclass
class DemoNode:
    index: int
    label: str
    directory: Path
    process: subprocess.Popen | None = None
    log_file: Any = None
    stopped: bool = False  # its process group was signalled and reaped

    @property
    def metrics_path(self) -> Path:
        return self.directory / "run" / "metrics.jsonl"

    def records(self) -> tuple[list[RoundRecord], list[EvalRecord]]:
        """The node's rounds and evaluations so far, from one read of its metrics.jsonl."""
        try:
            return read_records(self.metrics_path)
        except OSError:  # the run dir is being made
            return [], []


def solo_config(config: dict[str, Any], directory: Path) -> dict[str, Any]:
    """A swarm node's config trained alone: the same model, batch and rounds, no swarm."""
    return merged(config, {"node": {"run_dir": str(directory / "run")}, "swarm": {"enabled": False}})


def node_config(base: dict[str, Any], index: int, nodes: int, rounds: int, directory: Path) -> dict[str, Any]:
    kind = NODE_KINDS[index % len(NODE_KINDS)]
    overrides = {k: v for k, v in kind.items() if k != "label"}
    config = merged(base, overrides)
    return merged(
        config,
        {
            "node": {"rounds": rounds, "run_dir": str(directory / "run"), "eval_every": max(1, rounds // 4)},
            "swarm": {"min_peers": nodes - 1, "identity_path": str(directory / "identity.key")},
        },
    )


class Demo:
    def __init__(
        self,
        directory: Path,
        nodes: int = 3,
        rounds: int = 60,
        base: dict[str, Any] | None = None,
        console: Console | None = None,
        startup_timeout_s: float = 120.0,
        *,
        solo: bool,  # also train each node's config alone afterwards (the CLI's --solo, on by default)
    ) -> None:
        if nodes < 2:
            raise DemoError("a swarm needs at least 2 nodes")
        self.directory = directory
        self.rounds = rounds
        self.base = base or DEMO_BASE
        self.console = console or Console(stderr=True)
        self.startup_timeout_s = startup_timeout_s
        self.nodes = [
            DemoNode(i, NODE_KINDS[i % len(NODE_KINDS)]["label"], directory / f"node-{i}") for i in range(nodes)
        ]
        # each node's config alone, trained after the swarm (the curves' baseline)
        self.solos = [DemoNode(n.index, n.label, n.directory / "solo") for n in self.nodes] if solo else []
        # the swarm page (`swarmnode status --serve`) beside node 0's run dir, while the swarm runs
        self.page = DemoNode(-1, "page", directory / "page")

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> list[dict[str, Any]]:
        self._prepare()
        try:
            self._start_all()
            self._watch(self.nodes, "together")
            self._stop([*self.nodes, self.page])
            if self.solos:
                for node in self.solos:
                    self._start(node, [])
                self.console.print(f"now each node alone, for the baseline; logs in {self.directory}/node-*/solo/",
                                   highlight=False)
                self._watch(self.solos, "alone")
        finally:
            self.stop()
        return self.summary()

    def _prepare(self) -> None:
        if self.directory.exists():
            if not (self.directory / "demo.json").exists():
                raise DemoError(f"{self.directory} exists and is not a demo directory; choose another --dir")
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        (self.directory / "demo.json").write_text(json.dumps({"nodes": len(self.nodes), "rounds": self.rounds}))
        names = {merged(self.base, NODE_KINDS[n.index % len(NODE_KINDS)])["model"]["name"] for n in self.nodes}
        for name in sorted(names & TINY_PRESETS.keys()):  # build once here, not in three racing processes
            with self.console.status(f"preparing the {name} preset (once, cached afterwards) ..."):
                ensure_tiny(TINY_PRESETS[name])
        for node in self.nodes:
            node.directory.mkdir(parents=True)
            config = node_config(self.base, node.index, len(self.nodes), self.rounds, node.directory)
            (node.directory / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        for node in self.solos:
            node.directory.mkdir(parents=True)
            config = node_config(self.base, node.index, len(self.nodes), self.rounds, node.directory)
            (node.directory / "config.yaml").write_text(yaml.safe_dump(solo_config(config, node.directory), sort_keys=False))

    def _start(self, node: DemoNode, initial_peers: list[str]) -> None:
        cmd = [sys.executable, "-m", "swarmnode", "join", "--config", str(node.directory / "config.yaml"), "-q"]
        for maddr in initial_peers:
            cmd += ["--initial-peers", maddr]
        threads = max(1, (os.cpu_count() or 1) // len(self.nodes))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        node.log_file = (node.directory / CONSOLE_FILE).open("w")
        node.process = subprocess.Popen(
            cmd, stdout=node.log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def _start_all(self) -> None:
        bootstrap = self.nodes[0]
        self._start(bootstrap, [])
        info = bootstrap.directory / "run" / "swarm.json"
        deadline = time.monotonic() + self.startup_timeout_s
        with self.console.status("starting the bootstrap node ..."):
            while not info.exists():
                if bootstrap.process.poll() is not None:
                    raise DemoError(f"the bootstrap node exited; see {_logs_of(bootstrap)}")
                if time.monotonic() > deadline:
                    raise DemoError(f"the bootstrap node did not start within {self.startup_timeout_s:.0f} s")
                time.sleep(0.2)
        maddrs = json.loads(info.read_text())["maddrs"]
        self.console.print(f"swarm up at {maddrs[0]}", highlight=False, soft_wrap=True)
        for node in self.nodes[1:]:
            self._start(node, maddrs[:1])
        self.console.print(
            f"{len(self.nodes)} nodes started; logs and configs in {self.directory}/node-*/", highlight=False
        )
        self.console.print(f"watch the swarm in a browser: {self._start_page(bootstrap)}", highlight=False,
                           soft_wrap=True)

    def _start_page(self, beside: DemoNode) -> str:
        """`swarmnode status --serve` beside `beside`'s run dir, on a free local port; its URL."""
        with socket.socket() as probe:  # a free port now; the page takes it a moment later
            probe.bind((LOCAL_HOST, 0))
            port = probe.getsockname()[1]
        self.page.directory.mkdir(parents=True, exist_ok=True)
        self.page.log_file = (self.page.directory / CONSOLE_FILE).open("w")
        self.page.process = subprocess.Popen(
            [sys.executable, "-m", "swarmnode", "status", "--serve", f"{LOCAL_HOST}:{port}",
             "--run-dir", str(beside.directory / "run")],
            stdout=self.page.log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
        return f"http://{LOCAL_HOST}:{port}/"

    def _watch(self, nodes: list[DemoNode], phase: str) -> None:
        """Show the phase's progress until its processes end; DemoError if one failed."""
        with Live(self._progress_table(nodes, phase), console=self.console, refresh_per_second=2) as live:
            while True:
                failed = [n for n in nodes if n.process.poll() not in (None, 0)]
                if failed:
                    raise DemoError(
                        f"node {failed[0].index} ({phase}) exited with code {failed[0].process.returncode}; "
                        f"see {_logs_of(failed[0])}"
                    )
                live.update(self._progress_table(nodes, phase))
                if all(n.process.poll() is not None for n in nodes):
                    return
                time.sleep(1.0)

    def stop(self) -> None:
        """Stop every process started (nodes and their p2p daemons, the page) and close the logs."""
        self._stop([*self.nodes, *self.solos, self.page])
        for node in [*self.nodes, *self.solos, self.page]:
            if node.log_file is not None:
                node.log_file.close()

    def _stop(self, nodes: list[DemoNode]) -> None:
        """SIGTERM each started node's process group, SIGKILL stragglers and what is left of
        the group (a p2p daemon); a phase's groups go as soon as it ends."""
        started = [n for n in nodes if n.process is not None and not n.stopped]
        running = [n for n in started if n.process.poll() is None]
        for node in running:
            _signal_group(node.process, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for node in running:
            try:
                node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for node in started:
            _signal_group(node.process, signal.SIGKILL)  # whatever is left of the group
            node.process.wait()
            node.stopped = True

    # -- reporting ---------------------------------------------------------------------------

    def _progress_table(self, nodes: list[DemoNode], phase: str) -> Table:
        title = f"swarmnode demo: {len(nodes)} nodes {phase}, {self.rounds} rounds"
        table = Table(title=title, title_justify="left")
        for column in ("node", "kind", "round", "reward", "peer samples this round", "eval", "round s"):
            table.add_column(column, justify="left" if column in ("node", "kind") else "right")
        for node in nodes:
            rounds, evals = node.records()
            last = rounds[-1] if rounds else None
            table.add_row(
                str(node.index),
                node.label,
                f"{last.round + 1}/{self.rounds}" if last else "starting",
                f"{last.reward_mean:.3f}" if last else "-",
                str(last.peer_samples) if last else "-",
                f"{evals[-1].eval_acc:.3f}" if evals else "-",
                f"{last.timings.get('round_s', 0.0):.2f}" if last else "-",
            )
        return table

    def summary(self) -> list[dict[str, Any]]:
        """Per node: its rounds, accuracy before and after in the swarm, and after alone (None
        without the solo runs), and what its peers' samples came to."""
        rows = []
        alone = {node.index: _after(node.records()[1]) for node in self.solos}
        solos = {node.index: node.records() for node in self.solos}
        for node in self.nodes:
            rounds, evals = node.records()
            before = next((e.eval_acc for e in evals if e.phase == "before"), None)
            equal_time = equal_time_gain((rounds, evals), solos[node.index]) if node.index in solos else None
            rows.append(
                {
                    "node": node.index,
                    "kind": node.label,
                    "rounds": len(rounds),
                    "eval_before": before,
                    "eval_after": _after(evals),
                    "alone_after": alone.get(node.index),
                    "equal_time": equal_time,  # (modelled time in rounds alone, gain there) or None
                    "peer_samples": sum(r.peer_samples for r in rounds),
                    "eval_size": next((e.eval_size for e in reversed(evals) if e.eval_size), None),
                    "gated": sum(r.gated for r in rounds),
                    "rejected": max((r.rejected for r in rounds), default=0),
                }
            )
        return rows

    def plot(self, path: Path) -> Path:
        """Reward (moving average) and held-out accuracy per node, against the round: solid in
        the swarm, dashed in the same colour alone."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax_reward, ax_eval, ax_time) = plt.subplots(1, 3, figsize=(16, 4))
        solos = {node.index: node for node in self.solos}
        for node in self.nodes:
            colour = f"C{node.index % 10}"
            curves = [(node, "-", "")] + ([(solos[node.index], "--", " alone")] if node.index in solos else [])
            alone_rounds = solos[node.index].records()[0] if node.index in solos else []
            for run, style, suffix in curves:
                rounds, evals = run.records()
                label = f"{node.index}: {node.label}{suffix}"
                ax_reward.plot([r.round for r in rounds], _moving_mean([r.reward_mean for r in rounds], 10),
                               style, color=colour, label=label)
                points = [(e.round + 1, e.eval_acc) for e in evals]
                if points:
                    ax_eval.plot(*zip(*points), style, marker="o", color=colour, label=label)
                if alone_rounds:
                    timed = accuracy_by_time(rounds, evals, alone_rounds)
                    if timed:
                        ax_time.plot(*zip(*timed), style, marker="o", color=colour, label=label)
        ax_reward.set(title="training reward (10-round mean)", xlabel="round", ylabel="reward")
        ax_eval.set(title="held-out accuracy (greedy)", xlabel="round", ylabel="accuracy")
        ax_time.set(title="held-out accuracy against modelled GPU time", xlabel="rounds of the node alone",
                    ylabel="accuracy")
        if not self.solos:
            ax_time.text(0.5, 0.5, "no runs alone (--no-solo)", ha="center", va="center", transform=ax_time.transAxes)
        for ax in (ax_reward, ax_eval, ax_time):
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def modelled_times(rounds: list[RoundRecord], alone: list[RoundRecord], cost: CostModel | None = None) -> list[float]:
    """The modelled GPU time (swarmnode.sizing.cost) after each of `rounds`, in rounds of the same
    config alone (`alone`: its tokens generated and samples trained a round, on average). On a
    CPU generation is cheap, so the clock would say nothing of what a GPU volunteer pays."""
    return (cost or CostModel()).elapsed([r.priced for r in rounds], [r.priced for r in alone])


def accuracy_by_time(rounds: list[RoundRecord], evals: list[EvalRecord], alone: list[RoundRecord]) -> list[tuple[float, float]]:
    """(modelled time, held-out accuracy) at each of a run's evaluations (before: time 0)."""
    times = modelled_times(rounds, alone)
    points = []
    for record in evals:
        done = record.round + 1  # rounds trained when it was evaluated
        if done == 0 or 0 < done <= len(times):
            points.append((times[done - 1] if done else 0.0, record.eval_acc))
    return points


def equal_time_gain(run: tuple[list[RoundRecord], list[EvalRecord]],
                    solo: tuple[list[RoundRecord], list[EvalRecord]]) -> tuple[float, float] | None:
    """(time, gain): where the shorter of the two runs ends in modelled time, the swarm node's
    held-out accuracy minus the same config's alone, each read off its curve against that time
    (linear between evaluations); None without the points to read."""
    ours = accuracy_by_time(run[0], run[1], solo[0])
    theirs = accuracy_by_time(solo[0], solo[1], solo[0])
    if len(ours) < 2 or len(theirs) < 2:
        return None
    at = min(ours[-1][0], theirs[-1][0])
    return at, _interpolated(ours, at) - _interpolated(theirs, at)


def _interpolated(points: list[tuple[float, float]], at: float) -> float:
    for (t0, a0), (t1, a1) in zip(points, points[1:]):
        if t0 <= at <= t1:
            return a0 if t1 == t0 else a0 + (a1 - a0) * (at - t0) / (t1 - t0)
    return points[-1][1]


def _moving_mean(values: list[float], window: int) -> list[float]:
    return [sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def _after(evals: list[EvalRecord]) -> float | None:
    return next((e.eval_acc for e in reversed(evals) if e.phase == "after"), None)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
