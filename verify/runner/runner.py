#!/usr/bin/env python3
"""verify's device-side runner: reads a job file, runs ONNX Runtime, writes a result file.

This file is copied to the device as is. It imports only the standard library, numpy and
onnxruntime, never the verify package. The contract it follows (job and result formats) is
documented in docs/runner-contract.md; a native runner following the same contract can
replace it.

    python runner.py JOB.json      run the job; writes the result file the job names
    python runner.py --describe    print a JSON description of this device and exit
    python runner.py --serve       run jobs one after another: first a line {"verify-serve":
                                   1, "ready": true} on stdout once onnxruntime is imported;
                                   then one line in per job on stdin, {"job": "/abs/job.json"},
                                   and when its result file is written, one line out,
                                   {"verify-serve": 1, "job": the same path, "status": 0 (2: a
                                   job this runner cannot read)}; exit 0 at the end of stdin
    python runner.py --describe --probe P[,P...]
                                   also try to create a session with each provider P and
                                   report, under "probe", null (it works) or why it does not

A job with a "dump" entry captures intermediate tensors instead of timing: the graph is cut
into consecutive segments whose live tensors fit the memory budget, each built here as a model
of its own at the protobuf wire level (no onnx package needed) and run on the boundary values
the previous segment left, so every node runs once; each tensor is streamed as an .npy image
into its case's pack file (NpyPack; see capture_segments and docs/runner-contract.md,
"Segments").
A timed job with a "dump_first" entry (a dump entry plus its result file's name) first runs
that dump in a forked child, then times as usual (see forked_dump).
"""

import base64
import collections
import json
import math
import mmap
import os
import platform
import re
import sys
import tempfile
import time
import traceback

try:  # imported as verify.runner.runner (the host's tools and tests)
    from . import contract as C
except (ImportError, SystemError, ValueError):  # a program on the device: contract.py is beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import contract as C

# onnxruntime's session option naming the folder external data is read from (job key
# "external_data": that folder, relative to the work directory)
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"

# every key the runner reads or writes, with its default
J, R, D, CR, DR, T = C.Job, C.Result, C.Describe, C.CaseResult, C.DumpResult, C.Trace
CONTRACT, CONTRACT_VERSION = C.CONTRACT, C.VERSION

# the contract's names (C.OPT_LEVELS) -> onnxruntime's GraphOptimizationLevel members
OPT_LEVELS = dict(zip(C.OPT_LEVELS, (
    "ORT_DISABLE_ALL",
    "ORT_ENABLE_BASIC",
    "ORT_ENABLE_EXTENDED",
    "ORT_ENABLE_LAYOUT",  # extended plus layout rewrites (NCHWc); onnxruntime >= 1.21
    "ORT_ENABLE_ALL")))
PROVIDER_PACKAGES = {
    "CUDAExecutionProvider": "onnxruntime-gpu",
    "TensorrtExecutionProvider": "onnxruntime-gpu (with TensorRT)",
    "ROCMExecutionProvider": "onnxruntime-rocm",
    "OpenVINOExecutionProvider": "onnxruntime-openvino",
    "DmlExecutionProvider": "onnxruntime-directml",
    "QNNExecutionProvider": "onnxruntime-qnn",
}


# A one-node float model (Identity, opset 13, IR 7): enough for onnxruntime to build a session
# with a provider, so --describe --probe tells a provider that is listed from one that loads.
PROBE_MODEL = base64.b64decode(
    "CAcSBnZlcmlmeTo7ChAKAXgSAXkiCElkZW50aXR5EgVwcm9iZVoPCgF4EgoKCAgBEgQKAggBYg8KAXkSCgoICAESBAoC"
    "CAFCBAoAEA0=")


class JobError(Exception):
    """An error the runner can attribute: kind is model, input, provider or runtime."""

    def __init__(self, kind, message):
        Exception.__init__(self, message)
        self.kind = kind


def _cpu_model():
    """The processor's model name, where the OS says (Linux: /proc/cpuinfo), else ''."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor()


def _machine_id():
    """A hash of the OS install's machine id (not the id itself), where there is one."""
    import hashlib
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, "rb") as fh:
                raw = fh.read().strip()
        except OSError:
            continue
        if raw:
            return hashlib.sha256(b"verify-machine:" + raw).hexdigest()[:16]
    return ""


def describe():
    info = {
        D.ARCH: platform.machine(),
        D.OS: platform.system() + " " + platform.release(),
        D.HOSTNAME: platform.node(),
        D.PYTHON: platform.python_version(),
        D.CPU_COUNT: os.cpu_count(),
        D.CPU: _cpu_model(),
        D.MACHINE_ID: _machine_id(),
    }
    try:
        import numpy
        info[D.NUMPY] = numpy.__version__
    except Exception as exc:  # report, don't crash: describe must always answer
        info[D.NUMPY] = None
        info[D.NUMPY_ERROR] = str(exc)
    try:
        import onnxruntime
        info[D.ONNXRUNTIME] = onnxruntime.__version__
        info[D.PROVIDERS] = list(onnxruntime.get_available_providers())
    except Exception as exc:
        info[D.ONNXRUNTIME] = None
        info[D.PROVIDERS] = []
        info[D.ONNXRUNTIME_ERROR] = str(exc)
    try:
        st = os.statvfs(os.getcwd())
        info[D.FREE_DISK_BYTES] = st.f_bavail * st.f_frsize
    except (OSError, AttributeError):
        info[D.FREE_DISK_BYTES] = None
    return info


def _now_ms(t0):
    return (time.perf_counter() - t0) * 1000.0


def make_session(ort, model_bytes, job):
    so = ort.SessionOptions()
    # onnxruntime's own log goes to this process's stderr; verify shows the runner's errors
    # from the result file, so by default only errors are logged ("ort_log_severity" 0-4)
    severity = J.ORT_LOG_SEVERITY.of(job)
    if severity not in (0, 1, 2, 3, 4):
        severity = J.ORT_LOG_SEVERITY.default
    so.log_severity_level = severity
    # While the session is made, warnings are logged too: they are captured (never shown
    # unless asked for or the session fails) and say why a provider fell back (CUDA, cuDNN).
    _default_log_severity(ort, min(severity, 2))
    level = J.OPT_LEVEL.of(job)
    if level not in OPT_LEVELS:
        raise JobError("input", "unknown opt_level %r" % level)
    if not hasattr(ort.GraphOptimizationLevel, OPT_LEVELS[level]):
        raise JobError("provider", "onnxruntime %s here has no %r optimization level (%s); "
                       "use extended or all" % (ort.__version__, level, OPT_LEVELS[level]))
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[level])
    if J.THREADS.of(job):
        so.intra_op_num_threads = int(J.THREADS.of(job))
    if J.INTER_OP_THREADS.of(job):
        so.inter_op_num_threads = int(J.INTER_OP_THREADS.of(job))
    if J.OPTIMIZED_MODEL_PATH.of(job):
        so.optimized_model_filepath = J.OPTIMIZED_MODEL_PATH.of(job)
    external = J.EXTERNAL_DATA.of(job)
    if external:
        # the folder of the model's external data files (linked under their locations): read
        # from there whatever file or bytes the model comes as (a segment, a rewrite)
        so.add_session_config_entry(EXTERNAL_FOLDER_KEY, external)
        if not isinstance(model_bytes, (bytes, bytearray, memoryview)):
            with open(model_bytes, "rb") as fh:
                model_bytes = fh.read()
        if J.OPTIMIZED_MODEL_PATH.of(job):  # over 2 GiB it cannot be one message either
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name",
                os.path.basename(J.OPTIMIZED_MODEL_PATH.of(job)) + ".data")
    if J.NO_CPU_ARENA.of(job):
        so.enable_cpu_mem_arena = False
    for key, value in J.SESSION_CONFIG.of(job).items():
        so.add_session_config_entry(str(key), str(value))
    if J.PROFILE.of(job):
        so.enable_profiling = True
        so.profile_file_prefix = J.PROFILE.of(job) + ".raw"
    providers = list(J.PROVIDERS.of(job) or J.PROVIDERS.default)
    available = ort.get_available_providers()
    for p in providers:
        if p not in available:
            hint = PROVIDER_PACKAGES.get(p)
            raise JobError("provider", "%s is not available on this device (available: %s)%s" % (
                p, ", ".join(available), "; it comes with the %s package" % hint if hint else ""))
    options = J.PROVIDER_OPTIONS.of(job)
    provider_list = [(p, dict(options.get(p, {}))) for p in providers]
    try:
        try:
            sess, log = _with_stderr_captured(lambda: ort.InferenceSession(
                model_bytes, sess_options=so, providers=provider_list))
        finally:
            _default_log_severity(ort, severity)
        if severity < 3:  # the user asked for onnxruntime's log
            sys.stderr.write(log)
    except Exception as exc:
        text = str(exc)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text \
                or "is not a registered function/op" in text or "No Op registered" in text:
            raise JobError("model", "onnxruntime %s cannot run this model: %s"
                           % (ort.__version__, _first_line(text)))
        if "CUDA" in text or "provider" in text.lower():
            raise JobError("provider", _first_line(text))
        raise JobError("model", "onnxruntime could not load the model: %s" % _first_line(text))
    problem = provider_problem(ort, providers, sess.get_providers(), log)
    if problem:
        raise JobError("provider", problem)
    return sess


