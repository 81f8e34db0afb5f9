"""Does joining a swarm pay? Nodes trained alone and together, like for like, over seeds.

A *setting* names the swarm's members (models that differ in size, expertise or trainable
parameters). Each *condition* trains every member for the same rounds: `alone` (its own
full batch), or together with the others under one objective (nois, f-tis, ...). Two ways to
account for a swarm (node.own_share):

- `shared`: the batch stays `prompts_per_round` groups; each of N members generates 1/N of it
  and peers' groups fill the rest (the paper's vertical setup): as good for 1/N the generation?
- `on-top`: each member generates its whole batch and peers' groups come on top.

Two ways to match a condition to alone: `step`, the same number of rounds (today's
comparison), and `time`, the same modelled volunteer time (`CostModel`): on a GPU generation
is most of a round, so a member that generates 1/N of its batch runs more rounds in the time
alone needs for its own. A time-matched run trains the rounds its accounting fits in that
budget (`matched_rounds`) and is evaluated at the step-matched round on the way. A member
whose share of the batch adapts (node.adapt_share_nats) costs what its share makes of each
round, so it is priced as it runs (`BudgetClock`), evaluated where it has spent each of alone's
budgets, and trains until it has spent alone's whole run.

A condition may carry settings of its own after its objective, `f-tis:loss.filter_g=5`
(several joined by `:`), so variants of one objective are compared against the same alone.

The setting `same` (two copies of one model) is the control: together they should learn as
well as one alone. `control_warnings` names every condition where they do not, outside the
95 % interval of Student's t over the seeds; then the swarm's machinery (screening, bookkeeping) costs learning by
itself, and no other setting's gain can be read as what heterogeneity did.

Members run in one process through the in-memory exchange, stepped together round by round, so
a run is deterministic in its inputs (seed, names) and costs no network. A member keeps its
name across conditions, hence its prompts: alone and together see the same own prompts, and a
gain is paired by seed (standard error over seeds).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from scipy.stats import t as student_t

from swarmnode.assemble import assemble
from swarmnode.lab.verdicts import Verdict, verdict
from swarmnode.loop.node import Node
from swarmnode.loop.share import smoothed
from swarmnode.ops.lines import RoundRecord
from swarmnode.protocol.batches import batch_split
from swarmnode.settings.config import Config, load_config
from swarmnode.settings.registry import OBJECTIVES
from swarmnode.sizing.cost import GEN_SHARE, CostModel
from swarmnode.swarm.local import InMemoryHub

ALONE = "alone"
CONTROL = "same"
CONTROL_CONFIDENCE = 0.95  # a control gain outside this two-sided interval around 0 voids the rest
ACCOUNTINGS = ("shared", "on-top")
MATCHES = ("step", "time")
MAX_ROUNDS_FACTOR = 2  # a time-matched run whose cost varies stops at this many times its planned rounds
DIAGNOSTICS = ("weight_mean", "weight_max", "truncated_frac", "filtered_frac", "divergence_mean")


@dataclass(frozen=True)
class Member:
    """One node of a setting: a label for tables and the settings that make it what it is."""

    label: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Setting:
    name: str
    about: str
    members: tuple[Member, ...]


TINY = Member("tiny")
LARGE = Member("tiny-large", ("model.name=tiny-large",))
ADD = Member("tiny-add", ("model.name=tiny-add",))
LORA = Member("tiny-lora", ("model.lora.rank=16", "train.lr=3e-4"))
LLAMA = Member("tiny-llama", ("model.name=tiny-llama",))

SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("same", "two copies of tiny: on-policy up to sampling noise (the control)", (TINY, Member("tiny-b"))),
        Setting("size", "tiny next to tiny-large (3.2x the parameters, another warm-up)", (TINY, LARGE)),
        Setting("expertise", "tiny next to tiny-add (tiny's shape, warmed up on addition only)", (TINY, ADD)),
        Setting("lora", "tiny full fine-tuning next to tiny with LoRA r=16", (TINY, LORA)),
        Setting("swarm4", "tiny, tiny-large, tiny-add and tiny LoRA together", (TINY, LARGE, ADD, LORA)),
        Setting("family", "tiny next to tiny-llama (another tokenizer and architecture: trained on by span)", (TINY, LLAMA)),
        Setting("swarm5", "swarm4 with tiny-llama: every kind, another family among them", (TINY, LARGE, ADD, LORA, LLAMA)),
    )
}


@dataclass(frozen=True)
class Shape:
    """What every run of an ablation shares."""

    rounds: int = 200
    prompts_per_round: int = 16
    group_size: int = 8
    max_new_tokens: int = 10
    eval_size: int = 500
    eval_points: int = 4  # evaluations during training, for the curves (besides before and after)
    overrides: tuple[str, ...] = ()
    match: str = "step"  # "time": together trains the rounds that fit alone's modelled time
    gen_share: float = GEN_SHARE  # the cost model's generation share of a round alone


@dataclass
class MemberRun:
    """One member's run under one condition and seed."""

    label: str
    before: float
    after: float
    curve: list[tuple[int, int, float]] = field(default_factory=list)  # (rounds done, tokens generated, accuracy)
    rounds: list[RoundRecord] = field(default_factory=list)  # per-round records, as in metrics.jsonl
    time_matched_at: int | None = None  # the round its modelled time equals alone's (--match time)
    budget_rounds: dict[int, int] = field(default_factory=dict)  # alone's rounds -> the round it spent their time, priced as it ran

    @property
    def tokens_generated(self) -> int:
        return sum(r.wire_tokens for r in self.rounds)

    def accuracy_at(self, rounds: int) -> float:
        """Accuracy after `rounds` rounds: the curve's point there, the final one when the run
        ended there, else nan (never evaluated there)."""
        found = next((acc for done, _, acc in self.curve if done == rounds), None)
        if found is not None:
            return found
        return self.after if rounds == len(self.rounds) else math.nan

    def modelled_time(self, alone: MemberRun, cost: CostModel, rounds: int | None = None) -> float:
        """The modelled time of its first `rounds` rounds (all by default), in rounds of `alone`."""
        if not alone.rounds:
            return math.nan
        times = cost.elapsed([r.priced for r in self.rounds[:rounds]], [r.priced for r in alone.rounds])
        return times[-1] if times else 0.0


