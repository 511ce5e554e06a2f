"""`verify devices check SPEC --conformance`: docs/runner-contract.md's checks run against the
runner of SPEC's profile, on that device, through its normal transport.

Each check pushes what it needs (a tiny model made here, its inputs, a job file), runs the
runner, pulls its result file back and judges it: against the contract's JSON Schema
(verify/runner/contract.schema.json), against onnxruntime on this host, or against the error
kind or exit status the contract asks for. A check's failure is a `Check` with passed False and
the reason; only an unreachable device raises (exit 3 as usual)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verify.devices import Profile
from verify.dump_check import file_problem
from verify.errors import DeviceError
from verify.files import NPY_READ_ERRORS, npy_reason
from verify.layerdump import DumpSpec, dump_entry
from verify.runner import contract as C
from verify.runner.contract import CaseResult, Describe, DumpResult, Job, Record, Result
from verify.session import DeviceSession

SCHEMA = Path(__file__).resolve().parent / "runner" / "contract.schema.json"


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


class _Fail(Exception):
    """A check's finding: the runner does not do what the contract asks."""


def tiny_model() -> bytes:
    """y = relu(x @ w + b), z = x * 2: two outputs, a few nodes, float32 [2, 3] in."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 7, "w")
    b = numpy_helper.from_array(np.array([-1, 0.5, -2, 1], np.float32), "b")
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="matmul"),
             helper.make_node("Add", ["xw", "b"], ["pre"], name="add"),
             helper.make_node("Relu", ["pre"], ["y"], name="relu"),
             helper.make_node("Mul", ["x", "two"], ["z"], name="mul")]
    graph = helper.make_graph(
        nodes, "conformance", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])], [w, b, two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="verify-conformance")
    model.ir_version = 8
    return model.SerializeToString()


def _validate(doc: object, kind: str) -> None:
    try:
        import jsonschema
    except ImportError:
        raise _Fail("jsonschema is not installed on this host (pip install jsonschema)") from None
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    try:
        jsonschema.validate(doc, {**schema, "$ref": f"#/$defs/{kind}"},
                            cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise _Fail(f"{kind} does not match the schema at {where}: {exc.message}") from None


class _Session:
    """The checks' view of one device session (session.py: one connection, the runner and
    the profile's files pushed once): raw jobs, each in a work directory of its own, whose
    exit status and result file are judged as they are (DeviceSession.job would turn an
    error result into verify's exception)."""

    def __init__(self, session: DeviceSession) -> None:
        self.session, self.driver, self.profile = session, session.dev, session.profile
        self.tmp, self.argv = session.tmp, session.argv
        self.model_bytes = tiny_model()
        self.model = session.push_bytes(self.model_bytes, ".onnx", "model")
        self.x = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) / 3
        self.n = 0

    def push_array(self, value: np.ndarray) -> str:
        return self.session.push_array(value, "input")

    def job(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The timed job every check starts from (Job key -> value in `overrides`)."""
        job = C.new_job(self.model, [C.job_case({"x": self.push_array(self.x)})], {
            Job.PROVIDERS: list(self.profile.providers),
            Job.PROVIDER_OPTIONS: {k: dict(v) for k, v in
                                   self.profile.provider_options.items()},
            Job.ITERATIONS: 3})
        job.update(overrides or {})
        return job

    def run(self, job: Mapping[str, Any], pull: Callable[[str, Mapping[str, Any]], None]
            | None = None) -> tuple[int, dict[str, Any] | None]:
        """Run one job: (exit status, its result file or None when it wrote none)."""
        workdir = self.session.workdir()
        try:
            self.session.put_json(job, f"{workdir}/job.json")
            res = self.driver.run([*self.argv, f"{workdir}/job.json"], cwd=workdir, check=False)
            self.n += 1
            local = self.tmp / f"result{self.n}.json"
            try:
                self.session.pull(f"{workdir}/{job[Job.RESULT]}", local)
            except DeviceError:
                return res.status, None
            try:
                result = json.loads(local.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):
                raise _Fail("the result file is not JSON") from None
            if not isinstance(result, dict):
                raise _Fail("the result file is not a JSON object")
            if pull is not None and result.get(Result.STATUS) == C.STATUS_OK:
                pull(workdir, result)
            return res.status, result
        finally:
            self.session.remove(workdir, quiet=True)

    def get_npy(self, workdir: str, rel: str, offset: int | None = None) -> np.ndarray:
        """The .npy file `rel` of the job's folder, or the .npy image at `offset` in it (a
        dump's pack, its name and offset checked by the caller)."""
        if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/"):
            raise _Fail(f"the result names a file {rel!r} outside its work directory")
        self.n += 1
        local = self.tmp / f"o{self.n}.npy"
        self.session.pull(f"{workdir}/{rel}", local)
        try:
            with open(local, "rb") as fh:
                fh.seek(offset or 0)
                return np.load(fh, allow_pickle=False)
        except NPY_READ_ERRORS as exc:
            where = f" at offset {offset}" if offset is not None else ""
            raise _Fail(f"{rel}{where} is not a readable .npy: {npy_reason(exc)}") from None


def _ok_result(status: int, result: dict[str, Any] | None) -> dict[str, Any]:
    if result is None:
        raise _Fail(f"the runner exited {status} without writing a result")
    _validate(result, "result")
    if result.get(Result.STATUS) != C.STATUS_OK:
        err = result.get(Result.ERROR) or {}
        raise _Fail(f"the job failed: {err.get(C.Error.KIND)}: {err.get(C.Error.MESSAGE)}")
    if status != 0:
        raise _Fail(f"the runner wrote an ok result but exited {status}")
    return result


def _host_outputs(model: bytes, x: np.ndarray) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))


