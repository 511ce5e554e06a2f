#!/usr/bin/env python3
"""A second, independent device-side runner that follows docs/runner-contract.md.

It computes with onnx's reference evaluator (`onnx.reference.ReferenceEvaluator`) instead of
ONNX Runtime, and shares no code with verify/runner/runner.py: it is written from the
contract alone, as a user's own runner would be. The tests point a profile's
`runner = [...]` at it and expect every verify command to work unchanged.

    python alt_runner.py JOB.json      run the job, write the result file it names
    python alt_runner.py --describe    print this device's description as JSON
"""

import json
import os
import platform
import sys
import time

CONTRACT = "verify-runner"
VERSION = 1
PROVIDER = "CPUExecutionProvider"  # the only one it accepts: it computes on the CPU


def describe():
    import numpy
    import onnx

    return {"arch": platform.machine(), "os": "%s %s" % (platform.system(), platform.release()),
            "hostname": platform.node(), "python": platform.python_version(),
            "numpy": numpy.__version__, "onnxruntime": None,
            "runner": "alt_runner (onnx.reference %s)" % onnx.__version__,
            "providers": [PROVIDER], "cpu_count": os.cpu_count(),
            "free_disk_bytes": _free_disk(),
            "ld_library_path": os.environ.get("LD_LIBRARY_PATH")}


def _free_disk():
    st = os.statvfs(os.getcwd())
    return st.f_bavail * st.f_frsize


def _error(kind, message):
    return {"contract": CONTRACT, "version": VERSION, "status": "error",
            "error": {"kind": kind, "message": message}}


def run(job, job_dir):
    import numpy as np
    import onnx
    from onnx.reference import ReferenceEvaluator

    wrong = [p for p in job.get("providers") or [PROVIDER] if p != PROVIDER]
    if wrong:
        return _error("provider", "%s is not available to alt_runner (available: %s)"
                      % (wrong[0], PROVIDER))
    start = time.perf_counter()
    model = onnx.load(os.path.join(job_dir, job["model"]))
    load_ms = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    evaluator = ReferenceEvaluator(model)
    prepare_ms = (time.perf_counter() - start) * 1000
    names = [o.name for o in model.graph.output]
    out_dir = job.get("outputs_dir", "out")
    os.makedirs(os.path.join(job_dir, out_dir), exist_ok=True)
    cases = []
    for index, case in enumerate(job["cases"]):
        feeds = {name: np.load(os.path.join(job_dir, path), allow_pickle=False)
                 for name, path in case["inputs"].items()}
        timings = {"warmup_ms": [], "iter_ms": []}
        values = None
        for key, count in (("warmup_ms", int(job.get("warmup", 0))),
                           ("iter_ms", max(1, int(job.get("iterations", 1))))):
            for _ in range(count):
                start = time.perf_counter()
                values = evaluator.run(None, feeds)
                timings[key].append((time.perf_counter() - start) * 1000)
        files = {}
        for k, (name, value) in enumerate(zip(names, values)):
            rel = "%s/c%d-o%d.npy" % (out_dir, index, k)
            np.save(os.path.join(job_dir, rel), np.asarray(value), allow_pickle=False)
            files[name] = rel
        cases.append({"warmup_ms": timings["warmup_ms"], "iter_ms": timings["iter_ms"],
                      "outputs": files})
    return {"contract": CONTRACT, "version": VERSION, "status": "ok", "load_ms": load_ms,
            "prepare_ms": prepare_ms, "cases": cases}


def main(argv):
    if argv[1:] == ["--describe"]:
        print(json.dumps(describe()))
        return 0
    if len(argv) != 2:
        sys.stderr.write("usage: alt_runner.py JOB.json | --describe\n")
        return 2
    job_dir = os.path.dirname(os.path.abspath(argv[1]))
    with open(argv[1]) as fh:
        job = json.load(fh)
    if job.get("contract") != CONTRACT or job.get("version") != VERSION:
        sys.stderr.write("alt_runner speaks %s %d only\n" % (CONTRACT, VERSION))
        return 2
    try:
        result = run(job, job_dir)
    except Exception as exc:  # the contract: report it in the result, exit 0
        result = _error("runtime", "%s: %s" % (type(exc).__name__, exc))
    result["device"] = describe()
    path = os.path.join(job_dir, job.get("result", "result.json"))
    with open(path + ".tmp", "w") as fh:
        json.dump(result, fh)
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