@dataclass
class ConditionRun:
    condition: str  # ALONE or an objective
    accounting: str
    seed: int
    members: list[MemberRun]


def parse_condition(condition: str) -> tuple[str, tuple[str, ...]]:
    """(objective, its settings) of a condition `OBJECTIVE[:KEY=VALUE...]`; ValueError naming
    the problem for an unknown objective or a setting without `=`. Alone trains with nois."""
    name, *overrides = condition.split(":")
    if name == ALONE:
        if overrides:
            raise ValueError(f"{condition!r}: alone takes no settings (every member trains on its own samples)")
        return "nois", ()
    OBJECTIVES.get(name)  # an unknown objective is an error here, not after an hour
    if bad := [o for o in overrides if "=" not in o]:
        raise ValueError(f"{condition!r}: {bad[0]!r} is not KEY=VALUE")
    return name, tuple(overrides)


def member_config(
    directory: Path,
    member: Member,
    shape: Shape,
    seed: int,
    objective: str,
    own_share: float,
    peer_groups: int,
    condition_overrides: tuple[str, ...] = (),
) -> Config:
    """The settings of one member's node under a condition (the condition's own last)."""
    return load_config(
        None,
        [
            "model.name=tiny",  # the tiny CPU preset, with the shape and split of the setting
            "rollout.backend=hf",
            f"rollout.group_size={shape.group_size}",
            f"rollout.prompts_per_round={shape.prompts_per_round}",
            f"rollout.max_new_tokens={shape.max_new_tokens}",
            "train.micro_batch_size=256",
            f"loss.objective={objective}",
            f"node.seed={seed}",
            f"node.own_share={own_share}",
            f"node.max_peer_groups={peer_groups}",
            f"node.eval_size={shape.eval_size}",
            "node.checkpoint_every=0",
            "node.gather_timeout_s=5",
            f"node.run_dir={directory}",
            "swarm.enabled=false",
            *shape.overrides,
            *member.overrides,
            *condition_overrides,
        ],
    )


