"""Segmented capture at its edges: values that are no tensor (a sequence) crossing segments, a
graph output no node makes when sizes are measured, scratch files after a failure, and cases of
other shapes sharing one set of segment sessions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from corpus import model_path
from verify.capture import HostCapture
from verify.runner import runner as rt
from verify.shapes import tensor_sizes

JOB = {"opt_level": "disable", "providers": ["CPUExecutionProvider"], "no_cpu_arena": True,
       "ort_log_severity": 4}


def _model(nodes: list, inputs: list, outputs: list, inits: tuple = (),
           opsets: tuple = (("", 17),)) -> onnx.ModelProto:
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits)),
                     opset_imports=[h.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    return m


def _sequence_model() -> onnx.ModelProto:
    """x -> Relu a; SequenceConstruct(a, x) s; SequenceAt(s, 0) + Neg(x) -> y."""
    nodes = [h.make_node("Relu", ["x"], ["a"], name="r"),
             h.make_node("SequenceConstruct", ["a", "x"], ["s"], name="sc"),
             h.make_node("Neg", ["x"], ["n"], name="neg"),
             h.make_node("Constant", [], ["i"], name="ci",
                         value=h.make_tensor("iv", T.INT64, [], [0])),
             h.make_node("SequenceAt", ["s", "i"], ["y0"], name="sa"),
             h.make_node("Add", ["y0", "n"], ["y"], name="add")]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [2])],
                  [h.make_tensor_value_info("y", T.FLOAT, [2])])


@pytest.mark.parametrize("budget", [1, 1 << 20])
def test_a_sequence_is_not_captured_and_crosses_segments_as_it_is(
        budget: int, tmp_path: Path) -> None:
    """A sequence has no .npy form: its record is null (not captured), never a traceback; with
    a budget of one byte every node is a segment of its own, so the sequence crosses from the
    segment that makes it to the one that reads it, typed as a sequence of float tensors."""
    m = _sequence_model()
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    x = np.array([1.0, -2.0], np.float32)
    names = ["x", "a", "s", "n", "y0", "y"]
    stats: dict[str, Any] = {}
    sizes = {"a": 8, "s": 16, "n": 8, "y0": 8, "y": 8, "i": 8}
    got = {n: v for _, n, v in rt.capture_segments(np, ort, str(path), names, [{"x": x}], budget,
                                                   JOB, str(tmp_path), sizes=sizes, stats=stats)}
    assert got["s"] is None
    assert np.array_equal(got["y0"], [1.0, 0.0]) and np.array_equal(got["y"], [0.0, 2.0])
    assert np.array_equal(got["a"], [1.0, 0.0]) and np.array_equal(got["n"], [-1.0, 2.0])
    crossed = budget == 1
    assert (len(stats[rt.C.DumpResult.SEGMENTS]) > 3) == crossed
    with HostCapture(m.SerializeToString(), budget_bytes=budget) as capture:
        host = dict(capture.layers({"x": x}, with_missing=True))
    assert host["s"] is None and np.array_equal(host["y"], [0.0, 2.0])


def test_measuring_sizes_with_a_graph_output_no_node_makes(tmp_path: Path) -> None:
    """Two data-dependent sizes (NonZero) are measured by one profiled run of the whole graph;
    a graph output that is an initializer (anchors exported as an output) has no node making
    it, and is not asked of that run (onnxruntime refused the model: "Graph output (anchors)
    does not exist in the graph")."""
    nodes = [h.make_node("NonZero", ["x"], ["nz1"], name="nz1"),
             h.make_node("Cast", ["nz1"], ["f1"], name="c1", to=T.FLOAT),
             h.make_node("NonZero", ["f1"], ["nz2"], name="nz2"),
             h.make_node("Cast", ["nz2"], ["y"], name="c2", to=T.FLOAT)]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [4])],
               [h.make_tensor_value_info("y", T.FLOAT, ["a", "b"]),
                h.make_tensor_value_info("anchors", T.FLOAT, [3])],
               [nh.from_array(np.arange(3, dtype=np.float32), "anchors")])
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    feeds = {"x": np.array([1, 0, 2, 0], np.float32)}
    whole = dict(zip(["y", "anchors"], ort.InferenceSession(
        str(path), providers=["CPUExecutionProvider"]).run(None, feeds)))
    names = ["x", "nz1", "f1", "nz2", "y"]
    stats: dict[str, Any] = {}
    got = {n: v for _, n, v in rt.capture_segments(np, ort, str(path), names, [feeds], None,
                                                   JOB, str(scratch), sizes={}, stats=stats)}
    assert set(got) == set(names) and np.array_equal(got["y"], whole["y"])
    assert np.array_equal(got["nz1"], [[0, 2]])
    assert stats[rt.C.DumpResult.MEASURED] == 4 and os.listdir(scratch) == []