def _check_describe(s: _Session) -> str:
    res = s.driver.run([*s.argv, "--describe"], check=False)
    if res.status != 0:
        raise _Fail(f"--describe exited {res.status}: {res.stderr.strip()[-200:]}")
    try:
        info = json.loads(res.stdout)
    except ValueError:
        raise _Fail("--describe did not print JSON") from None
    _validate(info, "describe")
    who = info.get(Describe.RUNNER) or f"Python {info.get(Describe.PYTHON)}"
    return (f"{who}, onnxruntime {info.get(Describe.ONNXRUNTIME)}, "
            f"providers {', '.join(info.get(Describe.PROVIDERS) or [])}")


def _check_timed(s: _Session) -> str:
    got: dict[str, np.ndarray] = {}

    def pull(workdir: str, result: Mapping[str, Any]) -> None:
        for name, rel in result[Result.CASES][0][CaseResult.OUTPUTS].items():
            got[name] = s.get_npy(workdir, rel)

    result = _ok_result(*s.run(s.job(), pull))
    case = result[Result.CASES][0]
    warm, timed = len(case[CaseResult.WARMUP_MS]), len(case[CaseResult.ITER_MS])
    if (warm, timed) != (1, 3):
        raise _Fail(f"asked 1 warmup and 3 iterations, got {warm} and {timed} times")
    want = _host_outputs(s.model_bytes, s.x)
    if set(got) != set(want):
        raise _Fail(f"outputs {sorted(got)}, the model has {sorted(want)}")
    for name, value in want.items():
        if got[name].dtype != value.dtype or got[name].shape != value.shape:
            raise _Fail(f"output {name}: {got[name].dtype}{list(got[name].shape)}, expected "
                        f"{value.dtype}{list(value.shape)}")
        if not np.allclose(got[name], value, rtol=1e-5, atol=1e-6):
            err = float(np.max(np.abs(got[name].astype(np.float64) - value)))
            raise _Fail(f"output {name} differs from onnxruntime on this host (max |diff| {err:g})")
    return f"3 iterations timed, {len(want)} outputs match host onnxruntime"


def _error_kind(s: _Session, job: Mapping[str, Any], kind: str) -> str:
    status, result = s.run(job)
    if result is None:
        raise _Fail(f"exited {status} without a result; expected a result of kind {kind!r}")
    _validate(result, "result")
    err = result.get(Result.ERROR) or {}
    if result.get(Result.STATUS) != C.STATUS_ERROR or err.get(C.Error.KIND) != kind:
        raise _Fail(f"expected status error, kind {kind!r}; got {result.get(Result.STATUS)}"
                    + (f", kind {err.get(C.Error.KIND)!r}" if err else ""))
    if status != 0:
        raise _Fail(f"wrote the error result but exited {status} (the contract: 0)")
    return str(err.get(C.Error.MESSAGE, ""))[:80]


