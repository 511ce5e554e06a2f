"""verify.flops counts against hand-computed values, and verify.profile on real onnxruntime
traces (made here, from a model built in memory) and on small hand-written ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from verify.errors import ProfileError, UsageError
from verify.flops import UNKNOWN, NodeCost, TensorSpec, node_cost
from verify.profile_model import model_costs
from verify.profile import (COLUMNS, ModelIndex, analyze, load_profile,
                            parse_profile, si)


def f32(*shape: int) -> TensorSpec:
    return TensorSpec("float", shape)


# --- FLOPs, one op kind at a time --------------------------------------------------------------
def test_conv_groups_dilation_stride_padding() -> None:
    # X (2,8,15,15), W (16,4,3,3), group 2, stride 2, pads 2, dilation 2: the dilated kernel
    # spans 5, so Hout = (15 + 4 - 5) // 2 + 1 = 8.
    attrs = {"group": 2, "strides": [2, 2], "pads": [2, 2, 2, 2], "dilations": [2, 2],
             "kernel_shape": [3, 3]}
    x, w, b, y = f32(2, 8, 15, 15), f32(16, 4, 3, 3), f32(16), f32(2, 16, 8, 8)
    macs = 2 * 16 * 8 * 8 * (8 // 2) * 3 * 3
    assert node_cost("Conv", [x, w], [y], attrs).flops == 2 * macs
    assert node_cost("Conv", [x, w, b], [y], attrs).flops == 2 * macs + 2 * 16 * 8 * 8
    # the weight's shape may be missing (pre-packed): kernel_shape and group give the same
    assert node_cost("Conv", [x, UNKNOWN, b], [y], attrs).flops == 2 * macs + 2 * 16 * 8 * 8
    assert node_cost("Conv", [x, UNKNOWN, b], [y], None).flops is None


def test_ops_onnxruntime_fused() -> None:
    x, w, b, y = f32(1, 3, 8, 8), f32(4, 3, 3, 3), f32(4), f32(1, 4, 6, 6)
    conv = 2 * 144 * 27 + 144
    assert node_cost("FusedConv", [x, w, b], [y], {"activation": "Relu"}).flops == conv + 144
    # NCHWc Conv with a fused residual: a 4th input, one add per output element
    assert node_cost("Conv", [x, w, b, y], [y]).flops == conv + 144
    assert node_cost("FusedGemm", [f32(3, 5), UNKNOWN, f32(7)], [f32(3, 7)]).flops == 231 + 21


def test_conv_shape_inference_agrees() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 15, 15])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.zeros((16, 4, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", group=2, strides=[2, 2],
                            pads=[2, 2, 2, 2], dilations=[2, 2])
    model = _model([node], [x], [y], [w])
    assert model_costs(model, {"x": [2, 8, 15, 15]})["c"] == NodeCost(
        2 * (2 * 16 * 8 * 8 * 4 * 9), (2 * 8 * 15 * 15 + 16 * 4 * 9) * 4, 2 * 16 * 8 * 8 * 4)
    assert model_costs(model)["c"].flops is None  # batch left symbolic: unknown, not guessed


def test_conv_transpose() -> None:
    # X (1,4,5,5), W (Cin=4, Cout/group=3, 3, 3), stride 2: Y (1,3,11,11)
    x, w, b, y = f32(1, 4, 5, 5), f32(4, 3, 3, 3), f32(3), f32(1, 3, 11, 11)
    assert node_cost("ConvTranspose", [x, w], [y], {}).flops == 2 * (4 * 25) * (3 * 9)
    assert node_cost("ConvTranspose", [x, w, b], [y], {}).flops == 5400 + 3 * 121
    # group 2: W (4, 2, 3, 3), Cout = 4
    assert node_cost("ConvTranspose", [x, f32(4, 2, 3, 3)], [f32(1, 4, 11, 11)],
                     {"group": 2}).flops == 2 * 100 * 2 * 9


@pytest.mark.parametrize("a,b,attrs", [((3, 5), (5, 7), {}),
                                       ((5, 3), (5, 7), {"transA": 1}),
                                       ((3, 5), (7, 5), {"transB": 1}),
                                       ((5, 3), (7, 5), {"transA": 1, "transB": 1})])
def test_gemm_with_and_without_bias(a, b, attrs) -> None:
    y = f32(3, 7)
    assert node_cost("Gemm", [f32(*a), f32(*b)], [y], attrs).flops == 2 * 3 * 7 * 5
    assert node_cost("Gemm", [f32(*a), f32(*b), f32(7)], [y], attrs).flops == 210 + 21
    assert node_cost("Gemm", [f32(*a), f32(*b), None], [y], attrs).flops == 210


def test_batched_and_broadcast_matmul() -> None:
    y = f32(2, 3, 4, 6)
    assert node_cost("MatMul", [f32(2, 3, 4, 5), f32(2, 3, 5, 6)], [y]).flops == 2 * 144 * 5
    assert node_cost("MatMul", [f32(2, 1, 4, 5), f32(3, 5, 6)], [y]).flops == 1440
    assert node_cost("MatMul", [f32(5), f32(5, 6)], [f32(6)]).flops == 2 * 6 * 5


def test_pooling() -> None:
    x = f32(1, 2, 6, 6)
    assert node_cost("MaxPool", [x], [f32(1, 2, 4, 4)], {"kernel_shape": [3, 3]}).flops == 288
    assert node_cost("AveragePool", [x], [f32(1, 2, 3, 3)],
                     {"kernel_shape": [2, 2], "strides": [2, 2]}).flops == 18 * 4
    assert node_cost("MaxPool", [x], [f32(1, 2, 4, 4)], None).flops is None  # no kernel_shape
    assert node_cost("GlobalAveragePool", [f32(2, 3, 4, 5)], [f32(2, 3, 1, 1)]).flops == 120


@pytest.mark.parametrize("op,ins", [("Add", [f32(2, 3, 4), f32(4)]), ("Relu", [f32(2, 3, 4)]),
                                    ("Sigmoid", [f32(2, 3, 4)])])
def test_elementwise_is_one_per_output_element(op, ins) -> None:
    assert node_cost(op, ins, [f32(2, 3, 4)], {}).flops == 24


def test_normalizations_softmax_reductions() -> None:
    x = f32(2, 3, 4, 4)
    assert node_cost("BatchNormalization", [x, f32(3), f32(3), f32(3), f32(3)], [x]).flops == 192
    assert node_cost("InstanceNormalization", [x, f32(3), f32(3)], [x]).flops == 7 * 96
    ln = f32(2, 5, 8)
    assert node_cost("LayerNormalization", [ln, f32(8), f32(8)], [ln]).flops == 7 * 80
    assert node_cost("LayerNormalization", [ln, f32(8)], [ln]).flops == 6 * 80
    assert node_cost("Softmax", [f32(4, 10)], [f32(4, 10)], {"axis": -1}).flops == 200
    assert node_cost("ReduceMean", [f32(2, 3, 4)], [f32(2, 1, 1)], {}).flops == 24


@pytest.mark.parametrize("mode,per_element", [("nearest", 0), ("linear", 2 * 4), ("cubic", 2 * 16)])
def test_resize_by_mode(mode, per_element) -> None:
    ins = [f32(1, 3, 4, 4), None, f32(4)]  # roi absent, scales given
    assert node_cost("Resize", ins, [f32(1, 3, 8, 8)], {"mode": mode}).flops == 192 * per_element
    assert node_cost("Resize", ins, [f32(1, 3, 8, 8)], None).flops is None


def test_quantized_conv_and_matmul_count_as_their_float_ops() -> None:
    # QLinearConv: x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B (int32 bias)
    x, w, y = TensorSpec("int8", (1, 8, 10, 10)), TensorSpec("int8", (16, 8, 3, 3)), \
        TensorSpec("int8", (1, 16, 8, 8))
    s, z, b = f32(), TensorSpec("int8", ()), TensorSpec("int32", (16,))
    conv = 2 * 16 * 8 * 8 * 8 * 3 * 3
    assert node_cost("QLinearConv", [x, s, z, w, s, z, s, z], [y]).flops == conv
    assert node_cost("QLinearConv", [x, s, z, w, s, z, s, z, b], [y]).flops == conv + 1024
    attrs = {"kernel_shape": [3, 3], "group": 1}
    assert node_cost("QLinearConv", [x, s, z, UNKNOWN, s, z, s, z, b], [y],
                     attrs).flops == conv + 1024
    assert node_cost("ConvInteger", [x, w, z, z], [TensorSpec("int32", (1, 16, 8, 8))]
                     ).flops == conv
    # QLinearMatMul: a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp
    a, bm = TensorSpec("uint8", (4, 32)), TensorSpec("uint8", (32, 10))
    mm = 2 * 4 * 10 * 32
    assert node_cost("QLinearMatMul", [a, s, z, bm, s, z, s, z],
                     [TensorSpec("uint8", (4, 10))]).flops == mm
    assert node_cost("MatMulInteger", [a, bm], [TensorSpec("int32", (4, 10))]).flops == mm
    # quantize and dequantize: one element-wise op per element, as Cast
    assert node_cost("QuantizeLinear", [f32(4, 5), s, z], [TensorSpec("int8", (4, 5))]).flops == 20
    assert node_cost("DequantizeLinear", [TensorSpec("int8", (4, 5)), s, z],
                     [f32(4, 5)]).flops == 20


def test_unknown_op_has_no_flops_but_bytes() -> None:
    cost = node_cost("NonMaxSuppression", [f32(1, 10, 4), f32(1, 1, 10)],
                     [TensorSpec("int64", (3, 3))], {})
    assert cost == NodeCost(None, (40 + 10) * 4, 9 * 8)


# --- bytes ---------------------------------------------------------------------------------------
def test_bytes_count_inputs_with_weights_and_outputs() -> None:
    cost = node_cost("Conv", [f32(1, 3, 8, 8), f32(4, 3, 3, 3), f32(4)], [f32(1, 4, 6, 6)], {})
    assert (cost.bytes_read, cost.bytes_written, cost.bytes) == (768 + 432 + 16, 576, 1792)
    half = node_cost("Relu", [TensorSpec("float16", (10,))], [TensorSpec("float16", (10,))])
    assert (half.bytes_read, half.bytes_written) == (20, 20)
    assert TensorSpec("int4", (3,)).nbytes == 2
    assert TensorSpec("string", (3,)).nbytes is None
    # an absent optional input counts nothing; an input of unknown shape makes it unknown
    assert node_cost("Gemm", [f32(2, 2), f32(2, 2), None], [f32(2, 2)]).bytes_read == 32
    assert node_cost("Gemm", [f32(2, 2), UNKNOWN], [f32(2, 2)]).bytes_read is None


# --- real onnxruntime traces ---------------------------------------------------------------------
RUNS = 4
CONV_FLOPS = 2 * (8 * 16 * 16) * 27 + 8 * 16 * 16
MATMUL_FLOPS = 2 * 10 * 512


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 13  # onnxruntime 1.31 rejects onnx 1.23's default IR 14
    return m


@pytest.fixture(scope="module")
def cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.random((8, 3, 3, 3), np.float32), "w"),
             numpy_helper.from_array(rng.random(8, np.float32), "b"),
             numpy_helper.from_array(rng.random((512, 10), np.float32), "fc"),
             numpy_helper.from_array(rng.random(10, np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),  # unnamed: onnxruntime calls it Relu_1
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fc"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "fc_b"], ["a"], name="bias"),
             helper.make_node("Softmax", ["a"], ["y"], name="softmax")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)


def _trace(model: onnx.ModelProto, where: Path, runs: int, optimize: bool = False) -> Path:
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(where / "ort")
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).random((1, 3, 16, 16), np.float32)
    for _ in range(runs):
        sess.run(None, {"x": x})
    return Path(sess.end_profiling())


@pytest.fixture(scope="module")
def cnn_trace(cnn, tmp_path_factory) -> Path:
    return _trace(cnn, tmp_path_factory.mktemp("trace"), RUNS)


def test_real_trace_nodes_and_counts(cnn, cnn_trace) -> None:
    p = load_profile(cnn_trace)
    assert p.runs == RUNS and len(p.run_times) == RUNS
    assert [n.name for n in p.nodes] == ["conv", "Relu_1", "pool", "flat", "mm", "bias",
                                         "softmax"]
    assert [n.op_type for n in p.nodes] == [n.op_type for n in cnn.graph.node]
    assert all(n.calls == RUNS and n.provider == "CPUExecutionProvider" for n in p.nodes)
    conv = p.nodes[0]
    assert conv.variants[0].inputs == (f32(1, 3, 16, 16), f32(8, 3, 3, 3), f32(8))
    assert conv.variants[0].outputs == (f32(1, 8, 16, 16),)
    assert p.session_init is not None and p.session_init > 0


def test_real_trace_costs_with_and_without_model(cnn, cnn_trace) -> None:
    p = load_profile(cnn_trace)
    with_model = {r.name: r for r in analyze(p, cnn, top=0).rows}
    trace_only = {r.name: r for r in analyze(p, top=0).rows}
    assert with_model["conv"].computation == CONV_FLOPS == trace_only["conv"].computation
    assert with_model["pool"].computation == 8 * 8 * 8 * 4
    assert trace_only["pool"].computation is None  # kernel_shape lives in the model only
    # MatMul pre-packs its weight, so the trace lists only A: bytes need the model
    assert [t.shape for t in p.nodes[4].variants[0].inputs] == [(1, 512)]
    assert with_model["mm"].computation == MATMUL_FLOPS == trace_only["mm"].computation
    assert with_model["mm"].memory == (512 + 512 * 10 + 10) * 4
    assert trace_only["mm"].memory is None
    row = with_model["conv"]
    assert row.flops == pytest.approx(CONV_FLOPS / row.time)
    assert row.bandwidth == pytest.approx(row.memory / row.time)


def test_weights_held_in_constant_nodes_are_counted_like_initializers(tmp_path: Path) -> None:
    """PaddlePaddle's exporter (PP-OCR's det, rec and cls) keeps every weight in a Constant
    node, not in the initializers; onnxruntime pre-packs them all the same, so the trace
    lists MatMul's A alone and the bytes showed N/A with the model given."""
    w = np.random.default_rng(0).random((512, 10), np.float32)
    model = _model([helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
                    helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])])
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "ort")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for _ in range(RUNS):
        sess.run(None, {"x": np.ones((1, 512), np.float32)})
    p = load_profile(Path(sess.end_profiling()))
    assert [t.shape for t in next(n for n in p.nodes if n.name == "mm").variants[0].inputs] \
        == [(1, 512)]  # the weight is not in the trace
    row = next(r for r in analyze(p, model, top=0).rows if r.name == "mm")
    assert (row.computation, row.memory) == (MATMUL_FLOPS, (512 + 512 * 10 + 10) * 4)


