#!/usr/bin/env python3
"""verify's device-side runner: reads a job file, runs ONNX Runtime, writes a result file.

This file is copied to the device as is. It imports only the standard library, numpy and
onnxruntime, never the verify package. The contract it follows (job and result formats) is
documented in docs/runner-contract.md; a native runner following the same contract can
replace it.

    python runner.py JOB.json      run the job; writes the result file the job names
    python runner.py --describe    print a JSON description of this device and exit
"""

import json
import os
import platform
import sys
import time
import traceback

CONTRACT = "verify-runner"
CONTRACT_VERSION = 1

OPT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
PROVIDER_PACKAGES = {
    "CUDAExecutionProvider": "onnxruntime-gpu",
    "TensorrtExecutionProvider": "onnxruntime-gpu (with TensorRT)",
    "ROCMExecutionProvider": "onnxruntime-rocm",
    "OpenVINOExecutionProvider": "onnxruntime-openvino",
    "DmlExecutionProvider": "onnxruntime-directml",
    "QNNExecutionProvider": "onnxruntime-qnn",
}


class JobError(Exception):
    """An error the runner can attribute: kind is model, input, provider or runtime."""

    def __init__(self, kind, message):
        Exception.__init__(self, message)
        self.kind = kind


def describe():
    info = {
        "arch": platform.machine(),
        "os": platform.system() + " " + platform.release(),
        "hostname": platform.node(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except Exception as exc:  # report, don't crash: describe must always answer
        info["numpy"] = None
        info["numpy_error"] = str(exc)
    try:
        import onnxruntime
        info["onnxruntime"] = onnxruntime.__version__
        info["providers"] = list(onnxruntime.get_available_providers())
    except Exception as exc:
        info["onnxruntime"] = None
        info["providers"] = []
        info["onnxruntime_error"] = str(exc)
    try:
        st = os.statvfs(os.getcwd())
        info["free_disk_bytes"] = st.f_bavail * st.f_frsize
    except (OSError, AttributeError):
        info["free_disk_bytes"] = None
    return info


def _now_ms(t0):
    return (time.perf_counter() - t0) * 1000.0


def make_session(ort, model_bytes, job):
    so = ort.SessionOptions()
    level = job.get("opt_level", "disable")
    if level not in OPT_LEVELS:
        raise JobError("input", "unknown opt_level %r" % level)
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[level])
    if job.get("threads"):
        so.intra_op_num_threads = int(job["threads"])
    if job.get("inter_op_threads"):
        so.inter_op_num_threads = int(job["inter_op_threads"])
    if job.get("optimized_model_path"):
        so.optimized_model_filepath = job["optimized_model_path"]
    for key, value in (job.get("session_config") or {}).items():
        so.add_session_config_entry(str(key), str(value))
    if job.get("profile"):
        so.enable_profiling = True
        so.profile_file_prefix = job["profile"] + ".raw"
    providers = list(job.get("providers") or ["CPUExecutionProvider"])
    available = ort.get_available_providers()
    for p in providers:
        if p not in available:
            hint = PROVIDER_PACKAGES.get(p)
            raise JobError("provider", "%s is not available on this device (available: %s)%s" % (
                p, ", ".join(available), "; it comes with the %s package" % hint if hint else ""))
    options = job.get("provider_options") or {}
    provider_list = [(p, dict(options.get(p, {}))) for p in providers]
    try:
        return ort.InferenceSession(model_bytes, sess_options=so, providers=provider_list)
    except Exception as exc:
        text = str(exc)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text \
                or "is not a registered function/op" in text or "No Op registered" in text:
            raise JobError("model", "onnxruntime %s cannot run this model: %s"
                           % (ort.__version__, _first_line(text)))
        if "CUDA" in text or "provider" in text.lower():
            raise JobError("provider", _first_line(text))
        raise JobError("model", "onnxruntime could not load the model: %s" % _first_line(text))


def _first_line(text):
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else str(text)


def load_inputs(np, case, workdir):
    feeds = {}
    for name, rel in case["inputs"].items():
        feeds[name] = np.load(os.path.join(workdir, rel), allow_pickle=False)
    return feeds


def run_once(sess, feeds, output_names):
    try:
        return sess.run(output_names, feeds)
    except Exception as exc:
        text = str(exc)
        if "INVALID_ARGUMENT" in text or "Invalid rank" in text or "Got invalid dimensions" in text \
                or "Unexpected input data type" in text:
            raise JobError("input", _first_line(text))
        raise JobError("runtime", _first_line(text))


def run_job(job, workdir):
    import numpy as np
    import onnxruntime as ort

    result = {"contract": CONTRACT, "version": CONTRACT_VERSION, "status": "ok", "cases": []}
    t0 = time.perf_counter()
    with open(os.path.join(workdir, job["model"]), "rb") as fh:
        model_bytes = fh.read()
    result["load_ms"] = _now_ms(t0)
    t0 = time.perf_counter()
    sess = make_session(ort, model_bytes, job)
    result["prepare_ms"] = _now_ms(t0)
    del model_bytes
    output_names = [o.name for o in sess.get_outputs()]
    out_dir = os.path.join(workdir, job.get("outputs_dir", "out"))
    os.makedirs(out_dir, exist_ok=True)
    warmup = int(job.get("warmup", 1))
    iterations = max(1, int(job.get("iterations", 1)))
    perf = time.perf_counter
    for ci, case in enumerate(job["cases"]):
        feeds = load_inputs(np, case, workdir)
        warm_ms = []
        for _ in range(warmup):
            t = perf()
            run_once(sess, feeds, output_names)
            warm_ms.append((perf() - t) * 1000.0)
        iter_ms = []
        outputs = None
        for _ in range(iterations):
            t = perf()
            outputs = run_once(sess, feeds, output_names)
            iter_ms.append((perf() - t) * 1000.0)
        files = {}
        for k, (name, value) in enumerate(zip(output_names, outputs)):
            rel = os.path.join(job.get("outputs_dir", "out"), "case%d_out%d.npy" % (ci, k))
            np.save(os.path.join(workdir, rel), np.asarray(value), allow_pickle=False)
            files[name] = rel
        result["cases"].append({"warmup_ms": warm_ms, "iter_ms": iter_ms, "outputs": files})
    if job.get("profile"):
        # onnxruntime cannot start profiling after the session exists, so the trace holds the
        # warmup runs too: say which model_run events they are (0-based, in time order) in the
        # trace's otherData, where Perfetto ignores it and `verify profile` drops them.
        raw = sess.end_profiling()
        with open(raw) as fh:
            events = json.load(fh)
        os.remove(raw)
        per_case = warmup + iterations
        warm = [ci * per_case + k for ci in range(len(job["cases"])) for k in range(warmup)]
        write_json_atomic(os.path.join(workdir, job["profile"]), {
            "traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"verify_warmup_runs": warm, "verify_timed_runs":
                          len(job["cases"]) * iterations, "onnxruntime": ort.__version__}})
        result["profile"] = job["profile"]
        result["profile_warmup_runs"] = warmup
    return result


