"""docs/runner-contract.md, runner by runner: the same jobs sent straight to the Python runner
(verify/runner/runner.py) and to the native one (runner/native/, the linux-x86_64 bundle), and
the same answers expected of both. Outputs are checked against onnxruntime in this process;
dumps against the runner's own plain run (bit for bit) and against each other."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from fixtures_native import RUNNERS, runner_argv, validate

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "goldens" / "models"


def job_dir(tmp_path: Path, model: Path, feeds: dict[str, np.ndarray], valid: bool = True,
            **job: Any) -> Path:
    """A job folder; the job is checked against the schema unless it is meant to be bad."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(model, work / "model.onnx")
    inputs = {}
    for k, (name, value) in enumerate(feeds.items()):
        np.save(work / f"in{k}.npy", value)
        inputs[name] = f"in{k}.npy"
    doc = {"contract": "verify-runner", "version": 1, "model": "model.onnx",
           "cases": [{"inputs": inputs}], "providers": ["CPUExecutionProvider"],
           "provider_options": {}, "opt_level": "disable", "threads": 1, "session_config": {},
           "warmup": 1, "iterations": 2, "outputs_dir": "out", "result": "result.json",
           "profile": None, **job}
    if valid:
        validate(doc, "job")
    (work / "job.json").write_text(json.dumps(doc))
    return work


