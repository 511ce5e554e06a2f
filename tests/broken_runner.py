#!/usr/bin/env python3
"""verify/runner/runner.py with one deliberate breach of docs/runner-contract.md, for the
conformance check's tests (`verify devices check SPEC --conformance` must catch each):

    broken_runner.py --break outputs JOB.json   every output file is off by one
    broken_runner.py --break kind JOB.json      every error result says kind "runtime"
    broken_runner.py --break schema JOB.json    ok results lack "load_ms"
    broken_runner.py --break exit JOB.json      a job it refuses (exit 2) exits 0 instead
"""

import json
import os
import subprocess
import sys

import numpy as np

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "verify", "runner",
                      "runner.py")


def main(argv):
    if len(argv) < 3 or argv[1] != "--break":
        sys.stderr.write("usage: broken_runner.py --break MODE JOB.json|--describe\n")
        return 2
    mode, rest = argv[2], argv[3:]
    status = subprocess.call([sys.executable, RUNNER, *rest])
    if rest == ["--describe"] or len(rest) != 1:
        return status
    if mode == "exit" and status == 2:
        return 0
    job_path = os.path.abspath(rest[0])
    workdir = os.path.dirname(job_path)
    with open(job_path) as fh:
        job = json.load(fh)
    result_path = os.path.join(workdir, job["result"])
    if not os.path.exists(result_path):
        return status
    with open(result_path) as fh:
        result = json.load(fh)
    if mode == "kind" and result.get("status") == "error":
        result["error"]["kind"] = "runtime"
    elif mode == "schema" and result.get("status") == "ok":
        del result["load_ms"]
    elif mode == "outputs" and result.get("status") == "ok":
        for case in result["cases"]:
            for rel in case["outputs"].values():
                path = os.path.join(workdir, rel)
                value = np.load(path)
                np.save(path, value + np.ones((), value.dtype))
    with open(result_path, "w") as fh:
        json.dump(result, fh)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
