"""Does joining a swarm pay? One heterogeneity setting, alone against together, over seeds.

    python bench/ablation.py                                   # size setting, alone / nois / f-tis, 3 seeds
    python bench/ablation.py --setting expertise --objectives nois f-nois vis f-vis tis f-tis
    python bench/ablation.py --setting swarm4 --objectives f-tis --accounting shared
    python bench/ablation.py --setting size --accounting on-top
    python bench/ablation.py --setting size --match time   # the same modelled GPU time as alone
    python bench/ablation.py --setting swarm5 --match time --lr-scale 0.0625   # where alone still climbs
    python bench/ablation.py --member small model.name=Qwen/Qwen2.5-1.5B --member large model.name=Qwen/Qwen2.5-3B \\
        --set task.name=gsm8k --set task.data=../shared/data/gsm8k --set model.device=cuda --set rollout.max_new_tokens=512

Settings (swarmnode/lab/ablation.py): same (tiny twice, the control), size (tiny + tiny-large),
expertise (tiny + tiny-add, warmed up on addition only), lora (tiny full + tiny LoRA r=16),
swarm4 (all four kinds), family (tiny + tiny-llama: another tokenizer, trained on by span),
swarm5 (swarm4 and tiny-llama: every kind, another family among them).
`--accounting shared`: the batch stays --prompts groups and each of N members generates 1/N
of it (node.own_share = 1/N), and a member generates the part of peers it finds far itself
(the far-peer rules, on by default with a shared batch, under every objective:
node.adapt_share_nats, node.far_reward_lead, node.far_reward_trail) and takes their groups on
top of it (node.far_room top), a stronger peer's groups taken against the member's own mean
reward (loss.peer_baseline lower). For the tables of docs/figures.md before 2026-12-05 set
`f-tis:node.far_room=top-scored` in a condition, before
2026-12-04 `f-tis:node.far_room=own:loss.peer_baseline=group`, before
2026-12-03 the rules to 0 as well (`...:node.adapt_share_nats=0:node.far_reward_lead=0:
node.far_reward_trail=0`); `on-top`: each generates its whole batch, peers' groups come on top.
Alone = each member by itself with its whole batch.

Matching (swarmnode/lab/ablation.py): `--match step` (the default) trains every condition
for --rounds rounds. `--match time` gives each condition the modelled time that --rounds
rounds alone cost, from a stated cost model: generation takes `--gen-share` of a round alone
(0.93: qwen2.5-1.5b.yaml on an H200, 0.87-0.95 over the GPU configs; docs/gpu.md) and grows with the tokens generated, screening
and training take the rest and grow with the samples trained on. A member that generates half
its batch then trains about 1.9x the rounds; it is also evaluated at --rounds on the way, so
both comparisons are printed from one run.

Conditions are objectives, optionally with settings of their own: `--objectives nois f-tis
f-tis:loss.filter_g=5` compares F-TIS at the paper's g = 50 and the authors' g = 5 against the
same alone runs.

The control: unless the setting is `same` itself, or `--no-control`, the `same` setting (two
copies of tiny) runs first with the same conditions, seeds and shape (or is read from an
earlier run's control.json with `--control-from`), and its gains against alone are printed
with a warning wherever one lies outside the 95 % interval around 0 (Student's t over the
seeds: 2.78 SE at 5 seeds, 2.26 at 10). Only the shared, step-matched comparison is judged:
on top or time-matched a copy is worth something, and its gain is the yardstick for the
setting's rows. Where the control is off, the swarm's machinery costs
learning by itself and the setting's gains cannot be read as what heterogeneity did.

Printed: per member and condition, greedy pass@1 on --eval-size held-out problems before and
after, the gain against the same member alone with its standard error paired over seeds, and
the tokens it generated and its modelled time against alone (step-matched; with `--match
time`, a second table at the modelled time of alone; under a table, the seeds a row left out
because a run was never evaluated at its point); whether alone's own runs still climb at the end
(swarmnode/lab/alone_climb.py: where they do not, the swarm can pay only sooner); then the
per-round diagnostics (importance weights,
truncation, filter, divergence, gated share, samples trained on, the peers' reward lead). Written to --out: the curves
against rounds, tokens generated and modelled time (ablation.png) and every round's record
(ablation.json). Above the tables, `SETTING records:` is a digest of every round's record but the
clock's (swarmnode/lab/fingerprint.py): a table re-run on another machine computed the same
runs to the bit where it prints the same digest, and `bench/ablation_diff.py` names the first
round where two tables' runs part.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from swarmnode.lab.ablation import (  # noqa: E402
    ACCOUNTINGS,
    ALONE,
    CONTROL,
    MATCHES,
    SETTINGS,
    AreaGain,
    ConditionRun,
    Member,
    Setting,
    Shape,
    alone_shape,
    area_gains,
    budget_gains,
    by_member,
    control_judged,
    control_mismatch,
    control_warnings,
    diagnostics,
    paired_gains,
    parse_condition,
    pooled_gain,
    rate_scaled,
    run_from_json,
    setting_from_json,
)
from swarmnode.lab.alone_climb import alone_climbs  # noqa: E402
from swarmnode.lab.fingerprint import records_digest  # noqa: E402
from swarmnode.lab.kernels import pinned_path  # noqa: E402
from swarmnode.lab.parallel import (  # noqa: E402
    RunJob,
    code_digest,
    code_line,
    defaults_digest,
    kernels_line,
    recorded,
    run_codes,
    run_jobs,
)
from swarmnode.lab.verdicts import EQUIVALENCE_LEVEL, EQUIVALENCE_MARGIN, NON_INFERIORITY_MARGIN, Verdict  # noqa: E402
from swarmnode.model.tiny import TINY_PRESETS, tiny_path, weights_digest  # noqa: E402
from swarmnode.sizing.cost import GEN_SHARE, CostModel  # noqa: E402


def condition(text: str) -> str:
    """argparse type: an objective, optionally with settings (`f-tis:loss.filter_g=5`)."""
    try:
        parse_condition(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def positive(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def positive_float(text: str) -> float:
    """argparse type: a number above 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="size")
    parser.add_argument("--member", nargs="+", action="append", default=[], metavar="LABEL KEY=VALUE",
                        help="a member instead of the setting's: a label, then its settings (repeat per member)")
    parser.add_argument("--objectives", nargs="+", type=condition, default=["nois", "f-tis"], metavar="CONDITION",
                        help="objectives to train together under, each optionally with settings: OBJECTIVE[:KEY=VALUE...]")
    parser.add_argument("--versus", type=condition, default="nois",
                        help="a condition every other is also compared with, paired by seed (default nois)")
    parser.add_argument("--accounting", choices=ACCOUNTINGS, default="shared")
    parser.add_argument("--match", choices=MATCHES, default=Shape.match,
                        help="step: the same rounds as alone; time: the same modelled time (and step on the way)")
    parser.add_argument("--gen-share", type=float, default=GEN_SHARE,
                        help="the cost model's share of a round alone spent generating (measured 0.87-0.95 on a GPU, docs/gpu.md)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    parser.add_argument("--rounds", type=int, default=Shape.rounds)
    parser.add_argument("--prompts", type=int, default=Shape.prompts_per_round, help="groups in a training batch")
    parser.add_argument("--group", type=int, default=Shape.group_size)
    parser.add_argument("--max-new-tokens", type=int, default=Shape.max_new_tokens)
    parser.add_argument("--eval-size", type=int, default=Shape.eval_size)
    parser.add_argument("--eval-points", type=int, default=Shape.eval_points, help="evaluations during training")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="a setting for every node")
    parser.add_argument("--lr-scale", type=positive_float, default=1.0, metavar="FACTOR",
                        help="every member's learning rate times FACTOR, each from its own (the LoRA member's "
                        "3e-4 too, which a member's own setting keeps from --set train.lr); the control's too")
    parser.add_argument("--jobs", type=positive, default=os.cpu_count() or 1,
                        help="runs at once, each a process on one thread (default: the cores); a run's result "
                        "does not depend on it")
    parser.add_argument("--out", type=Path, default=Path("ablation-out"))
    parser.add_argument("--runs", type=Path, default=None,
                        help="where each run's file is kept (default: --out/runs); tables that share it share "
                        "their members' alone runs and resume from what it holds")
    parser.add_argument("--no-control", action="store_true", help="skip the `same` control run")
    parser.add_argument("--control-from", type=Path, nargs="+", default=None,
                        help="control.json (or a `same` ablation.json) of earlier runs of the same shape: no control run")
    parser.add_argument("--from", dest="saved", type=Path, nargs="+", default=None,
                        help="ablation.json files of earlier runs of one setting and accounting (e.g. other seeds): "
                        "print their tables and redraw the curves together, train nothing")
    return parser.parse_args()


