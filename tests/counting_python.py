#!/usr/bin/env python3
"""A python that counts its starts, for the tests that count runner processes.

    python counting_python.py LOG PROGRAM ARGS...

appends one line to LOG (its pid and the arguments, as JSON), then becomes
`python PROGRAM ARGS...` (exec: the same process, so the pid is the runner's). A profile
names it as its python (`python = [PYTHON, counting_python.py, LOG]`) or in front of a runner.
"""

import json
import os
import sys


def main() -> None:
    log, rest = sys.argv[1], sys.argv[2:]
    with open(log, "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "argv": rest}) + "\n")
    os.execv(sys.executable, [sys.executable, *rest])


if __name__ == "__main__":
    main()
