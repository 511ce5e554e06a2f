#!/usr/bin/env python3
"""A test device runner that follows the runner contract but corrupts its outputs with NaN.

It runs verify's own runner (loaded from its file, as a device would have it), then writes NaN
into the first `--count` elements of every float output it produced, or with `--drop` leaves
every output out of its result (a broken runner). verify itself does not know: it must find
the fault by checking the outputs against the ground truth.

    python nan_runner.py [--count N | --drop] JOB.json
"""

import importlib.util
import json
import os
import sys

import numpy as np

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                      "verify", "runner", "runner.py")


def main(argv: list[str]) -> int:
    count, drop = 3, False
    if len(argv) == 4 and argv[1] == "--count":
        count = int(argv[2])
        argv = [argv[0], argv[3]]
    elif len(argv) == 3 and argv[1] == "--drop":
        drop = True
        argv = [argv[0], argv[2]]
    spec = importlib.util.spec_from_file_location("device_runner", RUNNER)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    status = runner.main(argv)
    if len(argv) != 2 or argv[1] == "--describe":
        return status
    workdir = os.path.dirname(os.path.abspath(argv[1]))
    with open(os.path.join(workdir, "result.json")) as fh:
        result = json.load(fh)
    if drop:
        for case in result.get("cases", []):
            case["outputs"] = {}
        with open(os.path.join(workdir, "result.json"), "w") as fh:
            json.dump(result, fh)
        return status
    for case in result.get("cases", []):
        for rel in case["outputs"].values():
            path = os.path.join(workdir, rel)
            value = np.load(path, allow_pickle=False)
            if value.dtype.kind == "f":
                value.reshape(-1)[:count] = np.nan
                np.save(path, value, allow_pickle=False)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
