"""One reasoning-gym dataset grades hostile answers: the worker of `bench/attacks.py grader`,
a process of its own per dataset (an evaluator may never return), importing only the task
module so its start-up stays short beside the bench's timeout.

    python bench/grader_worker.py DATASET MARK_PATH
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from swarmnode.tasks.gym import ReasoningGymTask, gym_datasets

RESULT_PREFIX = "grader-result "  # a dataset may print lines of its own
# Answers that keep math-verify (sympy) busy for seconds or without end, found by red-team passes;
# `bench/attacks.py math-grader` sends them past cheap_to_grade, straight to the grading worker.
HOSTILE_MATH = (
    "$2^{2^{40}}$", "$9^{9^{9^{9}}}$", "$(a+b+c+d)^{99}$", "$\\sqrt{(999999999999999989\\cdot 999999999999999967)^{99}+1}$",
    "$(a+b)(c+d)(f+g)(h+k)(m+n)(p+q)(r+s)(t+u)(v+w)(x+y)(z+A)(B+C)$", "$10^{10^{9}}$",
    "1/(" * 17 + "3" + ")" * 17, "2^(2^(2^(2^(2^20))))",
)

# Answers a peer can write: code that leaves a mark (MARK is replaced by a file's path), work
# without end for an evaluator, and text that trips parsers.
HOSTILE_ANSWERS = (
    "__import__('pathlib').Path('MARK').touch()",
    "(lambda: __import__('pathlib').Path('MARK').touch() or 1)()",
    "9**9**9**9",
    "(" * 3000 + "1" + ")" * 3000,
    "1e999999999",
    "7" * 4000,
)


def grade_hostile(dataset: str, mark: Path) -> dict:
    """One dataset's scores of HOSTILE_ANSWERS against its first problem (run in a process of its
    own: an evaluator may never return)."""
    import reasoning_gym  # optional (the gym extra)

    offered = dataset in gym_datasets()
    answers = [a.replace("MARK", str(mark)) for a in HOSTILE_ANSWERS]
    raised, rewarded, slowest = 0, 0, 0.0
    if offered:
        task = ReasoningGymTask(f"rg:{dataset}", {"size": 10})
        problem = task.train_problem(0)
        scorer, entry = task._train.score_answer, problem.entry
    else:
        made = reasoning_gym.create_dataset(dataset, seed=0, size=10)
        scorer, entry = made.score_answer, made[0]
    for answer in answers:
        started = time.perf_counter()
        try:
            direct = float(scorer(answer, entry))
        except Exception:
            raised, direct = raised + 1, 0.0
        score = task.reward(f"<answer>{answer}</answer>", problem) if offered else direct
        slowest = max(slowest, time.perf_counter() - started)
        rewarded += score > 0
    return {"offered": offered, "raised": raised, "rewarded": rewarded, "slowest_s": slowest}


if __name__ == "__main__":
    result = grade_hostile(sys.argv[1], Path(sys.argv[2]))
    print(f"\n{RESULT_PREFIX}{json.dumps(result)}", flush=True)  # a line of its own: a dataset may print without one
