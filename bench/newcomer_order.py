"""How long a late honest newcomer waits to be heard beside crowds, under the newcomer order of
any revision: a simulation with that revision's real PeerPool and fair_queue and today's
PeerLedger, no models.

    python bench/newcomer_order.py                                  # the working tree's pool.py
    python bench/newcomer_order.py --revs 001dfdf 48cc397 c39f65a   # drawn, by arrival, alternating
    python bench/newcomer_order.py --revs 776dfb7 tree              # a revision beside the working tree

A node with one proven near peer (16 groups a round, every one teaching) shares an 8-group
batch; the newcomers are idle from round `--idle-at` (swarmnode.loop.ledger.newcomers_idle; by
default from the start), so they get one turn among the proven peer's and fill what it leaves; every PROBATION_EVERY-th round
one useless or on-trial near peer's group comes on top. The honest newcomer joins at round
`--joins` with 4 groups a round; the printed wait is the rounds until one of its groups
teaches (median / most / never within `--rounds`, over `--seeds`). Each of its groups screened
teaches with the chance `--teaches` (by default 1: the wait is until its first group is
screened); one that does not leaves it on trial, as an honest peer is whose first groups came
while the model knew little. The crowds, each group teaching nothing:
- churn: 8 names renewed every 4 rounds, one group a batch (bench/attacks.py probation-crowd --churn 4);
- persist: one new name a round, each kept coming with 4 groups a batch, judged useless once
  USELESS_AFTER of its samples were screened;
- both: the two at once;
- far: churn, and one far newcomer that came first and keeps coming (its groups take no room).
Every peer is fetched as the hold rule allows (PeerPool.holding), and where the revision's pool
drops a newcomer's batch once it no longer stands in for the next (PeerPool.expire with
`newcomers`), it does so here with the ledger's newcomers. A group leaves the pool
`--max-age` of our rounds after it arrived: `node.max_age_s` (300 s) over the round time, so 5-10
on a GPU's 30-60 s rounds; by default never, as in the probation-crowd bench's half-second rounds,
where 300 s outlasts the run. Since 23b675b (ee91b16 for `--max-age`) a pool ends a peer's hold
a round before its groups leave (a newcomer's at HOLD_ROUNDS, anyone's by `--max-age`), so here,
where a batch is fetched in the round its hold ends, the newer batch comes a round sooner than
under earlier revisions (over hivemind, in time for the old groups' leaving). Left out: waiting
and fetch timing, the adaptive share, gated samples screened in their place, and more proven peers.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import math
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from swarmnode.loop.ledger import USELESS_AFTER, PeerLedger
from swarmnode.swarm.base import is_useless

ROOT = Path(__file__).resolve().parent.parent
POOL = "swarmnode/loop/pool.py"
BUDGET = 8  # groups of the peers' share
ATTACKS = {
    "churn": {"churn": 8},
    "persist": {"persist": 1},
    "both": {"churn": 8, "persist": 1},
    "far": {"churn": 8, "far_first": True},
}


def load_pool(rev: str | None, scratch: Path) -> ModuleType:
    """pool.py of `rev` (None or "tree": the working tree's) as a module of its own."""
    path = ROOT / POOL
    if rev not in (None, "tree"):
        path = scratch / f"pool_{rev}.py"
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{POOL}"], capture_output=True, text=True)
        if shown.returncode:
            raise SystemExit(f"--revs {rev}: git has no {POOL} there ({shown.stderr.strip()})")
        path.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(f"pool_{rev or 'tree'}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def wait(pool_module: ModuleType, seed: int, join: int, rounds: int, churn: int = 0, persist: int = 0,
         far_first: bool = False, max_age: float = math.inf, teaches: float = 1.0, idle_at: int = 0) -> int | None:
    """Rounds from `join` until a group of the honest newcomer's teaches (each one screened
    does with the chance `teaches`; groups leave the pool `max_age` of our rounds after they
    arrived; the newcomers idle from our round `idle_at`); None: never."""
    pool, ledger = pool_module.PeerPool(), PeerLedger()
    accepts = inspect.signature(pool_module.fair_queue).parameters
    ages_newcomers = "newcomers" in inspect.signature(pool_module.PeerPool.expire).parameters  # HOLD_ROUNDS
    far_word = "far" if "far" in accepts else "not_on_probation"
    far = {"far0"} if far_first else set()
    ledger.screened("good", 8, 8, 0)
    sent: dict[str, int] = {}
    luck = random.Random(f"{seed}:teaches")

    def deliver(peer: str, groups: int, round_: int, held: frozenset[str]) -> None:
        if peer != "good" and peer in held:  # the hold rule: not fetched while unused groups wait
            return
        sent[peer] = sent.get(peer, -1) + 1
        offered = [pool_module.OfferedGroup(peer, sent[peer], i, [], arrived=float(round_)) for i in range(groups)]
        if pool.add(peer, sent[peer], offered, round_):
            ledger.delivered(peer)

    for round_ in range(join + rounds):
        if round_ == idle_at:
            for k in range(USELESS_AFTER // 8):  # the newcomers turn idle
                ledger.screened(f"spent{k}", 8, 0, round_)
        if ages_newcomers:  # a newcomer's batch leaves HOLD_ROUNDS after it came
            newcomers = {peer for peer in pool.peers if ledger.standing(peer) is None}
            pool.expire(float(round_), max_age, 1, round_, newcomers)
        else:
            pool.expire(float(round_), max_age, 1)
        held = pool.holding(round_)
        deliveries = [("good", 16), *([("far0", 4)] if far_first else [])]
        deliveries += [(f"kept{k}", 4) for k in range(persist * (round_ + 1))]
        deliveries += [(f"churn{k}.{round_ // 4}", 1) for k in range(churn)]
        deliveries += [("honest", 4)] if round_ >= join else []
        for peer, groups in deliveries:
            deliver(peer, groups, round_, held)
        offers = pool.offers(round_)
        standing = {peer: ledger.standing(peer) for peer in offers}
        probation = round_ % pool_module.PROBATION_EVERY == 0
        extra = {far_word: far}
        if "present_since" in accepts:
            extra["present_since"] = pool.present_since(round_)
        if "came_late" in accepts:
            extra["came_late"] = {peer for peer in offers if ledger.came_since_idle(peer)}
        queue = pool_module.fair_queue(
            offers, standing, random.Random(f"{seed}:{round_}"), probation=probation, round_=round_,
            on_trial={peer for peer in offers if ledger.on_trial(peer)},
            newcomer_most=pool_module.IDLE_NEWCOMER_TURNS if ledger.newcomers_idle() else None, **extra)
        first = queue[0].peer_id if queue else None
        on_probation = first is not None and first not in far and (
            is_useless(ledger.standing(first)) or (probation and ledger.on_trial(first)))
        near = [g for i, g in enumerate(queue) if (on_probation and i == 0) or g.peer_id not in far]
        screened = near[:BUDGET + on_probation]  # far groups take no room; probation comes on top
        pool.take(screened)
        pool.take(list({g.peer_id: g for g in reversed(queue) if g.peer_id in far}.values()))  # measured, not judged
        for group in screened:
            taught = group.peer_id == "good" or (group.peer_id == "honest" and luck.random() < teaches)
            if taught and group.peer_id == "honest":
                return round_ - join
            ledger.screened(group.peer_id, 8, 8 if taught else 0, round_, near=True)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--revs", nargs="+", default=[None], help="git revisions whose pool.py to run, `tree` for the working tree's (default: the working tree's)")
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    parser.add_argument("--joins", nargs="+", type=int, default=[20, 60], help="rounds the honest newcomer joins at")
    parser.add_argument("--rounds", type=int, default=300, help="rounds after joining before it counts as never heard")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--max-age", type=float, default=math.inf,
                        help="our rounds a group stays in the pool after it arrived: node.max_age_s over the round time "
                             "(default: never, as in the bench's half-second rounds)")
    parser.add_argument("--idle-at", type=int, default=0,
                        help="our round from which the newcomers are idle, the crowd's junk screened by then (default 0)")
    parser.add_argument("--teaches", type=float, default=1.0,
                        help="the chance that a group of the honest newcomer's teaches once screened (default 1)")
    args = parser.parse_args()
    if not 0.0 < args.teaches <= 1.0:
        parser.error(f"--teaches is a chance in (0, 1]: got {args.teaches}")
    if args.idle_at < 0:
        parser.error(f"--idle-at is a round, 0 or more: got {args.idle_at}")
    if not args.max_age > 0:
        parser.error(f"--max-age is a number of rounds above 0: got {args.max_age}")
    with tempfile.TemporaryDirectory(prefix="swarmnode-order-") as scratch:
        pools = {rev or "tree": load_pool(rev, Path(scratch)) for rev in args.revs}
    kept = "until used or stale" if math.isinf(args.max_age) else f"at most {args.max_age:g} rounds"
    print(f"rounds a newcomer joining late waits to teach, {args.seeds} seeds, groups kept {kept}, each of its "
          f"groups teaching with the chance {args.teaches:g}: median / most / never within {args.rounds}")
    print(f"{'crowd':>8} {'joins':>5} " + " ".join(f"{label:>18}" for label in pools))
    for attack in args.attacks:
        for join in args.joins:
            cells = []
            for module in pools.values():
                waits = [wait(module, seed, join, args.rounds, max_age=args.max_age, teaches=args.teaches,
                              idle_at=args.idle_at, **ATTACKS[attack])
                         for seed in range(args.seeds)]
                heard = [w for w in waits if w is not None]
                median = f"{statistics.median(heard):g}" if heard else "-"
                cells.append(f"{median} / {max(heard) if heard else '-'} / {waits.count(None)}")
            print(f"{attack:>8} {join:>5} " + " ".join(f"{cell:>18}" for cell in cells), flush=True)


if __name__ == "__main__":
    main()