def rate_scaled(setting: Setting, shape: Shape, factor: float) -> Setting:
    """The setting with every member's learning rate times `factor`: each member keeps its own
    rate relative to the others (a LoRA member's larger one too), which one `train.lr` for every
    node would flatten. The scaled rate is pinned as the member's last setting."""
    if factor == 1.0:
        return setting
    members = []
    for member in setting.members:
        with tempfile.TemporaryDirectory() as directory:
            rate = member_config(Path(directory), member, shape, 0, "f-tis", 1.0, 0).train.lr
        members.append(Member(member.label, (*member.overrides, f"train.lr={rate * factor:.6g}")))
    return Setting(setting.name, setting.about, tuple(members))


def split_for(condition: str, accounting: str, members: int, shape: Shape) -> tuple[float, int]:
    """(node.own_share, node.max_peer_groups) of a member under a condition."""
    if condition == ALONE:
        return 1.0, 0
    if accounting == "shared":
        return 1.0 / members, shape.prompts_per_round
    return 1.0, (members - 1) * shape.prompts_per_round


def matched_rounds(condition: str, accounting: str, members: int, shape: Shape) -> int:
    """Rounds a member trains under `condition`: `shape.rounds` step-matched (and alone);
    time-matched, those whose modelled cost fits that of `shape.rounds` rounds alone, from
    the samples its accounting promises (the tokens it generates go with its own samples)."""
    if shape.match == "step" or condition == ALONE:
        return shape.rounds
    own, peers = expected_samples(condition, accounting, members, shape)
    alone, _ = expected_samples(ALONE, accounting, members, shape)
    per_round = CostModel(shape.gen_share).round_cost(own, own + peers, alone, alone)
    return max(1, round(shape.rounds / per_round))


def alone_shape(shape: Shape) -> Shape:
    """The shape an alone run is kept under: alone trains `shape.rounds` rounds and each costs
    one round alone under every cost model, so its run is the same at every generation share,
    and keyed at the default one it serves a table at any `--gen-share`."""
    return replace(shape, gen_share=GEN_SHARE)


def eval_rounds(shape: Shape, matched: int | None = None) -> list[int]:
    """Rounds after which the curves get a point: spread over the run, which lasts
    `shape.rounds` or `matched` rounds, whichever is more; both among them. The last is the
    final evaluation. A time-matched run is also evaluated where its modelled time equals
    each of alone's points (`counterpart_round`), so it meets alone at every budget."""
    total = max(shape.rounds, matched or 0)
    points = max(1, shape.eval_points + 1)
    spread = {max(1, round(total * (i + 1) / points)) for i in range(points)}
    if not matched:
        return sorted(spread | {shape.rounds})
    alone = eval_rounds(shape)
    return sorted(spread | {shape.rounds, matched} | {counterpart_round(r, matched, shape.rounds) for r in alone})


def counterpart_round(alone_rounds: int, matched: int, rounds: int) -> int:
    """The round at which a time-matched run has spent the modelled time of `alone_rounds`
    rounds alone, when its `matched` rounds cost what `rounds` rounds alone do (a round's
    modelled cost is the same all run long)."""
    return max(1, round(alone_rounds * matched / rounds))


def round_at_budget(member: MemberRun, alone_rounds: int, rounds: int) -> int:
    """The round at which a time-matched `member` had spent the modelled time of `alone_rounds`
    rounds alone: as priced while it ran where its rounds' cost varied (`budget_rounds`), else
    from its constant cost (`counterpart_round`, its run the time of `rounds` rounds alone)."""
    found = member.budget_rounds.get(alone_rounds)
    return found if found is not None else counterpart_round(alone_rounds, member.time_matched_at or 0, rounds)


