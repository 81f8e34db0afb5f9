"""The paper's task: <think>..</think><answer>..</answer> graded by math-verify, as the authors'
reward grades it, and its prompt; and the presets that use it."""

import threading
import time
from pathlib import Path

import pytest
import yaml

from swarmnode.settings.config import load_config
from swarmnode.tasks import ArithmeticTask, GSM8KTask
from swarmnode.tasks.answers import extract_answer, graded_reward
from swarmnode.tasks.base import PAPER_SYSTEM_PROMPT
from swarmnode.tasks.verify import MAX_VERIFY_CHARS, TIMEOUT_S, answers_equal
from tests.conftest import data_path

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

THINK = "<think>She sells 16 - 3 - 4 = 9 eggs at $2 each: 9*2 = 18.</think>"


@pytest.mark.parametrize(
    "completion",
    [
        f"{THINK}<answer>18</answer>",
        f"{THINK}<answer>18 dollars</answer>",
        f"{THINK} <answer>\\boxed{{18}}</answer>\n",
        f"{THINK}<answer>9*2 = 18</answer>",
        f"{THINK}<answer>$18.00</answer>",
    ],
)
def test_math_verify_rewards_an_answer_equal_as_mathematics(completion):
    assert graded_reward(completion, "18", "think_answer", "math-verify") == 1.0


@pytest.mark.parametrize(
    "completion,why",
    [
        (f"{THINK}<answer>17</answer>", "wrong"),
        ("<answer>18</answer>", "no think block"),
        (f"{THINK}<answer>18</answer> so 18.", "text after the answer"),
        (f"{THINK}<answer>18</answer><answer>18</answer>", "two answers"),
        (f"<think>a</think>{THINK}<answer>18</answer>", "two think blocks"),
        ("<answer>18</answer><think>9*2 = 18</think>", "the answer does not end the completion"),
        (f"{THINK}<answer>18</answer>\n\n", "two whitespace characters after the answer"),
        ("</think>x<think><answer>18</answer>", "think block closed before it opens"),
        (f"{THINK}<answer>18", "unclosed"),
        (f"{THINK}<answer></answer>", "empty"),
        (f"{THINK}<answer>{'1' * (MAX_VERIFY_CHARS + 1)}</answer>", "too long to grade"),
    ],
)
def test_the_paper_format_scores_zero_when_malformed(completion, why):
    assert graded_reward(completion, "18", "think_answer", "math-verify") == 0.0, why


def test_the_numeric_grader_and_the_paper_grader_disagree_where_the_issue_says():
    """Ours accepts one plain number only; math-verify (the authors') also '18 dollars' and
    '9*2 = 18'. Both need the format, so the task's grader is part of what peers must share."""
    for answer, numeric in [("18", 1.0), ("18 dollars", 0.0), ("9*2 = 18", 0.0), ("\\boxed{18}", 0.0)]:
        completion = f"{THINK}<answer>{answer}</answer>"
        assert graded_reward(completion, "18", "think_answer", "numeric", True, True) == numeric, answer
        assert graded_reward(completion, "18", "think_answer", "math-verify") == 1.0, answer
    assert extract_answer(f"{THINK}<answer> 18 </answer>\n", "think_answer") == "18"


ADVERSARIAL = [
    "9^9^9", "10^1000000000", "18 + 0*10^(10^10)", "\\boxed{9^{9^{9}}}", "9**9**9", "3!", "1" * 30,
    "1/(" * 17 + "3" + ")" * 17, "\\int_0^1 18", "$18^{999}$", "\\(2^{99} \\cdot 3^{9}\\)",
    # found by a red-team pass over the LaTeX bounds, each seconds to minutes of sympy before they closed:
    "$\\sqrt{(999999999999999989\\cdot 999999999999999967)^{99}+1}$", "$(a+b+c+d)^{20}$",
    "$(1+\\sqrt2)(1+\\sqrt3)(1+\\sqrt5)(1+\\sqrt7)(1+\\sqrt{11})(1+\\sqrt{13})$",
    "$(a+b)(c+d)(f+g)(h+k)(m+n)(p+q)(r+s)(t+u)(v+w)(x+y)(z+A)(B+C)$",
    "$999999999999999999\\!999999999999999999$", "999999999999999999,999999999999999999",
]


