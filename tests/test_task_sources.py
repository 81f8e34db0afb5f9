"""Tasks from outside swarmnode: reasoning-gym datasets (`rg:<dataset>`) and plug-ins found
through the `swarmnode.tasks` entry point group."""

from __future__ import annotations

import sys
import textwrap
from importlib.metadata import distributions

import pytest

from swarmnode.assemble import assemble, compose_node, run_id_for
from swarmnode.loop.ledger import PeerLedger
from swarmnode.model.tiny import TINY_PRESETS, ensure_tiny
from swarmnode.ops.preflight import PreflightError, preflight
from swarmnode.rollout.hf import HFGenerator
from swarmnode.settings.config import ConfigError, load_config
from swarmnode.swarm.local import InMemoryHub
from swarmnode.tasks import make_task
from swarmnode.tasks.gym import GymProblem, check_reproducible, gym_datasets
from tests.test_swarm_processes import NodeProcess, wait_for

CHAIN = ["task.name=rg:chain_sum", "task.options.max_terms=2", "task.options.max_digits=2"]


def _task(*overrides: str):
    return make_task(load_config(overrides=list(overrides)).task)


def test_a_reasoning_gym_task_draws_the_same_problems_on_every_node_and_holds_its_evaluation_out():
    task, again = _task(*CHAIN), _task(*CHAIN)
    ids = [0, 1, 17, 99_999]
    assert [task.train_problem(i) for i in ids] == [again.train_problem(i) for i in ids]
    assert task.fingerprint == again.fingerprint
    held_out = {p.question for p in task.eval_problems(100)}
    assert len(held_out) == 100
    trained = {task.train_problem(i).question for i in range(3000)}
    assert not trained & held_out, "no held-out question is ever a training question"
    assert len(trained) > 1000, "two-digit sums: a space small enough that the hash hold-out matters"
    with pytest.raises(ValueError, match="out of range"):
        task.train_problem(100_000)


def test_a_reasoning_gym_task_is_scored_by_its_dataset_after_this_node_s_format_rules():
    task = _task(*CHAIN)
    problem = task.train_problem(3)
    assert isinstance(problem, GymProblem) and problem.entry["answer"] == problem.answer
    assert task.reward(f"<answer>{problem.answer}</answer>", problem) == 1.0
    assert task.reward(f"<answer>{int(problem.answer) + 1}</answer>", problem) == 0.0
    assert task.reward(f"<answer>{problem.answer}</answer> and more", problem) == 0.0, "strict: nothing after it"
    assert task.reward(problem.answer, problem) == 0.0, "no answer block"
    boxed = _task(*CHAIN, "task.answer_format=boxed")
    assert boxed.reward(f"\\boxed{{{problem.answer}}}", boxed.train_problem(3)) == 1.0


def test_an_answer_that_only_contains_the_right_one_gets_no_part_credit():
    task = _task("task.name=rg:gcd")
    problem = task.train_problem(0)
    listing = " ".join(str(n) for n in range(100))  # every small number, the right one among them
    assert problem.answer in listing.split()
    assert task._train.score_answer(listing, problem.entry) > 0, "reasoning-gym's default gives part credit"
    assert task.exact_only and task.reward(f"<answer>{listing}</answer>", problem) == 0.0
    assert task.reward(f"<answer>{problem.answer}</answer>", problem) == 1.0
    assert not _task(*CHAIN).exact_only, "a reviewed scorer of its own is asked"


def test_the_run_id_covers_the_dataset_its_config_and_its_seed():
    base = _task(*CHAIN).fingerprint
    assert _task(*CHAIN, "task.options.seed=1").fingerprint != base
    assert _task(*CHAIN, "task.options.max_digits=3").fingerprint != base
    assert _task("task.name=rg:basic_arithmetic").fingerprint != base
    assert _task(*CHAIN, "task.options.size=5000").fingerprint != base


def test_bad_reasoning_gym_settings_say_what_is_wrong_before_anything_starts():
    with pytest.raises(ConfigError, match="rg:<dataset>"):
        load_config(overrides=["task.name=rg:Not A Name"])
    with pytest.raises(ConfigError, match="makes its own problems"):
        load_config(overrides=["task.name=rg:chain_sum", "task.data=x.jsonl"])
    with pytest.raises(PreflightError, match="no dataset 'no_such_set'.*chain_sum"):
        preflight(load_config(overrides=["task.name=rg:no_such_set"]))
    with pytest.raises(PreflightError, match="refused by reasoning-gym.*bogus"):
        preflight(load_config(overrides=["task.name=rg:chain_sum", "task.options.bogus=1"]))


def test_datasets_that_would_run_a_peer_s_text_are_not_offered_and_a_scorer_that_chokes_scores_nothing():
    with pytest.raises(ValueError, match="safe on a peer's text"):
        _task("task.name=rg:string_insertion")  # its scorer eval()s the answer
    offered = gym_datasets()
    assert "chain_sum" in offered and not {"string_insertion", "binary_matrix", "polynomial_multiplication"} & set(offered)
    task = _task(*CHAIN)
    problem = task.train_problem(0)
    task._train.score_answer = lambda answer, entry: 1 / 0  # a dataset's scorer raising on odd text
    assert task.reward("<answer>((((</answer>", problem) == 0.0


def test_a_dataset_whose_problems_depend_on_the_process_is_refused_before_it_starts():
    with pytest.raises(PreflightError, match="another process makes other problems"):
        preflight(load_config(overrides=["task.name=rg:isomorphic_strings"]))
    check_reproducible(_task(*CHAIN))  # chain_sum: the same problems in a process of another hash seed


