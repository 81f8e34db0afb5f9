"""Step time of f-tis against plain nois, interleaved in one run on the same samples.

python bench/objective_overhead.py [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

from swarmnode.assemble import assemble
from swarmnode.learn.sample import samples_of
from swarmnode.model.policy import Policy
from swarmnode.settings.config import LossSettings, load_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    config = load_config(None, ["node.run_dir=/tmp/swarmnode-bench-overhead", "swarm.enabled=false", "rollout.backend=hf",
                                "model.device=auto"])
    policy = Policy.load(config.model, config.train, seed=config.node.seed)
    with assemble(config, policy=policy) as node:
        state = node.produce(0)
    samples = samples_of(state.own_groups)
    policy.optimizer.param_groups[0]["lr"] = 0.0  # same weights every step: compare like with like
    times: dict[str, list[float]] = {"nois": [], "f-tis": []}
    for step in range(args.steps + 2):
        for name in times:
            t = time.perf_counter()
            policy.train_step(samples, LossSettings(objective=name), 1.0)
            if step >= 2:  # warm-up steps excluded
                times[name].append(time.perf_counter() - t)
    nois, ftis = statistics.median(times["nois"]), statistics.median(times["f-tis"])
    print(f"{len(samples)} sequences per step, {args.steps} interleaved steps each")
    print(
        f"median step: nois {nois * 1000:.1f} ms, f-tis {ftis * 1000:.1f} ms, ratio f-tis/nois {ftis / nois:.3f}"
    )


if __name__ == "__main__":
    main()
