"""Every help screen reads as prose at 80 columns: text wraps where the terminal does, never
where a docstring or a description broke its line (a sentence cut while the next word would
still have fit on the line)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from swarmnode.cli import app

COMMANDS = [[], ["version"], ["join"], ["plan"], ["doctor"], ["health"], ["status"], ["demo"]]
WIDTH = 80


def help_screen(command: list[str], width: int = WIDTH) -> str:
    done = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": str(width), "TERMINAL_WIDTH": str(width)})
    assert done.exit_code == 0, done.output
    return done.output


def early_cuts(screen: str, width: int = WIDTH) -> list[str]:
    """Lines of a rendered help screen that end while the next line's first word would have
    fit after them: in a panel's cell (a continuation line is blank left of its text), or in
    the prose outside the panels."""
    cuts = []
    lines = screen.splitlines()
    for line, after in zip(lines, lines[1:]):
        if line.startswith("│") and after.startswith("│") and line.endswith("│") and after.endswith("│"):
            inner, next_inner = line[1:-1], after[1:-1]
            start = len(next_inner) - len(next_inner.lstrip())
            if start < 3 or not next_inner.strip() or inner[start - 1:start] != " ":
                continue  # the next line starts a row of its own, or a cell that is not this one's
            text, next_word = inner[start:].rstrip(), next_inner.split()[0]
            room = len(inner) - 1 - start - len(text)
        elif line.startswith(" ") and after.startswith(" ") and line.strip() and after.strip():
            text, next_word = line.rstrip(), after.split()[0]
            room = width - 1 - len(text)
        else:
            continue
        if text and not next_word.startswith("[") and len(next_word) + 1 <= room:  # typer puts [default: ..] below
            cuts.append(f"{line.rstrip()!r} / next: {next_word!r}")
    return cuts


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "swarmnode")
def test_no_help_screen_cuts_a_sentence_early_at_80_columns(command):
    screen = help_screen(command)
    assert all(len(line) <= WIDTH for line in screen.splitlines()), screen
    assert early_cuts(screen) == [], screen


def test_the_check_finds_a_sentence_cut_in_a_docstring():
    cut = ("│ join     Run a node: start a swarm (no --initial-peers) or join one, and     │\n"
           "│          train every round on your                                           │\n"
           "│          own and your peers' rollouts. Ctrl-C writes a checkpoint; the same  │\n")
    assert len(early_cuts(cut)) == 1 and "your" in early_cuts(cut)[0]
    prose = " Show what `join` would run on a GPU of this size: full or LoRA,\n checkpointing, micro-batch.\n"
    assert len(early_cuts(prose)) == 1