def chosen_setting(args: argparse.Namespace) -> Setting:
    if not args.member:
        return SETTINGS[args.setting]
    members = tuple(Member(spec[0], tuple(spec[1:])) for spec in args.member)
    return Setting("custom", "members given on the command line", members)


def print_gains(setting: Setting, args: argparse.Namespace, runs: list[ConditionRun]) -> None:
    print(f"\nsetting {setting.name}: {setting.about}")
    cost = CostModel(args.gen_share)
    print(f"accounting {args.accounting}, {args.rounds} rounds of {args.prompts} prompts x {args.group} a member, "
          f"up to {args.seeds} seed(s), greedy pass@1 on {args.eval_size} held-out problems; gain = after - after "
          f"alone, SE paired over seeds; modelled time: generation {cost.gen_share:.0%} of a round alone, growing "
          f"with the tokens generated, the rest with the samples trained on (a model, not a measurement)")
    for match in ("step", "time") if args.match == "time" else ("step",):
        print("\nstep-matched: after the same rounds as alone" if match == "step" else
              "\ntime-matched: after the modelled time of alone's rounds")
        gains = paired_gains(runs, match=match, cost=cost)
        versus = getattr(args, "versus", "nois")
        against_nois = {(g.label, g.condition): g for g in paired_gains(runs, baseline=versus, match=match, cost=cost)}
        print(f"{'member':<12} {'condition':<22} {'seeds':>5} {'before':>7} {'after':>7} {'gain vs alone':>16} "
              f"{'95% lower':>9} {'verdict':>13} {'tokens vs alone':>16} {'time vs alone':>14}"
              + (f" {'vs ' + versus:>16} {'verdict':>13}" if against_nois else ""))
        for gain in sorted(gains, key=lambda g: ([m.label for m in setting.members].index(g.label), g.condition != ALONE)):
            if not gain.seeds:
                print(f"{gain.label:<12} {gain.condition:<22} {0:>5} no seed evaluated at this point")
                continue
            cell = "" if gain.condition == ALONE else f"{gain.gain:+.3f} ({gain.se:.3f})"
            lower = "" if gain.condition == ALONE else f"{gain.verdict.lower:+.3f}"
            word = "" if gain.condition == ALONE else gain.verdict.word()
            nois = against_nois.get((gain.label, gain.condition))
            shown = nois is not None and nois.seeds > 0 and gain.condition not in (ALONE, versus)
            other = f"{nois.gain:+.3f} ({nois.se:.3f}) {nois.verdict.word():>13}" if shown else ""
            print(f"{gain.label:<12} {gain.condition:<22} {gain.seeds:>5} {gain.before:>7.3f} {gain.after:>7.3f} "
                  f"{cell:>16} {lower:>9} {word:>13} {gain.tokens_share:>15.2f}x {gain.time_share:>13.2f}x {other:>30}")
        for gain in gains:
            if gain.unevaluated:
                print(f"  {gain.label} {gain.condition}: {gain.unevaluated} seed(s) left out, never evaluated at "
                      + ("alone's round count (their runs spent alone's modelled time before it)" if match == "step"
                         else "the end of the run"))
    print(f"verdicts (Student's t over the seeds, paired): ahead = the one-sided 95 % lower bound of the gain is "
          f"above 0; non-inferior = it is at least -{NON_INFERIORITY_MARGIN}; not shown = neither")
    if args.match == "time" and setting.name != CONTROL:  # the control's come with print_control
        print_budgets(runs)
        print_areas(area_gains(runs))


