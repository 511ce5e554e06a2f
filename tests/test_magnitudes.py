"""A tensor that only selects values from another (a ReLU6 after a convolution), or squashes
them with a bounded slope (a Sigmoid), is judged no tighter than the share of its sources'
magnitude it can pass on (graph.value_sources, compare.Magnitudes): the sources' noise is its
noise however small its own peak. PP-OCRv4 rec on raw 0-255 pixels failed 17 Clip outputs
between two opt levels of one CPU, and localize named a "failing subgraph" there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from corpus import model_path
from fixtures_devices import run_cli
from verify.compare import Magnitudes, ToleranceSet, compare
from verify.graph import value_sources


def test_value_sources_follow_selecting_and_squashing_ops_to_computed_tensors() -> None:
    w = nh.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             h.make_node("Clip", ["c", "lo", "hi"], ["clip"], name="clip"),
             h.make_node("MaxPool", ["clip"], ["pool"], kernel_shape=[1, 1], name="pool"),
             h.make_node("Reshape", ["pool", "shape"], ["flat"], name="reshape"),
             h.make_node("Max", ["c", "clip", "w"], ["mx"], name="max"),
             h.make_node("Sigmoid", ["c"], ["sig"], name="sig"),
             h.make_node("LeakyRelu", ["c"], ["leaky"], alpha=2.0, name="leaky"),
             h.make_node("LeakyRelu", ["c"], ["leaky2"], alpha=0.1, name="leaky2"),
             h.make_node("HardSwish", ["c"], ["hs"], name="hs"),
             h.make_node("Relu", ["x"], ["relu_x"], name="relu_x")]
    inits = [w, nh.from_array(np.array(0, np.float32), "lo"),
             nh.from_array(np.array(6, np.float32), "hi"),
             nh.from_array(np.array([-1], np.int64), "shape")]
    m = h.make_model(h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT,
                                                                        [1, 2, 2, 2])],
                                  [h.make_tensor_value_info("flat", T.FLOAT, None)], inits))
    assert value_sources(m) == {"clip": ("c",), "pool": ("clip",), "flat": ("pool",),
                                "mx": ("c", "clip"), "sig": ("c",), "leaky2": ("c",)}


def _conv_then_relu6() -> tuple[dict, dict]:
    """A reference 'convolution' peaking at 600 and its ReLU6, and an actual side whose
    convolution carries benign noise (4.6e-4: 0.013x its tolerance) that ReLU6 passes on."""
    rng = np.random.default_rng(0)
    c = (rng.standard_normal(4096) * 150).astype(np.float32)
    c[0] = 600.0
    c[1:200] = rng.uniform(0.5, 5.5, 199)  # values the clip passes through
    noise = np.where(np.arange(4096) % 2, 4.6e-4, -4.6e-4).astype(np.float32)
    ref = {"c": c, "y": np.clip(c, 0, 6)}
    act = {"c": c + noise, "y": np.clip(c + noise, 0, 6)}
    return act, ref


def test_a_relu6_is_judged_against_its_convolution_s_magnitude() -> None:
    act, ref = _conv_then_relu6()
    rules = ToleranceSet()
    alone = compare("y", act["y"], ref["y"], rules.rule_for("y"))
    assert not alone.passed  # against its own peak (6): 4.6e-4 > 6 * 2^-14
    mags = Magnitudes(rules, {}, {"y": ("c",)}, {"y": "Clip"})
    assert mags.judge("c", act["c"], ref["c"]).passed
    got = mags.judge("y", act["y"], ref["y"])
    assert got.passed and got.threshold == pytest.approx(600 * 2 ** -14)
    assert "floor=600" in got.rule
    # a wrong ReLU6 (it clips at 5) is still caught: 1 against a threshold of 0.037
    wrong = np.clip(act["c"], 0, 5)
    mags = Magnitudes(rules, {}, {"y": ("c",)}, {"y": "Clip"})
    mags.judge("c", act["c"], ref["c"])
    assert not mags.judge("y", wrong, ref["y"]).passed
    # a source not judged yet lends nothing; a Sigmoid takes a quarter of it
    assert Magnitudes(rules, {"y": 0.5}, {"y": ("c",)}, {"y": "Clip"}).floor("y") == 0.5
    mags = Magnitudes(rules, {"s": 1 / 16}, {"s": ("c",)}, {"s": "Sigmoid"})
    mags.judge("c", act["c"], ref["c"])
    assert mags.floor("s") == pytest.approx(150.0)


@pytest.fixture(scope="module")
def rec_raw_pixels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PP-OCRv4 rec packed on raw 0-255 pixels (no --scale): activations reach ~1e5."""
    from PIL import Image

    root = tmp_path_factory.mktemp("rec")
    pixels = (np.random.RandomState(0).rand(300, 400, 3) * 255).astype("uint8")
    Image.fromarray(pixels).save(root / "img.png")
    vtc = root / "rec.vtc"
    from verify.cli import main

    assert main(["pack", str(model_path("ppocr_rec")), "-d", str(root / "img.png"), "--shape",
                 "x:1x3x48x320", "-o", str(vtc), "--json"]) == 0
    return vtc


def test_two_opt_levels_of_one_cpu_diff_clean_on_raw_pixels(
        rec_raw_pixels: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dumps = {}
    for level in ("all", "disable"):
        dumps[level] = tmp_path / level
        code, out, err = run_cli(["run", rec_raw_pixels, "--opt-level", level, "--iter", "1",
                                  "--warmup", "0", "--bin-io-dump", dumps[level]], capsys)
        assert code == 0, out + err
    for a, r in (("all", "disable"), ("disable", "all")):
        code, out, err = run_cli(["diff", dumps[a], dumps[r]], capsys)
        assert code == 0 and out.splitlines()[-1].startswith("=== PASS"), out + err
    code, out, err = run_cli(["diff", dumps["all"], rec_raw_pixels], capsys)
    assert code == 0, out + err


def test_localize_finds_no_faulty_node_on_raw_pixels(
        rec_raw_pixels: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["localize", rec_raw_pixels, "--device", "local", "-o", tmp_path],
                             capsys)
    assert code == 0, out + err
    assert "=== no faulty node" in out
