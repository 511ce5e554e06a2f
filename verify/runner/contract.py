"""The runner contract (docs/runner-contract.md) as code: every key of the job file, the result
file, the `--describe` object and the dump folder's manifest, with its JSON type and its
default, declared once.

This file travels to the device with runner.py (both in one zip application, see
verify/runner_files.py) and imports only the standard library: runner.py and the host
(pipeline, conformance, execute, dump, diff) both spell every key through the names here, and
`tests/runner/test_contract.py` checks contract.schema.json (for runners in other languages)
and the native runner's defaults (runner/native/src/contract.hpp, generated from here) against
it, and that no key is spelled as a string anywhere else in verify/.

A key is a `Field`: a `str` (so `job[Job.THREADS]` and `json.dumps` work as with the plain
string) with its JSON types, default and doc. `Field.of(doc)`: its value, or the default."""

CONTRACT = "verify-runner"
VERSION = 1
DUMP_FORMAT = "verify-dump"
DUMP_FORMAT_VERSION = 2  # 2: one pack file per case (Record.OFFSET); 1: one .npy per tensor

OPT_LEVELS = ("disable", "basic", "extended", "layout", "all")  # onnxruntime's, in order
ERROR_KINDS = ("model", "input", "provider", "runtime")
STATUS_OK, STATUS_ERROR = "ok", "error"
CPU_PROVIDER = "CPUExecutionProvider"
STAT_FIRST = 8  # how many leading values a tensor's summary keeps
PACK_ALIGN = 64  # where each .npy image in a dump's c<case>.npys starts: a multiple of this


class _Required(object):
    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()  # the default of a key every document must have


class Field(str):
    """One key of a contract document: the key itself, plus its JSON types (a tuple of
    "string", "integer", "number", "boolean", "array", "object", "null"), its default
    (REQUIRED, or the value meant when the key is absent: None for a key whose types exclude
    null means "absent", nothing to assume) and what it means."""

    def __new__(cls, key, types, default=REQUIRED, doc=""):
        self = str.__new__(cls, key)
        self.types = tuple(types.split("|")) if isinstance(types, str) else tuple(types)
        self.default = default
        self.doc = doc
        return self

    @property
    def required(self):
        return self.default is REQUIRED

    def of(self, doc):
        """The value `doc` holds under this key, or the default where it is absent or null
        (a fresh copy of a list or dict default)."""
        value = doc.get(self) if hasattr(doc, "get") else None
        if value is None and not self.required:
            value = self.default
            if isinstance(value, (list, dict)):
                value = type(value)(value)
        return value


class Document(object):
    """A contract document: its fields are the class's Field attributes, in order."""

    @classmethod
    def fields(cls):
        seen, out = set(), []
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, Field) and name not in seen:
                    seen.add(name)
                    out.append(value)
        return out

    @classmethod
    def keys(cls):
        return [str(f) for f in cls.fields()]

    @classmethod
    def defaults(cls):
        """key -> default, for every optional key."""
        return dict((str(f), f.default) for f in cls.fields() if not f.required)


# --- the job file (job.json, written by verify) --------------------------------------------------

