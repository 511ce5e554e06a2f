"""The golden models and images: reproducible from scripts/build_goldens.py, and runnable."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
GOLDENS = ROOT / "goldens"
SCRIPT = ROOT / "scripts" / "build_goldens.py"
FILES = [
    "models/cnn.onnx",
    "models/cnn_nhwc.onnx",
    "models/two_io.onnx",
    "models/int_bool.onnx",
    "models/dynamic.onnx",
    "models/unsupported_op.onnx",
    "images/sample.png",
    "images/sample.ppm",
]

# model -> (inputs, outputs), each a list of (name, numpy dtype, shape); str dims are symbolic.
SIGNATURES = {
    "cnn.onnx": (
        [("data", np.float32, [1, 3, 224, 224])],
        [("prob", np.float32, [1, 10])],
    ),
    "cnn_nhwc.onnx": (
        [("data", np.float32, [1, 224, 224, 3])],
        [("prob", np.float32, [1, 10])],
    ),
    "two_io.onnx": (
        [("a", np.float32, [1, 16]), ("b", np.float32, [1, 16])],
        [("sum_relu", np.float32, [1, 16]), ("prod", np.float32, [1, 8])],
    ),
    "int_bool.onnx": (
        [("ids", np.int64, [1, 8]), ("x", np.float32, [1, 8])],
        [("argmax", np.int64, [1]), ("mask", np.bool_, [1, 8]),
         ("selected", np.float32, [1, 8]), ("count", np.int64, [1])],
    ),
    "dynamic.onnx": (
        [("x", np.float32, ["N", 4])],
        [("y", np.float32, ["N", 3])],
    ),
}


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _feeds(inputs: list, rng: np.random.Generator, batch: int = 2) -> dict[str, np.ndarray]:
    feeds = {}
    for name, dtype, shape in inputs:
        concrete = [batch if isinstance(d, str) else d for d in shape]
        if dtype == np.int64:
            feeds[name] = rng.integers(-1000, 1000, size=concrete, dtype=np.int64)
        else:
            feeds[name] = rng.standard_normal(concrete).astype(dtype)
    return feeds


def test_script_reproduces_committed_files(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    differ = [f for f in FILES if (tmp_path / f).read_bytes() != (GOLDENS / f).read_bytes()]
    assert differ == []


def test_check_reports_a_changed_file(tmp_path: Path) -> None:
    shutil.copytree(GOLDENS / "models", tmp_path / "models")
    shutil.copytree(GOLDENS / "images", tmp_path / "images")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr

    target = tmp_path / "models" / "two_io.onnx"
    target.write_bytes(target.read_bytes() + b"\0")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"differs: {tmp_path / 'models' / 'two_io.onnx'}"]


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_model_signature_and_run(name: str) -> None:
    path = GOLDENS / "models" / name
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 13  # what onnxruntime 1.31 accepts
    assert model.producer_name == "verify goldens"

    inputs, outputs = SIGNATURES[name]
    sess = _session(path)
    assert [(i.name, i.shape) for i in sess.get_inputs()] == [(n, s) for n, _, s in inputs]
    assert [(o.name, o.shape) for o in sess.get_outputs()] == [(n, s) for n, _, s in outputs]

    results = sess.run(None, _feeds(inputs, np.random.default_rng(7)))
    for (oname, dtype, shape), value in zip(outputs, results):
        concrete = [2 if isinstance(d, str) else d for d in shape]
        assert value.dtype == dtype, oname
        assert list(value.shape) == concrete, oname
        if value.dtype.kind == "f":
            assert np.all(np.isfinite(value)), oname
            assert np.ptp(value) > 0, oname


def test_cnn_structure() -> None:
    model = onnx.load(GOLDENS / "models" / "cnn.onnx")
    nodes = model.graph.node
    ops = {n.op_type for n in nodes}
    assert {"Conv", "BatchNormalization", "Relu", "MaxPool", "Add", "GlobalAveragePool",
            "Flatten", "Gemm", "Softmax", "Sigmoid", "Mul"} <= ops
    names = [n.name for n in nodes]
    assert len(set(names)) == len(names)
    assert all("/" in n for n in names)
    assert sum(n.op_type == "Add" for n in nodes) >= 2

    stem = nodes[0]
    assert (stem.name, stem.op_type) == ("stem/conv", "Conv")
    assert onnx.helper.get_attribute_value(next(a for a in stem.attribute if a.name == "strides")) == [2, 2]
    # A stride-2 1x1 projection whose output reaches a residual Add.
    proj = next(n for n in nodes if n.name == "block2/proj/conv")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proj.attribute}
    assert attrs["kernel_shape"] == [1, 1] and attrs["strides"] == [2, 2]
    add = next(n for n in nodes if n.name == "block2/add")
    assert "block2/proj/bn:0" in add.input
    sig = [n.name for n in nodes if n.op_type == "Sigmoid"]
    assert sig == ["block3/se/sigmoid"]


def test_cnn_output_is_a_distribution_not_saturated() -> None:
    sess = _session(GOLDENS / "models" / "cnn.onnx")
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    (prob,) = sess.run(None, {"data": x})
    assert prob.sum() == pytest.approx(1.0, abs=1e-5)
    assert prob.max() < 0.9


def test_cnn_nhwc_matches_cnn_on_transposed_input() -> None:
    x = np.random.default_rng(4).standard_normal((1, 3, 224, 224)).astype(np.float32)
    (nchw,) = _session(GOLDENS / "models" / "cnn.onnx").run(None, {"data": x})
    (nhwc,) = _session(GOLDENS / "models" / "cnn_nhwc.onnx").run(
        None, {"data": np.ascontiguousarray(x.transpose(0, 2, 3, 1))})
    np.testing.assert_array_equal(nhwc, nchw)


def test_int_bool_semantics() -> None:
    sess = _session(GOLDENS / "models" / "int_bool.onnx")
    rng = np.random.default_rng(5)
    ids = np.array([[0, 15, 16, -1, 3, 2**40, -(2**40), 7]], dtype=np.int64)
    x = rng.standard_normal((1, 8)).astype(np.float32)
    argmax, mask, selected, count = sess.run(None, {"ids": ids, "x": x})
    assert np.array_equal(selected, np.where(mask, x, selected))
    assert count[0] == mask.sum()
    assert argmax[0] == np.argmax(selected[0])
    assert np.all(selected >= x)  # Where(x > e, x, e) is max(x, e)


def test_dynamic_model_takes_any_batch() -> None:
    sess = _session(GOLDENS / "models" / "dynamic.onnx")
    for n in (1, 5):
        (y,) = sess.run(None, {"x": np.ones((n, 4), dtype=np.float32)})
        assert y.shape == (n, 3)


def test_unsupported_op_fails_to_load() -> None:
    model = onnx.load(GOLDENS / "models" / "unsupported_op.onnx")
    onnx.checker.check_model(model)
    with pytest.raises(Exception, match="Frobnicate"):
        _session(GOLDENS / "models" / "unsupported_op.onnx")


def test_sample_images_decode_to_the_same_pixels() -> None:
    with Image.open(GOLDENS / "images" / "sample.png") as png, \
            Image.open(GOLDENS / "images" / "sample.ppm") as ppm:
        assert (png.format, png.mode, png.size) == ("PNG", "RGB", (256, 192))
        assert (ppm.format, ppm.mode, ppm.size) == ("PPM", "RGB", (256, 192))
        a, b = np.asarray(png), np.asarray(ppm)
    assert np.array_equal(a, b)
    assert a.std() > 30  # not a flat image