def print_areas(areas: list[AreaGain], title: str = "budget gain") -> None:
    """Each time-matched member's gain averaged over alone's evaluation points, with its verdict:
    whether joining pays sooner, in one number a seed."""
    if not areas:
        return
    print(f"\n{title}: mean over alone's evaluation points of the gain at the same modelled time (the area "
          "between the curves against time), SE paired over seeds")
    print(f"{'member':<12} {'condition':<22} {'seeds':>5} {'points':>6} {'budget gain':>16} {'95% lower':>9} {'verdict':>13}")
    for area in areas:
        v = area.verdict
        print(f"{area.label:<12} {area.condition:<22} {v.seeds:>5} {area.budgets:>6} {f'{v.mean:+.3f} ({v.se:.3f})':>16} "
              f"{v.lower:>+9.3f} {v.word():>13}")


def print_budgets(runs: list[ConditionRun], title: str = "time-matched at every budget") -> None:
    """Time-matched gains at each of alone's evaluation points: early, more rounds are worth
    most; near a plateau, nothing."""
    gains = budget_gains(runs)
    if not gains:
        return
    budgets = sorted({g.alone_rounds for g in gains})
    print(f"\n{title}: gain against alone (SE) after the modelled time of N rounds alone "
          "(in brackets: the rounds the condition trained in that time)")
    spent = {g.alone_rounds: g.rounds for g in gains}
    print(f"{'member':<12} {'condition':<22}" + "".join(f"{f'{b} ({spent[b]})':>17}" for b in budgets))
    rows: dict[tuple[str, str], dict[int, str]] = {}
    for g in gains:
        rows.setdefault((g.label, g.condition), {})[g.alone_rounds] = f"{g.gain:+.3f} ({g.se:.3f})"
    for (label, condition), cells in rows.items():
        print(f"{label:<12} {condition:<22}" + "".join(f"{cells.get(b, '-'):>17}" for b in budgets))


