import json
from decimal import Decimal

import pytest

from swarmnode.tasks import ArithmeticTask, GSM8KTask, Math500Eval
from swarmnode.tasks.answers import extract_answer, numeric_reward, parse_number
from swarmnode.tasks.arithmetic import _is_held_out
from swarmnode.tasks.gsm8k import reference_answer
from tests.conftest import data_path


@pytest.fixture(scope="module")
def gsm8k():
    return GSM8KTask(str(data_path("gsm8k")))


def test_every_gsm8k_test_reference_scores_one_and_wrong_or_malformed_zero(gsm8k):
    problems = gsm8k.eval_problems(10_000)
    assert len(problems) == 1319
    for p in problems:
        ref = p.answer
        wrong = str(Decimal(ref) + 1)
        assert gsm8k.reward(f"Let me think.\n<answer>{ref}</answer>", p) == 1.0
        assert gsm8k.reward(f"<answer>{wrong}</answer>", p) == 0.0
        assert gsm8k.reward(f"<answer>{ref}", p) == 0.0  # unclosed
        assert gsm8k.reward(f"The answer is {ref}.", p) == 0.0  # no answer block
        assert gsm8k.reward(f"<answer>{ref}</answer><answer>{ref}</answer>", p) == 0.0
    boxed = GSM8KTask(str(data_path("gsm8k")), answer_format="boxed")
    for p in boxed.eval_problems(10_000):
        assert boxed.reward(f"so \\boxed{{{p.answer}}}", p) == 1.0
        assert boxed.reward(f"\\boxed{{{p.answer}", p) == 0.0


@pytest.mark.parametrize(
    "written,reference",
    [
        ("1,000", "1000"),
        ("$18", "18"),
        ("18.0", "18"),
        ("18.00", "18"),
        ("18.", "18"),
        ("\\$5", "5"),
        (" 42 ", "42"),
        ("-3", "-3"),
        ("50%", "50"),
        ("0.5", ".5"),
    ],
)
def test_number_normalisation_accepts(written, reference):
    assert numeric_reward(f"<answer>{written}</answer>", reference, "answer_tag") == 1.0


@pytest.mark.parametrize("written", ["18 apples and 3", "eighteen", "1/0", "", "1e3", "--18"])
def test_non_numbers_score_zero(written):
    assert numeric_reward(f"<answer>{written}</answer>", "18", "answer_tag") == 0.0


def test_extract_answer_handles_nested_boxes_and_overlong_answers():
    assert extract_answer("\\boxed{\\frac{1}{2}}", "boxed") == "\\frac{1}{2}"
    assert extract_answer("<answer>" + "9" * 100 + "</answer>", "answer_tag") is None
    assert parse_number("1,234.50") == Decimal("1234.50")


def test_gsm8k_reference_parsing_and_bad_files(tmp_path):
    assert reference_answer("2+2=<<2+2=4>>4\n#### 1,024") == "1024"
    with pytest.raises(ValueError, match="####"):
        reference_answer("no final answer")
    with pytest.raises(FileNotFoundError):
        GSM8KTask(str(tmp_path / "missing"))
    (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
    (tmp_path / "test.jsonl").write_text("not json\n")
    with pytest.raises(ValueError, match="train.jsonl:1: missing field"):
        GSM8KTask(str(tmp_path))


def test_gsm8k_train_ids_and_fingerprint(gsm8k):
    assert gsm8k.num_train == 7473
    assert gsm8k.train_problem(0).answer == reference_answer(
        json.loads(data_path("gsm8k", "train.jsonl").read_text().splitlines()[0])["answer"]
    )
    with pytest.raises(ValueError):
        gsm8k.train_problem(7473)
    assert gsm8k.fingerprint != GSM8KTask(str(data_path("gsm8k")), answer_format="boxed").fingerprint


def test_math500_references_verify_and_wrong_answers_do_not():
    task = Math500Eval(str(data_path("math500")))
    problems = task.eval_problems(500)
    assert len(problems) == 500
    assert all(task.reward(f"Thus \\boxed{{{p.answer}}}", p) == 1.0 for p in problems)
    wrong = [task.reward("\\boxed{123456789}", p) for p in problems[:100]]
    assert sum(wrong) == 0
    assert task.reward("no box at all", problems[0]) == 0.0


def test_arithmetic_is_deterministic_and_held_out_is_disjoint():
    a, b = ArithmeticTask(), ArithmeticTask()
    assert [a.train_problem(i) for i in range(50)] == [b.train_problem(i) for i in range(50)]
    evals = a.eval_problems(500)
    assert len({p.question for p in evals}) == 500
    for i in range(3000):
        q = a.train_problem(i).question
        x, op, y = q[:2], q[2], q[3:5]
        assert not _is_held_out(int(x), op, int(y))
    p = a.train_problem(3)
    assert a.reward(a.target(p), p) == 1.0
    assert a.reward(f"<answer>{int(p.answer) + 1}</answer>", p) == 0.0
    assert ArithmeticTask(seed=1).fingerprint != a.fingerprint


def test_arithmetic_rejects_bad_settings_and_impossible_eval_sizes():
    with pytest.raises(ValueError, match="operations"):
        ArithmeticTask(operations="/")
    with pytest.raises(ValueError, match="held-out"):
        ArithmeticTask(max_operand=3).eval_problems(500)


def test_strict_format_gives_nothing_to_text_after_the_answer():
    task = ArithmeticTask()
    problem = task.train_problem(0)
    right = f"<answer>{problem.answer}</answer>"
    assert task.reward(right + "\n", problem) == 1.0
    assert task.reward("2+2=5 " + right, problem) == 1.0, "text before the answer is the likelihood gate's job"
    assert task.reward(right + " 2+2=5", problem) == 0.0
    lenient = ArithmeticTask(strict_format=False)
    assert lenient.reward(right + " 2+2=5", problem) == 1.0 and lenient.fingerprint != task.fingerprint
    assert extract_answer("so \\boxed{5}.", "boxed", strict=True) == "5"
    assert extract_answer("\\[\\boxed{\\frac{1}{2}}\\]", "boxed", strict=True) == "\\frac{1}{2}"
    assert extract_answer("\\boxed{5} and also import os", "boxed", strict=True) is None


@pytest.mark.parametrize(
    "written,strict_value",
    [("72", 72), ("1,234", 1234), ("12,345,678", 12345678), ("$1,234.50", Decimal("1234.50")), (" 72 ", 72),
     ("7 2", None), ("7,2", None), ("1234,567", None), ("1,2345", None), (",72", None)],
)
def test_strict_numbers_refuse_digits_that_only_match_once_noise_is_deleted(written, strict_value):
    assert parse_number(written, strict=True) == (None if strict_value is None else Decimal(strict_value))
    assert parse_number(written) is not None  # the lenient reading takes all of them


def test_strict_numbers_is_a_task_setting_and_part_of_its_fingerprint():
    task = ArithmeticTask()
    problem = next(p for p in (task.train_problem(i) for i in range(100)) if len(p.answer.lstrip("-")) >= 2)
    split = problem.answer[:-1] + " " + problem.answer[-1]
    assert task.reward(f"<answer>{split}</answer>", problem) == 0.0
    lenient = ArithmeticTask(strict_numbers=False)
    assert lenient.reward(f"<answer>{split}</answer>", problem) == 1.0
    assert lenient.fingerprint != task.fingerprint
