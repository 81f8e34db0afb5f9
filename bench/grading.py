"""What grading a round costs: the numeric grader against math-verify (the paper's reward), per
completion and per round, on GSM8K test problems written in the paper's format.

    python bench/grading.py [--data ../shared/data/gsm8k] [--problems 200]

Each problem gets five completions: the reference solution inside <think></think>, then an
answer written as a plain number, "N dollars", \\boxed{N}, "a*b = N" style working, and a wrong
number. Printed: the median microseconds a completion takes per grader and answer style, what
a round of 144 completions (12 prompts x 12, the paper presets) and 288 (with one peer's) costs,
and how often the two graders disagree.
"""

from __future__ import annotations

import argparse
import statistics
import time
from decimal import Decimal
from pathlib import Path

from swarmnode.tasks import GSM8KTask
from swarmnode.tasks.gsm8k import read_jsonl

STYLES = {
    "plain": lambda answer, last: answer,
    "units": lambda answer, last: f"{answer} dollars",
    "boxed": lambda answer, last: f"\\boxed{{{answer}}}",
    "working": lambda answer, last: f"{last} = {answer}" if last else answer,
    "wrong": lambda answer, last: str(Decimal(answer) + 1),
}


def _last_working(solution: str) -> str:
    """The left side of the solution's last <<a*b=c>> calculator note, e.g. '9*2'."""
    notes = [part.split(">>")[0] for part in solution.split("<<")[1:]]
    return notes[-1].split("=")[0] if notes else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="a directory holding GSM8K's test.jsonl", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"))
    parser.add_argument("--problems", type=int, default=200)
    args = parser.parse_args()
    graders = {
        name: GSM8KTask(args.data, answer_format="think_answer", grader=name) for name in ("numeric", "math-verify")
    }
    problems = graders["numeric"].eval_problems(args.problems)
    rows, _ = read_jsonl(Path(args.data) / "test.jsonl", ("question", "answer"))
    solutions = {row["question"]: row["answer"] for row in rows}
    times: dict[tuple[str, str], list[float]] = {}
    rewards: dict[tuple[str, str], list[float]] = {}
    for problem in problems:
        solution = solutions[problem.question]
        thinking = solution.split("####")[0].strip()
        for style, write in STYLES.items():
            completion = f"<think>{thinking}</think><answer>{write(problem.answer, _last_working(solution))}</answer>"
            for name, task in graders.items():
                started = time.perf_counter()
                reward = task.reward(completion, problem)
                times.setdefault((name, style), []).append(time.perf_counter() - started)
                rewards.setdefault((name, style), []).append(reward)
    print(f"{len(problems)} GSM8K test problems, {len(STYLES)} answer styles each; median microseconds a completion")
    print(f"{'grader':<12}" + "".join(f"{style:>10}" for style in STYLES) + f"{'144 / rd':>12}{'288 / rd':>12}")
    for name in graders:
        medians = [statistics.median(times[name, style]) for style in STYLES]
        per_completion = statistics.mean(t for style in STYLES for t in times[name, style])
        print(f"{name:<12}" + "".join(f"{m * 1e6:10.0f}" for m in medians)
              + f"{144 * per_completion:11.2f}s{288 * per_completion:11.2f}s")
    print("\nshare rewarded 1")
    for name in graders:
        print(f"{name:<12}" + "".join(f"{statistics.mean(rewards[name, style]):10.2f}" for style in STYLES))
    differ = sum(a != b for style in STYLES for a, b in zip(rewards["numeric", style], rewards["math-verify", style]))
    print(f"\nthe graders disagree on {differ} of {len(problems) * len(STYLES)} completions")


if __name__ == "__main__":
    main()