def _check_bad_model(s: _Session) -> str:
    bad = s.session.push_bytes(b"\x08\x07not a model", ".onnx", "model")
    return _error_kind(s, s.job({Job.MODEL: bad}), "model")


def _check_bad_input(s: _Session) -> str:
    wrong = s.push_array(s.x[:, :1])
    return _error_kind(s, s.job({Job.CASES: [C.job_case({"x": wrong})]}), "input")


def _check_provider(s: _Session) -> str:
    return _error_kind(s, s.job({Job.PROVIDERS: ["NoSuchExecutionProvider"]}), "provider")


def _check_bad_job(s: _Session) -> str:
    status, result = s.run(s.job({Job.VERSION: C.VERSION + 1}))
    if status != 2 or result is not None:
        raise _Fail(f"a job of version {C.VERSION + 1}: expected exit 2 and no result, "
                    f"got exit {status}" + (" and a result" if result is not None else ""))
    return "exit 2, no result"


def _check_dump(s: _Session) -> str:
    from verify.capture import plan_dump

    plan = plan_dump(s.model_bytes, None, None, [{"x": s.x.shape}])
    entry = dump_entry(plan, DumpSpec(dest=s.tmp))
    finals: dict[str, np.ndarray] = {}
    dumped: dict[str, np.ndarray] = {}

    def pull_plain(workdir: str, result: Mapping[str, Any]) -> None:
        for name, rel in result[Result.CASES][0][CaseResult.OUTPUTS].items():
            finals[name] = s.get_npy(workdir, rel)

    def pull(workdir: str, result: Mapping[str, Any]) -> None:
        for rec in ((result.get(Result.DUMP) or {}).get(DumpResult.CASES) or [[]])[0]:
            if isinstance(rec, dict) and rec.get(Record.NAME) in plan.outputs \
                    and rec.get(Record.FILE):
                rel, offset = str(rec[Record.FILE]), Record.OFFSET.of(rec)
                problem = file_problem(rel.rsplit("/", 1)[-1], offset)
                if problem:
                    raise _Fail(f"the dump record of {rec[Record.NAME]}: {problem}")
                dumped[rec[Record.NAME]] = s.get_npy(workdir, rel, offset)

    once = {Job.OPT_LEVEL: "disable", Job.WARMUP: 0, Job.ITERATIONS: 1}
    _ok_result(*s.run(s.job(once), pull_plain))
    result = _ok_result(*s.run(s.job({**once, Job.DUMP: entry}), pull))
    info = result.get(Result.DUMP)
    if not isinstance(info, dict) or not isinstance(info.get(DumpResult.CASES), list):
        raise _Fail("the result of a dump job has no 'dump'")
    records = [r for r in info[DumpResult.CASES][0] if r is not None]
    names = {r.get(Record.NAME) for r in records}
    missing = [t.name for t in plan.tensors if t.name not in names]
    if missing:
        raise _Fail(f"no record for {', '.join(missing)}")
    for name in plan.outputs:
        if name not in dumped or name not in finals:
            raise _Fail(f"no file for the output {name} (the dump's or the plain run's)")
        a, b = dumped[name], finals[name]
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            raise _Fail(f"the dumped {name} is not bit-identical to a plain run's output")
    return f"{len(records)} records, final outputs bit-identical"


CHECKS: tuple[tuple[str, Callable[[_Session], str]], ...] = (
    ("describe", _check_describe), ("timed job", _check_timed),
    ("bad model is kind model", _check_bad_model), ("bad input is kind input", _check_bad_input),
    ("missing provider is kind provider", _check_provider), ("bad job exits 2", _check_bad_job),
    ("dump job", _check_dump))


def run_checks(profile: Profile) -> list[Check]:
    """Every check against profile's runner on its device (DeviceError when unreachable)."""
    out = []
    with DeviceSession(profile) as device:
        session = _Session(device)
        for name, fn in CHECKS:
            try:
                out.append(Check(name, True, fn(session)))
            except _Fail as exc:
                out.append(Check(name, False, str(exc)))
            except (KeyError, TypeError, IndexError, AttributeError) as exc:
                out.append(Check(name, False, f"malformed result ({type(exc).__name__}: {exc})"))
    return out
