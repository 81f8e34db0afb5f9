"""bench/crowd_seeds.py: probation-crowd runs over disjoint seeds, judged as one run over all of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from swarmnode.lab.verdicts import verdict

ROOT = Path(__file__).resolve().parents[1]
ROW = ("{seed:>4} {ids:>4} {node:>4}     0    19          0,    19            0,    3       0.0      1.59 ( 8)"
       "         1016 (   0)          0.4  52.8 0.415->{after:.3f}    0.31")


def _output(seeds: list[int], after: dict[tuple[int, int, str], float], waited: dict[tuple[int, int, str], int | None]) -> str:
    lines = ["probation-crowd: honest tiny nodes a, b and a far tiny-llama f in step, 80 rounds",
             "seed  ids node whole turns won: other, crowd other useless, far crowd far ..."]
    lines += [ROW.format(seed=s, ids=k, node=n, after=after[s, k, n]) for s in seeds for k in (0, 8) for n in "ab"]
    lines += ["b joins at a's round 20: the round (a's) the other honest node's samples first taught each",
              "seed  ids node first taught rounds after join"]
    for s in seeds:
        for k in (0, 8):
            for n in "ab":
                w = waited[s, k, n]
                lines.append(f"{s:>4} {k:>4} {n:>4} {'-' if w is None else 20 + w:>12} {'-' if w is None else w:>17}")
    lines += ["the round (a's) the far peer f's samples first taught each honest node (-: never)",
              "seed    0 ids: a, b    8 ids: a, b"]
    lines += [f"{s:>4} {'0, 20':>14} {'3, -':>14}" for s in seeds]
    return "\n".join(lines) + "\n"


def _run(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench/crowd_seeds.py"), *map(str, paths)],
                          capture_output=True, text=True)


def test_two_runs_of_disjoint_seeds_are_judged_as_one(tmp_path):
    seeds = [0, 1, 2, 3]
    after = {(s, k, n): 0.5 + 0.01 * s - (0.02 + 0.005 * s if k else 0.0) * (n == "b") for s in seeds
             for k in (0, 8) for n in "ab"}
    waited = {(s, k, n): (None if (s, k, n) == (3, 8, "a") else (5 * s if k else 0)) for s in seeds
              for k in (0, 8) for n in "ab"}
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text(_output(seeds[:2], after, waited))
    second.write_text(_output(seeds[2:], after, waited))
    shown = _run(first, second)
    assert shown.returncode == 0, shown.stderr
    b = verdict([after[s, 8, "b"] - after[s, 0, "b"] for s in seeds])
    assert f"8 identities, node b: {b.mean:+.3f} ({b.se:.3f}), bound {b.lower:+.3f}" in shown.stdout
    assert "8 identities, node a: +0.000 (0.000)" in shown.stdout
    assert "seeds 0-3 (4)" in shown.stdout and "(Student's t, 3 df)" in shown.stdout
    assert "8 identities: median 7.5, most finite 15, never 1 of 8" in shown.stdout  # 0,0,5,5,10,10,15,-
    assert "8 identities: median inf, most finite 3, never 4 of 8" in shown.stdout  # f: 3 from a, never from b


def test_a_seed_in_two_runs_is_refused(tmp_path):
    after = {(0, k, n): 0.5 for k in (0, 8) for n in "ab"}
    waited = {(0, k, n): 0 for k in (0, 8) for n in "ab"}
    one, two = tmp_path / "one.txt", tmp_path / "two.txt"
    one.write_text(_output([0], after, waited))
    two.write_text(_output([0], after, waited))
    shown = _run(one, two)
    assert shown.returncode != 0 and "seed 0" in shown.stderr


def test_a_file_that_is_not_the_bench_s_output_is_refused_by_name(tmp_path):
    other = tmp_path / "ablation.txt"
    other.write_text("setting same: two copies of tiny\nmember condition seeds\n")
    shown = _run(other)
    assert shown.returncode != 0 and "ablation.txt: no probation-crowd rows" in shown.stderr
