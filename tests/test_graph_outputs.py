"""graph.with_outputs / inferred_types / fused_away, and the runner's wire-level segments."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from verify.errors import ModelError
from verify.graph import fused_away, parse_model, tensor_order, with_outputs
from verify.runner import runner as rt

CNN = Path(__file__).resolve().parent.parent / "goldens" / "models" / "cnn.onnx"


def session(model: onnx.ModelProto | bytes, level: str = "ORT_DISABLE_ALL") -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def test_with_outputs_marks_every_tensor_with_its_inferred_type() -> None:
    model = onnx.load(CNN)
    names = [t.name for t in tensor_order(model) if t.op != "<input>"]
    marked, skipped = with_outputs(model, names)
    assert skipped == []
    outs = [o.name for o in marked.graph.output]
    assert outs[0] == "prob" and outs[1:] == [n for n in names if n != "prob"]
    assert all(o.type.tensor_type.elem_type == TensorProto.FLOAT for o in marked.graph.output)
    assert [o.name for o in model.graph.output] == ["prob"]  # the original is untouched
    x = np.random.default_rng(0).random((1, 3, 224, 224), np.float32)
    plain = session(model).run(None, {"data": x})[0]
    values = session(marked).run(None, {"data": x})
    assert np.array_equal(values[0], plain)
    assert len(values) == len(names)


def test_with_outputs_skips_tensors_whose_type_cannot_be_inferred() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="r"),
         helper.make_node("Mystery", ["a"], ["b"], name="m", domain="custom.ops"),
         helper.make_node("Relu", ["b"], ["y"], name="r2")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("custom.ops", 1)])
    marked, skipped = with_outputs(model, ["a", "b", "y"])
    assert skipped == ["b"]
    assert [o.name for o in marked.graph.output] == ["y", "a"]


def test_tensor_order_lists_control_flow_bodies_under_their_parent() -> None:
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["inner_then"])], "then", [],
                             [helper.make_tensor_value_info("inner_then", TensorProto.FLOAT, [1])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["inner_else"])], "else", [],
                              [helper.make_tensor_value_info("inner_else", TensorProto.FLOAT, [1])])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
         helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [onnx.numpy_helper.from_array(np.zeros((), np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    order = tensor_order(model)
    assert [(t.name, t.op) for t in order] == [("x", "<input>"), ("s", "ReduceSum"),
                                               ("c", "Greater"), ("y", "If")]


def test_model_bytes_referring_to_external_data_are_refused(tmp_path: Path) -> None:
    """Bytes alone (an archive's model) must hold their weights; load_model reads a file's
    external data in (tests/test_corpus_external.py)."""
    model = onnx.load(CNN)
    onnx.save(model, tmp_path / "big.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="big.data", size_threshold=0)
    with pytest.raises(ModelError, match="refers to weights in external data files"):
        parse_model((tmp_path / "big.onnx").read_bytes(), "big.onnx")


def test_fused_away_groups_what_onnxruntime_fused(tmp_path: Path) -> None:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(str(CNN), so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(tmp_path / "opt.onnx")
    groups = fused_away(onnx.load(CNN), [t.name for t in tensor_order(optimized)])
    assert groups["stem/relu:0"] == ["stem/conv:0", "stem/bn:0"]
    assert "block3/se/sigmoid:0" in groups


@pytest.mark.parametrize("span", [(0, 3), (3, 9), (9, None)])
def test_runner_wire_level_segment_computes_what_the_whole_graph_does(span: tuple) -> None:
    """A segment model built from the bytes (no onnx package on the device) holds exactly its
    nodes, reads the boundary tensors as inputs, and computes the whole graph's values."""
    model = onnx.load(CNN)
    wire = rt.WireModel(memoryview(CNN.read_bytes()))
    assert [n.name for n in wire.nodes] == [n.name for n in model.graph.node]
    first, last = span[0], span[1] or len(wire.nodes)
    nodes = model.graph.node[first:last]
    made = {o for n in model.graph.node[:first] for o in n.output}
    boundary = sorted({i for n in nodes for i in n.input if i in made})
    outputs = [o for n in nodes for o in n.output]
    data = b"".join(bytes(p) for p in wire.segment_pieces(
        first, last, {b: rt._tensor_type(TensorProto.FLOAT) for b in boundary}, outputs))
    seg = onnx.load_from_string(data)
    assert [n.name for n in seg.graph.node] == [n.name for n in nodes]
    assert [o.name for o in seg.graph.output] == outputs
    inits = {i.name for i in model.graph.initializer}
    assert {i.name for i in seg.graph.initializer} == {i for n in nodes for i in n.input
                                                       if i in inits}
    full, _ = with_outputs(model, [o for n in model.graph.node for o in n.output])
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    whole = dict(zip([o.name for o in full.graph.output], session(full).run(None, {"data": x})))
    feeds = {b: whole[b] for b in boundary}
    if first == 0:
        feeds["data"] = x
    got = session(data).run(outputs, feeds)
    for name, value in zip(outputs, got):
        assert np.array_equal(value, whole[name]), name


def test_runner_refuses_bytes_that_are_not_a_model() -> None:
    with pytest.raises(rt.JobError, match="not an ONNX model"):
        rt.WireModel(b"\x08\x07\x12")


def test_plan_chunks_respects_the_budget() -> None:
    chunks = rt.plan_chunks(list("abcdef"), [4, 4, 4, 10, None, 1], 8)
    assert chunks == [["a", "b"], ["c"], ["d"], ["e"], ["f"]]
    assert rt.plan_chunks(["a", "b"], [None, None], 100) == [["a"], ["b"]]  # unknown: alone


def test_tensor_stats_use_float64_and_count_nan_inf() -> None:
    x = np.array([1.0, np.nan, np.inf, -np.inf, 3.0], np.float32)
    s = rt.tensor_stats(np, x)
    assert (s["nan"], s["inf"], s["min"], s["max"], s["mean"], s["std"]) == (1, 2, 1.0, 3.0, 2.0, 1.0)
    big = np.full(3_000_001, 1.0, np.float32)
    big[::2] = 3.0
    s = rt.tensor_stats(np, big)
    assert s["mean"] == pytest.approx(2.0000003333332222, rel=1e-12)
    assert s["first"] == [3.0, 1.0, 3.0, 1.0, 3.0, 1.0, 3.0, 1.0]