def print_pooled(what: str, pooled: Verdict | None, note: str = "") -> None:
    """One pooled control line: the mean (SE), its 90 % interval and whether that lies inside the margin."""
    if pooled is not None:
        low, high = pooled.interval
        word = "equivalent" if pooled.equivalent else "equivalence not shown"
        print(f"  {'pooled':<12} {what} {pooled.mean:+.3f} ({pooled.se:.3f}), {pooled.seeds} seed(s), "
              f"[{low:+.3f}, {high:+.3f}]: {word}{note}")


def control_about(runs: list[ConditionRun]) -> str:
    """What the control's runs are: the `same` setting's words only where its members ran, so a
    control of other copies (`--control-from` a custom table) is not printed as copies of tiny."""
    labels = [m.label for m in runs[0].members]
    if labels == [m.label for m in SETTINGS[CONTROL].members]:
        return f"{CONTROL}: {SETTINGS[CONTROL].about}"
    return f"{', '.join(labels)}, read as copies of one model"


def print_control(runs: list[ConditionRun], args: argparse.Namespace) -> None:
    """The `same` setting's gains against alone, and a warning for each that is off."""
    cost = CostModel(args.gen_share)
    for match in ("step", "time") if args.match == "time" else ("step",):
        gains = [g for g in paired_gains(runs, match=match, cost=cost) if g.condition != ALONE]
        print(f"\ncontrol ({control_about(runs)}), {match}-matched: gain against alone (SE), "
              f"its {EQUIVALENCE_LEVEL:.0%} interval and whether that lies inside +-{EQUIVALENCE_MARGIN}")
        for gain in gains:
            if not gain.seeds:
                print(f"  {gain.label:<12} {gain.condition:<22} no seed evaluated at this point")
                continue
            low, high = gain.verdict.interval
            word = "equivalent" if gain.verdict.equivalent else "equivalence not shown"
            print(f"  {gain.label:<12} {gain.condition:<22} {gain.gain:+.3f} ({gain.se:.3f}), {gain.seeds} seed(s), "
                  f"[{low:+.3f}, {high:+.3f}]: {word}")
        for condition in dict.fromkeys(g.condition for g in gains):
            print_pooled(f"{condition:<22}", pooled_gain(runs, condition, match),
                         " (the members are one model: their rows, averaged per seed)")
        if args.versus in {g.condition for g in gains}:  # a lever against what it changes: judged against 0
            for condition in dict.fromkeys(g.condition for g in gains if g.condition != args.versus):
                print_pooled(f"{condition:<22} vs {args.versus}:", pooled_gain(runs, condition, match, baseline=args.versus))
        if not control_judged(args.accounting, match):
            print("  not judged against 0: here a copy brings more samples a step or more rounds, and what it is "
                  "worth is the yardstick for the setting's rows")
            continue
        warnings = control_warnings(gains)
        for line in warnings:
            print(f"WARNING: {line}")
        if not warnings:
            judged = all(g.seeds > 1 for g in gains)
            print("  control holds: every gain inside the 95 % interval around 0 (Student's t over the seeds)" if judged
                  else "  fewer than two seeds evaluated for a row: the control cannot be judged")
    if args.match == "time":
        print_budgets(runs, f"control ({CONTROL}), time-matched at every budget")
        print_areas(area_gains(runs), f"control ({CONTROL}), budget gain")