def run_job(kind: str, work: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    proc = subprocess.run([*runner_argv(kind), str(work / "job.json")], cwd=work, text=True,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    path = work / "result.json"
    result = json.loads(path.read_text()) if path.exists() else None
    if result is not None:
        validate(result, "result")  # every result, ok or error, against the contract's schema
    return proc, result


def two_io_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    sess = ort.InferenceSession(str(MODELS / "two_io.onnx"), providers=["CPUExecutionProvider"])
    return {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
            .astype(np.float32) for i in sess.get_inputs()}


def reference(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


@pytest.mark.parametrize("kind", RUNNERS)
def test_describe(kind: str, tmp_path: Path) -> None:
    proc = subprocess.run([*runner_argv(kind), "--describe"], cwd=tmp_path, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    validate(info, "describe")
    for key in ("arch", "os", "python", "numpy", "onnxruntime", "providers", "cpu_count",
                "free_disk_bytes"):
        assert key in info
    assert "CPUExecutionProvider" in info["providers"]
    if kind == "native":
        assert info["python"] is None and info["numpy"] is None
        assert info["onnxruntime"] == "1.30.0"
        assert info["runner"].startswith("verify-runner (native C++")
        # onnxruntime-node's build lists CUDA/TensorRT, whose plug-in libraries are not there
        assert "CUDAExecutionProvider" not in info["providers"]


@pytest.mark.parametrize("kind", RUNNERS)
def test_timed_job_outputs_match_onnxruntime(kind: str, tmp_path: Path) -> None:
    feeds = two_io_feeds()
    work = job_dir(tmp_path, MODELS / "two_io.onnx", feeds, warmup=2, iterations=3)
    proc, result = run_job(kind, work)
    assert proc.returncode == 0 and result is not None, proc.stderr
    assert result["status"] == "ok" and result["contract"] == "verify-runner"
    case = result["cases"][0]
    assert len(case["warmup_ms"]) == 2 and len(case["iter_ms"]) == 3
    assert all(t > 0 for t in case["iter_ms"]) and result["prepare_ms"] > 0
    want = reference(MODELS / "two_io.onnx", feeds)
    assert list(case["outputs"]) == list(want)  # every output, in the model's order
    for name, rel in case["outputs"].items():
        got = np.load(work / rel, allow_pickle=False)
        assert got.dtype == want[name].dtype and got.shape == want[name].shape
        np.testing.assert_allclose(got, want[name], rtol=1e-6, atol=1e-6)
    assert result["device"]["providers"] and result["peak_rss_bytes"] > 0


@pytest.mark.parametrize("kind", RUNNERS)
def test_int_and_bool_tensors_round_trip(kind: str, tmp_path: Path) -> None:
    model = MODELS / "int_bool.onnx"
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 2 for d in i.shape]
        dtype = {"tensor(float)": np.float32, "tensor(int64)": np.int64,
                 "tensor(bool)": np.bool_, "tensor(int32)": np.int32}[i.type]
        feeds[i.name] = (rng.integers(0, 5, shape) if dtype != np.float32
                         else rng.standard_normal(shape)).astype(dtype)
    work = job_dir(tmp_path, model, feeds)
    proc, result = run_job(kind, work)
    assert result is not None and result["status"] == "ok", (proc.stderr, result)
    want = reference(model, feeds)
    for name, rel in result["cases"][0]["outputs"].items():
        got = np.load(work / rel)
        assert got.dtype == want[name].dtype
        np.testing.assert_array_equal(got, want[name])


@pytest.mark.parametrize("kind", RUNNERS)
def test_dump_final_outputs_are_bit_identical_to_the_plain_run(kind: str, tmp_path: Path) -> None:
    model = MODELS / "cnn.onnx"
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
             .astype(np.float32) for i in sess.get_inputs()}
    import onnx

    graph = onnx.load(str(model)).graph
    tensors = [i.name for i in graph.input] + [o for n in graph.node for o in n.output]
    outputs = [o.name for o in graph.output]
    plain = job_dir(tmp_path / "plain", model, feeds) if (tmp_path / "plain").mkdir() is None else None
    assert plain is not None
    proc, timed = run_job(kind, plain)
    assert timed is not None and timed["status"] == "ok", proc.stderr
    records_by_budget = []
    for budget in (None, 1):  # one chunk; then every tensor in a chunk (and session) of its own
        base = tmp_path / f"dump{budget}"
        base.mkdir()
        work = job_dir(base, model, feeds, warmup=0, iterations=1, dump={
            "tensors": tensors, "outputs": outputs, "budget_bytes": budget, "dir": "dump",
            "save": True, "first": 4})
        proc, result = run_job(kind, work)
        assert result is not None and result["status"] == "ok", (proc.stderr, result)
        records = result["dump"]["cases"][0]
        assert [r["name"] for r in records] == tensors
        if kind != "third":  # the shipped runners run in segments, each node once
            spans = result["dump"]["segments"]
            assert result["dump"]["nodes"] == len(graph.node)
            assert spans[0][0] == 0 and spans[-1][1] == len(graph.node)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            if budget == 1:  # a budget below every tensor: the nodes run one by one
                assert len(spans) == len(graph.node)
        if kind != "third":  # the shipped runners: one pack per case, images at 64-byte steps
            assert {r["file"] for r in records} == {"dump/c0.npys"}
            assert [r["offset"] % 64 for r in records] == [0] * len(records)
            assert sorted(r["offset"] for r in records) == [r["offset"] for r in records]
        for k, rec in enumerate(records):
            value = _record_value(work, rec)
            assert rec["shape"] == list(value.shape) and rec["dtype"] == str(value.dtype)
            assert rec["size"] == value.size and len(rec["first"]) == min(4, value.size)
            if value.dtype.kind == "f" and value.size:
                assert rec["min"] == float(value.min()) and rec["max"] == float(value.max())
                assert rec["mean"] == pytest.approx(float(value.astype(np.float64).mean()),
                                                    rel=1e-12, abs=1e-12)
                assert rec["std"] == pytest.approx(float(value.astype(np.float64).std()),
                                                   rel=1e-9, abs=1e-12)
        for name in outputs:
            k = tensors.index(name)
            dumped = _record_value(work, records[k])
            plain_out = np.load(plain / timed["cases"][0]["outputs"][name])
            assert dumped.tobytes() == plain_out.tobytes()  # bit-identical
        records_by_budget.append([{k: v for k, v in r.items()} for r in records])
    assert records_by_budget[0] == records_by_budget[1]


def _record_value(work: Path, rec: dict) -> np.ndarray:
    """A dump record's values: the .npy image at its offset (null: the file is its own)."""
    with open(work / rec["file"], "rb") as fh:
        fh.seek(rec.get("offset") or 0)
        return np.load(fh, allow_pickle=False)


@pytest.mark.parametrize("kind", [k for k in RUNNERS if k != "third"])
def test_a_dump_of_more_cases_than_open_files_allowed_completes(kind: str, tmp_path: Path) -> None:
    """One pack per case, one open at a time: 150 cases under a limit of 64 descriptors."""
    import resource

    work = job_dir(tmp_path, MODELS / "two_io.onnx", two_io_feeds(), warmup=0, iterations=1,
                   dump={"tensors": [], "outputs": [], "budget_bytes": None, "dir": "dump",
                         "save": True, "first": 2})
    job = json.loads((work / "job.json").read_text())
    sess = ort.InferenceSession(str(MODELS / "two_io.onnx"), providers=["CPUExecutionProvider"])
    job["dump"]["tensors"] = [o.name for o in sess.get_outputs()]
    job["cases"] = job["cases"] * 150
    (work / "job.json").write_text(json.dumps(job))
    proc = subprocess.run([*runner_argv(kind), str(work / "job.json")], cwd=work, text=True,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=300,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    result = json.loads((work / "result.json").read_text())
    assert result["status"] == "ok", (proc.stderr, result.get("error"))
    cases = result["dump"]["cases"]
    assert len(cases) == 150 and {r["file"] for r in cases[149]} == {"dump/c149.npys"}
    assert _record_value(work, cases[149][0]).tobytes() == _record_value(work, cases[0][0]).tobytes()


def test_dumps_agree_across_runners(tmp_path: Path) -> None:
    """The same dump job, every runner: the Python runner's records (stats to float tolerance)."""
    model = MODELS / "cnn.onnx"
    import onnx

    graph = onnx.load(str(model)).graph
    tensors = [i.name for i in graph.input] + [o for n in graph.node for o in n.output]
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.random.default_rng(2).standard_normal(
        [d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
        for i in sess.get_inputs()}
    got = {}
    for kind in RUNNERS:
        (tmp_path / kind).mkdir()
        work = job_dir(tmp_path / kind, model, feeds, dump={
            "tensors": tensors, "outputs": [o.name for o in graph.output], "budget_bytes": None,
            "dir": "dump", "save": False, "first": 8})
        proc, result = run_job(kind, work)
        assert result is not None and result["status"] == "ok", proc.stderr
        assert not (work / "dump").exists() or not any((work / "dump").iterdir())
        got[kind] = result["dump"]["cases"][0]
    for other in RUNNERS[1:]:
        assert len(got[other]) == len(got["python"])
        for a, b in zip(got["python"], got[other]):
            assert (a["name"], a["file"], a["dtype"], a["shape"], a["nan"], a["inf"]) == \
                   (b["name"], b["file"], b["dtype"], b["shape"], b["nan"], b["inf"])
            for key in ("min", "max", "mean", "std"):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6)
            np.testing.assert_allclose(b["first"], a["first"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", RUNNERS)
def test_profile_trace_and_optimized_model(kind: str, tmp_path: Path) -> None:
    feeds = two_io_feeds()
    work = job_dir(tmp_path, MODELS / "two_io.onnx", feeds, warmup=2, iterations=3,
                   profile="profile.json", opt_level="all", optimized_model_path="opt.onnx")
    proc, result = run_job(kind, work)
    assert result is not None and result["status"] == "ok", proc.stderr
    assert result["profile"] == "profile.json" and result["profile_warmup_runs"] == 2
    trace = json.loads((work / "profile.json").read_text())
    assert trace["otherData"]["verify_warmup_runs"] == [0, 1]
    assert trace["otherData"]["verify_timed_runs"] == 3
    runs = [e for e in trace["traceEvents"] if e.get("name") == "model_run"]
    assert len(runs) == 5
    assert not list(work.glob("profile.json.raw*"))  # the raw trace is removed
    import onnx

    onnx.checker.check_model(onnx.load(str(work / "opt.onnx")))


@pytest.mark.parametrize("kind", RUNNERS)
def test_every_listed_provider_is_asked_for_by_its_full_name(kind: str, tmp_path: Path) -> None:
    """Each provider --describe lists, asked for first: the session is made with it, or it
    fails as that provider's own error (no adapter, no driver), never as a name onnxruntime
    does not know. The native runner once cut the 'ExecutionProvider' suffix and passed
    'WebGpu' (onnxruntime wants 'WebGPU' or the full name), and appended it before its
    environment existed ('Attempt to use DefaultLogger'), so onnxruntime-node's WebGPU
    provider, listed on this machine, could never be used."""
    proc = subprocess.run([*runner_argv(kind), "--describe"], cwd=tmp_path, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    listed = [p for p in json.loads(proc.stdout)["providers"]
              if p not in ("CPUExecutionProvider", "CUDAExecutionProvider",
                           "TensorrtExecutionProvider")]  # CUDA: tests/test_cuda.py
    if kind == "native":
        assert "WebGpuExecutionProvider" in listed  # onnxruntime-node 1.30's Linux build
    if not listed:
        pytest.skip(f"{kind}: no provider but the CPU's to ask for")
    for provider in listed:
        (tmp_path / provider).mkdir()
        work = job_dir(tmp_path / provider, MODELS / "two_io.onnx", two_io_feeds(),
                       providers=[provider, "CPUExecutionProvider"], iterations=1)
        proc, result = run_job(kind, work)
        assert proc.returncode == 0 and result is not None, proc.stderr
        if result["status"] == "ok":
            continue
        error = result["error"]
        assert error["kind"] == "provider" and error["message"].startswith(f"{provider}: ")
        for wrong in ("Unknown provider name", "DefaultLogger", "not available on this device",
                      " was false."):
            assert wrong not in error["message"], error["message"]


def error_of(kind: str, work: Path) -> dict[str, Any]:
    proc, result = run_job(kind, work)
    assert proc.returncode == 0, proc.stderr  # a result file was written: exit 0
    assert result is not None and result["status"] == "error"
    assert "\n" not in result["error"]["message"] and result["device"]["providers"]
    return result["error"]


@pytest.mark.parametrize("kind", RUNNERS)
def test_error_kinds(kind: str, tmp_path: Path) -> None:
    feeds = two_io_feeds()
    (tmp_path / "a").mkdir()
    work = job_dir(tmp_path / "a", MODELS / "two_io.onnx", feeds)
    (work / "model.onnx").write_bytes(b"\x08\x07garbage")
    err = error_of(kind, work)
    assert err["kind"] == "model" and "could not load the model" in err["message"]

    (tmp_path / "b").mkdir()
    wrong = {k: v[..., :1] for k, v in feeds.items()}
    err = error_of(kind, job_dir(tmp_path / "b", MODELS / "two_io.onnx", wrong))
    assert err["kind"] == "input"

    (tmp_path / "c").mkdir()
    err = error_of(kind, job_dir(tmp_path / "c", MODELS / "two_io.onnx", feeds,
                                 providers=["QNNExecutionProvider"]))
    assert err["kind"] == "provider"
    assert err["message"].startswith("QNNExecutionProvider is not available on this device")
    assert err["message"].endswith("; it comes with the onnxruntime-qnn package")

    (tmp_path / "d").mkdir()
    err = error_of(kind, job_dir(tmp_path / "d", MODELS / "unsupported_op.onnx", {}))
    assert err["kind"] == "model"

    (tmp_path / "e").mkdir()
    err = error_of(kind, job_dir(tmp_path / "e", MODELS / "two_io.onnx", feeds,
                                 opt_level="fastest", valid=False))
    assert (err["kind"], err["message"]) == ("input", "unknown opt_level 'fastest'")

    (tmp_path / "f").mkdir()
    work = job_dir(tmp_path / "f", MODELS / "two_io.onnx", feeds)
    (work / "in0.npy").write_bytes(b"not numpy")
    assert error_of(kind, work)["kind"] == "runtime"


@pytest.mark.parametrize("kind", RUNNERS)
def test_bad_jobs_exit_2_without_a_result(kind: str, tmp_path: Path) -> None:
    work = job_dir(tmp_path, MODELS / "two_io.onnx", two_io_feeds(), version=2, valid=False)
    proc, result = run_job(kind, work)
    assert (proc.returncode, result) == (2, None)
    assert "runner speaks verify-runner version 1" in proc.stderr
    proc = subprocess.run([*runner_argv(kind)], text=True, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("usage:")


def test_native_unit_tests() -> None:
    from fixtures_native import unit_test_bin

    proc = subprocess.run([str(unit_test_bin())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    passed, failed = proc.stdout.split()[0], proc.stdout.split()[2]
    assert int(passed) >= 30 and failed == "0", proc.stdout


def test_native_npy_against_numpy(tmp_path: Path) -> None:
    """The runner's .npy writer read by numpy, and numpy's files (format 1.0, 2.0, 3.0) read
    by the runner."""
    from fixtures_native import unit_test_bin

    tool = str(unit_test_bin())
    subprocess.run([tool, "write", str(tmp_path)], check=True, capture_output=True, timeout=60)
    np.testing.assert_array_equal(np.load(tmp_path / "f32.npy"), np.array(
        [[1.5, -2.0, 0.0], [3.25, 1e-8, -7.0]], np.float32))
    scalar = np.load(tmp_path / "scalar_i64.npy")
    assert scalar.shape == () and scalar.dtype == np.int64 and scalar == -42
    assert np.load(tmp_path / "bool.npy").tolist() == [True, False, True]
    np.testing.assert_array_equal(np.load(tmp_path / "f16.npy"), np.array([[1, -2]], np.float16))
    assert np.load(tmp_path / "empty.npy").shape == (0, 5)
    # the pack writer (a dump's c<case>.npys): the same arrays at 64-byte offsets, zeros between
    offsets = json.loads((tmp_path / "pack.json").read_text())
    assert offsets == sorted(offsets) and [o % 64 for o in offsets] == [0] * 5
    with open(tmp_path / "pack.npys", "rb") as fh:
        for name, at in zip(("f32", "scalar_i64", "bool", "f16", "empty"), offsets):
            fh.seek(at)
            packed, own = np.load(fh), np.load(tmp_path / f"{name}.npy")
            assert (packed.dtype, packed.shape, packed.tobytes()) == \
                (own.dtype, own.shape, own.tobytes())
    # its headers are np.save's to the byte: diff reads them from the map (packed_image)
    from types import SimpleNamespace

    from verify.dump_read import OpenFiles, packed_image

    files = OpenFiles()
    for name, at in zip(("f32", "scalar_i64", "bool", "f16", "empty"), offsets):
        own = np.load(tmp_path / f"{name}.npy")
        entry = SimpleNamespace(name=name, dtype=str(own.dtype), shape=own.shape)
        got = packed_image(files, tmp_path / "pack.npys", at, entry, "t")
        assert got is not None and (got.dtype, got.shape, got.tobytes()) == \
            (own.dtype, own.shape, own.tobytes())
    files.close()
    cases = {"v1": (np.arange(6, dtype=np.int32).reshape(2, 3), (1, 0)),
             "v2": (np.array([0.5, -1.25], np.float64), (2, 0)),
             "v3": (np.array([[True], [False]]), (3, 0)),
             "u16": (np.array([65535, 7], np.uint16), None)}
    for name, (value, version) in cases.items():
        path = tmp_path / f"np_{name}.npy"
        with open(path, "wb") as fh:
            if version is None:
                np.save(fh, value)
            else:
                np.lib.format.write_array(fh, value, version=version)
        out = subprocess.run([tool, "read", str(path)], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        doc = json.loads(out)
        assert doc["dtype"] == str(value.dtype) and doc["shape"] == list(value.shape)
        assert doc["values"] == value.reshape(-1).tolist()
    fortran = tmp_path / "fortran.npy"
    np.save(fortran, np.asfortranarray(np.ones((2, 3), np.float32)))
    proc = subprocess.run([tool, "read", str(fortran)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Fortran" in proc.stderr
    assert os.path.getsize(fortran) > 0


def describe(kind: str, *extra: str) -> dict[str, Any]:
    proc = subprocess.run([*runner_argv(kind), "--describe", *extra], text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    validate(info, "describe")
    return info


@pytest.mark.parametrize("kind", RUNNERS)
def test_describe_probe(kind: str) -> None:
    info = describe(kind, "--probe", "CPUExecutionProvider,QNNExecutionProvider")
    assert info["probe"]["CPUExecutionProvider"] is None
    assert info["probe"]["QNNExecutionProvider"].startswith(
        "QNNExecutionProvider is not available on this device")


def test_both_runners_give_one_machine_fingerprint() -> None:
    """verify ci keys baselines by hostname, cpu and machine_id: the same machine must get the
    same fingerprint whichever runner describes it."""
    a, b = describe("python"), describe("native")
    assert (a["hostname"], a["cpu"], a["machine_id"]) == (b["hostname"], b["cpu"], b["machine_id"])


@pytest.mark.parametrize("kind", RUNNERS)
def test_control_probe(kind: str, tmp_path: Path) -> None:
    feeds = two_io_feeds()
    (tmp_path / "on").mkdir()
    work = job_dir(tmp_path / "on", MODELS / "two_io.onnx", feeds, iterations=3,
                   control_probe=True)
    proc, result = run_job(kind, work)
    assert result is not None and result["status"] == "ok", proc.stderr
    control = result["cases"][0]["control_ms"]
    assert len(control) == 3 and all(t > 0 for t in control)
    (tmp_path / "off").mkdir()
    proc, result = run_job(kind, job_dir(tmp_path / "off", MODELS / "two_io.onnx", feeds))
    assert result is not None and "control_ms" not in result["cases"][0]


def test_python_runner_serves_jobs_one_after_another(tmp_path: Path) -> None:
    """`runner.py --serve` (docs/runner-contract.md, "Serve"): the ready line, one reply per
    job with the job's own result file written (an error result too; 2 for a job of another
    contract, with no result), a library's print kept off the replies, exit 0 at EOF."""
    feeds = two_io_feeds()
    for name in "abc":
        (tmp_path / name).mkdir()
    good = job_dir(tmp_path / "a", MODELS / "two_io.onnx", feeds)
    bad_model = job_dir(tmp_path / "b", MODELS / "two_io.onnx", feeds)
    (bad_model / "model.onnx").write_bytes(b"not a model")
    foreign = job_dir(tmp_path / "c", MODELS / "two_io.onnx", feeds, valid=False,
                      version=99)
    lines = [json.dumps({"job": str(w / "job.json")}) for w in (good, bad_model, foreign)]
    proc = subprocess.run([*runner_argv("python"), "--serve"], cwd=tmp_path, text=True,
                          input="\n".join(lines) + "\n", capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    # "dumps": a job that captures layers runs in a child forked for it (serve_job)
    assert replies == [{"verify-serve": 1, "ready": True, "dumps": True},
                       *({"verify-serve": 1, "job": str(w / "job.json"), "status": s}
                         for w, s in ((good, 0), (bad_model, 0), (foreign, 2)))]
    ok = json.loads((good / "result.json").read_text())
    assert ok["status"] == "ok" and len(ok["cases"][0]["iter_ms"]) == 2
    assert json.loads((bad_model / "result.json").read_text())["error"]["kind"] == "model"
    assert not (foreign / "result.json").exists() and "version 99" in proc.stderr


def test_a_served_dump_job_runs_in_a_forked_child(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """serve_job: a job with a "dump" entry runs in a child forked for it (its memory starts
    clean, the serving process goes on), any other job in the serving process itself; the
    child's exit status is the job's, a signal as its negative."""
    from verify.runner import runner as R

    ran = tmp_path / "ran"

    def record(path: str, job: Any = None) -> int:
        assert job == json.loads(Path(path).read_text())  # read once, handed over
        with open(ran, "a") as fh:
            fh.write(f"{os.getpid()} {Path(path).name}\n")
        return 0

    monkeypatch.setattr(R, "run_job_file", record)
    timed, dump = tmp_path / "timed.json", tmp_path / "dump.json"
    timed.write_text(json.dumps({"model": "m.onnx", "dump": None}))
    dump.write_text(json.dumps({"model": "m.onnx", "dump": {"tensors": ["x"]}}))
    assert R.serve_job(str(timed)) == 0 and R.serve_job(str(dump)) == 0
    pids = dict(reversed(line.split()) for line in ran.read_text().splitlines())
    assert pids["timed.json"] == str(os.getpid()) != pids["dump.json"]
    monkeypatch.setattr(R, "run_job_file", lambda path, job=None: 2)
    assert R.serve_job(str(dump)) == 2
    monkeypatch.setattr(R, "run_job_file", lambda path, job=None: os.kill(os.getpid(), 9))
    assert R.serve_job(str(dump)) == -9


def test_python_runner_serve_refuses_a_line_that_is_not_a_job(tmp_path: Path) -> None:
    proc = subprocess.run([*runner_argv("python"), "--serve"], cwd=tmp_path, text=True,
                          input="job.json\n", capture_output=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stdout == '{"verify-serve": 1, "ready": true, "dumps": true}\n'
    assert proc.stderr.startswith('runner --serve: expected {"job": "/abs/path"} per line, '
                                  "got 'job.json'")


def test_a_served_job_that_cannot_be_read_says_why_not_read(tmp_path: Path) -> None:
    """A job file that is no JSON: one line naming the job and the reason, status 2 in the
    reply (the line said "cannot read job" of a full disk while the result was written,
    too: it now says the job failed, and why)."""
    bad = tmp_path / "bad" / "job.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    lines = json.dumps({"job": str(bad)}) + "\n"
    proc = subprocess.run([*runner_argv("python"), "--serve"], cwd=tmp_path, text=True,
                          input=lines, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(x) for x in proc.stdout.splitlines()]
    assert replies[1] == {"verify-serve": 1, "job": str(bad), "status": 2}
    assert proc.stderr.startswith(f"runner: job {bad} failed: "), proc.stderr
