"""The runner contract's one owner, verify/runner/contract.py, against every other statement of
it: the JSON Schema (key sets, required keys, types, defaults), the native runner's generated
header, the tables of docs/runner-contract.md, the host's own defaults, and what both runners
do with a job that leaves every optional key out."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import click
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fixtures_native import RUNNERS, runner_argv, validate
from verify.runner import contract as C

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "verify" / "runner" / "contract.schema.json").read_text())
MODELS = REPO / "goldens" / "models"
NATIVE_SRC = REPO / "runner" / "native" / "src"


def _schema_types(prop: dict[str, Any]) -> set[str]:
    """The JSON types a schema property allows."""
    if "type" in prop:
        t = prop["type"]
        return set(t) if isinstance(t, list) else {t}
    if "const" in prop:
        return {_json_type(prop["const"])}
    if "enum" in prop:
        return {_json_type(v) for v in prop["enum"]}
    if "$ref" in prop:
        return _schema_types(SCHEMA["$defs"][prop["$ref"].rsplit("/", 1)[1]])
    if "allOf" in prop:
        return {"object"}
    raise AssertionError(f"no type in {prop}")


def _json_type(value: object) -> str:
    return {str: "string", bool: "boolean", int: "integer", float: "number", list: "array",
            dict: "object", type(None): "null"}[type(value)]


def _schema_props(name: str) -> tuple[dict[str, Any], set[str]]:
    """A $defs entry's properties and required keys, those of the defs it extends included."""
    entry = SCHEMA["$defs"][name]
    props, required = dict(entry.get("properties", {})), set(entry.get("required", []))
    for base in entry.get("allOf", []):
        if "$ref" in base:
            more, req = _schema_props(base["$ref"].rsplit("/", 1)[1])
            props, required = {**more, **props}, required | req
    return props, required


@pytest.mark.parametrize("name", sorted(C.DOCUMENTS))
def test_the_schema_states_the_contract_module(name: str) -> None:
    doc = C.DOCUMENTS[name]
    props, required = _schema_props(name)
    assert set(props) == set(doc.keys()), name
    assert required == {f for f in doc.fields() if f.required}, name
    for field in doc.fields():
        prop = props[field]
        types = _schema_types(prop)
        # an integer is a number in JSON Schema; the module may say either
        assert types == set(field.types) or (types | {"integer"}) == set(field.types) | {
            "integer"} and "number" in types, (name, field, types, field.types)
        if field.required or (field.default is None and "null" not in field.types):
            assert "default" not in prop, (name, field)  # required, or absent: no default
        else:
            assert "default" in prop and prop["default"] == field.default, (name, field)
            assert _json_type(field.default) in types | ({"number"} if isinstance(
                field.default, int) else set()), (name, field)


def test_every_document_has_its_keys_once_and_job_keys_have_defaults() -> None:
    for name, doc in C.DOCUMENTS.items():
        keys = doc.keys()
        assert len(keys) == len(set(keys)), name
    optional = [f for f in C.Job.fields() if not f.required]
    assert {str(f) for f in C.Job.fields() if f.required} == {"contract", "version", "model",
                                                               "cases"}
    assert C.Job.OPT_LEVEL.default in C.OPT_LEVELS
    absent = {f for f in optional if f.default is None and "null" not in f.types}
    assert absent == {C.Job.DUMP, C.Job.DUMP_FIRST, C.Job.EXTERNAL_DATA}  # only these may be


def test_new_job_writes_every_default_and_refuses_unknown_keys() -> None:
    job = C.new_job("m.onnx", [C.job_case({"x": "x.npy"})], {C.Job.ITERATIONS: 3})
    validate(job, "job")
    assert job[C.Job.ITERATIONS] == 3 and job["warmup"] == 1 and job["opt_level"] == "all"
    assert "dump" not in job and "profile" not in job  # null defaults are left out
    with pytest.raises(TypeError, match="not an optional job key"):
        C.new_job("m.onnx", [], {"iteration": 3})
    with pytest.raises(TypeError):
        C.new_job("m.onnx", [], {C.Job.MODEL: "other.onnx"})


def test_field_of_gives_the_default_for_absent_and_null_keys() -> None:
    assert C.Job.ITERATIONS.of({}) == 10 and C.Job.ITERATIONS.of({"iterations": 2}) == 2
    assert C.Job.PROVIDERS.of({"providers": None}) == ["CPUExecutionProvider"]
    a = C.Job.SESSION_CONFIG.of({})
    a["x"] = "1"
    assert C.Job.SESSION_CONFIG.of({}) == {}  # a fresh copy: the default is never shared
    assert C.Job.MODEL.of({}) is None  # required: no default to fall back on


