"""Pull the final answer out of a completion and compare numbers after normalising them."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from swarmnode.tasks.base import AnswerFormat, Grader
from swarmnode.tasks.verify import MAX_VERIFY_CHARS, answers_equal, cheap_to_grade

MAX_ANSWER_CHARS = 64
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER_NOISE = re.compile(r"[\s,$]|\\\$|\\,|\\!")
_SPLIT_DIGITS = re.compile(r"\d\s+\d")
_BAD_COMMA = re.compile(r"(?<!\d)\d{4,},|,(?!\d{3}(?!\d))|(?<!\d),")  # not thousands groups
_PAPER_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_PAPER_ENDING = re.compile(r"</answer>\s?")  # the authors' own test of what may follow the answer
_BOXED_TAIL = re.compile(r"[\s.$]*(\\\][\s.]*)?")  # what may follow \boxed{} when strict: "$.", "\]"


def extract_answer(
    completion: str, answer_format: AnswerFormat, strict: bool = False, max_chars: int = MAX_ANSWER_CHARS
) -> str | None:
    """The single final answer, or None when the completion is not well formed.

    Well formed means exactly one answer block (tag or \\boxed{}), closed, and not empty.
    Two answers are ambiguous, so they count as malformed rather than "take the last".
    `strict`: the answer block also ends the completion (whitespace after it, and for
    \\boxed{} closing punctuation), so no text can ride on a correct answer's reward.
    think_answer (the paper's format) is always strict, by the authors' binary rule (see
    _paper_answer): nothing the authors would score 0 gets an answer here.
    """
    if answer_format == "think_answer":
        block = _paper_answer(completion)
        if block is None:
            return None
        content = block.strip()
    elif answer_format == "answer_tag":
        if completion.count("<answer>") != 1 or completion.count("</answer>") != 1:
            return None
        match = _ANSWER_TAG.search(completion)
        content = match.group(1).strip() if match else ""
        if strict and match and completion[match.end() :].strip():
            return None
    elif answer_format == "boxed":
        contents = _boxed_contents(completion)
        if len(contents) != 1:
            return None
        content = contents[0].strip()
        end = completion.find("\\boxed{") + len("\\boxed{") + len(contents[0]) + 1
        if strict and not _BOXED_TAIL.fullmatch(completion[end:]):
            return None
    else:
        raise ValueError(f"unknown answer format {answer_format!r}")
    if not content or len(content) > max_chars:
        return None
    return content


def _paper_answer(completion: str) -> str | None:
    """The inner text of the answer block where the authors' binary reward (HeterogeneousRL,
    src/reward.py) can pay, else None: at most one of each tag, one <answer>..</answer> block,
    a <think> opened before a </think>, and `</answer>` ending the completion or followed by one
    whitespace character. Their rule does not order the answer after the thinking, so neither
    does this."""
    if any(completion.count(tag) > 1 for tag in _PAPER_TAGS):
        return None
    opened, closed = completion.find("<think>"), completion.find("</think>")
    if opened < 0 or closed <= opened:
        return None
    blocks = _ANSWER_TAG.findall(completion)
    ending = _PAPER_ENDING.search(completion)
    if len(blocks) != 1 or ending is None or ending.end() != len(completion):
        return None
    return blocks[0]


def _boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...}, with nested braces balanced; unclosed ones are skipped."""
    found: list[str] = []
    start = text.find("\\boxed{")
    while start != -1:
        depth, i = 1, start + len("\\boxed{")
        begin = i
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            return found + ["\0unclosed"]  # makes the completion malformed
        found.append(text[begin : i - 1])
        start = text.find("\\boxed{", i)
    return found


def parse_number(text: str, strict: bool = False) -> Decimal | None:
    """'$1,234.50' -> Decimal('1234.50'); None for anything that is not one plain number.

    `strict`: whitespace may not split digits ("7 2" is not 72) and commas must separate
    thousands ("7,2" is not 72), so a reward cannot be earned by a string that only becomes
    the answer once its noise is deleted."""
    if strict:
        plain = text.replace("\\,", ",").strip()  # LaTeX's thin space between thousands is a comma
        if _SPLIT_DIGITS.search(plain) or _BAD_COMMA.search(plain):
            return None
    cleaned = _NUMBER_NOISE.sub("", text)
    cleaned = cleaned.removeprefix("\\text{").removesuffix("}") if "\\text{" in cleaned else cleaned
    cleaned = cleaned.rstrip(".").removesuffix("%")
    if not re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)", cleaned):
        return None
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def numeric_reward(
    completion: str, reference: str, answer_format: AnswerFormat, strict: bool = False, strict_numbers: bool = False
) -> float:
    """1.0 iff the completion is well formed and its number equals the reference number."""
    answer = extract_answer(completion, answer_format, strict)
    if answer is None:
        return 0.0
    got, want = parse_number(answer, strict_numbers), parse_number(reference)
    return 1.0 if got is not None and want is not None and got == want else 0.0


def graded_reward(
    completion: str,
    reference: str,
    answer_format: AnswerFormat,
    grader: Grader,
    strict: bool = False,
    strict_numbers: bool = False,
) -> float:
    """1.0 iff the completion is well formed and its answer equals the reference by `grader`:
    numeric (one plain number, compared exactly) or math-verify (equal as mathematics; an
    answer written with more than a word problem needs scores 0 unparsed, see cheap_to_grade)."""
    if grader == "numeric":
        return numeric_reward(completion, reference, answer_format, strict, strict_numbers)
    if grader != "math-verify":
        raise ValueError(f"unknown grader {grader!r}")
    answer = extract_answer(completion, answer_format, strict, max_chars=MAX_VERIFY_CHARS)
    return 1.0 if answer is not None and cheap_to_grade(answer) and answers_equal(answer, reference) else 0.0