class Job(Document):
    CONTRACT = Field("contract", "string", doc='always "verify-runner"')
    VERSION = Field("version", "integer", doc="the contract version the job speaks")
    MODEL = Field("model", "string", doc="the ONNX model file, absolute or relative to the job")
    CASES = Field("cases", "array", doc="one entry per input set (JobCase)")
    PROVIDERS = Field("providers", "array", [CPU_PROVIDER],
                      doc="execution providers in priority order")
    PROVIDER_OPTIONS = Field("provider_options", "object", {}, doc="per provider, its options")
    OPT_LEVEL = Field("opt_level", "string", "all",
                      doc="graph optimization level: " + ", ".join(OPT_LEVELS))
    THREADS = Field("threads", "integer", 0, doc="intra-op threads; 0: the runtime's default")
    INTER_OP_THREADS = Field("inter_op_threads", "integer|null", 0,
                             doc="inter-op threads; 0 or null: the runtime's default")
    SESSION_CONFIG = Field("session_config", "object", {},
                           doc="session configuration entries (key -> string)")
    WARMUP = Field("warmup", "integer", 1, doc="untimed runs per case")
    ITERATIONS = Field("iterations", "integer", 10, doc="timed runs per case (at least 1)")
    OUTPUTS_DIR = Field("outputs_dir", "string", "out",
                        doc="where output files go, relative to the job's directory")
    RESULT = Field("result", "string", "result.json",
                   doc="the result file's name, relative to the job's directory")
    PROFILE = Field("profile", "string|null", None,
                    doc="null, or the file to write onnxruntime's profiling trace to")
    OPTIMIZED_MODEL_PATH = Field("optimized_model_path", "string|null", None,
                                 doc="where onnxruntime saves the optimized model, relative "
                                     "to the job's directory")
    EXTERNAL_DATA = Field("external_data", "string", None,
                          doc="the folder of the model's external data files, relative to "
                              "the job's directory")
    NO_CPU_ARENA = Field("no_cpu_arena", "boolean", False,
                         doc="true: make the session without the CPU memory arena")
    ORT_LOG_SEVERITY = Field("ort_log_severity", "integer", 3,
                             doc="onnxruntime's log level, 0 (verbose) to 4 (fatal only)")
    CONTROL_PROBE = Field("control_probe", "boolean", False,
                          doc="true: time the control probe before each timed iteration")
    DUMP = Field("dump", "object", None,
                 doc="capture intermediate tensors instead of timing (DumpSpec)")
    DUMP_FIRST = Field("dump_first", "object", None,
                       doc="a DumpSpec plus `result`: dumped in a forked child first")


class JobCase(Document):
    INPUTS = Field("inputs", "object", doc="model input name -> .npy file")


class DumpSpec(Document):
    """The job's `dump` entry (and `dump_first`, which adds `result`)."""

    TENSORS = Field("tensors", "array", doc="tensor names to capture, in topological order")
    OUTPUTS = Field("outputs", "array", [], doc="the model's own graph outputs")
    BUDGET_BYTES = Field("budget_bytes", "integer|null", None,
                         doc="live bytes per segment; null: the runner chooses")
    DIR = Field("dir", "string", "dump", doc="where tensor files go, relative to the job")
    SAVE = Field("save", "boolean", True, doc="false: summaries only, no tensor files")
    STATS = Field("stats", "boolean", True, doc="false (with save): records carry no summary")
    FIRST = Field("first", "integer", STAT_FIRST, doc="leading values a summary keeps")
    SIZES = Field("sizes", "object|null", None,
                  doc="bytes of each node output (null or absent: unknown, measured)")


class DumpFirst(DumpSpec):
    RESULT = Field("result", "string", "dump_result.json", doc="the forked dump's result file")


# --- the result file (written by the runner) -----------------------------------------------------

class Result(Document):
    CONTRACT = Field("contract", "string", doc='always "verify-runner"')
    VERSION = Field("version", "integer", doc="the contract version the runner speaks")
    STATUS = Field("status", "string", doc='"ok" or "error"')
    LOAD_MS = Field("load_ms", "number", None, doc="reading the model file (status ok)")
    PREPARE_MS = Field("prepare_ms", "number", None, doc="creating the session (status ok)")
    CASES = Field("cases", "array", [], doc="one CaseResult per job case, in order")
    PROFILE = Field("profile", "string|null", None, doc="the profiling trace's file name")
    PROFILE_WARMUP_RUNS = Field("profile_warmup_runs", "integer", 0,
                                doc="warmup runs per case the trace holds")
    PEAK_RSS_BYTES = Field("peak_rss_bytes", "integer|null", None,
                           doc="the runner's peak resident memory, where it can tell")
    DEVICE = Field("device", "object", doc="the --describe object")
    DUMP_RESULT = Field("dump_result", "string|null", None,
                        doc="the result file of the dump_first child, when one ran")
    DUMP = Field("dump", "object", None, doc="what a dump job captured (DumpResult)")
    ERROR = Field("error", "object", None, doc='with status "error": Error')