@pytest.mark.parametrize("answer", ADVERSARIAL)
def test_answers_a_word_problem_never_needs_score_zero_unparsed_even_off_the_main_thread(answer):
    """A peer chooses what we grade: each of these kept math-verify busy for seconds (a power
    tower, 17 nested brackets: over 20 s in a thread, where no alarm can stop it)."""
    completion = f"{THINK}<answer>{answer}</answer>"
    results = []
    started = time.perf_counter()
    worker = threading.Thread(target=lambda: results.append(
        graded_reward(completion, "18", "think_answer", "math-verify")), daemon=True)
    worker.start()
    worker.join(10)
    assert results == [0.0] and time.perf_counter() - started < 5


def test_a_long_answer_in_words_still_reaches_math_verify():
    answer = "Janet makes 9 * 2 = 18 dollars every day at the farmers' market, which is the answer: 18"
    assert 64 < len(answer) <= MAX_VERIFY_CHARS
    assert graded_reward(f"{THINK}<answer>{answer}</answer>", "18", "think_answer", "math-verify") == 1.0


def test_a_slow_comparison_is_cut_off_in_the_main_thread():
    """Our own model's answers (MATH-500 evaluation) are not screened: math-verify's alarm,
    set to TIMEOUT_S a step, bounds them."""
    answers_equal("18", "18")  # imports math-verify first
    started = time.perf_counter()
    assert not answers_equal("2^(2^(2^(2^(2^20))))", "18")
    assert time.perf_counter() - started < 4 * TIMEOUT_S + 1


def test_gsm8k_in_the_paper_format_asks_with_the_paper_prompt_and_is_another_run():
    source = str(data_path("gsm8k"))
    paper = GSM8KTask(source, answer_format="think_answer", grader="math-verify")
    assert paper.system_prompt == PAPER_SYSTEM_PROMPT and "<think>" in paper.system_prompt
    ours = GSM8KTask(source, answer_format="think_answer")
    assert ours.system_prompt == PAPER_SYSTEM_PROMPT
    assert len({paper.fingerprint, ours.fingerprint, GSM8KTask(source).fingerprint}) == 3
    problem = paper.eval_problems(5)[0]
    assert paper.reward(f"<think>x</think><answer>{problem.answer} units</answer>", problem) == 1.0
    assert ours.reward(f"<think>x</think><answer>{problem.answer} units</answer>", problem) == 0.0


@pytest.mark.parametrize("grader", ["numeric", "math-verify"])
def test_the_arithmetic_target_in_the_paper_format_earns_its_own_reward(grader):
    """The tiny model's warm-up writes task.target: it must be a completion the task rewards."""
    task = ArithmeticTask(answer_format="think_answer", grader=grader)
    for problem in task.eval_problems(20):
        assert task.reward(task.target(problem), problem) == 1.0


def test_every_gsm8k_config_asks_the_same_task_so_their_nodes_can_meet():
    """Peers mix only with equal task fingerprints: a 24 GB config and the paper's 3B config
    must share the format, grader and prompt, or their volunteers would never meet."""
    tasks = set()
    for path in sorted(CONFIGS.glob("qwen2.5-*.yaml")):
        config = load_config(path)
        tasks.add((config.task.name, config.task.answer_format, config.task.grader, config.task.system_prompt))
        assert config.rollout.prompts_per_round * config.rollout.group_size == 144, path.name
        assert config.train.adam_betas == (0.9, 0.999), path.name
        if config.model.lora.rank:
            assert config.train.lr == 1e-4, path.name
    assert tasks == {("gsm8k", "think_answer", "math-verify", None)}
    preset = load_config(None, ["model.name=Qwen2.5-1.5B"])
    assert (preset.task.answer_format, preset.task.grader) == ("think_answer", "math-verify")
    assert yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())["task"]["answer_format"] == "answer_tag"


def test_settings_a_format_or_grader_ignores_do_not_split_runs():
    """think_answer is always strict and math-verify reads no number rules: turning those
    settings off changes no reward, so it must not change the run id either."""
    source = str(data_path("gsm8k"))
    paper = GSM8KTask(source, answer_format="think_answer", grader="math-verify")
    loose = GSM8KTask(source, answer_format="think_answer", grader="math-verify", strict_format=False, strict_numbers=False)
    assert paper.fingerprint == loose.fingerprint
    numeric = GSM8KTask(source)
    assert numeric.fingerprint != GSM8KTask(source, strict_format=False).fingerprint, "where they grade, they count"
