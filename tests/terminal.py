"""What a test needs to send Ctrl-C to a process it starts, as a terminal would.

A shell starts a background job with SIGINT ignored, and an ignored signal stays ignored across
exec: a suite run from one (`bash .ci/run &`, nohup, some CI runners) would start nodes that
never see the test's SIGINT and train on after the test has failed. A test that interrupts a
process starts it with `preexec_fn=ctrl_c_as_in_a_terminal`.
"""

from __future__ import annotations

import signal


def ctrl_c_as_in_a_terminal() -> None:
    """Run in the child before exec: SIGINT back at its default, whatever the suite inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
