"""capture.plan_dump on a real model (yolov8n, nudenet 320n) as a device dump plans it: at
--opt-level disable the model's own tensors, above it the graph onnxruntime wrote (fused
Conv+SiLU, NCHWc reorders), with what the dump's manifest then says about that graph (tensors
only the optimized graph has, the model's tensors fused away and into what, how many the
--dump-filter left out, floors, sizes); and the one-line errors on a broken model."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from corpus import model_path
from verify.capture import plan_dump
from verify.errors import ModelError

SHAPES = [{"images": (1, 3, 320, 320)}]
SIGMOID = "/model.0/act/Sigmoid_output_0"   # a SiLU's Sigmoid: fused into a Conv at "all"
SILU = "/model.2/cv1/act/Mul_output_0"      # a fused Conv+SiLU chain's last output


@pytest.fixture(scope="module")
def yolo(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """The model and the optimized model onnxruntime writes at --opt-level all (as the
    device's runner does), on this host's CPU."""
    path = model_path("yolov8n")
    out = tmp_path_factory.mktemp("opt") / "optimized.onnx"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return path.read_bytes(), out.read_bytes()


def test_the_optimized_plan_says_what_the_optimizer_changed(yolo: tuple[bytes, bytes]) -> None:
    original, optimized = yolo
    plan = plan_dump(original, optimized, None, SHAPES)
    model_names = {t.name for t in plan_dump(original).tensors}
    dumped = [t.name for t in plan.tensors]
    assert plan.graph == "optimized"
    assert plan.outputs == ("output0",)
    # the NCHWc reorders exist only in the optimized graph: listed, and nothing else is
    assert "reorder_token_0" in plan.optimized_only
    assert set(plan.optimized_only) == {n for n in dumped if n not in model_names}
    # the SiLU Sigmoids went into fused Convs: not dumped, listed as fused away, and where to
    fused = {t.name for t in plan.fused_away}
    assert SIGMOID in fused and SIGMOID not in dumped
    assert fused == model_names - set(dumped)
    assert SIGMOID in plan.fused_into[SILU]
    assert plan.filtered_out == 0
    # the model's own floors (a Sigmoid saturates) for the report; a graph input has none
    assert plan.model_floors[SIGMOID] == 1 / 16
    assert plan.floors["images"] == 0.0
    # every node output of the graph that runs is sized for the case's shapes
    assert set(plan.sizes) == set(dumped) - {"images"}
    assert plan.sizes["reorder_token_0"] > 0
    assert plan.subgraph_tensors == 0


def test_the_model_plan_has_the_models_floors_and_sizes(yolo: tuple[bytes, bytes]) -> None:
    plan = plan_dump(yolo[0], None, None, SHAPES)
    dumped = [t.name for t in plan.tensors]
    assert plan.graph == "model" and SIGMOID in dumped
    assert plan.floors[SIGMOID] == 1 / 16 and plan.floors["images"] == 0.0
    assert plan.model_floors[SIGMOID] == 1 / 16
    assert set(plan.sizes) == set(dumped) - {"images"}
    assert plan.filtered_out == 0 and plan.fused_away == () and plan.optimized_only == ()
    # without the case's shapes nothing is sized (the device measures)
    assert plan_dump(yolo[0]).sizes == {}
    assert plan_dump(yolo[0], yolo[1]).sizes == {}


@pytest.mark.parametrize("optimized", [False, True])
def test_the_filter_counts_what_it_left_out(yolo: tuple[bytes, bytes], optimized: bool) -> None:
    captured = yolo[1] if optimized else None
    every = plan_dump(yolo[0], captured)
    head = plan_dump(yolo[0], captured, r"^/model\.22/")
    assert 0 < len(head.tensors) < len(every.tensors)
    # and the graph inputs, whatever the filter (diff's check that both sides had the same)
    assert all(t.node.startswith("/model.22/") or t.name.startswith("/model.22/")
               or t.op == "<input>" for t in head.tensors)
    assert [t.name for t in head.tensors if t.op == "<input>"] == ["images"]
    assert head.filtered_out == len(every.tensors) - len(head.tensors)


def test_external_data_models_are_planned_from_their_structure(
        yolo: tuple[bytes, bytes], tmp_path: Path) -> None:
    """An archive whose model keeps its weights in external data (and the optimized model the
    runner writes beside its .data file) is planned from the structure alone; bytes that
    refer to external data are refused unless the caller says so."""
    model = onnx.load_from_string(yolo[0])
    onnx.save_model(model, tmp_path / "m.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.data")
    structure = onnx.load(tmp_path / "m.onnx", load_external_data=False).SerializeToString()
    full = plan_dump(yolo[0], None, None, SHAPES)
    plan = plan_dump(structure, None, None, SHAPES, True)
    assert [t.name for t in plan.tensors] == [t.name for t in full.tensors]
    assert plan.sizes == full.sizes
    again = plan_dump(structure, structure, None, SHAPES, True)
    assert again.graph == "optimized" and len(again.tensors) == len(full.tensors)
    with pytest.raises(ModelError, match="^model: refers to weights in external data"):
        plan_dump(structure)


def test_a_broken_model_is_one_line_naming_which(yolo: tuple[bytes, bytes]) -> None:
    with pytest.raises(ModelError, match="^model: not an ONNX model"):
        plan_dump(b"\x00not a model")
    with pytest.raises(ModelError, match="^the optimized model written on the device: "
                                         "not an ONNX model"):
        plan_dump(yolo[0], b"\x00not a model")


def test_the_optimized_plan_counts_if_bodies(tmp_path: Path) -> None:
    """silero VAD at --opt-level all still computes most of its tensors inside If bodies: the
    optimized plan counts them (the report says they are not captured)."""
    path = model_path("silero_vad")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    plan = plan_dump(path.read_bytes(), (tmp_path / "optimized.onnx").read_bytes())
    assert plan.graph == "optimized"
    assert 0 < plan.subgraph_tensors < plan_dump(path.read_bytes()).subgraph_tensors


def test_a_renamed_sigmoid_keeps_its_floor(tmp_path: Path) -> None:
    """The NHWC sandwich a TensorFlow export leaves (Transpose, Sigmoid, Transpose back):
    onnxruntime's transpose optimizer cancels the Transposes and gives the Sigmoid's output a
    new name, a tensor only the optimized graph has; it keeps the Sigmoid's saturating floor
    (from the optimized graph, the model having no tensor of that name)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Transpose", ["x"], ["nhwc"], perm=[0, 2, 3, 1], name="to_nhwc"),
             helper.make_node("Sigmoid", ["nhwc"], ["gate"], name="gate"),
             helper.make_node("Transpose", ["gate"], ["nchw"], perm=[0, 3, 1, 2], name="to_nchw"),
             helper.make_node("Add", ["nchw", "x"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "nhwc", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, 8, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    plan = plan_dump(model.SerializeToString(), (tmp_path / "optimized.onnx").read_bytes())
    (renamed,) = plan.optimized_only
    assert [t.op for t in plan.tensors if t.name == renamed] == ["Sigmoid"]
    assert plan.floors == {"x": 0.0, renamed: 1 / 16, "y": 0.0}