def _default_log_severity(ort, severity):
    if hasattr(ort, "set_default_logger_severity"):
        ort.set_default_logger_severity(severity)


def _with_stderr_captured(make):
    """Call make() with file descriptor 2 sent to a temporary file, where onnxruntime's C++
    logger writes, and Python's sys.stdout to a buffer (its Python layer prints its provider
    fallback there, which would corrupt --describe's JSON); return (make's value, the text
    written to either). On an exception the text goes to stderr (the host shows its tail)."""
    import contextlib
    import io
    sys.stderr.flush()
    saved = os.dup(2)
    printed = io.StringIO()
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        failed = True
        try:
            with contextlib.redirect_stdout(printed):
                value = make()
            failed = False
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace") + printed.getvalue()
            if failed:
                sys.stderr.write(text)
    return value, text


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def provider_problem(ort, requested, created, log):
    """Why a requested provider is missing from the session onnxruntime made, or None.

    onnxruntime does not fail when a provider's libraries cannot be loaded (a CUDA build
    without the CUDA or cuDNN libraries): it logs an error and falls back to the CPU, so a run
    on "cuda" would silently run on the CPU. The reason comes from what it logged."""
    missing = [p for p in requested if p not in created]
    if not missing:
        return None
    log = _ANSI.sub("", log)
    loaded = re.search(r"Failed to load library (\S+) with error: ([^\n]+)", log)
    needs = re.search(r"Require ([^\n]*?\.\*(?: and [^\n]*?\.\*)?)\.", log)
    install = re.search(r"(Please install \S+ libraries)", log)
    reason = []
    if loaded:
        reason.append("%s: %s" % (os.path.basename(loaded.group(1)), loaded.group(2).strip()))
    if needs:
        reason.append("it requires %s" % needs.group(1))
    elif install:
        reason.append(install.group(1).lower().replace("please install", "it needs the"))
    if not reason:
        lines = [ln for ln in log.splitlines() if missing[0] in ln or "rror" in ln]
        reason.append(_first_line(lines[0]) if lines else "onnxruntime gave no reason")
    return ("%s could not be created by onnxruntime %s (%s); the session fell back to %s, "
            "so nothing would run on %s" % (", ".join(missing), ort.__version__,
                                            "; ".join(reason), ", ".join(created) or "nothing",
                                            "it" if len(missing) == 1 else "them"))


def probe_providers(providers):
    """For --describe --probe: {provider: None if a session can be made with it, else why}."""
    import onnxruntime as ort
    found = {}
    for p in providers:
        try:
            make_session(ort, PROBE_MODEL, {J.PROVIDERS: [p, C.CPU_PROVIDER]
                                            if p != C.CPU_PROVIDER else [p]})
            found[p] = None
        except JobError as exc:
            found[p] = str(exc)
    return found


def _first_line(text):
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else str(text)


def load_inputs(np, case, workdir):
    feeds = {}
    for name, rel in case[C.JobCase.INPUTS].items():
        feeds[name] = np.load(os.path.join(workdir, rel), allow_pickle=False)
    return feeds


def run_once(sess, feeds, output_names):
    try:
        return sess.run(output_names, feeds)
    except Exception as exc:
        raise _run_error(exc)


def _run_error(exc):
    text = str(exc)
    if "INVALID_ARGUMENT" in text or "Invalid rank" in text or "Got invalid dimensions" in text \
            or "Unexpected input data type" in text:
        return JobError("input", _first_line(text))
    return JobError("runtime", _first_line(text))


PROBE_ROUNDS = 4000


def control_probe():
    """A fixed amount of single-threaded CPU work, timed right before each timed iteration.

    It shares the iteration's moment, process and core, so a busy machine slows both alike;
    `verify ci` divides each iteration by the probe beside it (docs/suite.md, "control").
    Pure Python on purpose: no library version or thread pool changes what it measures.
    """
    x = 0
    for i in range(PROBE_ROUNDS):
        x = (x + i * i) & 0xFFFF
    return x


def run_job(job, workdir):
    import numpy as np
    import onnxruntime as ort

    if J.EXTERNAL_DATA.of(job):  # relative to the work directory
        job = dict(job)
        job[J.EXTERNAL_DATA] = os.path.abspath(os.path.join(workdir, J.EXTERNAL_DATA.of(job)))

    result = C.new_result()
    result[R.CASES] = []
    if J.DUMP_FIRST.of(job) and not J.DUMP.of(job):
        result[R.DUMP_RESULT] = forked_dump(job, workdir)
    if J.OPTIMIZED_MODEL_PATH.of(job):
        job = dict(job)
        job[J.OPTIMIZED_MODEL_PATH] = os.path.join(workdir, J.OPTIMIZED_MODEL_PATH.of(job))
    if J.DUMP.of(job):  # a dump job captures layers only (in its own process: see run_dump)
        result[R.LOAD_MS] = result[R.PREPARE_MS] = 0.0
        result[R.CASES] = [{CR.WARMUP_MS: [], CR.ITER_MS: [], CR.OUTPUTS: {}}
                           for _ in job[J.CASES]]
        run_dump(np, ort, job, workdir, result)
        return result
    t0 = time.perf_counter()
    with open(os.path.join(workdir, job[J.MODEL]), "rb") as fh:
        model_bytes = fh.read()
    result[R.LOAD_MS] = _now_ms(t0)
    t0 = time.perf_counter()
    sess = make_session(ort, model_bytes, job)
    result[R.PREPARE_MS] = _now_ms(t0)
    del model_bytes
    output_names = [o.name for o in sess.get_outputs()]
    out_rel = J.OUTPUTS_DIR.of(job)
    os.makedirs(os.path.join(workdir, out_rel), exist_ok=True)
    warmup = int(J.WARMUP.of(job))
    iterations = max(1, int(J.ITERATIONS.of(job)))
    perf = time.perf_counter
    control = bool(J.CONTROL_PROBE.of(job))
    for ci, case in enumerate(job[J.CASES]):
        feeds = load_inputs(np, case, workdir)
        warm_ms = []
        for _ in range(warmup):
            t = perf()
            run_once(sess, feeds, output_names)
            warm_ms.append((perf() - t) * 1000.0)
        iter_ms = []
        control_ms = []
        outputs = None
        for _ in range(iterations):
            if control:
                t = perf()
                control_probe()
                control_ms.append((perf() - t) * 1000.0)
            t = perf()
            outputs = run_once(sess, feeds, output_names)
            iter_ms.append((perf() - t) * 1000.0)
        files = {}
        for k, (name, value) in enumerate(zip(output_names, outputs)):
            rel = os.path.join(out_rel, "case%d_out%d.npy" % (ci, k))
            np.save(os.path.join(workdir, rel), np.asarray(value), allow_pickle=False)
            files[name] = rel
        record = {CR.WARMUP_MS: warm_ms, CR.ITER_MS: iter_ms, CR.OUTPUTS: files}
        if control:
            record[CR.CONTROL_MS] = control_ms
        result[R.CASES].append(record)
    if J.PROFILE.of(job):
        # onnxruntime cannot start profiling after the session exists, so the trace holds the
        # warmup runs too: say which model_run events they are (0-based, in time order) in the
        # trace's otherData, where Perfetto ignores it and `verify profile` drops them.
        raw = sess.end_profiling()
        with open(raw) as fh:
            events = json.load(fh)
        os.remove(raw)
        per_case = warmup + iterations
        n_cases = len(job[J.CASES])
        warm = [ci * per_case + k for ci in range(n_cases) for k in range(warmup)]
        write_json_atomic(os.path.join(workdir, J.PROFILE.of(job)), {
            T.EVENTS: events, T.TIME_UNIT: "ms",
            T.OTHER_DATA: {T.WARMUP_RUNS: warm, T.TIMED_RUNS: n_cases * iterations,
                           T.ONNXRUNTIME: ort.__version__}})
        result[R.PROFILE] = J.PROFILE.of(job)
        result[R.PROFILE_WARMUP_RUNS] = warmup
    return result


