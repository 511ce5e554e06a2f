"""What localize judges a device's outputs against, and how (found by a review):

- an archive whose ground truth this host's onnxruntime does not reproduce (packed with
  --expected): a healthy device was told the whole model was a failing subgraph, a fusion bug,
  with a repro that passes there;
- the outputs in a per-layer run were judged by the layer judge, which lends upstream errors,
  so localize said "verify run would pass" of outputs `verify run` fails;
- an output no node computes (a graph input, an initializer, a Constant's) was missing from
  the per-layer run's outputs (exit 3, "the runner returned no value") and asked of this
  host's capture in a bisection over the budget (exit 2, "no tensor named").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fixtures_devices import run_cli
from fixtures_localize import REPO


def _localize(archive: Path, device: str, capsys: pytest.CaptureFixture[str],
              *extra: str) -> tuple[int, dict]:
    code, out, err = run_cli(["localize", archive, "--device", device, "--json", *extra], capsys)
    assert code in (0, 1), err
    return code, json.loads(out)


def test_ground_truth_this_host_does_not_reproduce_is_no_device_fault(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = REPO / "goldens" / "models" / "cnn.onnx"
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    [name] = [o.name for o in sess.get_outputs()]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", sess.run(None, {sess.get_inputs()[0].name: x})[0] * 1.01)
    vtc = tmp_path / "given.vtc"
    code, out, err = run_cli(["pack", model, "-d", tmp_path / "x.npy", "--expected",
                              f"{name}:{tmp_path / 'y.npy'}", "-o", vtc], capsys)
    assert code == 0, out + err
    for mode in ([], ["--no-dump"]):
        code, doc = _localize(vtc, "local", capsys, "-o", tmp_path / "out", *mode)
        assert (code, doc["verdict"]) == (0, "no faulty node"), doc
        assert any("this host's own onnxruntime run is over tolerance against the archive's "
                   "ground truth" in n and "given with --expected or by a PyTorch reference?"
                   in n for n in doc["notes"]), doc["notes"]
        assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_an_fp16_archive_of_onnxruntime_s_own_ground_truth_is_judged_against_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An fp16 model packed plainly, localized on this healthy host at the packing settings:
    marking every tensor as an output rounds its float16 intermediates, so the host's capture
    is off its own plain run (8e-5 at the output); the device was judged against the capture,
    and named a "failing subgraph" (`run` passes it). onnxruntime's own ground truth now judges
    the outputs, as `run` does."""
    from corpus_made import fp16_model

    vtc = tmp_path / "o16.vtc"
    code, out, err = run_cli(["pack", fp16_model(), "-d", REPO / "goldens" / "images" /
                              "sample.png", "-o", vtc], capsys)
    assert code == 0, out + err
    assert run_cli(["run", vtc, "--device", "local", "--opt-level", "disable", "--iter", "1"],
                   capsys)[0] == 0
    code, doc = _localize(vtc, "local", capsys, "--opt-level", "disable", "--no-repro")
    assert (code, doc["verdict"]) == (0, "no faulty node"), doc
    assert any(n.startswith("this host's per-layer capture is over tolerance against the "
                            "archive's ground truth") and "rounded to float16" in n
               for n in doc["notes"]), doc["notes"]


