"""The process that runs math-verify for a node (swarmnode.tasks.grader_process starts it):
one JSON request a line on stdin, one JSON answer a line on stdout.

Here grading runs on the process's main thread, so math-verify's own alarms stop slow
parsing; what they cannot stop (big-integer work, memory) the parent stops by killing this
process at its hard limits.

    request: {"predicted": str, "reference": str, "latex": bool}
    answer:  {"equal": bool}    (the first line, before any request: {"ready": true})
"""

from __future__ import annotations

import json
import sys

from swarmnode.tasks.grader_process import limit_memory
from swarmnode.tasks.verify import answers_equal_here


def serve(lines: object = sys.stdin, out: object = sys.stdout) -> None:
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in lines:
        try:
            request = json.loads(line)
            equal = answers_equal_here(str(request["predicted"]), str(request["reference"]), bool(request["latex"]))
        except (ValueError, KeyError, TypeError):
            equal = False
        out.write(json.dumps({"equal": equal}) + "\n")
        out.flush()


if __name__ == "__main__":
    limit_memory()  # before the first answer imports sympy (verify imports math-verify when it grades)
    serve()