@dataclass
class BudgetClock:
    """A member's modelled time as it runs, for one whose rounds' cost varies (an adaptive share):
    each round priced by the samples it generated and trained on against a round alone's
    (`full` each), and the round nearest each of alone's `budgets` (in rounds alone) kept."""

    budgets: list[int]
    cost: CostModel
    full: int
    spent: float = 0.0
    crossed: dict[int, int] = field(default_factory=dict)

    def tick(self, record: RoundRecord, done: int) -> bool:
        """Price the round just trained (`done` rounds so far): True where it is the round
        nearest a budget (the next, were it to cost the same, would end further past it)."""
        price = self.cost.round_cost(record.own_samples, record.own_samples + record.peer_samples, self.full, self.full)
        self.spent += price
        due = [b for b in self.budgets if b not in self.crossed and self.spent + price / 2 >= b]
        for budget in due:
            self.crossed[budget] = done
        return bool(due)

    @property
    def done(self) -> bool:
        return len(self.crossed) == len(self.budgets)


def run_condition(
    setting: Setting,
    condition: str,
    accounting: str,
    seed: int,
    shape: Shape,
    progress: Callable[[str], None] = lambda line: None,
) -> ConditionRun:
    """Train the setting's members `shape.rounds` rounds under one condition; alone, each
    member trains by itself (one after the other), together they step round by round."""
    objective, condition_overrides = parse_condition(condition)
    share, peer_groups = split_for(condition, accounting, len(setting.members), shape)
    matched = matched_rounds(condition, accounting, len(setting.members), shape) if shape.match == "time" else None
    groups = [list(setting.members)] if condition != ALONE else [[m] for m in setting.members]
    runs: dict[str, MemberRun] = {}
    with tempfile.TemporaryDirectory(prefix="swarmnode-ablation-") as scratch:
        for together in groups:
            hub = InMemoryHub()
            with contextlib.ExitStack() as stack:
                nodes = []
                for member in together:
                    config = member_config(
                        Path(scratch) / member.label, member, shape, seed, objective, share, peer_groups,
                        condition_overrides,
                    )
                    name = member.label  # the peer id, hence the prompts, are the member's in every condition
                    node = stack.enter_context(assemble(config, join=lambda run, standing, n=name, h=hub: h.join(n, run, standing)))
                    node.intake.costs.pin(shape.gen_share)  # groups on top priced as the bench prices rounds
                    nodes.append(node)
                runs.update(_train_together(together, nodes, shape, matched, progress))
    return ConditionRun(condition, accounting, seed, [runs[m.label] for m in setting.members])


def _train_together(
    members: list[Member], nodes: list[Node], shape: Shape, matched: int | None, progress: Callable[[str], None]
) -> dict[str, MemberRun]:
    """Step the nodes together for `shape.rounds` rounds, or `matched` (the time-matched
    count) when that is more, evaluating at both. Time-matched, a member whose share adapts
    is priced as it runs (`BudgetClock`) and evaluated where it spent each of alone's budgets;
    every node steps until each such member has spent alone's whole run (the others go on as
    its peers, their records ending at their own count)."""
    runs = {}
    for member, node in zip(members, nodes):
        before = node.evaluate()
        runs[member.label] = MemberRun(member.label, before, before, curve=[(0, 0, before)], time_matched_at=matched)
    checkpoints = set(eval_rounds(shape, matched))
    rounds = max(checkpoints)
    full = shape.prompts_per_round * shape.group_size
    clocks = {m.label: BudgetClock(eval_rounds(shape), CostModel(shape.gen_share), full)
              for m, node in zip(members, nodes) if matched and node.intake.share.enabled}
    started = time.perf_counter()
    round_ = 0
    while round_ < rounds or not all(clock.done for clock in clocks.values()):
        if round_ >= MAX_ROUNDS_FACTOR * rounds:
            break  # a member that never spends alone's time: its missing budgets stay unmeasured
        states = [node.produce(round_) for node in nodes]
        due = []
        for member, node, state in zip(members, nodes, states):
            record = node.consume(round_, state)
            clock = clocks.get(member.label)
            if clock is None and round_ < rounds:
                runs[member.label].rounds.append(record)
                if round_ + 1 in checkpoints:
                    due.append((member, node))
            elif clock is not None and not clock.done:
                runs[member.label].rounds.append(record)
                if clock.tick(record, round_ + 1) or round_ + 1 in checkpoints:
                    due.append((member, node))
        for member, node in due:
            run = runs[member.label]
            run.after = node.evaluate()
            run.curve.append((round_ + 1, run.tokens_generated, run.after))
        if due:
            progress(f"    round {round_ + 1}/{rounds} ({time.perf_counter() - started:.0f} s): "
                     + ", ".join(f"{m.label} {runs[m.label].after:.3f}" for m, _ in due))
        round_ += 1
    for label, clock in clocks.items():
        runs[label].budget_rounds = dict(clock.crossed)
        runs[label].time_matched_at = clock.crossed.get(shape.rounds)
    return runs


