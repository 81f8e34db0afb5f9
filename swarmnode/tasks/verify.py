"""math-verify as a grader: answers equal as mathematics ("18 dollars", "\\boxed{18}",
"9*2 = 18" all equal 18), bounded in size and time because peers choose what we grade."""

from __future__ import annotations

import logging
import re
import threading

from swarmnode.tasks.grader_process import shared_grader

MAX_VERIFY_CHARS = 256  # longer answers are not graded: parsing cost grows with them
TIMEOUT_S = 5  # per parse and per comparison, where math-verify can set its alarm (the main thread); its own
# default. 1 s cut MATH-500 references that verify in 0.9 s idle off under load; peers' answers never get
# this far unless cheap_to_grade passed them
LONGEST_NUMBER = 18  # digits: a word problem's answer, not a number sympy takes seconds to build
MAX_NESTING = 4  # brackets within brackets: 17 levels of "1/(1/(..." held a thread over 20 s

# What a word problem's answer may be written with: words, numbers, arithmetic, units, the LaTeX a
# model writes them in (delimiters, fractions, two roots, text, one small power of a number),
# shallow brackets. Not: factorials, towers of powers, sums or integrals ("9^9^9" alone keeps sympy
# busy for seconds, and in a big-integer operation no alarm can stop it, off the main thread
# nothing would); a root of a power (sympy factors the radicand: 19 s for
# sqrt{(p*q)^{99}+1}); products of more than MAX_SUM_GROUPS bracketed sums, or a power of one
# (sympy expands them: 12 letter binomials 14.6 s, (a+b+c+d)^{99} without end); digit groups that
# math-verify joins into one long number ("1\!000", "1,000"). Measured: what these bounds admit
# grades in at most 0.13 s (a red-team pass over the widened bounds found the holes above).
_ALLOWED_CHARS = re.compile(r"[A-Za-z0-9\s+\-*/=.,:;$%(){}\[\]\\'\"^_<>|&]*")
_ALLOWED_COMMANDS = frozenset({
    "boxed", "frac", "dfrac", "tfrac", "sqrt", "text", "textbf", "textrm", "textit", "mathrm", "mathbf",
    "mathit", "mbox", "displaystyle", "cdot", "times", "div", "pm", "left", "right", "approx", "circ",
    "le", "leq", "ge", "geq", "ne", "neq", "lt", "gt", "dots", "ldots", "cdots", "pi", "quad", "qquad",
    "$", "%", ",", ";", ":", " ", "(", ")", "[", "]", "{", "}",
})
MAX_ROOTS = 2  # \sqrt's in an answer: a product of roots of sums is expanded term by term
MAX_SUM_GROUPS = 2  # bracketed groups holding a + or -: their product is expanded term by term
# one ^, after a digit, raised to at most two digits (or a degree sign): 18^2, 10^{-3}, 18^\circ
_SMALL_POWER = re.compile(r"\d\s*\^\s*(\{\s*[+-]?\d{1,2}\s*\}|[+-]?\d{1,2}(?!\d)|\{?\\circ\}?)")
_DIGIT_JOINS = re.compile(r"(?<=\d)(\\,|\{,\}|,|\s+)(?=\d)")  # what math-verify may read as one number
_SUM_GROUP = re.compile(r"[(\[{][^()\[\]{}]*[+-][^()\[\]{}]*[)\]}]")  # innermost: ( ), [ ] or { }
_COMMAND = re.compile(r"\\([A-Za-z]+|.)")
_LONG_NUMBER = re.compile(rf"\d{{{LONGEST_NUMBER + 1},}}")

# math-verify logs the text it failed on at WARNING: a peer's text, so not in our logs
logging.getLogger("math_verify").setLevel(logging.ERROR)


def cheap_to_grade(answer: str) -> bool:
    """True when `answer` is short and written only with what a word problem's answer needs,
    so that grading it cannot take long whoever wrote it; graders of peers' answers score the
    rest 0 without parsing them."""
    if not answer or len(answer) > MAX_VERIFY_CHARS or "**" in answer:
        return False
    if not _ALLOWED_CHARS.fullmatch(answer) or _LONG_NUMBER.search(_DIGIT_JOINS.sub("", answer)):
        return False
    if "^" in answer and (answer.count("^") > 1 or not _SMALL_POWER.search(answer) or "sqrt" in answer):
        return False
    if answer.count("\\sqrt") > MAX_ROOTS or len(_SUM_GROUP.findall(answer)) > MAX_SUM_GROUPS:
        return False
    if _nesting(answer) > MAX_NESTING:
        return False
    return all(command in _ALLOWED_COMMANDS for command in _COMMAND.findall(answer))


def _nesting(text: str) -> int:
    """The deepest run of open brackets of any kind."""
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(0, depth - 1)
    return deepest


def _timeout_s() -> int | None:
    """math-verify stops slow work with SIGALRM, which only the main thread can set (a node
    run by `swarmnode join` grades there). Off the main thread (nodes run in threads in tests
    and in-process benches) it runs without: what reaches it from peers passed cheap_to_grade."""
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def answers_equal(predicted: str, reference: str, latex: bool = False) -> bool:
    """True when math-verify finds `predicted` mathematically equal to `reference`, graded in
    the node's grading worker (swarmnode.tasks.grader_process: killed at a hard time and
    memory limit, so no answer can hold the node however it was written).

    `latex`: both are LaTeX without delimiters (MATH-500's answers), so they are parsed inside
    $...$; otherwise as written (plain text, expressions, or LaTeX with its own delimiters).
    Anything math-verify cannot parse, or that takes too long, is not equal."""
    if not predicted or len(predicted) > MAX_VERIFY_CHARS:
        return False
    return shared_grader().equal(predicted, reference, latex)


def answers_equal_here(predicted: str, reference: str, latex: bool = False) -> bool:
    """`answers_equal` in this process (the grading worker's side)."""
    from math_verify import parse, verify  # sympy-heavy: loaded only by tasks that grade with it
    from math_verify.errors import TimeoutException

    if not predicted or len(predicted) > MAX_VERIFY_CHARS:
        return False
    wrap = (lambda text: f"${text}$") if latex else (lambda text: text)
    timeout = _timeout_s()
    try:
        gold = parse(wrap(reference), parsing_timeout=timeout)
        guess = parse(wrap(predicted), parsing_timeout=timeout)
        return bool(gold) and bool(guess) and bool(verify(gold, guess, timeout_seconds=timeout))
    except (Exception, TimeoutException):  # noqa: BLE001 - a grader never fails the node on what a peer wrote
        return False