PLUGIN = '''
from swarmnode.tasks import ArithmeticTask


class Doubling(ArithmeticTask):
    name = "doubling"

    @property
    def fingerprint(self):
        return "doubling"  # a careless plug-in: the same whatever its options


MADE = []  # each task made, so a test can count them


def make_task(settings):
    MADE.append(Doubling(max_operand=int(settings.options.get("max_operand", 9))))
    return MADE[-1]
'''


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    """A separate package, installed as pip would leave it: its module and a dist-info that
    declares the entry point."""
    (tmp_path / "doubling_task.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "doubling_task-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: doubling-task\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text("[swarmnode.tasks]\ndoubling = doubling_task:make_task\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert any(d.metadata["Name"] == "doubling-task" for d in distributions())
    yield tmp_path
    sys.modules.pop("doubling_task", None)


def test_a_plug_in_task_is_found_runs_and_enters_the_run_id(plugin_package, tmp_path, make_policy):
    config = load_config(overrides=["task.name=doubling", "task.options.max_operand=5", f"node.run_dir={tmp_path / 'n'}"])
    task = make_task(config.task)
    problem = task.train_problem(0)
    assert task.reward(f"<answer>{problem.answer}</answer>", problem) == 1.0
    assert task.name == "doubling" and "doubling-task==1.2" in task._distribution
    policy = make_policy()
    arithmetic = load_config(overrides=[f"node.run_dir={tmp_path / 'a'}"])
    assert run_id_for(config, task, policy) != run_id_for(arithmetic, make_task(arithmetic.task), policy)
    other = load_config(overrides=["task.name=doubling", "task.options.max_operand=6"])
    assert run_id_for(other, make_task(other.task), policy) != run_id_for(config, task, policy), \
        "its options enter the run id though its own fingerprint ignores them"


def test_the_task_preflight_made_is_the_node_s_own_and_is_made_once(plugin_package, tmp_path, make_policy):
    config = load_config(overrides=["task.name=doubling", f"node.run_dir={tmp_path / 'n'}", "node.checkpoint_every=0"])
    found = preflight(config)
    made = sys.modules["doubling_task"].MADE
    assert len(made) == 1 and found.task.name == "doubling", "preflight makes the plug-in's task"
    hub = InMemoryHub()
    with assemble(config, policy=make_policy(), join=lambda run, standing: hub.join("n", run, standing),
                  task=found.task) as node:
        assert node.task is found.task
    assert len(made) == 1, "the node takes the task preflight made instead of making another"
    assert preflight(load_config(overrides=[f"node.run_dir={tmp_path / 'a'}"])).task is None, \
        "a built-in task is made by the node"


def test_a_plug_in_that_is_not_installed_or_fails_is_a_clear_error(plugin_package):
    with pytest.raises(ConfigError, match="unknown task 'tripling'.*doubling"):
        load_config(overrides=["task.name=tripling"])
    (plugin_package / "doubling_task.py").write_text("def make_task(settings):\n    raise RuntimeError('no data')\n")
    with pytest.raises(PreflightError, match="plug-in 'doubling'.*doubling-task==1.2.*no data"):
        preflight(load_config(overrides=["task.name=doubling"]))


def test_two_nodes_of_one_reasoning_gym_run_train_on_each_other_s_samples(tmp_path, make_policy):
    hub = InMemoryHub()
    nodes = []
    for name, hidden in (("a", 32), ("b", 64)):
        config = load_config(None, [*CHAIN, f"node.run_dir={tmp_path / name}", "rollout.group_size=4",
                                    "rollout.prompts_per_round=3", "rollout.max_new_tokens=8", "node.eval_size=8",
                                    "node.checkpoint_every=0"])
        policy = make_policy(hidden=hidden)
        task = make_task(config.task)
        run = run_id_for(config, task, policy)
        ledger = PeerLedger(config.swarm)
        nodes.append(compose_node(config, policy, HFGenerator(policy, config.rollout), task, run,
                                  hub.join(name, run, ledger), ledger))
    assert nodes[0].run_id == nodes[1].run_id
    for round_ in range(2):
        states = [node.produce(round_) for node in nodes]
        records = [node.consume(round_, state) for node, state in zip(nodes, states)]
        for record in records:
            assert record.peers == 1 and record.rejected == 0 and record.peer_samples > 0


@pytest.mark.slow
def test_two_join_processes_of_one_reasoning_gym_run_exchange_over_hivemind(tmp_path):
    task = {"name": "rg:chain_sum", "options": {"max_terms": 2, "max_digits": 2}}
    kinds = {"a": {"model": {"name": "tiny"}, "task": task, "swarm": {"min_peers": 1}},
             "b": {"model": {"name": "tiny", "lora": {"rank": 8}}, "task": task, "swarm": {"min_peers": 1}}}
    nodes = {name: NodeProcess(tmp_path, name, kind) for name, kind in kinds.items()}
    ensure_tiny(TINY_PRESETS["tiny"])  # built here, not by both processes at once
    try:
        nodes["a"].start([])
        wait_for(lambda: (nodes["a"].dir / "run" / "swarm.json").exists(), 60, "the first node", [nodes["a"]])
        nodes["b"].start(nodes["a"].info["maddrs"])
        live = list(nodes.values())
        wait_for(lambda: all(sum(r["peer_samples"] > 0 for r in n.rounds()) >= 3 for n in live), 180,
                 "three rounds with the other's samples on each node", live)
    finally:
        for node in nodes.values():
            node.stop()
    # batches are found by run id: samples taken at all mean both nodes made one run of the task
    assert all(r["rejected"] == 0 for n in live for r in n.rounds()), "an honest peer of the same run"