def test_job_problem_refuses_other_contracts_and_newer_versions() -> None:
    ok = C.new_job("m.onnx", [])
    assert C.job_problem(ok) is None
    assert "version 2" in C.job_problem({**ok, "version": 2})
    assert "the job is other" in C.job_problem({**ok, "contract": "other"})
    assert C.job_problem({**ok, "version": "x"}) is not None
    assert C.job_problem([]) is not None


# --- the native runner's defaults -------------------------------------------------------------

def _load_script(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_native_header_is_generated_from_the_contract_module() -> None:
    gen = _load_script("gen_native_contract")
    assert gen.HEADER.read_text(encoding="utf-8") == gen.render(), \
        "runner/native/src/contract.hpp is stale: run scripts/gen_native_contract.py"
    assert gen.main(["--check"]) == 0
    text = gen.render()
    assert 'kDefaultOptLevel = "all";' in text and "kDefaultIterations = 10;" in text


def test_the_native_sources_take_defaults_from_the_header_only() -> None:
    """`json::value(KEY, DEFAULT)` with a literal DEFAULT is how the native runner's defaults
    drifted (opt_level "disable", 1 iteration): every default must be a `contract::` name (or
    kStatFirst, itself one)."""
    literal = []
    for path in sorted(NATIVE_SRC.glob("*.cpp")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r'\.value\("(\w+)",\s*([^;]*?)\)\s*[;)]', line):
                if "contract::" not in m.group(2) and "kStatFirst" not in m.group(2):
                    literal.append(f"{path.name}:{n}: {m.group(0)}")
    assert not literal, literal
    common = (NATIVE_SRC / "common.cpp").read_text(encoding="utf-8")
    assert "return contract::kDefaultOrtLogSeverity;" in common


# --- the documentation's tables ---------------------------------------------------------------

def _doc_defaults(heading: str) -> dict[str, str]:
    """key -> the default cell of the first `| key | default | meaning |` table after heading."""
    text = (REPO / "docs" / "runner-contract.md").read_text(encoding="utf-8")
    rest = text[text.index(heading):]
    rest = rest[rest.index("| key | default | meaning |"):]
    out = {}
    for line in rest.splitlines()[2:]:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0].strip("`")] = cells[1]
    return out


@pytest.mark.parametrize("heading, doc", [("## The job file", C.Job),
                                          ("### Dump jobs", C.DumpSpec)])
def test_the_doc_states_every_default(heading: str, doc: type[C.Document]) -> None:
    table = _doc_defaults(heading)
    assert set(table) == set(doc.keys())
    for field in doc.fields():
        want = ("required" if field.required else "absent" if field.default is None and
                "null" not in field.types else f"`{json.dumps(field.default)}`")
        assert table[field] == want, (field, table[field], want)


# --- the host's defaults ----------------------------------------------------------------------

def test_the_host_defaults_are_the_contracts() -> None:
    from verify.cli import cli
    from verify.pipeline import RunOptions

    opts = RunOptions()
    assert (opts.timed.iterations, opts.timed.warmup, opts.session.opt_level,
            opts.session.threads) == (
        C.Job.ITERATIONS.default, C.Job.WARMUP.default, C.Job.OPT_LEVEL.default,
        C.Job.THREADS.default)
    run = cli.get_command(click.Context(cli), "run")
    assert isinstance(run, click.Command)
    flags = {opt: p.default for p in run.params for opt in getattr(p, "opts", [])}
    assert flags["--iter"] == C.Job.ITERATIONS.default
    assert flags["--warmup"] == C.Job.WARMUP.default
    assert flags["--opt-level"] == C.Job.OPT_LEVEL.default
    assert flags["--threads"] == C.Job.THREADS.default


# --- what each runner does with a job that leaves every optional key out ----------------------

def _minimal_job(tmp_path: Path, **extra: Any) -> tuple[Path, dict[str, np.ndarray]]:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    model = MODELS / "cnn.onnx"
    (work / "model.onnx").write_bytes(model.read_bytes())
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
             .astype(np.float32) for i in sess.get_inputs()}
    inputs = {}
    for k, (name, value) in enumerate(feeds.items()):
        np.save(work / f"in{k}.npy", value)
        inputs[name] = f"in{k}.npy"
    job = {"contract": C.CONTRACT, "version": C.VERSION, "model": "model.onnx",
           "cases": [{"inputs": inputs}], **extra}
    validate(job, "job")
    (work / "job.json").write_text(json.dumps(job))
    return work, feeds