def print_alone_climb(runs: list[ConditionRun], rounds: int) -> None:
    """Whether this table's own alone runs still climb at the end: where they do not, the swarm
    can pay only sooner, whatever it is worth."""
    print(f"\nalone, still climbing at the end? per seed, at 0, {rounds / 2:g} and {rounds} rounds (half-way read "
          "between the evaluations around it); qualifies = a gain shown and its last half beyond a third of it")
    print(f"{'member':<12} {'seeds':>5} {'gain':>16} {'last half':>16} {'95% lower':>10} {'beyond a third':>16} "
          f"{'95% lower':>10}  verdict")
    for climb in alone_climbs(runs, rounds):
        said = ("qualifies" if climb.qualifies else "still rising" if climb.last_half.ahead
                else "not shown rising")
        print(f"{climb.label:<12} {climb.gain.seeds:>5} {climb.gain.mean:>+8.3f} ({climb.gain.se:.3f}) "
              f"{climb.last_half.mean:>+8.3f} ({climb.last_half.se:.3f}) {climb.last_half.lower:>+10.3f} "
              f"{climb.beyond_third.mean:>+8.3f} ({climb.beyond_third.se:.3f}) {climb.beyond_third.lower:>+10.3f}  {said}")


def print_diagnostics(runs: list[ConditionRun]) -> None:
    print("\nper-round diagnostics, mean over rounds and seeds (weight max: the largest seen; lead: the median of "
          "the running reward lead of the peers' samples trained on, as node.far_reward_lead keeps it)")
    print(f"{'member':<12} {'condition':<22} {'weight':>7} {'max':>8} {'trunc':>7} {'filtered':>9} "
          f"{'diverg.':>8} {'unlikely':>9} {'gated':>7} {'own/round':>10} {'peers/round':>12} {'lead':>7}")
    for (condition, label), row in diagnostics(runs).items():
        print(f"{label:<12} {condition:<22} {row['weight_mean']:>7.3f} {row['weight_max']:>8.2f} "
              f"{row['truncated_frac']:>7.1%} {row['filtered_frac']:>9.1%} {row['divergence_mean']:>8.3f} "
              f"{row['below_bar_frac']:>9.1%} {row['gated_frac']:>7.1%} {row['own_samples']:>10.0f} {row['peer_samples']:>12.0f} "
              f"{row['reward_lead']:>+7.3f}")


