"""How often a member that is exactly as good as alone is *shown* non-inferior, by seeds.

A verdict's power follows from the spread of a member's gain a seed: on the CPU bench the
time-matched gains spread 0.045-0.05 a seed (SE 0.014-0.016 at ten seeds, docs/figures.md).
A setting passes "never costs" only when every member is shown non-inferior, so with k members
all level with alone the chance is about the k-th power of one member's (gains of members of one
swarm are correlated, so this is a rough guide).

    python bench/verdict_power.py                      # the bench's spreads, 10/20/30 seeds
    python bench/verdict_power.py --sd 0.03 --gain 0.01
"""

from __future__ import annotations

import argparse

from swarmnode.lab.verdicts import NON_INFERIORITY_MARGIN, non_inferior_power


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sd", type=float, nargs="+", default=[0.045, 0.05], help="spread of the gain a seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[10, 20, 30])
    parser.add_argument("--gain", type=float, default=0.0, help="the member's true mean gain")
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 4, 5], help="members that must all pass")
    args = parser.parse_args()
    print(f"chance of 'non-inferior' (margin {NON_INFERIORITY_MARGIN}) for a true gain of {args.gain:+.3f}")
    print(f"{'sd':>6} {'seeds':>5} {'SE':>7} " + " ".join(f"{f'{k} member(s)':>12}" for k in args.members))
    for sd in args.sd:
        for seeds in args.seeds:
            one = non_inferior_power(args.gain, sd, seeds)
            print(f"{sd:6.3f} {seeds:5d} {sd / seeds ** 0.5:7.4f} " + " ".join(f"{one ** k:12.2f}" for k in args.members))


if __name__ == "__main__":
    main()
