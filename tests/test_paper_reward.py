"""The paper preset's reward against the authors' binary rule (HeterogeneousRL, src/reward.py,
`reward_answer_binary`), restated here from its conditions: the two must agree on every
completion, except that an answer outside the grading bounds (cheap_to_grade: a peer chooses
what we grade) scores 0 here unread."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from math_verify import parse, verify

from swarmnode.tasks.answers import extract_answer, graded_reward
from swarmnode.tasks.gsm8k import GSM8KTask
from swarmnode.tasks.verify import cheap_to_grade
from tests.conftest import data_path


def authors_rule(completion: str, reference: str) -> float:
    """1 when: one <answer>(.*?)</answer> block (DOTALL) whose raw text math-verify finds equal to
    the reference; '<think>' and '</think>' both present, the first '</think>' after the first
    '<think>'; no tag twice; and the first match of '</answer>\\s?' ends the completion."""
    blocks = re.findall(r"<answer>(.*?)</answer>", completion, flags=re.DOTALL)
    correct = len(blocks) == 1 and bool(verify(parse(reference), parse(blocks[0])))
    thought = "<think>" in completion and completion.find("</think>") > completion.find("<think>") >= 0
    single = all(len(re.findall(tag, completion)) <= 1 for tag in ("<answer>", "</answer>", "<think>", "</think>"))
    ending = re.search(r"</answer>\s?", completion)
    ends = ending is not None and ending.span()[1] == len(completion)
    return float(correct and thought and single and ends)


# How a model writes 18, in plain text and in the LaTeX math-verify reads, and some that are not 18
ANSWERS = [
    "18", " 18 ", "\n18\n", "18 dollars", "$18", "18.0", "\\boxed{18}", "\\(18\\)", "\\[18\\]", "$18$", "$$18$$",
    "\\(\\boxed{18}\\)", "$\\frac{36}{2}$", "\\(\\dfrac{36}{2}\\)", "\\(\\sqrt{324}\\)", "$3^2 \\cdot 2$",
    "\\(x_1 = 18\\)", "$18^\\circ$", "\\(\\$18\\)", "$\\text{18 eggs}$", "$\\mathbf{18}$", "18 \\text{ dollars}",
    "\\(18\\%\\)", "9*2 = 18", "The answer is 18.", "17", "\\(17\\)", "1,8", "", "  ", "18</think>",
    "\\(\\sqrt{999999999999999989}\\)", "\\(99^{99}\\)", "3!", "9^9^9",
]
WHITESPACE = [" ", "\n", "\t", "\r\n", "\u00a0", "\u2003", "\x1c", "  ", "\n\n"]
PIECES = ["<think>", "</think>", "<answer>", "</answer>", "so 18.", "9*2 = 18", *WHITESPACE, *ANSWERS]

well_formed_ish = st.builds(
    lambda before, thinking, between, answer, after: f"{before}{thinking}{between}<answer>{answer}</answer>{after}",
    before=st.sampled_from(["", "Sure. ", "<answer>", "</think>", "\n"]),
    thinking=st.sampled_from(["<think>9*2 = 18</think>", "<think>x", "x</think>", "</think>x<think>", "", "<think></think>"]),
    between=st.sampled_from(["", " ", "\n", "<think>", "</answer>", "text "]),
    answer=st.sampled_from(ANSWERS),
    after=st.sampled_from(["", *WHITESPACE, "x", " so 18.", "<think>y</think>", "</answer>"]),
)
anything = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)


def ours(completion: str, reference: str = "18") -> float:
    return graded_reward(completion, reference, "think_answer", "math-verify")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(well_formed_ish, anything))
def test_the_paper_reward_is_the_authors_rule_within_the_grading_bounds(completion):
    blocks = re.findall(r"<answer>(.*?)</answer>", completion, flags=re.DOTALL)
    if len(blocks) == 1 and not cheap_to_grade(blocks[0].strip()):
        assert ours(completion) == 0.0  # scored unread: see cheap_to_grade
        return
    assert ours(completion) == authors_rule(completion, "18"), repr(completion)


@pytest.mark.parametrize("after,paid", [("", 1.0), (" ", 1.0), ("\n", 1.0), ("\t", 1.0), ("\u2003", 1.0),
                                        ("  ", 0.0), ("\n\n", 0.0), (" \n", 0.0), (".", 0.0)])
def test_at_most_one_whitespace_character_may_follow_the_answer(after, paid):
    completion = f"<think>9*2 = 18</think><answer>18</answer>{after}"
    assert ours(completion) == authors_rule(completion, "18") == paid


def test_the_authors_rule_does_not_order_the_answer_after_the_thinking():
    """Their conditions place the think block's tags and the answer's end, not one after the other."""
    for completion in ["<think><answer>18</answer>", "<answer>18</answer><think>", "<think>x<answer>18</think></answer>"]:
        assert ours(completion) == authors_rule(completion, "18"), completion


def test_gsm8k_answers_written_in_latex_are_graded_as_the_authors_grade_them():
    """Every GSM8K reference of the first 50, written the ways a model writes it in LaTeX: each
    form passes the grading bounds and gets the authors' score (1 where math-verify reads it)."""
    task = GSM8KTask(str(data_path("gsm8k")), answer_format="think_answer", grader="math-verify")
    paid = 0
    for problem in task.eval_problems(50):
        ref = problem.answer
        for form in [f"\\({ref}\\)", f"\\[{ref}\\]", f"$\\boxed{{{ref}}}$", f"$${ref}$$", f"\\(\\text{{{ref}}}\\)",
                     f"{ref} \\text{{ dollars}}", f"\\(\\${ref}\\)", f"$\\mathbf{{{ref}}}$"]:
            completion = f"<think>work</think><answer>{form}</answer>\n"
            assert cheap_to_grade(extract_answer(completion, "think_answer")), form
            expected = authors_rule(completion, ref)
            assert task.reward(completion, problem) == expected, form
            paid += expected == 1.0
    assert paid >= 0.9 * 50 * 8, "math-verify reads these forms"
