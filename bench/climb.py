"""Is training alone still climbing when a run ends? Alone's curve for candidate bench shapes.

    python bench/climb.py                          # every candidate, 100 rounds, seeds 0-2
    python bench/climb.py --only default prompts-4 --rounds 200 --seeds 10

A swarm that buys a member more rounds in the same modelled time can pay at the end of a run
only where alone has not levelled off by then. A shape qualifies when alone's last half adds at
least a third of its gain over the run, shown over the seeds: per seed, what the last half adds
beyond a third of the whole gain, its one-sided 95 % lower bound above 0 (Student's t), with
the whole gain shown above 0 as well (swarmnode/lab/verdicts.climbing_by_a_third). Beside it, whether the last half adds anything shown
above 0 (still_rising): room alone left at the end, however little. Ten seeds' mean curve qualified `prompts-4` at 44 %
where twenty seeds of two names in bench/ablation.py read 7-26 %. Each candidate is
a tiny preset (a shipped one, or one built here from a spec, cached) and settings; each seed runs
alone in a child process on the pinned kernels (swarmnode/lab/kernels.py), `--jobs` of them side
by side, one thread each, and the candidate prints its curve, the mean over seeds (greedy pass@1
on --eval-size held-out problems at ten points): one seed's curve wanders by several points
(tiny: 7 % or 42 % of its gain in the last half, by its prompts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from swarmnode.lab.ablation import ALONE, Member, Setting, Shape, run_condition
from swarmnode.lab.kernels import pinned_env, pinned_path
from swarmnode.lab.verdicts import climbing_by_a_third, still_climbing, still_rising
from swarmnode.model.tiny import TINY_PRESETS, TINY_SPEC, ensure_tiny, weights_digest
from swarmnode.settings.presets import TINY_CPU

CHAIN = ("model.name=tiny-chain", "task.name=rg:chain_sum", "task.options.max_terms=2", "task.options.max_digits=2")
# label -> (preset spec overrides, None for the shipped preset named in the settings; settings)
CANDIDATES: dict[str, tuple[dict | None, tuple[str, ...]]] = {
    "default": (None, ()),
    "operands-199": (None, ("task.max_operand=199",)),
    "operands-999": (None, ("task.max_operand=999",)),
    "times-too": (None, ("task.operations=+-*",)),
    "lr-quarter": (None, ("train.lr=2.5e-5",)),
    # smaller still, towards a real model's 1e-6: the steps, not the samples, may then be the limit
    "lr-eighth": (None, ("train.lr=1.25e-5",)),
    "lr-sixteenth": (None, ("train.lr=6.25e-6",)),
    "lr-32nd": (None, ("train.lr=3.125e-6",)),
    # a sixteenth with more room: the larger model, or tiny warmed up less (a lower start)
    "large-lr-sixteenth": (None, ("model.name=tiny-large", "train.lr=6.25e-6")),
    "warm-300-lr-sixteenth": ({"warmup_steps": 300}, ("train.lr=6.25e-6",)),
    # a lower start, where a group's rare right answer makes the step small: an RL curve that
    # speeds up as it rises (warm-300 at the full rate fell, at a sixteenth it barely moved)
    "warm-300-lr-quarter": ({"warmup_steps": 300}, ("train.lr=2.5e-5",)),
    "warm-400": ({"warmup_steps": 400}, ()),
    "warm-400-lr-quarter": ({"warmup_steps": 400}, ("train.lr=2.5e-5",)),
    "warm-400-lr-eighth": ({"warmup_steps": 400}, ("train.lr=1.25e-5",)),
    "lr-64th": (None, ("train.lr=1.5625e-6",)),
    "large": (None, ("model.name=tiny-large",)),
    "warm-300": ({"warmup_steps": 300}, ()),
    "warm-199": ({"warmup_max_operand": 199}, ("task.max_operand=199",)),
    "warm-999": ({"warmup_max_operand": 999}, ("task.max_operand=999",)),
    "large-warm-199": ({**TINY_PRESETS["tiny-large"], "warmup_max_operand": 199}, ("task.max_operand=199",)),
    # fewer prompts a round: the step size does not limit tiny (lr-quarter), so the samples may
    "prompts-4": (None, ("rollout.prompts_per_round=4",)),
    "prompts-8": (None, ("rollout.prompts_per_round=8",)),
    # a reasoning-gym task at its own rate and at twice and half it: room that a node alone could
    # not take by raising its rate (a slower rate's room it could: docs/figures.md)
    "chain": (None, CHAIN),
    "chain-lr-double": (None, (*CHAIN, "train.lr=2e-4")),
    "chain-lr-half": (None, (*CHAIN, "train.lr=5e-5")),
    # the arithmetic task at twice the rate: is tiny's 1e-4 its best rate at 100 rounds?
    "lr-double": (None, ("train.lr=2e-4",)),
    # operands to 199 at twice and half its rate: is its slow late rise (a sixth of its gain,
    # docs/figures.md) room a node alone could take by raising its rate?
    "operands-199-lr-double": (None, ("task.max_operand=199", "train.lr=2e-4")),
    "operands-199-lr-half": (None, ("task.max_operand=199", "train.lr=5e-5")),
    # the chain task at four times its rate: twice it put more of the same gain late
    "chain-lr-quadruple": (None, (*CHAIN, "train.lr=4e-4")),
    # the larger model on operands to 199: is there room at the end for another size to fill?
    "large-operands-199": (None, ("model.name=tiny-large", "task.max_operand=199")),
    "large-operands-199-lr-half": (None, ("model.name=tiny-large", "task.max_operand=199", "train.lr=5e-5")),
    "large-operands-199-lr-double": (None, ("model.name=tiny-large", "task.max_operand=199", "train.lr=2e-4")),
    "large-operands-199-lr-quarter": (None, ("model.name=tiny-large", "task.max_operand=199", "train.lr=2.5e-5")),
    # the LoRA member (rank 16 at 3e-4, as bench/ablation.py's) on operands to 199, where its own alone runs
    # there climb by a third: at its rate and twice it, is that room it could take by raising its rate?
    "lora-operands-199": (None, ("model.lora.rank=16", "train.lr=3e-4", "task.max_operand=199")),
    "lora-operands-199-lr-double": (None, ("model.lora.rank=16", "train.lr=6e-4", "task.max_operand=199")),
    # between 199 (tiny still rising, short of a third) and 999 (nothing learnt): is there a width
    # where tiny itself climbs late, so that target 3 can judge tiny beside another size?
    "operands-299": (None, ("task.max_operand=299",)),
    "operands-499": (None, ("task.max_operand=499",)),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(CANDIDATES), default=list(CANDIDATES))
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3, help="the verdict reads the mean curve over these seeds")
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=1, help="seeds run side by side, one thread each (the figures do "
                        "not change; with more jobs than cores the wall time does not fall)")
    parser.add_argument("--one", nargs=2, metavar=("LABEL", "SEED"), help=argparse.SUPPRESS)  # a child's job
    return parser.parse_args()


def member_of(label: str) -> Member:
    """The candidate's member: a built preset's directory as its model where it has a spec."""
    spec, settings = CANDIDATES[label]
    if spec is None:
        return Member(label, settings)
    path = preset_of(label)
    # a directory is no preset name, so the tiny preset's settings come along explicitly
    preset = [f"{section}.{key}={json.dumps(value)}" for section, values in TINY_CPU.items() if section not in ("model", "node")
              for key, value in values.items()]
    return Member(label, (f"model.name={path}", *preset, *settings))


def run_one(label: str, seed: int, args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    shape = Shape(rounds=args.rounds, eval_size=args.eval_size, eval_points=9)
    run = run_condition(Setting(label, "alone", (member_of(label),)), ALONE, "shared", seed, shape)
    member = run.members[0]
    return {"curve": [(done, acc) for done, _, acc in member.curve], "before": member.before, "after": member.after,
            "half": member.accuracy_at(args.rounds // 2)}


def preset_of(label: str) -> Path:
    """The candidate's preset directory, built here first where it has a spec (once, not per child)."""
    spec, settings = CANDIDATES[label]
    if spec is not None:
        return ensure_tiny({**TINY_SPEC, **spec})
    named = [setting.split("=", 1)[1] for setting in settings if setting.startswith("model.name=")]
    return ensure_tiny(TINY_PRESETS[named[-1] if named else TINY_CPU["model"]["name"]])