def _run(kind: str, work: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run([*runner_argv(kind), str(work / "job.json")], cwd=work, text=True,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    result_file = work / C.Job.RESULT.default
    assert proc.returncode == 0 and result_file.is_file(), proc.stderr
    result = json.loads(result_file.read_text())
    validate(result, "result")
    assert result["status"] == "ok", result
    return proc, result


@pytest.mark.parametrize("kind", RUNNERS)
def test_a_job_without_optional_keys_runs_the_defaults(kind: str, tmp_path: Path) -> None:
    work, _ = _minimal_job(tmp_path)
    _, result = _run(kind, work)
    case = result["cases"][0]
    assert len(case["warmup_ms"]) == C.Job.WARMUP.default
    assert len(case["iter_ms"]) == C.Job.ITERATIONS.default
    assert "control_ms" not in case and "profile" not in result
    for rel in case["outputs"].values():
        assert rel.startswith(C.Job.OUTPUTS_DIR.default + "/") and (work / rel).is_file()


def _optimized_ops(kind: str, tmp_path: Path, **opt: Any) -> list[str]:
    work, _ = _minimal_job(tmp_path, optimized_model_path="optimized.onnx", **opt)
    _run(kind, work)
    model = onnx.load(str(work / "optimized.onnx"))
    return sorted(f"{n.domain}:{n.op_type}" for n in model.graph.node)  # order may vary


@pytest.mark.parametrize("kind", RUNNERS)
def test_a_job_without_opt_level_optimizes_at_the_default_level(kind: str,
                                                                 tmp_path: Path) -> None:
    """The graph a runner optimized without `opt_level` is the one it optimizes at the
    contract's default ("all": fused and NCHWc ops), not at "disable" (the runner's old
    default: the model's own ops)."""
    default = _optimized_ops(kind, tmp_path / "default")
    stated = _optimized_ops(kind, tmp_path / "stated", opt_level=C.Job.OPT_LEVEL.default)
    disabled = _optimized_ops(kind, tmp_path / "disable", opt_level="disable")
    assert default == stated
    assert default != disabled


def test_the_python_runner_reads_every_default_from_the_contract() -> None:
    """runner.py's session for a job of no options is made as the contract's defaults say."""
    from verify.runner import runner as rt

    sess = rt.make_session(ort, (MODELS / "cnn.onnx").read_bytes(), {})
    so = sess.get_session_options()
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert so.log_severity_level == C.Job.ORT_LOG_SEVERITY.default
    assert so.enable_cpu_mem_arena and not so.enable_profiling
    assert sess.get_providers() == C.Job.PROVIDERS.default


# --- the runner as the device receives it -----------------------------------------------------

def test_the_runner_bundle_is_deterministic_and_runs_as_a_program(tmp_path: Path) -> None:
    from verify import runner_files

    data = runner_files.runner_bundle()
    assert data == runner_files.runner_bundle()
    with zipfile.ZipFile(runner_files.runner_file()) as zf:
        assert zf.namelist() == ["__main__.py", "contract.py"]
        assert zf.read("__main__.py") == runner_files.RUNNER_SOURCE.read_bytes()
        assert zf.read("contract.py") == runner_files.CONTRACT_SOURCE.read_bytes()
    assert runner_files.runner_file().read_bytes() == data
    copy = tmp_path / "x.pyz"  # anywhere, alone: no verify package, no contract.py beside it
    copy.write_bytes(data)
    proc = subprocess.run([sys.executable, "-I", str(copy), "--describe"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    validate(json.loads(proc.stdout), "describe")
    work, _ = _minimal_job(tmp_path, iterations=2)
    proc = subprocess.run([sys.executable, "-I", str(copy), str(work / "job.json")], cwd=work,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((work / "result.json").read_text())
    assert result["status"] == "ok" and len(result["cases"][0]["iter_ms"]) == 2


def test_a_damaged_cached_bundle_is_replaced_not_pushed(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from verify import runner_files

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = runner_files.runner_file()
    assert path.parent == tmp_path / "verify" / "runner"
    path.write_bytes(b"planted")
    assert runner_files.runner_file() == path
    assert path.read_bytes() == runner_files.runner_bundle()
