"""join's start-up memory estimate for every shipped config, on a 24 GB and an 80 GB GPU.

    python bench/config_memory.py [--gib 23.5 79.1]
Prints the total and whether it fits (vLLM backend, as on a GPU with vLLM installed); the
docs/gpu.md's config table quotes these. Then the calibration points: each measured process peak
(memory.CALIBRATION_PEAKS_GIB) next to the estimate of the path it was measured on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from swarmnode.settings.config import load_config
from swarmnode.sizing.memory import (
    CALIBRATION_CAPACITY_GIB,
    CALIBRATION_PEAKS_GIB,
    CALIBRATION_SETTINGS,
    GIB,
    estimate,
)
from swarmnode.sizing.shapes import shape_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, nargs="+", default=[23.5, 79.1], help="GPU sizes (GiB)")
    parser.add_argument("--configs", type=Path, default=Path(__file__).resolve().parents[1] / "configs")
    args = parser.parse_args()
    print(f"{'config':<30}" + "".join(f"{f'{gib:g} GiB GPU':>22}" for gib in args.gib))
    for path in sorted(args.configs.glob("*.yaml")):
        config = load_config(path)
        shape = shape_of(config.model.name)
        if shape is None:
            continue
        cells = []
        for gib in args.gib:
            est = estimate(config, shape, gib * GIB, True, "vllm")
            cells.append(f"{est.total / GIB:8.1f} GiB {'fits' if est.fits else 'NO':>6}")
        print(f"{path.name:<30}" + "".join(f"{c:>22}" for c in cells))
    print("\ncalibration (HF, whole-sequence log-probs, no inference copy): measured peak vs estimate")
    for name, measured in CALIBRATION_PEAKS_GIB.items():
        config = load_config(args.configs / name, CALIBRATION_SETTINGS)
        total = estimate(config, shape_of(config.model.name), CALIBRATION_CAPACITY_GIB * GIB, True, "hf").total / GIB
        print(f"{name:<30} measured {measured:5.1f} GiB   estimate {total:5.1f} GiB   {total / measured:.2f}x")


if __name__ == "__main__":
    main()