def test_real_trace_summary(cnn, cnn_trace) -> None:
    p = load_profile(cnn_trace)
    report = analyze(p, cnn, top=0)
    s = report.summary
    assert s.kernel_time == pytest.approx(sum(n.total for n in p.nodes) / RUNS)
    assert s.device_time == s.kernel_time and not s.device_events  # CPU: one clock
    assert s.run_time == pytest.approx(sum(p.run_times) / RUNS)
    assert s.host_overhead == pytest.approx(s.run_time - s.kernel_time)
    assert s.host_overhead >= 0
    assert s.nodes == 7 and s.calls == 7 * RUNS and s.unknown_computation == 0
    assert report.rows[-1].cumulative_share == pytest.approx(100.0)
    assert sum(r.time for r in report.rows) == pytest.approx(s.total)
    json.dumps(report.to_dict())  # the --json document is plain JSON


def test_skip_runs_drops_the_first_run_and_what_ran_in_it(cnn_trace) -> None:
    skipped = load_profile(cnn_trace, skip_runs=1)
    assert skipped.runs == RUNS - 1 and all(n.calls == RUNS - 1 for n in skipped.nodes)
    # the oracle: the trace without its first model_run and every event inside it
    events = json.loads(cnn_trace.read_text())
    first = min((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                key=lambda e: e["ts"])
    start, end = first["ts"], first["ts"] + first["dur"]
    dropped = parse_profile([e for e in events if not (
        isinstance(e.get("ts"), (int, float)) and start <= e["ts"] <= end)])
    assert [(n.name, n.calls, n.total) for n in dropped.nodes] == \
        [(n.name, n.calls, n.total) for n in skipped.nodes]
    with pytest.raises(ProfileError, match=f"cannot skip {RUNS} warmup runs, the profile has "
                                           f"{RUNS}$"):
        load_profile(cnn_trace, skip_runs=RUNS)


def test_gemm_prepacked_weight_in_trace(tmp_path) -> None:
    inits = [numpy_helper.from_array(np.ones((32, 16), np.float32), "B"),
             numpy_helper.from_array(np.ones(32, np.float32), "C")]
    model = _model([helper.make_node("Gemm", ["x", "B", "C"], ["y"], name="fc", transB=1)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], inits)
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "g")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    sess.run(None, {"x": np.ones((4, 16), np.float32)})
    p = load_profile(Path(sess.end_profiling()))
    flops = 2 * 4 * 32 * 16 + 4 * 32
    trace_only, = analyze(p).rows
    assert (trace_only.computation, trace_only.memory) == (flops, None)
    with_model, = analyze(p, ModelIndex.of(model)).rows
    assert (with_model.computation, with_model.bytes_read, with_model.bytes_written) == \
        (flops, (64 + 512 + 32) * 4, 128 * 4)