def run_child(label: str, seed: int, args: argparse.Namespace) -> dict | None:
    """One seed alone, in a child on the pinned kernels; None (and its error printed) where it failed."""
    child = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", label, str(seed),
                            "--rounds", str(args.rounds), "--eval-size", str(args.eval_size)],
                           env=pinned_env(), capture_output=True, text=True, check=False)
    if child.returncode != 0:
        print(f"{label} seed {seed}: failed\n{child.stderr[-1500:]}", flush=True)
        return None
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args)))
        return
    print(f"alone, {args.rounds} rounds of 16 prompts x 8 (unless the candidate sets fewer), greedy pass@1 on "
          f"{args.eval_size} held-out problems; qualifies: what the last half adds beyond a third of the gain, "
          f"paired over seeds, has its one-sided 95 % lower bound above 0 (Student's t); kernels {pinned_path()}",
          flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for label in args.only:
            digest = weights_digest(preset_of(label))[:16]
            found = [run for run in pool.map(lambda seed, label=label: run_child(label, seed, args), range(args.seeds))
                     if run is not None]
            if found:
                print_curve(f"{label} (preset {digest})", found)


def print_curve(label: str, found: list[dict]) -> None:
    """The mean curve over seeds and its verdict: one seed's curve wanders by several points."""
    points = [done for done, _ in found[0]["curve"]]
    mean = [statistics.mean(dict(run["curve"])[done] for run in found) for done in points]
    befores, halves, afters = ([run[key] for run in found] for key in ("before", "half", "after"))
    beyond, rising = still_climbing(befores, halves, afters), still_rising(halves, afters)
    gain = statistics.mean(afters) - statistics.mean(befores)
    share = rising.mean / gain if gain > 0 else float("nan")
    curve = " ".join(f"{done}:{acc:.2f}" for done, acc in zip(points, mean))
    said = ("qualifies" if climbing_by_a_third(befores, halves, afters)
            else "not shown" if not beyond.ahead else "no gain shown over the run, so it does not qualify")
    print(f"{label:<40} {len(found)} seed(s): {curve} | gain {gain:+.3f}, last half {rising.mean:+.3f} "
          f"({rising.se:.3f}, {share:.0%} of the gain), 95 % lower {rising.lower:+.3f}: "
          f"{'still rising' if rising.ahead else 'not shown rising'}; beyond a third of the gain "
          f"{beyond.mean:+.3f} ({beyond.se:.3f}), 95 % lower {beyond.lower:+.3f}: {said}", flush=True)


if __name__ == "__main__":
    main()