# -- summaries ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gain:
    """One member under one condition against the same member alone, paired by seed."""

    label: str
    condition: str
    before: float
    after: float
    gain: float  # mean over seeds of after - after under the baseline (alone unless asked)
    se: float  # standard error of that mean (nan with one seed)
    seeds: int
    tokens_share: float  # tokens it generated / tokens it generated under the baseline
    time_share: float = math.nan  # its modelled time / the baseline's (CostModel)
    unevaluated: int = 0  # seeds with a run either side left out: one of the two has no evaluation at the point
    by_seed: tuple[tuple[int, float], ...] = ()  # (seed, gain) behind the mean: to pair it with another table's

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.gain, self.se, self.seeds)


def member_from_json(data: dict) -> MemberRun:
    """A member's run as `dataclasses.asdict` wrote it."""
    return MemberRun(data["label"], data["before"], data["after"], [tuple(p) for p in data["curve"]],
                     [RoundRecord.from_json(line) for line in data["rounds"]], data.get("time_matched_at"),
                     {int(k): int(v) for k, v in data.get("budget_rounds", {}).items()})


def run_from_json(data: dict) -> ConditionRun:
    """A condition's run as `dataclasses.asdict` wrote it."""
    return ConditionRun(data["condition"], data["accounting"], data["seed"], [member_from_json(m) for m in data["members"]])


def setting_from_json(data: dict) -> Setting:
    """A setting as `dataclasses.asdict` wrote it."""
    return Setting(data["name"], data["about"], tuple(Member(m["label"], tuple(m["overrides"])) for m in data["members"]))


def control_mismatch(saved: dict, control: Setting, accounting: str, shape: Shape,
                     defaults: str | None = None) -> list[str]:
    """What differs between a control read from a file (its JSON) and the control these rows
    need: copies trained at another rate, batch, length, matching or generation share, or under
    other defaults (`defaults`, the digest of the settings' defaults here, where the file records
    its own), are no yardstick for them. Empty where it is the same control; a shape written
    before a field existed ran at that field's default."""
    ours = asdict(shape)
    theirs = {**asdict(Shape()), **saved["shape"]}
    differ = [f"{key} {_plain(theirs[key])} (here {_plain(value)})"
              for key, value in ours.items() if _plain(theirs[key]) != _plain(value)]
    if saved["accounting"] != accounting:
        differ.append(f"accounting {saved['accounting']} (here {accounting})")
    theirs_setting = setting_from_json(saved["setting"])
    if (theirs_setting.name, theirs_setting.members) != (control.name, control.members):
        differ.append(f"members {theirs_setting.members} (here {control.members})")
    if defaults is not None and saved.get("defaults") not in (None, defaults):
        differ.append(f"defaults {saved['defaults'][:16]} (here {defaults[:16]}: a default changed since it ran)")
    return differ


def _plain(value: object) -> object:
    """A shape field as JSON holds it (tuples are lists there)."""
    return list(value) if isinstance(value, tuple) else value


def by_member(runs: list[ConditionRun]) -> dict[tuple[str, str], list[tuple[int, MemberRun]]]:
    """(condition, member label) -> that member's (seed, run) under the condition, in the
    order conditions and members first appear."""
    grouped: dict[tuple[str, str], list[tuple[int, MemberRun]]] = {}
    for run in runs:
        for member in run.members:
            grouped.setdefault((run.condition, member.label), []).append((run.seed, member))
    return grouped