def test_optimized_graph_still_parses(cnn, tmp_path) -> None:
    report = analyze(load_profile(_trace(cnn, tmp_path, 2, optimize=True)), cnn, top=0)
    assert report.summary.runs == 2
    assert report.rows[-1].cumulative_share == pytest.approx(100.0)


# --- hand-written traces: exact times ----------------------------------------------------------
def _node(name, op, ts, dur, ins=(), outs=(), provider="CPUExecutionProvider", tid=1):
    return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "ph": "X",
            "pid": 1, "tid": tid,
            "args": {"op_name": op, "provider": provider, "unknown_field": {"x": 1},
                     "input_type_shape": [{"float": list(s)} for s in ins],
                     "output_type_shape": [{"float": list(s)} for s in outs]}}


def _run(ts, dur):
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur, "args": {}}


CONV_IN, CONV_OUT = [(1, 3, 8, 8), (4, 3, 3, 3)], [(1, 4, 6, 6)]
SMALL_CONV = 2 * 144 * 27


def _two_runs() -> list[dict]:
    events = []
    for start, (c1, c2, r) in ((1000, (100, 50, 10)), (2000, (120, 50, 30))):
        events += [_node("conv1", "Conv", start + 1, c1, CONV_IN, CONV_OUT),
                   _node("conv2", "Conv", start + 200, c2, CONV_IN, CONV_OUT),
                   _node("relu", "Relu", start + 300, r, [(1, 4, 6, 6)], [(1, 4, 6, 6)]),
                   _node("odd", "TopK", start + 400, 5, [(8,)], [(2,)]),
                   _run(start, 500)]
    return [{"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 900}] + events


def test_per_node_statistics() -> None:
    p = parse_profile(_two_runs())
    conv1 = p.nodes[0]
    assert conv1.calls == 2
    assert (conv1.total, conv1.min, conv1.max) == pytest.approx((220e-6, 100e-6, 120e-6))
    assert conv1.mean == pytest.approx(110e-6)
    assert p.run_times == (500e-6, 500e-6) and p.session_init == 900e-6


def test_aggregate_by_type() -> None:
    p = parse_profile(_two_runs())
    rows = {r.name: r for r in analyze(p, top=0).rows}
    for how, time, flops in (("sum", 160e-6, 2 * SMALL_CONV), ("mean", 80e-6, SMALL_CONV),
                             ("max", 110e-6, SMALL_CONV), ("min", 50e-6, SMALL_CONV)):
        conv, = [r for r in analyze(p, top=0, aggregate_by="type", aggregate=how).rows
                 if r.op_type == "Conv"]
        assert (conv.name, conv.nodes, conv.calls) == ("Conv", 2, 4)
        assert conv.time == pytest.approx(time)
        assert conv.computation == flops
    summed = analyze(p, top=0, aggregate_by="type", aggregate="sum").rows
    assert sum(r.time for r in summed) == pytest.approx(sum(r.time for r in rows.values()))
    conv_sum, = [r for r in summed if r.op_type == "Conv"]
    assert conv_sum.computation == rows["conv1"].computation + rows["conv2"].computation
    assert [r.computation for r in summed if r.op_type == "TopK"] == [None]
    everything, = analyze(p, aggregate="sum").rows
    assert (everything.name, everything.nodes) == ("all", 4)
    # the TopK of unknown FLOPs is counted, not a reason to hide the rest (it made the row N/A)
    known = [r.computation for r in rows.values() if r.computation is not None]
    assert everything.computation == sum(known) and everything.unknown_nodes >= 1
    assert analyze(p, aggregate_by="type").options.aggregate == "sum"


def test_ordering_and_top() -> None:
    p = parse_profile(_two_runs())
    assert [r.name for r in analyze(p).rows] == ["conv1", "conv2", "relu"]  # top 3 by time
    assert [r.name for r in analyze(p, top=0, order_by="+time").rows] == \
        ["odd", "relu", "conv2", "conv1"]
    # unknown values sort last whichever the direction
    assert [r.name for r in analyze(p, top=0, order_by="computation").rows][-1] == "odd"
    assert [r.name for r in analyze(p, top=0, order_by="+computation").rows] == \
        ["relu", "conv1", "conv2", "odd"]
    assert [r.name for r in analyze(p, top=0, order_by="+name").rows] == \
        ["conv1", "conv2", "odd", "relu"]
    rows = analyze(p, top=2).rows
    assert rows[1].cumulative == pytest.approx(rows[0].time + rows[1].time)
    assert rows[0].share == pytest.approx(100 * 110 / 185)


def test_filters() -> None:
    p = parse_profile(_two_runs())
    names = lambda **kw: [r.name for r in analyze(p, top=0, **kw).rows]  # noqa: E731
    assert names(types=["Conv"]) == ["conv1", "conv2"]
    assert names(name="^c.*2$") == ["conv2"]
    assert names(name="onv") == ["conv1", "conv2"]
    assert names(min_time=15e-6) == ["conv1", "conv2", "relu"]
    assert names(min_time=15e-6, max_time=60e-6) == ["conv2", "relu"]
    # shares stay relative to the whole run, not to what the filters kept
    relu, = analyze(p, types=["Relu"]).rows
    assert relu.share == pytest.approx(100 * 20 / 185)


def test_bad_options() -> None:
    p = parse_profile(_two_runs())
    with pytest.raises(UsageError) as e:
        analyze(p, order_by="+speed")
    assert str(e.value) == ("unknown --order-by column 'speed'; valid: time, calls, "
                            "computation, flops, memory, bandwidth, name, type, provider")
    assert list(COLUMNS) == str(e.value).split("valid: ")[1].split(", ")
    with pytest.raises(UsageError, match=r"^unknown --aggregate 'median'; valid: sum, mean, "
                                         r"max, min$"):
        analyze(p, aggregate="median")
    with pytest.raises(UsageError, match=r"^--opr-name '\(' is not a valid regular expression"):
        analyze(p, name="(")
    with pytest.raises(UsageError, match=r"^--top must be 0 \(all\) or more, got -1$"):
        analyze(p, top=-1)


def test_nested_kernels_count_once() -> None:
    events = [_node("iff", "If", 10, 100), _node("then_relu", "Relu", 30, 40), _run(0, 120)]
    p = parse_profile(events)
    assert {n.name: n.total for n in p.nodes} == pytest.approx({"iff": 60e-6, "then_relu": 40e-6})
    s = analyze(p).summary
    assert s.kernel_time == pytest.approx(100e-6)
    assert s.host_overhead == pytest.approx(20e-6)
    # back to back is not nested
    p = parse_profile([_node("a", "Relu", 0, 10), _node("b", "Relu", 10, 5), _run(0, 20)])
    assert {n.name: n.total for n in p.nodes} == pytest.approx({"a": 10e-6, "b": 5e-6})


def test_device_kernel_events_are_the_device_clock() -> None:
    kernel = {"cat": "Kernel", "name": "void gemm_kernel<...>", "ts": 11, "dur": 30, "args": {}}
    events = [_node("mm", "MatMul", 10, 8, [(4, 8)], [(4, 2)], "CUDAExecutionProvider"),
              kernel, dict(kernel, ts=12, dur=5),
              _node("shape", "Shape", 40, 3, [(4, 2)], [(2,)]), _run(0, 60)]
    p = parse_profile(events)
    assert p.device_events
    device = {r.name: r.time for r in analyze(p, top=0).rows}
    host = {r.name: r.time for r in analyze(p, top=0, clock="host").rows}
    assert device == pytest.approx({"mm": 35e-6, "shape": 3e-6})
    assert host == pytest.approx({"mm": 8e-6, "shape": 3e-6})
    assert analyze(p).summary.device_time == pytest.approx(38e-6)
    assert analyze(p).summary.kernel_time == pytest.approx(11e-6)


def test_trace_object_form_and_no_run_events() -> None:
    events = [_node("a", "Relu", 0, 5, [(2,)], [(2,)]), _node("a", "Relu", 10, 7, [(2,)], [(2,)])]
    p = parse_profile({"traceEvents": events})
    assert (p.runs, p.run_times, p.nodes[0].calls) == (2, (), 2)
    assert analyze(p).summary.host_overhead is None


# --- bad files -----------------------------------------------------------------------------------
@pytest.mark.parametrize("content,message", [
    ("", "not a JSON trace (Expecting value at line 1 column 1)"),
    ("{\"a\": 1}", "not an ONNX Runtime profile (expected a JSON list of trace events, "
     "or an object with a 'traceEvents' list)"),
    ("[]", "no node events; the session never ran while profiling was on"),
    (json.dumps([{"cat": "Node", "name": "a_kernel_time", "ts": 0, "dur": "7"}]),
     "event 0 (a_kernel_time): 'dur' is not a number"),
    (json.dumps([{"cat": "Node", "name": "a_kernel_time", "ts": 0, "dur": -5}]),
     "event 0 (a_kernel_time): 'dur' is negative (-5); a hand-edited trace?"),
])
def test_bad_files(tmp_path, content, message) -> None:
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert str(e.value) == f"{path}: {message}"


def test_missing_file(tmp_path) -> None:
    with pytest.raises(ProfileError) as e:
        load_profile(tmp_path / "nope.json")
    assert str(e.value) == f"{tmp_path / 'nope.json'}: no such file"


def test_si() -> None:
    assert si(236.03e6, "FLO") == "236.03 MFLO"
    assert si(3.67 * 1024 ** 2, "B", 1024) == "3.67 MiB"
    assert si(None, "FLOPS") == "N/A"
