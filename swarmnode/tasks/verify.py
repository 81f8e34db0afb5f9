"""math-verify as a grader: answers equal as mathematics ("18 dollars", "\\boxed{18}",
"9*2 = 18" all equal 18), bounded in size and time because peers choose what we grade."""

from __future__ import annotations

import threading

MAX_VERIFY_CHARS = 256  # longer answers are not graded: parsing cost grows with them
TIMEOUT_S = 2  # per parse and per comparison; "2^(2^(2^(2^(2^20))))" alone takes math-verify's 5 s default


def _timeout_s() -> int | None:
    """math-verify stops slow work with SIGALRM, which only the main thread can set (a node
    run by `swarmnode join` grades there). Nodes run in threads (tests, in-process benches) grade
    without it, bounded by MAX_VERIFY_CHARS only."""
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def answers_equal(predicted: str, reference: str, latex: bool = False) -> bool:
    """True when math-verify finds `predicted` mathematically equal to `reference`.

    `latex`: both are LaTeX without delimiters (MATH-500's answers), so they are parsed inside
    $...$; otherwise as written (plain text, expressions, or LaTeX with its own delimiters).
    Anything math-verify cannot parse, or that takes too long, is not equal."""
    from math_verify import parse, verify  # sympy-heavy: loaded only by tasks that grade with it

    if not predicted or len(predicted) > MAX_VERIFY_CHARS:
        return False
    wrap = (lambda text: f"${text}$") if latex else (lambda text: text)
    timeout = _timeout_s()
    try:
        gold = parse(wrap(reference), parsing_timeout=timeout)
        guess = parse(wrap(predicted), parsing_timeout=timeout)
        return bool(gold) and bool(guess) and bool(verify(gold, guess, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - a grader never fails the node on what a peer wrote
        return False
