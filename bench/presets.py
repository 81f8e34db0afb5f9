"""Build the tiny presets afresh on this machine and compare them with the shipped ones.

    python bench/presets.py                 # every preset: built here on the pinned kernels vs shipped
    python bench/presets.py tiny --unpinned # one preset, on this CPU's own kernels
    python bench/presets.py --ship          # maintainers: replace the shipped builds (a spec changed)

The presets ship built (swarmnode/model/presets) because a warm-up on another CPU's kernels ends
in other weights; this prints, per preset, the sha256 of the weights built here and of the
shipped ones, so anyone can see whether their machine computes as the one that built them.
Each build runs in a child process (the kernels are chosen when torch loads), one at a time.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarmnode.lab.kernels import kernel_path, pinned_env
from swarmnode.model.tiny import PRESET_DIGESTS, TINY_PRESETS, build_tiny, shipped_dir, weights_digest


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=sorted(TINY_PRESETS), help="presets to build (default: all)")
    parser.add_argument("--unpinned", action="store_true", help="build on this CPU's own kernels, not the pinned path")
    parser.add_argument("--ship", action="store_true", help="copy the builds into the package's presets/")
    parser.add_argument("--build", nargs=2, metavar=("NAME", "DIR"), help=argparse.SUPPRESS)  # the child's job
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.build:
        name, directory = args.build
        build_tiny(TINY_PRESETS[name], Path(directory))
        print(kernel_path())
        return
    if unknown := sorted(set(args.names) - TINY_PRESETS.keys()):
        raise SystemExit(f"unknown preset(s) {unknown}; presets: {sorted(TINY_PRESETS)}")
    env = None if args.unpinned else pinned_env()
    print(f"{'preset':<12} {'built here (sha256)':<20} {'shipped':<20} {'same':<5} {'s':>5}  kernels")
    differ = []
    for name in args.names:
        with tempfile.TemporaryDirectory(prefix=f"preset-{name}-") as scratch:
            started = time.perf_counter()
            child = subprocess.run([sys.executable, __file__, "--build", name, scratch], env=env,
                                   capture_output=True, text=True, check=False)
            if child.returncode != 0:
                raise SystemExit(f"building {name} failed:\n{child.stdout[-2000:]}{child.stderr[-2000:]}")
            built = weights_digest(Path(scratch))
            shipped = PRESET_DIGESTS.get(name, "")
            print(f"{name:<12} {built[:16]:<20} {shipped[:16] or '-':<20} {str(built == shipped).lower():<5} "
                  f"{time.perf_counter() - started:>5.0f}  {child.stdout.strip().splitlines()[-1]}", flush=True)
            if shipped and built != shipped:
                differ.append(name)
            if args.ship:
                target = shipped_dir(TINY_PRESETS[name])
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(scratch, target)
                print(f"  shipped to {target}: record {built} in PRESET_DIGESTS")
    if differ and not args.ship:
        why = ("this CPU's own kernels are not the pinned path's" if args.unpinned else
               "this CPU, a library or the build code computes other bits than the shipped builds' "
               "(docs/figures.md, 'An Intel Xeon builds other presets')")
        print(f"{len(differ)} of {len(args.names)} built to other weights here: {why}. Nodes and benches load the "
              "shipped builds, so they start from the same weights all the same.")


if __name__ == "__main__":
    main()