def read_rounds(member: MemberRun, baseline: MemberRun, alone_rounds: int, match: str) -> tuple[int, int]:
    """Where a member and its baseline are read: `step`, both at alone's round count; `time`,
    each where its own modelled time equals alone's (its end, or before it on top)."""
    if match == "step":
        return alone_rounds, alone_rounds
    return member.time_matched_at or len(member.rounds), baseline.time_matched_at or len(baseline.rounds)


def paired_gains(runs: list[ConditionRun], baseline: str = ALONE, match: str = "step",
                 cost: CostModel | None = None) -> list[Gain]:
    """Every (condition, member) against the same member under `baseline` (alone, or an
    objective such as nois), seed by seed; [] when no run has that condition. `step`: at
    alone's round count (a time-matched run is evaluated there on its way), the baseline too;
    `time`: where each run's modelled time equals alone's (its end, or before it where its
    rounds cost more than alone's: on top).
    A seed either side was not evaluated at is left out, and counted (`Gain.unevaluated`): step-
    matched, a run whose rounds cost more than alone's spends its modelled time before alone's
    round count and has no point there. A row that leaves out every seed is still returned, with
    no seeds and nan figures, so that a table says it is missing rather than dropping it."""
    cost = cost or CostModel()
    base = {(r.seed, m.label): m for r in runs if r.condition == baseline for m in r.members}
    if not base:
        return []
    steps = {(r.seed, m.label): len(m.rounds) for r in runs if r.condition == ALONE for m in r.members}
    gains = []
    for (condition, label), seeded in by_member(runs).items():
        pairs, upto, theirs, seeds, unevaluated = [], [], [], [], 0
        for seed, m in seeded:
            if (seed, label) not in base:
                continue
            a = base[(seed, label)]
            at, baseline_at = read_rounds(m, a, steps.get((seed, label), len(a.rounds)), match)
            baseline_accuracy = a.accuracy_at(baseline_at)
            if not (math.isnan(m.accuracy_at(at)) or math.isnan(baseline_accuracy)):
                pairs.append((m, a))
                upto.append(at)
                theirs.append(baseline_accuracy)
                seeds.append(seed)
            else:
                unevaluated += 1
        if pairs:
            accuracy = [m.accuracy_at(n) for (m, _), n in zip(pairs, upto)]
            diffs = [acc - base_acc for acc, base_acc in zip(accuracy, theirs)]
            tokens = sum(sum(r.wire_tokens for r in m.rounds[:n]) for (m, _), n in zip(pairs, upto))
            times = [m.modelled_time(a, cost, n) / a.modelled_time(a, cost) for (m, a), n in zip(pairs, upto)]
            gains.append(
                Gain(
                    label=label,
                    condition=condition,
                    before=statistics.mean(m.before for m, _ in pairs),
                    after=statistics.mean(accuracy),
                    gain=statistics.mean(diffs),
                    se=standard_error(diffs),
                    seeds=len(diffs),
                    tokens_share=tokens / max(sum(a.tokens_generated for _, a in pairs), 1),
                    time_share=statistics.mean(times),
                    unevaluated=unevaluated,
                    by_seed=tuple(zip(seeds, diffs)),
                )
            )
        elif unevaluated:
            gains.append(Gain(label, condition, math.nan, math.nan, math.nan, math.nan, 0, math.nan, math.nan, unevaluated))
    return gains


@dataclass(frozen=True)
class BudgetGain:
    """A time-matched member against itself alone at one budget: the modelled time of
    `alone_rounds` rounds alone, which the condition spent in `rounds` rounds."""

    label: str
    condition: str
    alone_rounds: int
    rounds: int
    gain: float  # mean over seeds
    se: float  # over seeds (nan with one)
    seeds: int