class CaseResult(Document):
    WARMUP_MS = Field("warmup_ms", "array", doc="each warmup run, in ms")
    ITER_MS = Field("iter_ms", "array", doc="each timed run, in ms")
    CONTROL_MS = Field("control_ms", "array", [], doc="the control probe before each run")
    OUTPUTS = Field("outputs", "object", doc="every model output name -> .npy file")


class Error(Document):
    KIND = Field("kind", "string", doc="one of " + ", ".join(ERROR_KINDS))
    MESSAGE = Field("message", "string", doc="one line")
    TRACEBACK = Field("traceback", "string", None, doc="optional")


class DumpResult(Document):
    BUDGET_BYTES = Field("budget_bytes", "integer|null", doc="the budget used")
    MS = Field("ms", "number", doc="the capture's time")
    CASES = Field("cases", "array", doc="per case, one Record (or null) per tensor asked for")
    SEGMENTS = Field("segments", "array", [], doc="[first, last) node spans of case 0")
    NODES = Field("nodes", "integer", 0, doc="top-level nodes")
    MEASURED = Field("measured", "integer", 0, doc="nodes whose output sizes were measured")
    SUBGRAPH_TENSORS = Field("subgraph_tensors", "integer", 0,
                             doc="tensors the nodes inside subgraph bodies compute")


class Record(Document):
    """A captured tensor's file and summary (STAT_KEYS: absent where the dump's stats is false)."""

    NAME = Field("name", "string")
    FILE = Field("file", "string|null", doc="DIR/c<case>.npys (a pack), or null without save")
    OFFSET = Field("offset", "integer|null", None, doc="where its .npy image starts in file "
                   "(a multiple of 64); null: file is its own .npy, DIR/c<case>_t<index>.npy")
    DTYPE = Field("dtype", "string")
    SHAPE = Field("shape", "array")
    SIZE = Field("size", "integer")
    MIN = Field("min", "number|boolean|null", None)
    MAX = Field("max", "number|boolean|null", None)
    MEAN = Field("mean", "number|null", None)
    STD = Field("std", "number|null", None)
    NAN = Field("nan", "integer", None)
    INF = Field("inf", "integer", None)
    FIRST = Field("first", "array", None)


STAT_KEYS = (Record.MIN, Record.MAX, Record.MEAN, Record.STD, Record.NAN, Record.INF,
             Record.FIRST)


class Trace(object):
    """The profiling trace a job's `profile` names: Chrome's JSON object form, whose
    `otherData` says which `model_run` events were warmups (docs/runner-contract.md)."""

    EVENTS = "traceEvents"
    TIME_UNIT = "displayTimeUnit"
    OTHER_DATA = "otherData"
    WARMUP_RUNS = "verify_warmup_runs"
    TIMED_RUNS = "verify_timed_runs"
    ONNXRUNTIME = "onnxruntime"


class Serve(object):
    """`runner --serve` (docs/runner-contract.md, "Serve"): one request line per job in, one
    reply line out, each a JSON object; every reply carries REPLY (the contract version)."""

    FLAG = "--serve"
    REPLY = "verify-serve"
    READY = "ready"      # the first reply: true once the runner is ready for jobs
    JOB = "job"          # a request's (and its reply's) absolute job file path
    STATUS = "status"    # a reply's exit status for the job (0, or 2: a job it cannot read)
    DUMPS = "dumps"      # the ready line's: true when it runs each dump job in a child process
                         # forked for it, whose memory starts clean (else dumps are not sent)


# --- `--describe` (also the result's `device`) ---------------------------------------------------