# --- per-layer dumps ---------------------------------------------------------------------------
# The model is rewritten at the protobuf wire level: ModelProto.graph is field 7, and
# GraphProto.output (field 12) is a repeated ValueInfoProto, so appending outputs means appending
# `12: {1: name}` records to the graph's bytes and re-encoding its length. onnxruntime infers the
# type of an output given by name only.
_GRAPH_FIELD = 7
_OUTPUT_TAG = b"\x62"      # field 12, wire type 2
_NAME_TAG = b"\x0a"        # field 1, wire type 2
_MIB = 1 << 20
STAT_FIRST = C.STAT_FIRST  # how many leading values the stats keep
_STAT_BLOCK = 1 << 16      # elements per block when computing stats (a cache-sized temporary)
ITEMSIZE = {"float": 4, "float16": 2, "double": 8, "bfloat16": 2, "int8": 1, "uint8": 1,
            "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
            "bool": 1, "string": 8, "float8e4m3fn": 1, "float8e5m2": 1}


def _varint(n):
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(buf, pos):
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise JobError("model", "not an ONNX model (truncated protobuf)")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _graph_span(buf):
    """(tag start, value start, value end) of ModelProto.graph in serialized bytes."""
    pos, n = 0, len(buf)
    while pos < n:
        start = pos
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _read_varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            if field == _GRAPH_FIELD:
                return start, pos, pos + length
            pos += length
        else:
            raise JobError("model", "not an ONNX model (protobuf wire type %d)" % wire)
    raise JobError("model", "not an ONNX model (no graph)")