def test_a_failing_segment_leaves_no_scratch_model_and_names_the_nodes(tmp_path: Path) -> None:
    nodes = [h.make_node("Relu", ["x"], ["a"], name="r"),
             h.make_node("NoSuchOp", ["a"], ["y"], name="bad", domain="my.domain")]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [2])],
               [h.make_tensor_value_info("y", T.FLOAT, [2])],
               opsets=(("", 17), ("my.domain", 1)))
    path, scratch = tmp_path / "m.onnx", tmp_path / "dump"
    onnx.save(m, path)
    scratch.mkdir()
    with pytest.raises(rt.JobError) as err:
        list(rt.capture_segments(np, ort, str(path), ["x", "a", "y"],
                                 [{"x": np.ones(2, np.float32)}], 1, JOB, str(scratch),
                                 sizes={"a": 8, "y": 8}))
    assert os.listdir(scratch) == []
    assert "capturing nodes 1-1: bad ... bad" in str(err.value)
    assert "_segment.onnx" not in str(err.value)


def test_a_failing_measuring_run_leaves_no_profile_behind(tmp_path: Path) -> None:
    """Sizes unknown (a dynamic x): measured by a profiled run, which fails here (4 values
    reshaped to 3); the profile onnxruntime writes when a session is dropped is removed."""
    nodes = [h.make_node("Relu", ["x"], ["a"], name="r"),
             h.make_node("Reshape", ["a", "s"], ["b"], name="rs"),
             h.make_node("Relu", ["b"], ["y"], name="r2")]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["n"]),
                       h.make_tensor_value_info("s", T.INT64, [1])],
               [h.make_tensor_value_info("y", T.FLOAT, ["m"])])
    path, scratch = tmp_path / "m.onnx", tmp_path / "dump"
    onnx.save(m, path)
    scratch.mkdir()
    feeds = {"x": np.ones(4, np.float32), "s": np.array([3])}
    with pytest.raises(rt.JobError) as err:
        list(rt.capture_segments(np, ort, str(path), ["x", "a", "b", "y"], [feeds], 1 << 20,
                                 JOB, str(scratch), sizes={}))
    assert os.listdir(scratch) == []
    assert "_whole.onnx" not in str(err.value)


def test_cases_of_other_shapes_share_one_set_of_segment_sessions(tmp_path: Path) -> None:
    """Two cases of PP-OCRv4 det at different sizes, with the host's sizes (the largest over the
    cases): both cut the graph alike, so no case makes sessions of its own (each holds a copy
    of its weights, which the budget does not count). Before, case 0 held values smaller than
    the sizes said and cut differently: 55 segments, 129 sessions kept to the end."""
    path = str(model_path("ppocr_det"))
    m = onnx.load(path)
    rng = np.random.default_rng(0)
    cases = [{"x": rng.random((1, 3, s, s), dtype=np.float32)} for s in (160, 320)]
    sizes = tensor_sizes(m, [{"x": c["x"].shape} for c in cases])
    names = [o for n in m.graph.node for o in n.output if o]
    made: list[str] = []

    class CountingOrt:
        def __getattr__(self, k: str) -> Any:
            return getattr(ort, k)

        def InferenceSession(self, model: str, *a: Any, **k: Any) -> Any:  # noqa: N802
            made.append(model)
            return ort.InferenceSession(model, *a, **k)

    stats: dict[str, Any] = {}
    count = sum(1 for _ in rt.capture_segments(np, CountingOrt(), path, names, cases, 4 << 20,
                                                JOB, str(tmp_path), sizes=sizes, stats=stats))
    assert count == 2 * len(names)
    assert len(stats[rt.C.DumpResult.SEGMENTS]) > 10
    assert len(made) == len(stats[rt.C.DumpResult.SEGMENTS])


@pytest.mark.parametrize("runner", ["python", "native"])
def test_run_dumps_a_model_with_a_sequence_crossing_segments(
        runner: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `verify run` with either runner, a budget of a few bytes (every node a segment):
    the sequence crosses from SequenceConstruct to SequenceAt, the run passes, and the dump
    names it not captured; every tensor captured equals the archive's reference."""
    from fixtures_devices import run_cli
    from test_segments import _runner_device

    from verify.dump import open_dump

    device = _runner_device(runner, tmp_path, monkeypatch)
    model = tmp_path / "seq.onnx"
    onnx.save(_sequence_model(), model)
    x = tmp_path / "x.npy"
    np.save(x, np.array([1.0, -2.0], np.float32))
    vtc = tmp_path / "seq.vtc"
    code, out, err = run_cli(["pack", model, "-d", x, "-o", vtc, "--layers"], capsys)
    assert code == 0, out + err
    code, out, err = run_cli(["run", vtc, *device, "--iter", "1", "--warmup", "0",
                              "--opt-level", "disable", "--dump-budget-mb", "0.000001",
                              "--bin-io-dump", tmp_path / "d"], capsys)
    assert code == 0, out + err
    assert "not captured" in out + err and "'s'" in out + err
    dump = open_dump(tmp_path / "d")
    assert dump.not_captured == ["s"]
    assert [e.name for e in dump.entries(0)] == ["x", "a", "n", "i", "y0", "y"]
    assert dump.manifest["segments"] >= 5
    values = {e.name: np.asarray(dump.load(e)) for e in dump.entries(0)}
    assert np.array_equal(values["y"], [0.0, 2.0]) and np.array_equal(values["y0"], [1.0, 0.0])
    code, out, err = run_cli(["diff", tmp_path / "d", vtc], capsys)
    assert code == 0, out + err