class Describe(Document):
    ARCH = Field("arch", "string|null")
    OS = Field("os", "string|null")
    HOSTNAME = Field("hostname", "string", "")
    PYTHON = Field("python", "string|null", doc="null for a native runner")
    NUMPY = Field("numpy", "string|null")
    NUMPY_ERROR = Field("numpy_error", "string", None, doc="why numpy did not import")
    ONNXRUNTIME = Field("onnxruntime", "string|null")
    ONNXRUNTIME_ERROR = Field("onnxruntime_error", "string", None,
                              doc="why onnxruntime did not import (with onnxruntime null)")
    PROVIDERS = Field("providers", "array")
    CPU_COUNT = Field("cpu_count", "integer|null")
    FREE_DISK_BYTES = Field("free_disk_bytes", "integer|null")
    CPU = Field("cpu", "string", "", doc="the processor's model name")
    MACHINE_ID = Field("machine_id", "string", "", doc="a hash of the OS's machine id")
    RUNNER = Field("runner", "string", None, doc="a runner other than runner.py names itself")
    SERVE = Field("serve", "boolean", False,
                  doc="true: the runner offers --serve (docs/runner-contract.md, \"Serve\")")
    PROBE = Field("probe", "object|null", None,
                  doc="with --probe: provider -> null (works) or why not")


# --- the dump folder's manifest.json (written by verify) -----------------------------------------

class Manifest(Document):
    FORMAT = Field("format", "string", doc='always "verify-dump"')
    FORMAT_VERSION = Field("format_version", "integer")
    COMPLETE = Field("complete", "boolean", doc="true: every file was written before it")
    VERIFY = Field("verify", "string", None, doc="verify's version")
    CREATED_UTC = Field("created_utc", "string", None)
    DEVICE = Field("device", "object", doc="the --describe object")
    SPEC = Field("spec", "string", None, doc="the device as the user named it")
    PROVIDERS = Field("providers", "array", [])
    OPTIONS = Field("options", "object", {}, doc="ManifestOptions")
    VERSIONS = Field("versions", "object", {},
                     doc="onnxruntime, numpy, python (the device's) and verify")
    MODEL_SHA256 = Field("model_sha256", "string", "")
    GRAPH = Field("graph", "string", "model", doc='"model" or "optimized": what was captured')
    OUTPUTS = Field("outputs", "array", [], doc="the model's graph outputs")
    CASES = Field("cases", "array", doc="ManifestCase per case")
    OPTIMIZED_ONLY = Field("optimized_only", "array", [],
                           doc="tensors only the optimized graph has")
    FUSED_AWAY = Field("fused_away", "array", [],
                       doc="{name, node, op} of tensors the optimizer removed")
    FUSED_INTO = Field("fused_into", "object", {},
                       doc="optimized tensor -> the model tensors fused into it")
    FILTERED_OUT = Field("filtered_out", "integer", 0, doc="tensors --dump-filter left out")
    SUBGRAPH_TENSORS = Field("subgraph_tensors", "integer", 0,
                             doc="tensors inside subgraph bodies (not captured)")
    NOT_CAPTURED = Field("not_captured", "array", [],
                         doc="tensors the runner wrote no record for: a type with no .npy form "
                             "(bfloat16, float8, string)")
    SEGMENTS = Field("segments", "integer", 0, doc="how many segments the graph was cut into")


class ManifestOptions(Document):
    OPT_LEVEL = Field("opt_level", "string", None)
    THREADS = Field("threads", "integer", None)
    CAPTURED_AT_OPT_LEVEL = Field("captured_at_opt_level", "string", "disable")
    BUDGET_BYTES = Field("budget_bytes", "integer|null", None)
    FILTER = Field("filter", "string|null", None, doc="--dump-filter")
    STATS_ONLY = Field("stats_only", "boolean", False, doc="--dump-stats-only: no files")