def write_json_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, allow_nan=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv):
    if len(argv) == 2 and argv[1] == "--describe":
        json.dump(describe(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    if len(argv) != 2:
        sys.stderr.write("usage: runner.py JOB.json | --describe\n")
        return 2
    job_path = os.path.abspath(argv[1])
    workdir = os.path.dirname(job_path)
    with open(job_path) as fh:
        job = json.load(fh)
    if job.get("contract") != CONTRACT or int(job.get("version", 0)) > CONTRACT_VERSION:
        sys.stderr.write("runner speaks %s version %d; the job is %s version %s\n" % (
            CONTRACT, CONTRACT_VERSION, job.get("contract"), job.get("version")))
        return 2
    result_path = os.path.join(workdir, job.get("result", "result.json"))
    try:
        result = run_job(job, workdir)
    except JobError as exc:
        result = {"contract": CONTRACT, "version": CONTRACT_VERSION, "status": "error",
                  "error": {"kind": exc.kind, "message": str(exc)}}
    except Exception as exc:  # anything else is a runner failure; keep the trace for the host
        result = {"contract": CONTRACT, "version": CONTRACT_VERSION, "status": "error",
                  "error": {"kind": "runtime", "message": "%s: %s" % (type(exc).__name__, exc),
                            "traceback": traceback.format_exc()}}
    result["device"] = describe()
    write_json_atomic(result_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
