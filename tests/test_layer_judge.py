"""A tensor that only selects values from another (a ReLU6 after a convolution), or squashes
them with a bounded slope (a Sigmoid), is not blamed for the share of its sources' measured
error it can pass on (graph.value_sources, layer_judge.LayerJudge): the sources' noise is its
noise however small its own peak. PP-OCRv4 rec on raw 0-255 pixels failed 17 Clip outputs
between two opt levels of one CPU, and localize named a "failing subgraph" there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from corpus import model_path
from fixtures_devices import run_cli
from fixtures_dump import dump_factory  # noqa: F401  (a fixture)
from helpers_cli import verify
from verify.compare import ToleranceSet, compare
from verify.layer_judge import LayerJudge
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


def test_a_relu6_is_not_blamed_for_its_convolution_s_error() -> None:
    act, ref = _conv_then_relu6()
    rules = ToleranceSet()
    alone = compare("y", act["y"], ref["y"], rules.rule_for("y", np.float32))
    assert not alone.passed  # against its own peak (6): 4.6e-4 > 6 * 2^-14
    judge = LayerJudge(rules, {}, {"y": ("c",)}, {"y": "Clip"})
    source = judge("c", act["c"], ref["c"])
    assert source.passed and source.max_abs < 0.02 * source.threshold
    got = judge("y", act["y"], ref["y"])
    assert got.passed and got.threshold == pytest.approx(source.max_abs)  # c's error
    # a wrong ReLU6 (it clips at 5) is caught: 1 against the 4.6e-4 its source hands it
    judge = LayerJudge(rules, {}, {"y": ("c",)}, {"y": "Clip"})
    judge("c", act["c"], ref["c"])
    assert not judge("y", np.clip(act["c"], 0, 5), ref["y"]).passed
    # pieces fed the reference inputs inherit nothing
    assert not judge.plain("y", act["y"], ref["y"]).passed
    # a source not judged (fused away, filtered out) lends nothing
    assert LayerJudge(rules, {}, {"y": ("c",)}, {"y": "Clip"}).rule("y", np.float32) == \
        rules.rule_for("y", np.float32, 0.0)


def test_a_masked_softmax_or_a_min_with_a_large_bound_gets_no_slack_from_it() -> None:
    """What a source lends is its measured error, not its tolerance: a -1e4 attention mask
    before a Softmax (its tolerance 0.6) or a 1e4 clamp beside a Min (exact) lends nothing,
    so a Softmax that lost 20% of a row's mass, or a Min off by 0.3, fails."""
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((4, 8)).astype(np.float32)
    masked = scores + np.where(np.arange(8) < 6, 0.0, -1e4).astype(np.float32)
    probs = np.exp(masked - masked.max(-1, keepdims=True))
    probs = (probs / probs.sum(-1, keepdims=True)).astype(np.float32)
    wrong = probs.copy()
    wrong[0] *= 0.8
    rules = ToleranceSet()
    judge = LayerJudge(rules, {"p": 1 / 16}, {"p": ("m",)}, {"p": "Softmax"})
    assert judge("m", masked, masked).passed
    assert not judge("p", wrong, probs).passed
    a = rng.uniform(-1, 1, 1000).astype(np.float32)
    bound = np.full(1000, 1e4, np.float32)
    judge = LayerJudge(rules, {}, {"m": ("a", "bound")}, {"m": "Min"})
    judge("a", a, a)
    judge("bound", bound, bound)
    assert not judge("m", np.minimum(a, bound) + np.float32(0.3), np.minimum(a, bound)).passed


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


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> bytes:
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs, inits),
                     opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    return m.SerializeToString()


def _edited(dump: Path, out: Path, name: str, fn: Any) -> None:
    """A copy of `dump` with tensor `name`'s values replaced by fn(its values)."""
    from helpers_dump import get_tensor, manifest, put_tensor

    shutil.copytree(dump, out)
    m = manifest(out)
    t = next(t for t in m["cases"][0]["tensors"] if t["name"] == name)
    put_tensor(out, m, t, fn(get_tensor(out, t).copy()))


def _rows(out: str) -> dict:
    return {r["name"]: r["diff"] for r in json.loads(out)["cases"][0]["rows"] if r["diff"]}