def budget_gains(runs: list[ConditionRun]) -> list[BudgetGain]:
    """Every time-matched (condition, member) against the same member alone at each point of
    alone's curve, paired by seed: whether joining pays can depend on how far training has
    gone (a member near its plateau gains nothing from more rounds, one early on does).
    A budget where a seed's run has no evaluation leaves that seed out."""
    base = {(r.seed, m.label): m for r in runs if r.condition == ALONE for m in r.members}
    gains = []
    for (condition, label), seeded in by_member(runs).items():
        pairs = [(m, base[(seed, label)]) for seed, m in seeded
                 if condition != ALONE and m.time_matched_at and (seed, label) in base]
        budgets = sorted({done for _, alone in pairs for done, _, _ in alone.curve if done > 0})
        for budget in budgets:
            diffs, spent = [], []
            for member, alone in pairs:
                at = round_at_budget(member, budget, len(alone.rounds))
                ours, theirs = member.accuracy_at(at), alone.accuracy_at(budget)
                if not (math.isnan(ours) or math.isnan(theirs)):
                    diffs.append(ours - theirs)
                    spent.append(at)
            if diffs:
                gains.append(BudgetGain(label, condition, budget, max(spent), statistics.mean(diffs),
                                        standard_error(diffs), len(diffs)))
    return gains


def pooled_gain(runs: list[ConditionRun], condition: str, match: str = "step", baseline: str = ALONE) -> Verdict | None:
    """The condition's gain against `baseline` (alone, or an objective such as the one a lever
    changes) with every member's pooled per seed (their mean), judged over seeds: the control's
    one figure, since its two members train as one model and their rows differ only in their
    alone runs. `step`: both at alone's round count; `time`: each where its modelled time equals
    alone's (its end, or before it on top), as paired_gains reads them."""
    alone = {r.seed: r for r in runs if r.condition == ALONE}
    base = {r.seed: r for r in runs if r.condition == baseline}
    per_seed = []
    for run in runs:
        if run.condition != condition or run.seed not in base or run.seed not in alone:
            continue
        diffs = []
        for member, theirs, by_itself in zip(run.members, base[run.seed].members, alone[run.seed].members, strict=True):
            at, theirs_at = read_rounds(member, theirs, len(by_itself.rounds), match)
            diffs.append(member.accuracy_at(at) - theirs.accuracy_at(theirs_at))
        if not any(math.isnan(d) for d in diffs):
            per_seed.append(statistics.mean(diffs))
    return verdict(per_seed) if per_seed else None


@dataclass(frozen=True)
class AreaGain:
    """A time-matched member's budget gain: over alone's evaluation points, the mean of its
    accuracy where it has spent the same modelled time minus alone's there (the area between the
    two curves against modelled time, over alone's span), one value a seed, judged over seeds."""

    label: str
    condition: str
    budgets: int  # alone's evaluation points averaged over
    verdict: Verdict


def area_gains(runs: list[ConditionRun]) -> list[AreaGain]:
    """Every time-matched (condition, member)'s budget gain against the same member alone, paired
    by seed: "pays sooner" in one number, where the gain at one budget says little near a plateau."""
    base = {(r.seed, m.label): m for r in runs if r.condition == ALONE for m in r.members}
    gains = []
    for (condition, label), seeded in by_member(runs).items():
        per_seed, budgets = [], 0
        for seed, member in seeded:
            alone = base.get((seed, label))
            if condition == ALONE or not member.time_matched_at or alone is None:
                continue
            points = [done for done, _, _ in alone.curve if done > 0]
            diffs = [member.accuracy_at(round_at_budget(member, done, len(alone.rounds))) - alone.accuracy_at(done)
                     for done in points]
            diffs = [d for d in diffs if not math.isnan(d)]
            if diffs:
                per_seed.append(statistics.mean(diffs))
                budgets = max(budgets, len(diffs))
        if per_seed:
            gains.append(AreaGain(label, condition, budgets, verdict(per_seed)))
    return gains