def total_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_budget(model_bytes, memory=None):
    """Bytes of live tensors one dump segment may hold, before the sizes are known (a dump
    raises it to half a plain run's live activations, see plain_live_bytes): 1.5x the model's
    size, at least
    16 MiB, at most 1/16 of the machine's memory. A plain run holds the model twice while its
    session is made (the file's bytes and the weights); a dump session loads from the file and
    keeps no copy, so a model's worth of room is free, and half a model more is within 1.3x of
    the plain run's peak, which is at least twice the model. Fewer chunks, fewer sessions: a
    ResNet-50 (100 MB of weights, 106 MB of activations) is one chunk, captured by the
    session that sized it (benchmarks/bench_dump.py: 0.6-1.2x a plain run's peak)."""
    budget = max(16 * _MIB, model_bytes * 3 // 2)
    memory = total_memory() if memory is None else memory
    if memory:
        budget = min(budget, max(memory // 16, _MIB))
    return int(budget)


def plan_chunks(names, sizes, budget):
    """Split `names` (in order) into consecutive chunks whose estimated sizes fit `budget`;
    a tensor over the budget goes alone, an unknown size counts as the largest known one."""
    known = [s for s in sizes if s is not None]
    guess = max(known) if known else budget
    chunks, current, used = [], [], 0
    for name, size in zip(names, sizes):
        size = guess if size is None else size
        if current and used + size > budget:
            chunks.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    if current:
        chunks.append(current)
    return chunks


def tensor_head(a):
    """What every record of the array `a` holds, with its summary or without: dtype, shape,
    size."""
    return {C.Record.DTYPE: str(a.dtype), C.Record.SHAPE: [int(d) for d in a.shape],
            C.Record.SIZE: int(a.size)}


def tensor_stats(np, value, first=STAT_FIRST):
    """min, max, mean, std (float64 sums over finite values), NaN/Inf counts, first values;
    computed block by block so no full-size temporary is made.

    Per block of _STAT_BLOCK elements (its float64 copy stays in the core's cache): min and
    max, one float64 copy, and its sum and sum of squares as two dot products (one pass each
    at the cache's speed; numpy's own sum is 3x slower). Where the mean dominates the spread
    (the sum of squares over 1024x the squared deviations) the block's deviations are summed
    instead, their own sum correcting the mean (the corrected two-pass form), as accurate as
    subtract-square-sum was. The blocks are merged with Chan's formula. 1.4-1.7x faster than
    subtract-square-sum (PP-OCRv4 det 960's 1.5 GB of activations: its stats were half the
    capture's time; a dump for diff now skips them, see run_dump). BLAS runs on the calling
    thread: main() sets OPENBLAS_NUM_THREADS/MKL_NUM_THREADS before numpy is imported (its
    threads, spinning, made a dot 10x dearer in CPU time)."""
    a = np.asarray(value)
    Rec = C.Record
    stats = tensor_head(a)
    stats.update({Rec.NAN: 0, Rec.INF: 0, Rec.MIN: None, Rec.MAX: None, Rec.MEAN: None,
                  Rec.STD: None, Rec.FIRST: []})
    if a.dtype.kind not in "biuf":
        return stats
    flat = a.reshape(-1)
    stats[Rec.FIRST] = [_json_value(v.item()) for v in flat[:first]]
    count, total, m2, lo, hi = 0, 0.0, 0.0, None, None
    # one float64 buffer for all blocks, not one per block: where malloc maps each buffer
    # afresh (glibc's default; run_dump changes that where it can) it doubled the cost
    buf = np.empty(min(flat.size, _STAT_BLOCK), np.float64)
    ones = np.ones(buf.size, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # squares past float64: inf
        for start in range(0, flat.size, _STAT_BLOCK):
            block = flat[start:start + _STAT_BLOCK]
            bmin = bmax = None
            if a.dtype.kind == "f":
                bmin, bmax = block.min(), block.max()  # both finite: no NaN/Inf in the block
            if a.dtype.kind == "f" and not (np.isfinite(bmin) and np.isfinite(bmax)):
                finite = np.isfinite(block)
                nan = int(np.count_nonzero(np.isnan(block)))
                stats[Rec.NAN] += nan
                stats[Rec.INF] += int(block.size - np.count_nonzero(finite)) - nan
                block = block[finite]
                bmin = bmax = None
            k = block.size
            if k == 0:
                continue
            b64 = buf[:k]
            np.copyto(b64, block, casting="unsafe")
            bsum = float(np.dot(b64, ones[:k]))
            bsq = float(np.dot(b64, b64))
            bmean = bsum / k
            bm2 = bsq - bsum * bmean
            if not bm2 * 1024.0 > bsq:  # the mean dominates (or all equal): the deviations,
                b64 -= bmean            # their own sum correcting the mean (corrected two-pass)
                r = float(np.dot(b64, ones[:k])) / k
                bm2 = max(float(np.dot(b64, b64)) - k * r * r, 0.0)
                bmean += r
            n = count + k
            if count:
                delta = bmean - total / count
                mean = total / count + delta * k / n
                m2 = m2 + bm2 + delta * delta * count * k / n
            else:  # the first block as it is (delta * delta * 0 would be NaN past 1.3e154)
                mean, m2 = bmean, bm2
            total, count = mean * n, n
            if bmin is None:
                bmin, bmax = block.min(), block.max()
            bmin, bmax = bmin.item(), bmax.item()
            lo = bmin if lo is None else min(lo, bmin)
            hi = bmax if hi is None else max(hi, bmax)
    if count:  # a mean or spread past float64's range (inf) is null, as JSON has no inf
        stats.update({Rec.MIN: lo, Rec.MAX: hi, Rec.MEAN: _finite_or_none(total / count),
                      Rec.STD: _finite_or_none((m2 / count) ** 0.5)})
    return stats


def _json_value(v):
    """A summary's value as strict JSON has it: NaN and infinities as the strings "nan",
    "inf", "-inf" (the contract's form, and the manifest's), never JSON's missing NaN token."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    return v


def _finite_or_none(v):
    return v if math.isfinite(v) else None


_NP_TYPES = {"float": "float32", "float16": "float16", "double": "float64", "int8": "int8",
             "uint8": "uint8", "int16": "int16", "uint16": "uint16", "int32": "int32",
             "uint32": "uint32", "int64": "int64", "uint64": "uint64", "bool": "bool"}


# --- segmented capture: each node runs once ------------------------------------------------------
# The graph is cut into consecutive segments of nodes (in the model's order, which ONNX requires
# to be topological). Each segment becomes a model of its own, built here at the protobuf wire
# level: the original ModelProto with its graph's nodes restricted to the segment, the
# initializers those nodes use, the graph inputs they read, every tensor that an earlier segment
# produced and they read ("boundary" values, typed by element type only, or as a sequence of
# such tensors), and as outputs the tensors to capture plus those a later segment reads.
# Segment k runs on the values segment k-1 left, so every node runs exactly once. See
# docs/runner-contract.md, "Segments".
_GRAPH_NODE, _GRAPH_INIT, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 5, 11, 12
_GRAPH_VALUE_INFO, _GRAPH_SPARSE_INIT = 13, 15
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP, _NODE_ATTR, _NODE_DOMAIN = 1, 2, 3, 4, 5, 7
_ATTR_G, _ATTR_GRAPHS = 6, 11
# TensorProto.DataType of numpy dtypes (a boundary tensor's graph-input type)
ELEM_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6,
              "int64": 7, "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13}
# onnxruntime's names of the types numpy (and so a .npy file) has no form for: such a tensor
# crosses segment boundaries as onnxruntime's own value and is not captured (a null record)
NO_NPY_TYPES = {"string": 8, "bfloat16": 16, "float8e4m3fn": 17, "float8e4m3fnuz": 18,
                "float8e5m2": 19, "float8e5m2fnuz": 20, "uint4": 21, "int4": 22}
CONTROL_FLOW_OPS = ("If", "Loop", "Scan")


def _wire_fields(buf, start, end):
    """(field, wire type, value start, value end, record start) of each field in buf[start:end];
    for a varint field the value span covers the varint's bytes."""
    pos = start
    while pos < end:
        rec = pos
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            vstart = pos
            _, pos = _read_varint(buf, pos)
            yield field, wire, vstart, pos, rec
        elif wire == 1:
            yield field, wire, pos, pos + 8, rec
            pos += 8
        elif wire == 5:
            yield field, wire, pos, pos + 4, rec
            pos += 4
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            yield field, wire, pos, pos + length, rec
            pos += length
        else:
            raise JobError("model", "not an ONNX model (protobuf wire type %d)" % wire)
    if pos != end:
        raise JobError("model", "not an ONNX model (truncated protobuf)")


def _string(buf, start, end):
    return bytes(buf[start:end]).decode("utf-8")


def _first_string(buf, start, end, field):
    for f, w, s, e, _ in _wire_fields(buf, start, end):
        if f == field and w == 2:
            return _string(buf, s, e)
    return ""


class WireNode(object):
    """One NodeProto of the top-level graph: its record's byte span, names, and the tensors it
    reads, its subgraphs' reads from the enclosing scope included (If/Loop/Scan bodies)."""

    __slots__ = ("span", "inputs", "outputs", "name", "op", "domain", "reads", "subgraph_tensors")

    def __init__(self, buf, rec, vstart, vend):
        self.span = (rec, vend)
        self.inputs, self.outputs, self.name, self.op, self.domain = [], [], "", "", ""
        self.subgraph_tensors = 0
        outer = set()
        for f, w, s, e, _ in _wire_fields(buf, vstart, vend):
            if w != 2:
                continue
            if f == _NODE_INPUT:
                self.inputs.append(_string(buf, s, e))
            elif f == _NODE_OUTPUT:
                self.outputs.append(_string(buf, s, e))
            elif f == _NODE_NAME:
                self.name = _string(buf, s, e)
            elif f == _NODE_OP:
                self.op = _string(buf, s, e)
            elif f == _NODE_DOMAIN:
                self.domain = _string(buf, s, e)
            elif f == _NODE_ATTR:
                for af, aw, a_s, a_e, _ in _wire_fields(buf, s, e):
                    if aw == 2 and af in (_ATTR_G, _ATTR_GRAPHS):
                        reads, count = _subgraph_reads(buf, a_s, a_e)
                        outer.update(reads)
                        self.subgraph_tensors += count
        self.reads = [n for n in self.inputs if n] + sorted(outer - set(self.inputs))


def _subgraph_reads(buf, start, end):
    """(names a GraphProto in buf[start:end] reads from enclosing scopes, how many tensors its
    nodes compute, nested bodies included)."""
    defined, read, count = set(), set(), 0
    for f, w, s, e, rec in _wire_fields(buf, start, end):
        if w != 2:
            continue
        if f in (_GRAPH_INPUT, _GRAPH_INIT):
            defined.add(_first_string(buf, s, e, 1 if f == _GRAPH_INPUT else 8))
        elif f == _GRAPH_SPARSE_INIT:
            for sf, sw, ss, se, _ in _wire_fields(buf, s, e):
                if sf == 1 and sw == 2:
                    defined.add(_first_string(buf, ss, se, 8))
        elif f == _GRAPH_OUTPUT:
            read.add(_first_string(buf, s, e, 1))
        elif f == _GRAPH_NODE:
            node = WireNode(buf, rec, s, e)
            read.update(node.reads)
            defined.update(node.outputs)
            count += len([o for o in node.outputs if o]) + node.subgraph_tensors
    read.discard("")
    return read - defined, count


class WireModel(object):
    """A serialized ModelProto split into what segment models are built from."""

    def __init__(self, buf):
        self.buf = buf
        self.head, gstart, gend = _graph_span(buf)
        self.gstart, self.gend = gstart, gend
        self.nodes, self.inits, self.inputs, self.outputs, self.other = [], {}, {}, [], []
        for f, w, s, e, rec in _wire_fields(buf, gstart, gend):
            if f == _GRAPH_NODE and w == 2:
                self.nodes.append(WireNode(buf, rec, s, e))
            elif f == _GRAPH_INIT and w == 2:
                self.inits[_first_string(buf, s, e, 8)] = (rec, e)
            elif f == _GRAPH_SPARSE_INIT and w == 2:
                for sf, sw, ss, se, _ in _wire_fields(buf, s, e):
                    if sf == 1 and sw == 2:
                        self.inits[_first_string(buf, ss, se, 8)] = (rec, e)
            elif f == _GRAPH_INPUT and w == 2:
                self.inputs[_first_string(buf, s, e, 1)] = (rec, e)
            elif f == _GRAPH_OUTPUT and w == 2:
                self.outputs.append(_first_string(buf, s, e, 1))
            elif f != _GRAPH_VALUE_INFO:
                self.other.append((rec, e))
        self.nodes = _topological(self.nodes, set(self.inits) | set(self.inputs))
        self.constants = dict((o, node) for node in self.nodes if _is_constant(node)
                              for o in node.outputs if o)

    def segment_pieces(self, first, last, boundary_types, outputs):
        """The pieces of a model of nodes[first:last]: inputs are the graph inputs they read and
        `boundary_types` (name -> serialized TypeProto: `_tensor_type`, `_value_type`), outputs
        are `outputs` (by name)."""
        buf = self.buf
        nodes = self.nodes[first:last]
        reads = set(n for node in nodes for n in node.reads)
        graph = []
        for rec, end in self.other:
            graph.append(buf[rec:end])
        made = set(o for node in nodes for o in node.outputs)
        for name in sorted(reads - made):  # a Constant node made earlier: copied, not fed
            if name in self.constants:
                span = self.constants[name].span
                graph.append(buf[span[0]:span[1]])
        for node in nodes:
            graph.append(buf[node.span[0]:node.span[1]])
        for name in sorted(reads):
            if name in self.inits:
                graph.append(buf[self.inits[name][0]:self.inits[name][1]])
            elif name in self.inputs and name not in boundary_types:
                graph.append(buf[self.inputs[name][0]:self.inputs[name][1]])
        for name, tp in boundary_types.items():
            raw = name.encode("utf-8")
            vi = _NAME_TAG + _varint(len(raw)) + raw + b"\x12" + _varint(len(tp)) + tp
            graph.append(b"\x5a" + _varint(len(vi)) + vi)         # GraphProto.input (11)
        for name in outputs:
            raw = name.encode("utf-8")
            vi = _NAME_TAG + _varint(len(raw)) + raw
            graph.append(_OUTPUT_TAG + _varint(len(vi)) + vi)
        length = sum(len(p) for p in graph)
        head = _varint((_GRAPH_FIELD << 3) | 2) + _varint(length)
        return [buf[:self.head], head] + graph + [buf[self.gend:]]


def _tensor_type(elem):
    """A serialized TypeProto of a tensor of TensorProto element type `elem`, any shape."""
    tensor = b"\x08" + _varint(elem)                  # TypeProto.Tensor.elem_type
    return b"\x0a" + _varint(len(tensor)) + tensor    # TypeProto.tensor_type


def _value_type(kind):
    """A serialized TypeProto for onnxruntime's name of a value's type ("tensor(bfloat16)",
    "seq(tensor(float))"), or None for one a segment cannot take as an input (a map)."""
    if kind.startswith("tensor(") and kind.endswith(")"):
        name = kind[len("tensor("):-1]
        elem = NO_NPY_TYPES.get(name, ELEM_TYPES.get(_NP_TYPES.get(name, "")))
        return None if elem is None else _tensor_type(elem)
    if kind.startswith("seq(") and kind.endswith(")"):
        inner = _value_type(kind[len("seq("):-1])
        if inner is None:
            return None
        seq = b"\x0a" + _varint(len(inner)) + inner       # TypeProto.Sequence.elem_type
        return b"\x22" + _varint(len(seq)) + seq          # TypeProto.sequence_type
    return None


def _topological(nodes, available):
    """`nodes` in the file's order where that is topological (ONNX requires it; onnxruntime's
    saved models keep it), else stably reordered so each node follows what it reads."""
    available = set(available) | {""}
    produced = set(o for node in nodes for o in node.outputs)
    ordered, pending = [], list(nodes)
    while pending:
        later = []
        for node in pending:
            if all(n in available or n not in produced for n in node.reads):
                ordered.append(node)
                available.update(node.outputs)
            else:
                later.append(node)
        if len(later) == len(pending):
            raise JobError("model", "the graph has a cycle (node %r)" % later[0].name)
        pending = later
    return ordered


def _is_constant(node):
    return node.op == "Constant" and node.domain in ("", "ai.onnx") and not node.reads


def segment_reads(nodes, keep=()):
    """name -> index of the last node reading it (len(nodes) for names in `keep`).

    A Constant node's output is not listed (unless kept): it never crosses a segment boundary
    as a value. A later segment that reads it gets a copy of the Constant node instead
    (WireModel.segment_pieces), so the value reaches its readers as onnxruntime's plain run
    gives it to them, an initializer: fed as an input instead, MatMul's weight was not
    pre-packed and PP-OCR cls's classifier head came out 1 ulp off the one-segment dump's."""
    constants = set(o for node in nodes if _is_constant(node) for o in node.outputs)
    last_read = {}
    for i, node in enumerate(nodes):
        for name in node.reads:
            if name not in constants:
                last_read[name] = i
    for name in keep:
        last_read[name] = len(nodes)
    return last_read


def next_segment(nodes, first, sizes, captured, last_read, budget, held_bytes):
    """The end of the segment starting at nodes[first].

    Its live bytes are `held_bytes` (the boundary tensors alive when it starts: made earlier,
    read by it or later) plus what it marks as outputs (tensors in `captured`, or read after
    it); `sizes` maps a name to its bytes (None or absent: unknown). The segment grows while
    they fit `budget`; a node alone is always a segment. A node with an output of unknown size
    runs alone, so its size is measured, never guessed."""
    end = len(nodes)
    counted = {}  # marked tensors of the segment so far -> bytes
    total = 0
    last = first
    while last < end:
        node = nodes[last]
        if last > first and _alone(node, sizes):
            break
        change = 0
        for name in node.reads:  # read for the last time here: no longer needs marking
            if name in counted and last_read.get(name) == last and name not in captured:
                change -= counted[name]
        add = {}
        for out in node.outputs:
            if out and (out in captured or last_read.get(out, -1) > last):
                add[out] = sizes.get(out) or 0
        change += sum(add.values())
        if last > first and held_bytes + total + change > budget:
            break
        for name in node.reads:
            if name in counted and last_read.get(name) == last and name not in captured:
                del counted[name]
        counted.update(add)
        total += change
        last += 1
        if _alone(node, sizes):
            break
    return last


def plain_live_bytes(nodes, sizes, last_read):
    """The most bytes of node outputs a plain (unmarked) run holds at once: after each node,
    what it and earlier nodes made that a later node still reads. A dump may hold half that
    again without leaving a plain run's memory envelope by much (the default budget)."""
    ends = {}
    live = peak = 0
    for i, node in enumerate(nodes):
        for out in node.outputs:
            size = sizes.get(out) or 0
            if out and last_read.get(out, -1) > i:
                live += size
                ends[last_read[out]] = ends.get(last_read[out], 0) + size
        peak = max(peak, live + sum(sizes.get(o) or 0 for o in node.outputs
                                    if o and last_read.get(o, -1) <= i))
        live -= ends.pop(i, 0)
    return peak


def _alone(node, sizes):
    return any(o and sizes.get(o) is None for o in node.outputs)


def plan_segments(nodes, sizes, captured, budget):
    """Every segment [(first, last), ...] that `capture_segments` runs when `sizes` are exact."""
    last_read = segment_reads(nodes)
    made = {}
    for i, node in enumerate(nodes):
        for out in node.outputs:
            made[out] = i
    segments, first = [], 0
    while first < len(nodes):
        held = sum(sizes.get(n) or 0 for n, k in made.items()
                   if k < first and last_read.get(n, -1) >= first)
        last = next_segment(nodes, first, sizes, captured, last_read, budget, held)
        segments.append((first, last))
        first = last
    return segments

def capture_segments(np, ort, model, tensors, cases, budget, session_job, scratch, sizes=None,
                     copy=True, stats=None):
    """Yield (case index, name, value) for every name in `tensors` that the graph computes or is
    fed, case by case, segment by segment in graph order. `model` is a file; `sizes` maps
    tensor names to bytes (the host's plan; unknown ones are measured by running their node
    alone). Each segment is a session on its own model (see WireModel), run with optimizations
    as in `session_job`, on the case's inputs and the boundary values earlier segments left:
    every node runs once per case. With `copy` false, values view onnxruntime's buffers and are
    valid only until the next item. A value of a type numpy has no form for (NO_NPY_TYPES:
    bfloat16, float8, string) is None (it still crosses boundaries, as onnxruntime's value).
    `stats` (a dict), when given, receives the C.DumpResult fields but its cases and time: the
    budget, the segments (the [first, last) node spans run for the first case), the nodes,
    those measured, and the tensors inside subgraphs."""
    with open(model, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        buf = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) if size else b""
    try:
        wire = WireModel(memoryview(buf))
        wire.path = model
        for item in _capture(np, ort, wire, tensors, cases, budget, session_job, scratch,
                             dict(sizes or {}), copy, stats):
            yield item
    finally:
        wire = None
        if size:
            try:
                buf.close()
            except BufferError:  # a view still alive (an interrupted generator): the GC closes it
                pass


def measure_sizes(np, ort, model, cases, session_job, scratch):
    """Bytes of every named node's outputs, measured: one run per case of `model` (a file) with
    nothing marked (so memory as in a plain run) and onnxruntime's profiler on, whose node
    events record each output's type and shape. Largest over the cases."""
    job = dict(session_job)
    job[J.PROFILE] = os.path.join(scratch, "_measure")
    sess = make_session(ort, model, job)
    names = [o.name for o in sess.get_outputs()]
    wanted = set(i.name for i in sess.get_inputs())
    try:
        for feeds in cases:
            run_once(sess, dict((k, v) for k, v in feeds.items() if k in wanted), names)
    except BaseException:  # the profile a dropped session would write on its own: not left
        _remove_quietly(sess.end_profiling())
        raise
    trace = sess.end_profiling()
    sess = None
    try:
        with open(trace) as fh:
            events = json.load(fh)
    finally:
        os.remove(trace)
    by_node = {}
    for ev in events:
        args = ev.get("args") or {}
        name = ev.get("name", "")
        if ev.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        sizes = []
        for entry in args.get("output_type_shape", []):
            (kind, shape), = entry.items()
            n = ITEMSIZE.get(kind)
            for d in shape:
                n = None if n is None else n * int(d)
            sizes.append(n)
        node = name[:-len("_kernel_time")]
        old = by_node.get(node)
        by_node[node] = sizes if old is None else [
            None if a is None or b is None else max(a, b) for a, b in zip(old, sizes)]
    return by_node


def _capture(np, ort, wire, tensors, cases, budget, session_job, scratch, sizes, copy, stats):
    nodes = wire.nodes
    unknown = [n for n in nodes if _alone(n, sizes)]
    if len(unknown) > 1:  # measure them (one plain profiled run) rather than isolate each
        names = collections.Counter(n.name for n in nodes)
        # measured on the graph's nodes as one segment, not on the file itself: an optimized
        # model of IR version 3 keeps as graph inputs the initializers its optimizer folded away
        # (Reshape's "X__SHAPE", "OC2_DUMMY_N"), which no node reads and nothing feeds
        # (and with the outputs nodes make: one that is an initializer or an input has none)
        made = set(o for node in nodes for o in node.outputs if o)
        whole = os.path.join(scratch, "_whole.onnx")
        try:
            outputs = [o for o in wire.outputs if o in made]
            with open(whole, "wb") as out:
                for piece in wire.segment_pieces(0, len(nodes), {}, outputs or [
                        o for o in nodes[-1].outputs if o]):
                    out.write(piece)
            measured = measure_sizes(np, ort, whole, cases, session_job, scratch)
        except JobError as exc:
            raise _reworded(exc, whole, "model", "measuring the tensors' sizes")
        finally:
            _remove_quietly(whole)
        for node in unknown:
            got = measured.get(node.name) if node.name and names[node.name] == 1 else None
            for out, size in zip(node.outputs, got or []):
                if out and sizes.get(out) is None and size is not None:
                    sizes[out] = size
    captured = set(tensors)
    last_read = segment_reads(nodes)
    if budget is None:
        budget = max(default_budget(os.path.getsize(wire.path)),
                     plain_live_bytes(nodes, sizes, last_read) // 2)
    path = os.path.join(scratch, "_segment.onnx")
    sessions = {}  # segment span -> session, kept across cases only when there are several
    if stats is not None:  # the result's "dump" entry, but for its cases and time
        stats.update({DR.BUDGET_BYTES: budget, DR.NODES: len(nodes), DR.SEGMENTS: [],
                      DR.MEASURED: len(unknown),
                      DR.SUBGRAPH_TENSORS: sum(n.subgraph_tensors for n in nodes)})
    for ci, feeds in enumerate(cases):
        for name in tensors:
            if name in feeds:
                yield ci, name, feeds[name]
        held = {}  # name -> (array, owner): values later segments read
        used = set()  # the segments this case ran: a session no case runs again is dropped
        first = 0
        while first < len(nodes):
            # held values counted at their planned sizes (the largest over the cases), as the
            # segment's own outputs are: every case cuts the graph alike and reuses the sessions
            held_bytes = sum(sizes.get(n) or (int(v.nbytes) if v is not None else 0)
                             for n, (v, _) in held.items())
            last = next_segment(nodes, first, sizes, captured, last_read, budget, held_bytes)
            if stats is not None and ci == 0:
                stats[DR.SEGMENTS].append([first, last])
            fetch = [o for node in nodes[first:last] for o in node.outputs
                     if o and (o in captured or last_read.get(o, -1) >= last)]
            if fetch:
                reads = [n for node in nodes[first:last] for n in node.reads]
                boundary = dict((n, held[n]) for n in reads if n in held)
                used.add((first, last))
                sess = sessions.get((first, last))
                if sess is None:
                    types = {}
                    for n, (value, owner) in boundary.items():
                        kind = str(value.dtype) if value is not None else owner[0].data_type()
                        types[n] = (_tensor_type(ELEM_TYPES[kind]) if kind in ELEM_TYPES
                                    else _value_type(kind))  # numpy's name, or onnxruntime's
                        if types[n] is None:
                            raise JobError("runtime", "value %r (%s) cannot cross a segment "
                                           "boundary" % (n, kind))
                    try:
                        with open(path, "wb") as out:
                            for piece in wire.segment_pieces(first, last, types, fetch):
                                out.write(piece)
                        sess = make_session(ort, path, session_job)
                    except JobError as exc:
                        raise _reworded(exc, path, "segment", "capturing nodes %d-%d: %s ... %s"
                                        % (first, last - 1, nodes[first].name or nodes[first].op,
                                           nodes[last - 1].name or nodes[last - 1].op))
                    finally:
                        _remove_quietly(path)
                    if len(cases) > 1:
                        sessions[(first, last)] = sess
                fed = dict((n, (feeds[n], None)) for n in reads if n in feeds and n not in boundary)
                fed.update(boundary)
                values = dict(zip(fetch, _run_segment(np, ort, sess, fed, fetch, copy)))
                sess = fed = boundary = None
                for name in fetch:
                    value, owner = values.pop(name)  # value None: no numpy form (owner holds it)
                    if value is not None:
                        sizes[name] = max(sizes.get(name) or 0, int(value.nbytes))
                    if last_read.get(name, -1) >= last:
                        held[name] = (value, owner)
                    if name in captured:
                        yield ci, name, value
                    value = owner = None
            for name in [n for n in held if last_read.get(n, -1) < last]:
                del held[name]
            first = last
        held = None
        for span in [s for s in sessions if s not in used]:
            del sessions[span]


def _reworded(exc, path, name, where):
    """`exc` said of `name` (the model, a segment), not of the scratch file `path`, and where."""
    return JobError(exc.kind, "%s (%s)" % (str(exc).replace(path, name), where))


def _remove_quietly(path):
    """Remove a scratch file of the capture, if it is there."""
    try:
        os.remove(path)
    except OSError:
        pass


def _run_segment(np, ort, sess, fed, fetch, copy):
    """Run `sess` on `fed` (name -> (array, OrtValue or None)) and return (array, owner) per
    name in `fetch`. Where onnxruntime allows, values cross segments as OrtValues and come back
    as arrays viewing its own buffers (no copy); with `copy` they are copied. Each output is
    taken through DLPack where numpy and onnxruntime have it: the array then owns a reference
    to its own buffer and nothing else (owner None). An OrtValue indexed from the run's output
    vector keeps the whole vector alive instead, so holding one boundary tensor held every
    output of its segment: on PP-OCRv4 det at 960, up to 134 MB pinned behind 22 MB held, none
    of it counted against the budget (issue 14). The fallback views the buffer through ctypes
    and keeps the vector as the owner."""
    import ctypes

    if not hasattr(sess, "run_with_ort_values"):
        got = run_once(sess, dict((k, v) for k, (v, _) in fed.items()), fetch)
        return [(np.asarray(v), None) for v in got]
    try:
        ort_feeds = dict((k, o[0] if o is not None else ort.OrtValue.ortvalue_from_numpy(
            np.asarray(v, order="C"))) for k, (v, o) in fed.items())
        owners = sess.run_with_ort_values(fetch, ort_feeds)
    except Exception as exc:
        raise _run_error(exc)
    out = []
    for i in range(len(fetch)):
        v = owners[i]
        kind = _elem_name(v)
        dtype = _NP_TYPES.get(kind)
        if kind in NO_NPY_TYPES or not kind:  # no .npy form, or no tensor (a sequence):
            out.append((None, (v, owners)))  # fed on as it is, where a later segment reads it
            continue
        if dtype is None or v.device_name().lower() != "cpu":
            out.append((v.numpy(), None))
            continue
        shape = tuple(int(d) for d in v.shape())
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        array = owner = None
        if nbytes == 0:
            array = np.zeros(shape, dtype)
        elif hasattr(np, "from_dlpack") and hasattr(v, "__dlpack__"):
            try:
                array = np.from_dlpack(v)
            except (TypeError, ValueError, BufferError, RuntimeError):
                pass  # refused: viewed below
            if array is not None and (array.dtype != np.dtype(dtype) or array.shape != shape):
                array = None  # (a bool exported as uint8 by some version): view it instead
        if array is None:
            array = np.frombuffer((ctypes.c_char * nbytes).from_address(v.data_ptr()),
                                  dtype=dtype).reshape(shape)
            owner = (v, owners)
        out.append((array.copy(), None) if copy else (array, owner))
    return out


def _elem_name(value):
    """onnxruntime's element type name of an OrtValue ('float', 'bfloat16'; '' for a value
    that is no tensor, a sequence or a map)."""
    kind = value.data_type()
    return kind[len("tensor("):-1] if kind.startswith("tensor(") else ""


def _return_freed_memory():
    """glibc only: serve tensors up to 256 MiB from the heap and give back free heap above
    64 MiB, so a freed tensor's memory is reused by the next one without faulting fresh pages
    in, yet does not pile up. Mapping each tensor of 4 MiB or more on its own (the policy
    before) made every dumped tensor map, zero and unmap its pages: run_dump on PP-OCRv4 det's
    optimized graph took 2.0-2.3 CPU s at 640 and 5.3-6.8 at 960, against 1.3-1.5 and 2.5-2.8
    this way, with the same peak (147-162 vs 160-172 MB, 250 vs 250-273 MB; issue 14)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(-3, 256 << 20)  # M_MMAP_THRESHOLD: fixed at 256 MiB
        libc.mallopt(-1, 64 << 20)   # M_TRIM_THRESHOLD


def _trim_heap():
    """glibc only: hand the heap's free memory back to the system (malloc_trim)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _libc():
    """The C library through ctypes, or None where it cannot be loaded."""
    try:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("c")
        return ctypes.CDLL(name) if name else None
    except (OSError, AttributeError, ValueError):
        return None


class NpyPack(object):
    """One case's dump file, DIR/c<case>.npys: the tensors' .npy images one after another, each
    starting at a multiple of 64 bytes (zeros between), so `fh.seek(offset); np.load(fh)` reads
    one back. One file per case instead of one per tensor: creating PP-OCRv4 det 640's 673
    tensor files cost 0.88 s of CPU in a fresh folder, one file 0.15 s (issue 14)."""

    def __init__(self, workdir, rel, case):
        self.rel, self.case = rel, case
        self.fh = open(os.path.join(workdir, rel), "wb")
        self.end = 0

    def append(self, np, value):
        """Write `value` as the next .npy image; its offset."""
        offset = -(-self.end // C.PACK_ALIGN) * C.PACK_ALIGN
        if offset > self.end:
            self.fh.write(b"\0" * (offset - self.end))
        np.lib.format.write_array(self.fh, np.asarray(value), allow_pickle=False)
        self.end = self.fh.tell()
        return offset

    def close(self):
        self.fh.close()


def run_dump(np, ort, job, workdir, result):
    """Capture the job's dump tensors into one pack of .npy images per case (`NpyPack`), with
    per-tensor stats unless the spec says stats false.

    job["dump"] is a C.DumpSpec: the tensors in topological order, the budget (null:
    default_budget), where to write them and whether to, how many leading values a summary
    keeps, the host's sizes (what is missing is measured). Every segment runs at opt-level
    disable on job["model"]. result["dump"] is a C.DumpResult: per case, per tensor in order,
    a C.Record (its file relative to the job's directory, or null), the segments' node spans
    in the order they ran, and the counts.

    Run it in a process of its own, not after a timed session in the same one: what that
    session freed stays in the heap and adds to the dump's peak (1.7x instead of 1.2x a plain
    run on a wide model in benchmarks/bench_dump.py)."""
    DS = C.DumpSpec
    spec = job[J.DUMP]
    out_rel = DS.DIR.of(spec)
    out_dir = os.path.join(workdir, out_rel)
    os.makedirs(out_dir, exist_ok=True)
    model = os.path.join(workdir, job[J.MODEL])
    # No arena: it grows in doubling steps and keeps its peak, which a chunk's pinned outputs
    # would raise; and large buffers go back to the system as soon as they are freed.
    # Its worker threads do not spin between ops: a dump runs the graph as many short runs
    # (one per segment) whose timing nobody reads; spinning took ~20% of its CPU time (run_dump
    # on PP-OCRv4 det 640's optimized graph: 1.65-2.15 s without, 2.35-2.47 s with, on a
    # loaded 2-core host; issue 14). Scheduling only: the values are the same.
    config = J.SESSION_CONFIG.of(job)
    config.setdefault("session.intra_op.allow_spinning", "0")
    session_job = dict(job)
    session_job.update({J.OPT_LEVEL: "disable", J.OPTIMIZED_MODEL_PATH: None, J.PROFILE: None,
                        J.NO_CPU_ARENA: True, J.SESSION_CONFIG: config})
    _return_freed_memory()
    tensors = list(spec[DS.TENSORS])
    index = {name: i for i, name in enumerate(tensors)}
    save = bool(DS.SAVE.of(spec))
    # the summaries only where asked (the text io-dump) or they are all there is: on PP-OCRv4
    # det they were a third of the capture's CPU time, for a dump read only by diff
    summarize = bool(DS.STATS.of(spec)) or not save
    first = int(DS.FIRST.of(spec))
    cases = [load_inputs(np, case, workdir) for case in job[J.CASES]]
    budget = DS.BUDGET_BYTES.of(spec)  # None: default_budget, raised to half a plain run's
    # live activations once the sizes are known; not a positive number: the default too
    budget = int(budget) if isinstance(budget, (int, float)) and budget >= 1 else None
    records = [[None] * len(tensors) for _ in cases]
    t0 = time.perf_counter()
    stats = {DR.BUDGET_BYTES: budget}
    pack = None  # the case's: cases come one after the other, one pack open at a time
    try:
        for ci, name, value in capture_segments(np, ort, model, tensors, cases, budget,
                                                session_job, out_dir, sizes=DS.SIZES.of(spec),
                                                copy=False, stats=stats):
            if value is None:  # no numpy form (bfloat16, float8, string): not captured, a
                continue       # null record, as the contract says of a tensor not written
            rec = tensor_stats(np, value, first) if summarize else tensor_head(value)
            rec[C.Record.NAME] = name
            rec[C.Record.FILE] = None
            if save:
                if pack is None or pack.case != ci:
                    if pack is not None:
                        pack.close()
                    pack = NpyPack(workdir, "%s/c%d.npys" % (out_rel, ci), ci)
                rec[C.Record.FILE] = pack.rel
                rec[C.Record.OFFSET] = pack.append(np, value)
            records[ci][index[name]] = rec
    finally:
        if pack is not None:
            pack.close()
    dump = dict((f, f.of(stats)) for f in DR.fields() if not f.required)
    dump.update({DR.BUDGET_BYTES: stats[DR.BUDGET_BYTES], DR.MS: _now_ms(t0),
                 DR.CASES: records})
    result[R.DUMP] = dump


def peak_rss_bytes():
    """This process's peak resident memory, or None where the platform cannot tell.

    Linux's VmHWM first: ru_maxrss survives exec, so it would report the parent's peak."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def write_json_atomic(path, data):
    """One string from json's C encoder, not json.dump's chunks: those (and any indent) take
    the pure-Python encoder, 5x the CPU on a dump's result (PP-OCRv4 det 640: 54 ms, 12 ms)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(json.dumps(data, allow_nan=True))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv):
    # before numpy is imported: its OpenBLAS would start a thread per core that spins ~0.1 s of
    # CPU each, and the runner never threads BLAS (the host's CLI does the same); an MKL build's
    # threads likewise. tensor_stats' dot products then run on the calling thread.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    if argv[1:2] == ["--describe"] and len(argv) in (2, 4) and argv[2:3] in ([], ["--probe"]):
        info = describe()
        if __name__ == "__main__":  # --serve is offered by this file run as the program, not
            info[D.SERVE] = True    # by a wrapper that imports it and calls main() per job
        if len(argv) == 4 and info.get(D.ONNXRUNTIME):
            info[D.PROBE] = probe_providers([p for p in argv[3].split(",") if p])
        json.dump(info, sys.stdout)
        sys.stdout.write("\n")
        return 0
    if argv[1:] == [C.Serve.FLAG] and __name__ == "__main__":
        return serve(sys.stdin)
    if len(argv) != 2:
        sys.stderr.write("usage: runner.py JOB.json | --serve | --describe [--probe P[,P...]]\n")
        return 2
    return run_job_file(argv[1])


def run_job_file(path, job=None):
    """Run the job file at `path` in its folder (the job's work directory), `job` being its
    contents where already read; 0, or 2 when the job is not one this runner reads (no result
    file is written then)."""
    job_path = os.path.abspath(path)
    workdir = os.path.dirname(job_path)
    if job is None:
        with open(job_path) as fh:
            job = json.load(fh)
    problem = C.job_problem(job)
    if problem:
        sys.stderr.write(problem + "\n")
        return 2
    execute_job(job, workdir)
    return 0


CAN_FORK = hasattr(os, "fork")  # dumps run in forked children (serve_job, forked_dump)


def _in_child(fn):
    """Call fn() in a child forked for it, whose exit status is what fn returns (1, its
    traceback on stderr, if it raises), and wait for it: that status, or minus the number of
    the signal that ended it (as a one-job run's would be reported)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never return into the parent's code
        code = 1
        try:
            code = fn()
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve_job(path):
    """A served job, run as run_job_file would: in this process, or one that captures layers
    (a "dump" entry) in a child forked for it, where the platform can fork. The child's memory
    starts as a new process's would (what earlier jobs freed is handed back to the system
    before the fork) without paying a process start and onnxruntime's import again (~0.5 CPU
    s of `verify run --bin-io-dump` above opt-level disable, whose dump is a second job);
    the child is gone before the next job. Its exit status is the job's (see _in_child)."""
    with open(path) as fh:  # what cannot be read, the serving loop reports
        job = json.load(fh)
    if not (CAN_FORK and isinstance(job, dict) and job.get(J.DUMP)):
        return run_job_file(path, job)
    _trim_heap()
    return _in_child(lambda: run_job_file(path, job))


SERVE_REPLY = C.Serve.REPLY


def serve(requests, run=None):
    """--serve: one job per line of `requests`, each run as `runner.py JOB` would run it
    (in its folder, its result file written; `run(path)` -> status, default serve_job, which
    runs a dump job in a forked child: the ready line then says "dumps": true), then one
    reply line. numpy and onnxruntime are imported once, before the ready line. The replies go
    out on a private copy of stdout and fd 1 is pointed at stderr, so nothing a library prints
    can corrupt them. A line that is not a job request ends the serving with status 2; the end
    of input, with 0."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        import numpy  # noqa: F401 - paid once here, not per job
        import onnxruntime  # noqa: F401
    except Exception:  # each job reports it in its result, as a one-shot runner would
        pass
    run = run or serve_job
    ready = {SERVE_REPLY: CONTRACT_VERSION, C.Serve.READY: True}
    if run is serve_job and CAN_FORK:
        ready[C.Serve.DUMPS] = True
    replies.write(json.dumps(ready) + "\n")
    for line in requests:
        if not line.strip():
            continue
        try:
            path = json.loads(line)[C.Serve.JOB]
            if not isinstance(path, str) or not os.path.isabs(path):
                raise ValueError("not an absolute path")
        except (ValueError, KeyError, TypeError) as exc:
            sys.stderr.write("runner --serve: expected {\"job\": \"/abs/path\"} per line, "
                             "got %r (%s)\n" % (line.strip()[:200], exc))
            return 2
        os.chdir(os.path.dirname(path))
        try:
            status = run(path)
        except (OSError, ValueError) as exc:  # an unreadable job file, or a full disk while
            # writing its result: as a one-shot run would (it said "cannot read" of either)
            sys.stderr.write("runner: job %s failed: %s\n" % (path, _os_text(exc) if
                                                             isinstance(exc, OSError) else exc))
            status = 2
        replies.write(json.dumps({SERVE_REPLY: CONTRACT_VERSION, C.Serve.JOB: path,
                                  C.Serve.STATUS: status}) + "\n")
    return 0


def execute_job(job, workdir):
    """Run the job and write its result file (errors included)."""
    result_path = os.path.join(workdir, J.RESULT.of(job))
    try:
        result = run_job(job, workdir)
    except JobError as exc:
        result = C.error_result(exc.kind, str(exc))
    except EnvironmentError as exc:  # the device's disk, say: its reason, not a traceback's
        result = C.error_result("runtime", _os_text(exc))
    except Exception as exc:  # anything else is a runner failure; keep the trace for the host
        result = C.error_result("runtime", "%s: %s" % (type(exc).__name__, exc),
                                traceback.format_exc())
    result[R.DEVICE] = describe()
    result[R.PEAK_RSS_BYTES] = peak_rss_bytes()
    write_json_atomic(result_path, result)


def _os_text(exc):
    """An OSError in words: its reason and file, and numpy's short write (tofile on a full
    disk: "N requested and M written", errno lost) as the full disk it almost always is."""
    text = str(exc)
    short = re.match(r"(\d+) requested and (\d+) written$", text.strip())
    if short:
        return "No space left on device? (a short write: %s of %s bytes written)" % (
            short.group(2), short.group(1))
    if getattr(exc, "strerror", None):
        where = getattr(exc, "filename", None)
        return "%s%s" % (exc.strerror, ": %s" % where if where else "")
    return "%s: %s" % (type(exc).__name__, text)


def forked_dump(job, workdir):
    """Run job["dump_first"] (a "dump" entry plus "result", its result file's name) in a
    child forked before any session exists, and wait for it; return the result file's name,
    or None where the platform cannot fork (the host then runs the dump as a job of its own).

    The child shares the imports already done (onnxruntime's import and a process start,
    ~0.4 s, are paid once) but nothing else: its heap starts clean, as in a process of its own
    (see run_dump), and it is gone before the timed session is made, so it cannot disturb the
    timings. Only for a dump of the model itself (opt-level disable): a dump of the optimized
    model needs the file the timed session writes."""
    if not CAN_FORK:
        return None
    spec = dict(job[J.DUMP_FIRST])
    dump_job = dict(job)
    dump_job[J.RESULT] = C.DumpFirst.RESULT.of(spec)
    spec.pop(C.DumpFirst.RESULT, None)
    dump_job[J.DUMP] = spec
    del dump_job[J.DUMP_FIRST]
    _in_child(lambda: execute_job(dump_job, workdir) or 0)
    name = dump_job[J.RESULT]
    return name if os.path.exists(os.path.join(workdir, name)) else None  # killed: no result


if __name__ == "__main__":
    sys.exit(main(sys.argv))