@pytest.mark.parametrize("neg", [-10000.0, float(np.finfo(np.float32).min)])
def test_a_wrong_softmax_after_an_attention_mask_fails_the_diff(
        neg: float, dump_factory: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """scores + (1 - mask) * NEG, then Softmax: the masked scores' peak is the mask constant
    (BERT's -1e4, transformers' float32 min), which lent the Softmax a tolerance of 0.3 or
    1e34 while it passed on tolerances; their error lends nothing."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("MatMul", ["x", "wq"], ["scores"], name="qk"),
             h.make_node("Clip", ["mask", "zero", "one"], ["m01"], name="m01"),
             h.make_node("Sub", ["one", "m01"], ["inv"], name="inv"),
             h.make_node("Mul", ["inv", "neg"], ["bias"], name="bias"),
             h.make_node("Add", ["scores", "bias"], ["masked"], name="add"),
             h.make_node("Softmax", ["masked"], ["probs"], axis=-1, name="softmax")]
    inits = [nh.from_array(rng.standard_normal((8, 8)).astype(np.float32), "wq"),
             nh.from_array(np.array(1, np.float32), "one"),
             nh.from_array(np.array(0, np.float32), "zero"),
             nh.from_array(np.array(neg, np.float32), "neg")]
    model = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 8]),
                           h.make_tensor_value_info("mask", T.FLOAT, [1, 1, 8])],
                   [h.make_tensor_value_info("probs", T.FLOAT, None)], inits)
    ref = dump_factory(model, "disable")

    def wrong(p: np.ndarray) -> np.ndarray:
        p[0, 0, :] *= 0.8  # 20% of row 0's probability mass lost
        return p

    _edited(ref, tmp_path / "act", "probs", wrong)
    code, out, _ = verify(capsys, "diff", tmp_path / "act", ref, "--json")
    assert code == 1 and not _rows(out)["probs"]["passed"]


def _masked_relu(relu_is_output: bool) -> bytes:
    """x @ W -> s; s + bias (float32 min on 4 of 16 columns) -> m; Relu(m) -> y (then y @ W2
    -> z unless y is the output): m's peak is the mask's, 3.4e38."""
    rng = np.random.default_rng(0)
    bias = np.where(np.arange(16) < 12, 0.0, np.finfo(np.float32).min).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "w"], ["s"], name="mm"),
             h.make_node("Add", ["s", "bias"], ["m"], name="add"),
             h.make_node("Relu", ["m"], ["y"], name="relu")]
    inits = [nh.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w"),
             nh.from_array(bias, "bias")]
    if not relu_is_output:
        nodes.append(h.make_node("MatMul", ["y", "w2"], ["z"], name="mm2"))
        inits.append(nh.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2"))
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 16])],
                  [h.make_tensor_value_info("y" if relu_is_output else "z", T.FLOAT, None)],
                  inits)


@pytest.mark.parametrize("actual", ["filtered", "fused"])
def test_a_source_the_actual_side_lacks_lends_nothing(
        actual: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Relu's source left out of the actual dump (--dump-filter), or fused away there (MatMul,
    Add and Relu are one FusedGemm at opt level all): lent its tolerance (its reference peak,
    a float32-min mask), a Relu off by 1000 passed, exit 0. Its error is unknown: it lends
    nothing, and the wrong Relu fails."""
    from fixtures_dump import make_dump, pack
    from helpers_dump import manifest

    vtc = pack(_masked_relu(actual == "fused"), tmp_path / "m.vtc")
    ref = make_dump(vtc, tmp_path / "ref", "disable")
    side = (make_dump(vtc, tmp_path / "side", "disable", "--dump-filter", "^(x|y|z)$")
            if actual == "filtered" else make_dump(vtc, tmp_path / "side", "all"))
    names = {t["name"] for t in manifest(side)["cases"][0]["tensors"]}
    assert "m" not in names and "y" in names

    def wrong(v: np.ndarray) -> np.ndarray:
        v[0, 0] += np.float32(1000.0)
        return v

    _edited(side, tmp_path / "wrong", "y", wrong)
    code, out, _ = verify(capsys, "diff", tmp_path / "wrong", ref, "--json")
    assert code == 1 and not _rows(out)["y"]["passed"]
    assert verify(capsys, "diff", side, ref)[0] == 0


def test_an_fp16_copy_with_float16_inputs_is_compared_not_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its graph input is the same data rounded to float16: not 'fed different inputs'."""
    from fixtures_dump import make_dump, pack

    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", rng.standard_normal((1, 16)).astype(np.float32))
    dumps = {}
    for name, et, wt in (("f32", T.FLOAT, w), ("f16", T.FLOAT16, w.astype(np.float16))):
        model = _model([h.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
                        h.make_node("Relu", ["mm"], ["y"], name="relu")],
                       [h.make_tensor_value_info("x", et, [1, 16])],
                       [h.make_tensor_value_info("y", et, None)], [nh.from_array(wt, "w")])
        vtc = pack(model, tmp_path / f"{name}.vtc", "-d", f"x:{tmp_path / 'x.npy'}")
        dumps[name] = make_dump(vtc, tmp_path / name, "disable")
    code, out, err = verify(capsys, "diff", dumps["f16"], dumps["f32"], "--tol", "*:k=2^-9")
    assert code == 0, out + err
    # fed other data, it is refused all the same: more than float16's rounding apart
    np.save(tmp_path / "x2.npy", rng.standard_normal((1, 16)).astype(np.float32))
    vtc = pack(model, tmp_path / "f16b.vtc", "-d", f"x:{tmp_path / 'x2.npy'}")
    other = make_dump(vtc, tmp_path / "f16b", "disable")
    code, out, err = verify(capsys, "diff", other, dumps["f32"], "--tol", "*:k=2^-9")
    assert code == 2 and "were fed different inputs in case 0: 'x' differs" in err


def test_an_output_over_tolerance_as_run_judges_it_fails_the_diff_with_no_layer_blamed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """x * 8 -> c, Sigmoid(c) -> out: c off by 4e-4 (within its tolerance, 8 * 2^-14) hands
    the Sigmoid up to 1e-4, over the output's own tolerance (6.1e-5), and `run` fails it;
    diff, lending the Sigmoid its source's error, passed the same output, exit 0 (PP-OCRv4 det
    at opt level all on an image: run FAIL, diff PASS). diff now fails the outputs as `run`
    judges them and says no layer is over its own: the error accumulated."""
    from fixtures_dump import make_dump, pack
    from helpers_dump import get_tensor, manifest

    nodes = [h.make_node("Mul", ["x", "eight"], ["c"], name="scale"),
             h.make_node("Sigmoid", ["c"], ["out"], name="sig")]
    model = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 256])],
                   [h.make_tensor_value_info("out", T.FLOAT, None)],
                   [nh.from_array(np.array(8, np.float32), "eight")])
    vtc = pack(model, tmp_path / "m.vtc")
    ref = make_dump(vtc, tmp_path / "ref", "disable")
    noise = np.float32(4e-4)
    _edited(ref, tmp_path / "mid", "c", lambda c: c + noise)
    c = get_tensor(tmp_path / "mid", next(t for t in manifest(tmp_path / "mid")["cases"][0][
        "tensors"] if t["name"] == "c"))
    _edited(tmp_path / "mid", tmp_path / "act", "out",
            lambda _: (1 / (1 + np.exp(-c.astype(np.float64)))).astype(np.float32))
    code, out, err = verify(capsys, "diff", tmp_path / "act", vtc, "--json")
    doc = json.loads(out)["cases"][0]
    assert code == 1, out + err
    assert _rows(out)["c"]["passed"] and _rows(out)["out"]["passed"]  # each layer within its own
    over = doc["outputs_over_tolerance"]
    assert [d["name"] for d in over] == ["out"] and over[0]["max_abs"] > over[0]["threshold"]
    assert doc["first_divergent"] is None
    code, out, _ = verify(capsys, "diff", tmp_path / "act", vtc)
    assert code == 1 and out.rstrip().endswith(
        "no single node is over its own tolerance") and "=== FAIL: out over tolerance as `run` "\
        "judges the outputs (max_abs " in out
    # --only-failing: no row to show, and the line over the verdict said no tensor was over
    code, out, _ = verify(capsys, "diff", tmp_path / "act", vtc, "--only-failing")
    assert code == 1 and "no tensor over tolerance" not in out, out
    assert "no layer over its own tolerance; the outputs as `run` judges them:" in out
