"""The sample CNN's convolution FLOPs equal hand-computed values: computed here from the shapes
and attributes read off the model, by the textbook formula, independently of verify.flops —
and `verify profile` reports the same numbers for a real trace of the model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import onnx
import pytest

from verify.cli import main
from verify.profile_model import model_costs

CNN = Path(__file__).resolve().parent.parent / "goldens" / "models" / "cnn.onnx"


def _attr(node: onnx.NodeProto, name: str, default: object) -> object:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def hand_counted_convs() -> dict[str, int]:
    """FLOPs per Conv node: 2 * N * Cout * Hout * Wout * (Cin / group) * kh * kw, plus one add
    per output element for the bias; Hout = floor((H + pad_begin + pad_end - dilation*(k-1)
    - 1) / stride) + 1."""
    model = onnx.load(str(CNN))
    inferred = onnx.shape_inference.infer_shapes(model)
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in (*inferred.graph.input, *inferred.graph.value_info,
                       *inferred.graph.output)}
    weights = {init.name: list(init.dims) for init in model.graph.initializer}
    counts = {}
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        assert _attr(node, "auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
        n, cin, h, w = dims[node.input[0]]
        cout, cin_per_group, kh, kw = weights[node.input[1]]
        group = int(_attr(node, "group", 1))
        assert cin_per_group == cin // group
        sh, sw = _attr(node, "strides", [1, 1])
        dh, dw = _attr(node, "dilations", [1, 1])
        pt, pl, pb, pr = _attr(node, "pads", [0, 0, 0, 0])
        hout = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
        wout = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
        assert dims[node.output[0]] == [n, cout, hout, wout]  # the formula agrees with onnx
        outputs = n * cout * hout * wout
        bias = outputs if len(node.input) > 2 and node.input[2] else 0
        counts[node.name] = 2 * outputs * (cin // group) * kh * kw + bias
    return counts


def test_hand_counts_of_the_sample_cnn() -> None:
    counts = hand_counted_convs()
    assert len(counts) == 10
    # the stem, worked out in full: 1x3x224x224 -> 8 channels, 3x3, stride 2, pad 1 -> 112x112
    assert counts["stem/conv"] == 2 * 1 * 8 * 112 * 112 * 3 * 3 * 3 == 5_419_008
    costs = model_costs(onnx.load(str(CNN)))
    assert {name: costs[name].flops for name in counts} == counts


def test_profile_of_a_real_run_reports_the_hand_counts(
        capsys: pytest.CaptureFixture[str], cnn_two_cases: Path, private_cache: Path,
        tmp_path: Path) -> None:
    trace = tmp_path / "prof.json"
    # optimizations off: the trace's nodes are the model's own convolutions
    assert main(["run", str(cnn_two_cases), "--opt-level", "disable", "--iter", "2",
                 "--profile", str(trace), "--json"]) == 0
    capsys.readouterr()
    assert main(["profile", str(trace), "--model", str(cnn_two_cases), "--type", "Conv",
                 "-t", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    counts = hand_counted_convs()
    assert {r["name"]: r["computation"] for r in rows} == counts
    for r in rows:
        assert r["flops"] == pytest.approx(r["computation"] / r["time"])
    total = sum(counts.values())
    assert math.isclose(sum(r["computation"] for r in rows), total)