class ManifestVersions(Document):
    ONNXRUNTIME = Field("onnxruntime", "string|null", None)
    NUMPY = Field("numpy", "string|null", None)
    PYTHON = Field("python", "string|null", None)
    VERIFY = Field("verify", "string", None)


class ManifestCase(Document):
    CASE = Field("case", "integer", doc="the archive's case number")
    TENSORS = Field("tensors", "array", doc="ManifestTensor per tensor, topological order")


class ManifestTensor(Document):
    INDEX = Field("index", "integer", doc="the tensor's position (its file name's number)")
    NAME = Field("name", "string")
    NODE = Field("node", "string", "", doc="the node computing it")
    OP = Field("op", "string", "")
    ORIGIN = Field("origin", "string", "model", doc='"model" or "optimized"')
    FLOOR = Field("floor", "number", 0.0, doc="the saturation floor (graph.py)")
    DTYPE = Field("dtype", "string")
    SHAPE = Field("shape", "array")
    FILE = Field("file", "string|null", doc="the tensor's file in the folder, or null")
    OFFSET = Field("offset", "integer|null", None, doc="its .npy image's start; null: format 1")
    STATS = Field("stats", "object", {}, doc="the Record's summary (STAT_KEYS), or {}: none")
    SOURCES = Field("sources", "array", [], doc="the tensors it selects values from (graph.py)")


class FusedAway(Document):
    NAME = Field("name", "string")
    NODE = Field("node", "string", "")
    OP = Field("op", "string", "")


# every document, by the name the schema's $defs and docs/runner-contract.md use
DOCUMENTS = {
    "job": Job, "job_case": JobCase, "dump_spec": DumpSpec, "dump_first": DumpFirst,
    "result": Result, "case_result": CaseResult, "error": Error, "dump_result": DumpResult,
    "stats_record": Record, "describe": Describe, "dump_manifest": Manifest,
    "manifest_options": ManifestOptions, "manifest_versions": ManifestVersions,
    "manifest_case": ManifestCase, "manifest_tensor": ManifestTensor, "fused_away": FusedAway,
}


def new_job(model, cases, values=None):
    """A job document: contract and version, `model`, `cases`, then `values` (Job field ->
    value; any other key is a TypeError); every optional key absent from `values` whose
    default is not null is written with its default, so the file says what the runner does."""
    job = {Job.CONTRACT: CONTRACT, Job.VERSION: VERSION, Job.MODEL: model, Job.CASES: cases}
    known = set(f for f in Job.fields() if not f.required)
    for key, value in (values or {}).items():
        if key not in known:
            raise TypeError("not an optional job key: %r" % (key,))
        job[key] = value
    for field in Job.fields():
        if field not in job and not field.required and field.default is not None:
            job[field] = field.of({})
    return job


def job_case(inputs):
    return {JobCase.INPUTS: dict(inputs)}


def job_problem(job, version=VERSION):
    """Why a runner speaking `version` must refuse `job` (exit 2, no result), or None: another
    contract, or a newer version."""
    ours = isinstance(job, dict) and job.get(Job.CONTRACT) == CONTRACT
    got = job.get(Job.VERSION, 0) if isinstance(job, dict) else None
    try:
        newer = int(got) > version
    except (TypeError, ValueError):
        newer = True
    if ours and not newer:
        return None
    return "runner speaks %s version %d; the job is %s version %s" % (
        CONTRACT, version, job.get(Job.CONTRACT) if isinstance(job, dict) else None, got)


def new_result(status=STATUS_OK):
    return {Result.CONTRACT: CONTRACT, Result.VERSION: VERSION, Result.STATUS: status}


def error_result(kind, message, traceback=None):
    result = new_result(STATUS_ERROR)
    result[Result.ERROR] = {Error.KIND: kind, Error.MESSAGE: message}
    if traceback is not None:
        result[Result.ERROR][Error.TRACEBACK] = traceback
    return result