def plot(runs: list[ConditionRun], path: Path, title: str, cost: CostModel) -> None:
    """Per member (a row): accuracy against rounds, against tokens it generated and against
    modelled time (in rounds of itself alone), one line per condition (alone dashed), mean
    over seeds."""
    labels = [m.label for m in runs[0].members]
    conditions = list(dict.fromkeys(r.condition for r in runs))
    alone = {(r.seed, m.label): m for r in runs if r.condition == ALONE for m in r.members}
    fig, axes = plt.subplots(len(labels), 3, figsize=(15, 3.2 * len(labels)), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    grouped = by_member(runs)
    for row, label in enumerate(labels):
        by_round, by_tokens, by_time = axes[row]
        for index, condition in enumerate(conditions):
            seeded = grouped[(condition, label)]
            points = list(zip(*(member.curve for _, member in seeded)))  # per evaluation point, one per seed
            rounds = [p[0][0] for p in points]
            tokens = [sum(q[1] for q in p) / len(p) for p in points]
            accuracy = [sum(q[2] for q in p) / len(p) for p in points]
            style = {"linestyle": "--", "color": "black"} if condition == ALONE else {
                "color": colours[index % len(colours)]}
            by_round.plot(rounds, accuracy, marker="o", markersize=3, label=condition, **style)
            by_tokens.plot(tokens, accuracy, marker="o", markersize=3, label=condition, **style)
            if all((seed, label) in alone for seed, _ in seeded):
                times = [sum(member.modelled_time(alone[(seed, label)], cost, done) for seed, member in seeded) / len(seeded)
                         for done in rounds]
                by_time.plot(times, accuracy, marker="o", markersize=3, label=condition, **style)
        by_round.set_title(f"{label}: against rounds", fontsize=9)
        by_tokens.set_title(f"{label}: against completion tokens it generated", fontsize=9)
        by_time.set_title(f"{label}: against modelled time (generation {cost.gen_share:.0%} of a round alone)", fontsize=9)
        for axis in (by_round, by_tokens, by_time):
            axis.set_ylabel("held-out pass@1")
            axis.grid(alpha=0.3)
        by_tokens.legend(fontsize=7)
    axes[-1][0].set_xlabel("rounds")
    axes[-1][1].set_xlabel("tokens")
    axes[-1][2].set_xlabel("rounds of itself alone")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def load_saved(paths: list[Path]) -> tuple[Setting, argparse.Namespace, list[ConditionRun]]:
    """Earlier runs' setting, shape (as the arguments they were run with) and records; the
    files must share setting, accounting and shape."""
    files = [json.loads(path.read_text()) for path in paths]
    saved = files[0]
    for other, path in zip(files[1:], paths[1:]):
        if (other["setting"], other["accounting"], other["shape"]) != (saved["setting"], saved["accounting"], saved["shape"]):
            raise SystemExit(f"{path} is another setting, accounting or shape than {paths[0]}")
    setting = setting_from_json(saved["setting"])
    seeds = [r["seed"] for f in files for r in f["runs"] if r["condition"] == ALONE]
    if len(seeds) != len(set(seeds)):
        raise SystemExit("the files repeat a seed: give each seed once (--first-seed when running)")
    shape = saved["shape"]
    runs = [run_from_json(r) for f in files for r in f["runs"]]
    args = argparse.Namespace(accounting=saved["accounting"], rounds=shape["rounds"], prompts=shape["prompts_per_round"],
                              group=shape["group_size"], eval_size=shape["eval_size"],
                              match=shape.get("match", Shape.match), gen_share=shape.get("gen_share", GEN_SHARE),
                              seeds=len({r.seed for r in runs}))
    return setting, args, runs


def preset_digests(setting: Setting, shape: Shape) -> tuple[tuple[str, str], ...]:
    """(preset, sha256 of its weights) of every tiny preset the setting's members start from:
    a figure compares with another only where both ran on the same weights."""
    names = {"tiny"}
    for member in setting.members:
        for override in (*shape.overrides, *member.overrides):
            key, _, value = override.partition("=")
            if key == "model.name":
                names.add(value)
    return tuple((name, weights_digest(tiny_path(TINY_PRESETS[name]))) for name in sorted(names & TINY_PRESETS.keys()))


def alone_setting(member: Member) -> Setting:
    """A member by itself: its alone run is the same in every setting it belongs to (its name,
    hence its prompts, and its settings make it), so one run file serves them all."""
    return Setting(f"alone-{member.label}", "one member, alone", (member,))


def train(setting: Setting, conditions: list[str], args: argparse.Namespace, shape: Shape) -> list[ConditionRun]:
    """Every condition of the setting for every seed, `--jobs` runs at a time in processes of their
    own (on the pinned kernels), each kept in --runs so a stopped table resumes; alone is run per
    member, so settings that share a member share its alone runs (and tables at every
    `--gen-share` do: `alone_shape`)."""
    presets = preset_digests(setting, shape)
    print(f"{setting.name}: presets " + ", ".join(f"{name} {digest[:16]}" for name, digest in presets)
          + f"; defaults {defaults_digest()[:16]}", flush=True)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    alone = [RunJob(alone_setting(m), ALONE, args.accounting, seed, alone_shape(shape), preset_digests(alone_setting(m), shape))
             for seed in seeds for m in setting.members] if ALONE in conditions else []
    together = [RunJob(setting, name, args.accounting, seed, shape, presets)
                for seed in seeds for name in conditions if name != ALONE]
    directory = args.runs or args.out / "runs"
    runs = run_jobs(alone + together, directory, args.jobs, progress=lambda line: print(line, flush=True))
    print(code_line(run_codes(alone + together, directory), code_digest()), flush=True)
    mixed_paths = kernels_line(recorded(alone + together, directory, "kernels"), pinned_path())
    if mixed_paths:
        print(mixed_paths, flush=True)
    members = len(setting.members)
    merged = [ConditionRun(ALONE, args.accounting, seed, [run.members[0] for run in runs[i * members:(i + 1) * members]])
              for i, seed in enumerate(seeds)] if alone else []
    table = merged + runs[len(alone):]
    print(f"{setting.name} records: {records_digest([asdict(run) for run in table])} (every run's rounds but the "
          "clock's; equal on another machine, equal runs)", flush=True)
    return table


def save(path: Path, setting: Setting, accounting: str, shape: Shape, runs: list[ConditionRun]) -> None:
    records = [asdict(r) for r in runs]
    path.write_text(json.dumps({"setting": asdict(setting), "accounting": accounting, "shape": asdict(shape),
                                "presets": dict(preset_digests(setting, shape)), "defaults": defaults_digest(),
                                "kernels": pinned_path(), "records": records_digest(records),
                                "runs": records}, indent=1))


def control_runs(setting: Setting, conditions: list[str], args: argparse.Namespace, shape: Shape) -> list[ConditionRun]:
    """The `same` setting's runs to judge this one by: its own, read from files, or trained now."""
    if setting.name == CONTROL or args.no_control:
        return []
    if args.control_from:
        control_setting, control_args, runs = load_saved(args.control_from)
        if control_setting.name != CONTROL:
            raise SystemExit(f"{args.control_from[0]} is a run of setting {control_setting.name}, not {CONTROL}")
        differ = control_mismatch(json.loads(args.control_from[0].read_text()),
                                  rate_scaled(SETTINGS[CONTROL], shape, args.lr_scale), args.accounting, shape,
                                  defaults_digest())
        if differ:
            raise SystemExit(f"{args.control_from[0]} is not this table's control; it differs in: " + "; ".join(differ)
                             + ". Run the control with these arguments (leave out --control-from), or read one that matches.")
        return runs
    control = rate_scaled(SETTINGS[CONTROL], shape, args.lr_scale)
    runs = train(control, conditions, args, shape)
    save(args.out / "control.json", control, args.accounting, shape, runs)
    print_control(runs, args)  # now, so a broken control is seen before the setting's hour of training
    return runs


def main() -> None:
    args = parse_args()
    if args.saved is not None:
        setting, saved_args, runs = load_saved(args.saved)
        saved_args.versus = args.versus  # not in the files: what a lever is judged against is asked here
        print(f"{setting.name} records: {records_digest([asdict(run) for run in runs])}", flush=True)
        print_gains(setting, saved_args, runs)
        print_alone_climb(runs, saved_args.rounds)
        print_diagnostics(runs)
        if setting.name == CONTROL:
            print_control(runs, saved_args)
        elif args.control_from:
            print_control(load_saved(args.control_from)[2], saved_args)
        args.out.mkdir(parents=True, exist_ok=True)
        plot(runs, args.out / "ablation.png", f"{setting.name}, {saved_args.accounting}, {saved_args.seeds} seed(s)",
             CostModel(saved_args.gen_share))
        print(f"\ncurves: {args.out / 'ablation.png'}")
        return
    shape = Shape(args.rounds, args.prompts, args.group, args.max_new_tokens, args.eval_size, args.eval_points,
                  tuple(args.overrides), args.match, args.gen_share)
    setting = rate_scaled(chosen_setting(args), shape, args.lr_scale)
    conditions = [ALONE, *args.objectives]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(f"runs on: {pinned_path()}", flush=True)
    control = control_runs(setting, conditions, args, shape)
    runs = train(setting, conditions, args, shape)
    save(args.out / "ablation.json", setting, args.accounting, shape, runs)  # first: a failure below loses no run
    print_gains(setting, args, runs)
    print_alone_climb(runs, args.rounds)
    print_diagnostics(runs)
    if setting.name == CONTROL or control:
        print_control(runs if setting.name == CONTROL else control, args)
    else:
        print("\nno control run (--no-control): the gains above are not checked against two copies of one model")
    plot(runs, args.out / "ablation.png", f"{setting.name}, {args.accounting}, {args.seeds} seed(s)",
         CostModel(args.gen_share))
    print(f"\ncurves: {args.out / 'ablation.png'}, records: {args.out / 'ablation.json'}; "
          f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