def standard_error(values: list[float]) -> float:
    """Of the mean; nan for fewer than two values."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")


def control_limit_se(seeds: int, confidence: float = CONTROL_CONFIDENCE) -> float:
    """How many standard errors from 0 a control's mean gain may lie at `confidence`: a mean
    over n paired seeds over its standard error follows Student's t with n - 1 degrees of
    freedom, so at 5 seeds the line is 2.78 SE, not the normal 1.96 (a fixed 2-SE line
    calls a perfect control off in 12 % of comparisons there)."""
    return float(student_t.ppf(0.5 + confidence / 2, seeds - 1))


def control_judged(accounting: str, match: str) -> bool:
    """Whether two copies should learn exactly as one alone: only with a shared batch after the
    same rounds, where they train on as many on-policy samples a step as alone. On top each
    step has twice the samples, time-matched there are more rounds: a copy is then worth
    something, and what it is worth is the yardstick for the setting's rows, not an error."""
    return accounting == "shared" and match == "step"


def control_warnings(gains: list[Gain], confidence: float = CONTROL_CONFIDENCE) -> list[str]:
    """For gains of the control setting against alone: one line per member and condition whose
    gain lies outside the `confidence` interval around 0 (none can be judged with one seed)."""
    warnings = []
    for gain in gains:
        if gain.condition == ALONE or math.isnan(gain.se) or gain.seeds < 2:
            continue
        limit = control_limit_se(gain.seeds, confidence)
        if abs(gain.gain) > limit * max(gain.se, 1e-12):
            warnings.append(
                f"control off: {gain.label} under {gain.condition} gains {gain.gain:+.3f} (SE {gain.se:.3f}) "
                f"against alone, beyond {limit:.2f} SE (the {confidence:.0%} line at {gain.seeds} seeds): "
                f"two copies of one model should learn as one alone"
            )
    return warnings


def diagnostics(runs: list[ConditionRun]) -> dict[tuple[str, str], dict[str, float]]:
    """(condition, member) -> mean over rounds and seeds of each objective diagnostic, plus
    the share of peers' samples gated, the samples trained on per round (own, peers') and the
    median of the peers' running reward lead (`running_lead`)."""
    table: dict[tuple[str, str], dict[str, float]] = {}
    for key, seeded in by_member(runs).items():
        rounds = [line for _, member in seeded for line in member.rounds]
        if not rounds:
            continue
        row = {name: statistics.mean(getattr(line, name) for line in rounds) for name in DIAGNOSTICS}
        row["weight_max"] = max(line.weight_max for line in rounds)
        peers = sum(line.peer_samples for line in rounds)
        gated = sum(line.gated for line in rounds)
        row["gated_frac"] = gated / max(peers + gated, 1)
        row["below_bar_frac"] = sum(line.below_bar for line in rounds) / max(peers + gated, 1)
        row["own_samples"] = statistics.mean(line.own_samples for line in rounds)
        row["peer_samples"] = statistics.mean(line.peer_samples for line in rounds)
        leads = [lead for _, member in seeded for lead in running_lead(member.rounds)]
        row["reward_lead"] = statistics.median(leads) if leads else math.nan
        table[key] = row
    return table


def running_lead(rounds: list[RoundRecord]) -> list[float]:
    """The peers' reward lead at a member, round by round, as `node.far_reward_lead` keeps it
    (a running mean from a prior of no lead, swarmnode.loop.share), but of the peers' samples it
    trained on, pooled over peers, so that it can be read off any condition's run: a round
    without peers' samples leaves it where it was and adds no value."""
    lead, leads = 0.0, []
    for line in rounds:
        if line.peer_reward_mean is None:
            continue
        lead = smoothed(lead, line.peer_reward_mean - line.reward_mean)
        leads.append(lead)
    return leads


def expected_samples(condition: str, accounting: str, members: int, shape: Shape) -> tuple[int, int]:
    """(own, peers') samples a member trains on per round when every peer delivers and none
    is gated: what the bookkeeping must show."""
    share, peer_groups = split_for(condition, accounting, members, shape)
    probe = load_config(None, [f"rollout.prompts_per_round={shape.prompts_per_round}",
                               f"node.own_share={share}", f"node.max_peer_groups={peer_groups}"])
    own_groups, budget = batch_split(probe)
    peers_offer = 0 if condition == ALONE else (members - 1) * own_groups
    return own_groups * shape.group_size, min(budget, peers_offer) * shape.group_size
