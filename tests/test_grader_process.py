"""math-verify in its own process: the same answers as in this one, and an answer that would
hold it past its hard limit scores 0, the worker killed and started again for the next."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from swarmnode.tasks.grader_process import MEMORY_LIMIT_BYTES, GradingProcess
from swarmnode.tasks.grading_worker import serve
from swarmnode.tasks.verify import answers_equal, answers_equal_here

PAIRS = [("18", "18", False), ("\\boxed{18}", "18", False), ("$\\frac{36}{2}$", "18", False), ("17", "18", False),
         ("\\frac{1}{2}", "0.5", True), ("\\sqrt{2}", "2^{1/2}", True), ("x+1", "1+x", True), ("3", "\\pi", True),
         ("18 dollars", "18", False), ("", "18", False)]


@pytest.fixture
def grader():
    process = GradingProcess(hard_timeout_s=4.0)
    yield process
    process.close()


def test_the_worker_grades_as_this_process_does(grader):
    for predicted, reference, latex in PAIRS:
        assert grader.equal(predicted, reference, latex) == answers_equal_here(predicted, reference, latex), predicted
    assert answers_equal("18", "18") and not answers_equal("17", "18"), "the node's path goes through a worker"


def test_an_answer_past_the_hard_limit_scores_0_and_the_next_is_graded(grader):
    assert grader.equal("1", "1")
    started = time.monotonic()
    assert not grader.equal("$2^{2^{40}}$", "$3$", False), "a big-integer power no alarm stops"
    assert time.monotonic() - started < 4.0 + 3.0 and grader.killed == 1
    assert grader.equal("18", "18") and grader.killed == 1, "a new worker for the next answer"


def test_a_worker_that_died_is_started_again(grader):
    assert grader.equal("2", "2")
    grader._process.kill()
    grader._process.wait()
    assert grader.equal("3", "3") and grader.killed == 0


def test_the_workers_address_space_is_capped(grader):
    assert grader.equal("1", "1")
    limits = Path(f"/proc/{grader._process.pid}/limits").read_text()
    line = next(line for line in limits.splitlines() if line.startswith("Max address space"))
    assert line.split()[3] == str(MEMORY_LIMIT_BYTES), line


def test_a_request_the_worker_cannot_read_is_not_equal():
    out = io.StringIO()
    serve(["not json\n", json.dumps({"predicted": "1"}) + "\n",
           json.dumps({"predicted": "1", "reference": "1", "latex": False}) + "\n"], out)
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [
        {"ready": True}, {"equal": False}, {"equal": False}, {"equal": True}]
