#!/usr/bin/env python3
"""A runner that serves (docs/runner-contract.md, "Serve") and dies on its Nth job.

    python dying_server.py N --describe | --serve | JOB.json

Jobs run with verify's own runner (loaded from its file, as a device would have it); the Nth
job a serving process is given ends the process with status 9 and a line on stderr, no
result written: a runner lost in the middle of a command. One-shot jobs never die.
"""

import importlib.util
import json
import os
import sys

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                      "verify", "runner", "runner.py")


def main(argv):
    spec = importlib.util.spec_from_file_location("device_runner", RUNNER)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    die_at, rest = int(argv[1]), argv[2:]
    if rest == ["--describe"]:
        info = runner.describe()
        info["serve"] = True
        print(json.dumps(info))
        return 0
    if rest == ["--serve"]:
        done = []

        def run(path):
            done.append(path)
            if len(done) == die_at:
                sys.stderr.write("dying_server: lost the accelerator\n")
                sys.stderr.flush()
                os._exit(9)
            return runner.run_job_file(path)

        return runner.serve(sys.stdin, run)
    return runner.run_job_file(rest[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