def test_outputs_are_judged_as_run_judges_them(faulty_profile, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """PP-OCRv4 cls, its logits' Add scaled by 1.05: `run` fails the Softmax output; the
    per-layer run lent it the Add's error and called it within tolerance."""
    from corpus import model_path

    spec = faulty_profile("dev", "scale", "Add@43", 1.05)
    vtc = tmp_path / "cls.vtc"
    code, out, err = run_cli(["pack", model_path("ppocr_cls"), "-d",
                              REPO / "goldens" / "images" / "sample.png", "--shape",
                              "x:1x3x48x192", "--scale", "0.00392156862745098", "-o", vtc], capsys)
    assert code == 0, out + err
    code, _, _ = run_cli(["run", vtc, "--device", spec, "--iter", "1"], capsys)
    assert code == 1
    code, doc = _localize(vtc, spec, capsys, "--no-repro")
    assert code == 1 and doc["mode"] == "dump"
    assert doc["outputs"] and not any(o["passed"] for o in doc["outputs"])
    assert not any("verify run would pass" in n for n in doc["notes"])
    assert not any("ulp(s) of the output's peak" in n for n in doc["notes"]), doc["notes"]


def test_an_error_of_a_few_ulps_is_called_rounding(faulty_profile, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A tolerance below float32's rounding (k=2^-22) finds a node whose output is off by 8
    ulps of its peak (scaled by 1 + 2^-20, as a reordered sum can be): the report says that
    is rounding, not a wrong kernel."""
    from corpus import model_path

    spec = faulty_profile("dev", "scale", "Add@43", 1 + 2.0 ** -20)
    vtc = tmp_path / "cls.vtc"
    code, out, err = run_cli(["pack", model_path("ppocr_cls"), "-d",
                              REPO / "goldens" / "images" / "sample.png", "--shape",
                              "x:1x3x48x192", "--scale", "0.00392156862745098", "-o", vtc], capsys)
    assert code == 0, out + err
    code, doc = _localize(vtc, spec, capsys, "--no-repro", "--tol", "*:k=2^-22",
                          "--opt-level", "disable")  # the fault alone differs
    assert code == 1 and doc["suspect"]["name"] == "Add@43", doc
    note = [n for n in doc["notes"] if "ulp(s) of the output's peak" in n]
    assert len(note) == 1 and note[0].startswith("Add@43's own error"), doc["notes"]
    ulps = float(note[0].split(" is ")[1].split()[0])
    assert 0 < ulps <= 8.5, note


def test_a_tol_glob_matching_no_tensor_is_noted(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """As `run` notes it: a typo otherwise leaves the default rule judging without a word."""
    model = REPO / "goldens" / "models" / "cnn.onnx"
    vtc = tmp_path / "cnn.vtc"
    code, out, err = run_cli(["pack", model, "-d", REPO / "goldens" / "images" / "sample.png",
                              "--scale", "0.00392", "-o", vtc], capsys)
    assert code == 0, out + err
    code, doc = _localize(vtc, "local", capsys, "--tol", "nosuch:atol=1", "--no-repro")
    assert code == 0
    assert any(n.startswith("--tol 'nosuch:atol=1' matches no output or layer of the archive")
               for n in doc["notes"]), doc["notes"]


def _outputs_no_node_computes() -> onnx.ModelProto:
    """z = Relu(x * 3), and as outputs too: the graph input x, an initializer c and a Constant
    node's k. Its tensors (1.2 MB each) are over a 1 MB --budget: bisection then asks the host
    for what each round needs, not for everything at once."""
    from onnx import TensorProto, helper, numpy_helper

    f = TensorProto.FLOAT
    nodes = [helper.make_node("Mul", ["x", "s"], ["y"], name="mul"),
             helper.make_node("Relu", ["y"], ["z"], name="relu"),
             helper.make_node("Constant", [], ["k"], name="const",
                              value=numpy_helper.from_array(np.array([7.0], np.float32)))]
    graph = helper.make_graph(
        nodes, "passthrough", [helper.make_tensor_value_info("x", f, [1, 300000])],
        [helper.make_tensor_value_info(n, f, s) for n, s in
         (("z", [1, 300000]), ("x", [1, 300000]), ("c", [1]), ("k", [1]))],
        initializer=[numpy_helper.from_array(np.array([3.0], np.float32), "s"),
                     numpy_helper.from_array(np.array([5.0], np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("mode", [[], ["--no-dump"], ["--budget", "1"]],
                         ids=["dump", "bisect", "bisect-over-budget"])
def test_outputs_no_node_computes_are_judged_as_run_judges_them(
        mode: list[str], faulty_profile, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An output that is a graph input, an initializer or a Constant's: `run` checks it; the
    per-layer run said the runner returned no value for it (exit 3, on --device local too),
    and bisection over the budget asked this host's capture for it ('no tensor named')."""
    import onnx

    onnx.save(_outputs_no_node_computes(), tmp_path / "m.onnx")
    vtc = tmp_path / "m.vtc"
    code, out, err = run_cli(["pack", tmp_path / "m.onnx", "-o", vtc], capsys)
    assert code == 0, out + err
    code, doc = _localize(vtc, "local", capsys, "--no-repro", *mode)
    assert (code, doc["verdict"]) == (0, "no faulty node"), doc
    spec = faulty_profile("dev", "scale", "relu", 1.01)
    code, doc = _localize(vtc, spec, capsys, "--no-repro", *mode)
    assert (code, doc["verdict"], doc["suspect"]["name"]) == (1, "faulty here", "relu"), doc
    assert {o["name"]: o["passed"] for o in doc["outputs"]} == {
        "z": False, "x": True, "c": True, "k": True}
