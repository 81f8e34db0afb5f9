"""What the learning levers add to a round: f-tis's step against plain nois, and the probe of
node.adapt_share_nats, interleaved in one run on the same samples.

python bench/objective_overhead.py [--steps 30]

The probe: a node with the per-peer share measures one group of each far peer a round under its
model (a forward pass, no step), at most the peers' share of groups and what the far groups on
top leave of the tenth of a round they may take (swarmnode.loop.intake, loop.round_costs); with
top-k or top-p sampling it also measures its own samples again (outside that tenth). Each is
timed here against the training step on a whole round's samples, and priced as a share of a round by the cost model:
screening and training are the part of a round that generation leaves (`1 - gen_share`), at the
generation shares docs/gpu.md measured on GPUs (0.66 at 3B and the paper's batch, where training
weighs most; 0.93 at the bench's shape). The forward/step ratio is measured on this machine's
CPU; on a GPU a forward is about the same third of a step. Since the probe is paid from the tenth
of a round that far groups on top may take (swarmnode.loop.round_costs), a node prices a group
measured at FORWARD_OF_STEP of a group's training until it has timed its own; the bench prints
that against what it measured.
"""

from __future__ import annotations

import argparse
import statistics
import time

from swarmnode.assemble import assemble
from swarmnode.learn.sample import samples_of
from swarmnode.model.policy import Policy
from swarmnode.settings.config import LossSettings, load_config
from swarmnode.sizing.cost import FORWARD_OF_STEP, GEN_SHARE

GPU_GEN_SHARES = (0.66, GEN_SHARE)  # docs/gpu.md: 3B at the paper's batch; the bench's shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="interleaved timings of each kind (two more as warm-up)")
    args = parser.parse_args()
    config = load_config(None, ["node.run_dir=/tmp/swarmnode-bench-overhead", "swarm.enabled=false", "rollout.backend=hf",
                                "model.device=auto"])
    policy = Policy.load(config.model, config.train, seed=config.node.seed)
    with assemble(config, policy=policy) as node:
        state = node.produce(0)
    samples = samples_of(state.own_groups)
    size, batch = config.rollout.group_size, config.rollout.prompts_per_round
    half = samples[:size * (batch // 2)]  # the peers' share between two members: the most the room lets a round probe
    temperature = config.rollout.temperature
    policy.optimizer.param_groups[0]["lr"] = 0.0  # same weights every step: compare like with like

    def forward(chosen):
        return lambda: policy.token_logprobs([s.prompt_ids for s in chosen], [s.tokens for s in chosen], temperature)

    work = {
        "nois": lambda: policy.train_step(samples, LossSettings(objective="nois"), temperature),
        "f-tis": lambda: policy.train_step(samples, LossSettings(objective="f-tis"), temperature),
        "one group": forward(samples[:size]),
        "half a batch": forward(half),
        "a batch": forward(samples),
    }
    times: dict[str, list[float]] = {name: [] for name in work}
    for step in range(args.steps + 2):
        for name, run in work.items():
            t = time.perf_counter()
            run()
            if step >= 2:  # warm-up steps excluded
                times[name].append(time.perf_counter() - t)
    median = {name: statistics.median(values) for name, values in times.items()}
    nois, ftis = median["nois"], median["f-tis"]
    print(f"{len(samples)} sequences per step, {args.steps} interleaved timings each")
    print(f"median step: nois {nois * 1000:.1f} ms, f-tis {ftis * 1000:.1f} ms, ratio f-tis/nois {ftis / nois:.3f}")
    share = {name: median[name] / ftis for name in ("one group", "half a batch", "a batch")}
    print("median forward, as a share of the f-tis step: "
          + ", ".join(f"{name} ({n} sequences) {median[name] * 1000:.1f} ms = {share[name]:.3f}"
                      for name, n in (("one group", size), ("half a batch", len(half)), ("a batch", len(samples)))))
    per_sample = share["half a batch"] * len(samples) / len(half)
    print(f"a forward over half a batch, per sample, as a share of the step's: {per_sample:.3f} "
          f"(a node prices a group measured at {FORWARD_OF_STEP:.3f} until it has timed its own)")
    for gen_share in GPU_GEN_SHARES:
        rest = 1.0 - gen_share
        print(f"as a share of a round at generation share {gen_share:.2f}: a far peer's probe group "
              f"{rest * share['one group']:.2%}; half a batch probed (the room between two members; the tenth "
              f"bounds it with the groups on top) {rest * share['half a batch']:.2%}; "
              f"our own samples again under top-k/top-p {rest * share['half a batch']:.2%} (half a batch) to "
              f"{rest * share['a batch']:.2%} (all of it)")


if __name__ == "__main__":
    main()
