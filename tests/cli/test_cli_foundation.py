"""pack / inspect / run --device local through the real CLI: outputs, exit codes and messages.

Every error case asserts the exit code, the one-line message, and that nothing half-written
is left where the user asked for output.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import h5py
import numpy as np
import onnxruntime as ort
import click
import pytest

from helpers_cli import only_line, verify
from verify import __version__
from verify.cli import cli, main

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "goldens" / "models"
IMAGE = REPO / "goldens" / "images" / "sample.png"
TESTS = Path(__file__).resolve().parents[1]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture(scope="module")
def cnn_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pack") / "cnn.vtc"
    assert main(["pack", str(MODELS / "cnn.onnx"), "-d", str(IMAGE), "--scale", "0.00392",
                 "-o", str(out)]) == 0
    return out


@pytest.fixture
def device_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Profiles written by a test go here; `local`'s work area stays inside the test."""
    folder = tmp_path / "devices"
    folder.mkdir()
    monkeypatch.setenv("VERIFY_DEVICES", str(folder))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return folder


def write_profile(folder: Path, name: str, runner: list[str]) -> None:
    words = ", ".join(json.dumps(w) for w in runner)
    (folder / f"{name}.toml").write_text(f'transport = "local"\nrunner = [{words}]\n')


# --- help and version ----------------------------------------------------------------------------
def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = verify(capsys, "--version")
    assert code == 0 and __version__ in out


def _commands(group, prefix=()):  # type: ignore[no-untyped-def]
    ctx = click.Context(group)  # the lazy commands too (verify/cli's LAZY_COMMANDS)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if hasattr(command, "commands"):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name)


@pytest.mark.parametrize("path", sorted(_commands(cli)), ids=lambda p: " ".join(p))
def test_every_command_has_help_with_an_example(capsys: pytest.CaptureFixture[str],
                                                path: tuple[str, ...]) -> None:
    code, out, _ = verify(capsys, *path, "--help")
    assert code == 0
    assert re.search(rf"^\s+verify {' '.join(path)}\b", out, re.M), \
        f"`verify {' '.join(path)} --help` shows no example line:\n{out}"


# --- pack and inspect ----------------------------------------------------------------------------
def test_pack_then_inspect_reports_model_cases_and_provenance(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path) -> None:
    code, out, _ = verify(capsys, "inspect", cnn_vtc, "--json")
    assert code == 0
    doc = json.loads(out)
    model_bytes = (MODELS / "cnn.onnx").read_bytes()
    assert doc["provenance"]["model_sha256"] == hashlib.sha256(model_bytes).hexdigest()
    assert doc["provenance"]["onnxruntime"] == ort.__version__
    assert doc["model"]["inputs"] == [{"name": "data", "dtype": "float32",
                                       "shape": [1, 3, 224, 224]}]
    assert [c["index"] for c in doc["cases"]] == [0]
    data = doc["cases"][0]["inputs"]["data"]
    assert 0.0 <= data["min"] < data["max"] <= 1.0  # --scale 1/255 applied to the image
    code, out, _ = verify(capsys, "inspect", cnn_vtc)
    assert code == 0 and "model:" in out and "provenance:" in out


def test_pack_several_cases_and_the_ground_truth_is_onnxruntime_cpu(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a0, b0, a1, b1 = (np.random.default_rng(i).standard_normal((1, 16)).astype(np.float32)
                      for i in range(4))
    for name, value in (("a0", a0), ("b0", b0), ("a1", a1), ("b1", b1)):
        np.save(tmp_path / f"{name}.npy", value)
    out = tmp_path / "two.vtc"
    code, _, _ = verify(capsys, "pack", MODELS / "two_io.onnx", "-o", out,
                        "-d", f"a:{tmp_path / 'a0.npy'}", "-d", f"b:{tmp_path / 'b0.npy'}",
                        "-d", f"a:{tmp_path / 'a1.npy'}", "-d", f"b:{tmp_path / 'b1.npy'}")
    assert code == 0
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(MODELS / "two_io.onnx"), so, providers=["CPUExecutionProvider"])
    with h5py.File(out) as f:
        assert len(f["cases"]) == 2
        for i, (a, b) in enumerate(((a0, b0), (a1, b1))):
            expected = sess.run(None, {"a": a, "b": b})
            stored = {f[f"cases/{i}/outputs/{k}"].attrs["name"].decode(): f[f"cases/{i}/outputs/{k}"][()]
                      for k in f[f"cases/{i}/outputs"]}
            for o, want in zip(sess.get_outputs(), expected):
                np.testing.assert_array_equal(stored[o.name], want)


# --- run ------------------------------------------------------------------------------------------
def test_run_prints_load_and_run_timing_then_the_check(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path, device_dir: Path) -> None:
    code, out, _ = verify(capsys, "run", cnn_vtc, "--device", "local", "--iter", "4", "--warmup", "2")
    assert code == 0, out
    assert re.search(r"^load model: [\d.]+ms$", out, re.M)
    assert re.search(r"^=== prepare: [\d.]+ms; going to warmup$", out, re.M)
    assert len(re.findall(r"^warmup \d: [\d.]+ms$", out, re.M)) == 2
    assert [int(m) for m in re.findall(r"^iter (\d)/4: [\d.]+ms$", out, re.M)] == [0, 1, 2, 3]
    m = re.search(r"^=== finished test #0: time=([\d.]+)ms avg_time=([\d.]+)ms sd=([\d.]+)ms "
                  r"minmax=([\d.]+),([\d.]+)$", out, re.M)
    assert m, out
    total, avg, _sd, lo, hi = map(float, m.groups())
    assert lo <= avg <= hi and total == pytest.approx(4 * avg, rel=1e-3, abs=3e-3)  # printed to 1 us
    assert re.search(r"^check #0: prob: max_abs=\S+ max_rel=\S+ .*\[magnitude k=2\^-14 "
                     r"floor=2\^-4\]\s+PASS$", out, re.M)
    assert "=== PASS" in out


def test_run_json_and_bin_out_dump_hold_what_the_device_computed(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path, device_dir: Path, tmp_path: Path) -> None:
    dump = tmp_path / "outs"
    code, out, _ = verify(capsys, "run", cnn_vtc, "--iter", "3", "--warmup", "0", "--threads", "1",
                          "--opt-level", "disable", "--bin-out-dump", dump, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["passed"] is True
    case = doc["cases"][0]
    assert len(case["iter_ms"]) == 3 and case["warmup_ms"] == []
    assert case["timing"]["avg_ms"] == pytest.approx(sum(case["iter_ms"]) / 3)
    assert case["check"][0]["name"] == "prob" and case["check"][0]["passed"] is True
    index = json.loads((dump / "outputs.json").read_text())
    assert [(o["case"], o["output"]) for o in index["outputs"]] == [(0, "prob")]
    value = np.load(dump / index["outputs"][0]["file"], allow_pickle=False)
    with h5py.File(cnn_vtc) as f:
        truth = f["cases/0/outputs/0"][()]
    # opt-level disable with one thread is the reference configuration: bit-identical.
    np.testing.assert_array_equal(value, truth)
    assert not [p for p in leftovers(dump) if p.endswith(".part")]


def test_run_several_cases(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                           device_dir: Path) -> None:
    out = tmp_path / "two.vtc"
    assert verify(capsys, "pack", MODELS / "two_io.onnx", "-o", out, "-d", "a:rand", "-d",
                  "b:rand", "-d", "a:rand", "-d", "b:rand")[0] == 0
    code, text, _ = verify(capsys, "run", out, "--iter", "2")
    assert code == 0
    assert "=== going to run 2 testcases" in text
    assert len(re.findall(r"^check #[01]: (sum_relu|prod): .*PASS$", text, re.M)) == 4
    code, text, _ = verify(capsys, "run", out, "--iter", "1", "--case", "1")
    assert code == 0 and "finished test #1" in text and "finished test #0" not in text


def test_run_input_override_has_no_ground_truth(capsys: pytest.CaptureFixture[str],
                                                cnn_vtc: Path, tmp_path: Path,
                                                device_dir: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 224, 224), np.float32))
    code, out, _ = verify(capsys, "run", cnn_vtc, "--iter", "1", "--input", f"data:{tmp_path / 'x.npy'}")
    assert code == 0
    assert "no ground truth to check" in out and "=== no check" in out


def test_run_input_is_read_as_pack_reads_data(capsys: pytest.CaptureFixture[str],
                                              cnn_vtc: Path, tmp_path: Path,
                                              device_dir: Path) -> None:
    """--input goes through pack -d's reader: cast without loss, shape checked on this host
    (a float64 array was sent as is and refused by onnxruntime on the device)."""
    np.save(tmp_path / "f64.npy", np.zeros((1, 3, 224, 224), np.float64))
    code, out, err = verify(capsys, "run", cnn_vtc, "--iter", "1",
                            "--input", f"data:{tmp_path / 'f64.npy'}", "--json")
    assert code == 0, err
    np.save(tmp_path / "small.npy", np.zeros((1, 3, 100, 100), np.float32))
    code, out, err = verify(capsys, "run", cnn_vtc, "--iter", "1",
                            "--input", f"data:{tmp_path / 'small.npy'}")
    assert (code, out) == (2, "")
    assert "input 'data' expects (1,3,224,224), got (1,3,100,100)" in only_line(err)
    code, out, err = verify(capsys, "run", cnn_vtc, "--input", "label:x.npy")
    assert (code, only_line(err)) == (
        2, "error: --input 'label:x.npy': expected NAME:FILE with NAME one of 'data'")


def test_run_input_image_takes_the_size_of_the_case_it_replaces(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, device_dir: Path) -> None:
    """An image for an input of dynamic height and width (as PP-OCR's det model takes): it is
    resized to the case's size, as the archive was packed (here 48x64; the model gives its
    input's shape back). It was refused with a hint to pass --shape, which run has not."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [4])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Shape", ["x"], ["y"])],
                                                  "hw", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "hw.onnx")
    archive = tmp_path / "hw.vtc"
    assert verify(capsys, "pack", tmp_path / "hw.onnx", "--shape", "x:1x3x48x64", "-o",
                  archive)[0] == 0
    code, out, err = verify(capsys, "run", archive, "--iter", "1", "--input", f"x:{IMAGE}",
                            "--bin-out-dump", tmp_path / "od")
    assert code == 0, err
    assert "=== no check" in out
    assert np.load(tmp_path / "od" / "case0-out0.npy").tolist() == [1, 3, 48, 64]
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 20, 30), np.float32))  # an array keeps its own
    code, out, err = verify(capsys, "run", archive, "--iter", "1", "--input",
                            f"x:{tmp_path / 'x.npy'}", "--bin-out-dump", tmp_path / "od2")
    assert code == 0, err
    assert np.load(tmp_path / "od2" / "case0-out0.npy").tolist() == [1, 3, 20, 30]


# --- bad input: exit 2, one line, nothing left behind --------------------------------------------
def test_missing_model_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = verify(capsys, "pack", tmp_path / "nope.onnx", "-o", tmp_path / "x.vtc")
    assert code == 2
    assert only_line(err) == f"error: {tmp_path / 'nope.onnx'}: no such file"
    assert leftovers(tmp_path) == []


def test_file_that_is_not_onnx(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bogus = tmp_path / "model.onnx"
    bogus.write_text("this is not a protobuf\n" * 20)
    code, _, err = verify(capsys, "pack", bogus, "-o", tmp_path / "x.vtc")
    assert code == 2
    assert only_line(err).startswith(f"error: {bogus}: not an ONNX model")
    assert leftovers(tmp_path) == ["model.onnx"]


def test_truncated_archive(capsys: pytest.CaptureFixture[str], cnn_vtc: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.vtc"
    cut.write_bytes(cnn_vtc.read_bytes()[: cnn_vtc.stat().st_size // 2])
    for command in (["inspect", cut], ["run", cut, "--iter", "1"]):
        code, _, err = verify(capsys, *command)
        assert code == 2
        assert only_line(err) == (f"error: {cut}: not a verify testcase archive "
                                  "(not HDF5, or truncated/corrupt)")


def test_hdf5_file_that_is_not_an_archive(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    other = tmp_path / "other.vtc"
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(3)
    code, _, err = verify(capsys, "inspect", other)
    assert code == 2
    assert only_line(err) == f"error: {other}: an HDF5 file, but not a verify testcase archive"


def test_archive_from_a_newer_format_version(capsys: pytest.CaptureFixture[str], cnn_vtc: Path,
                                             tmp_path: Path) -> None:
    newer = tmp_path / "newer.vtc"
    newer.write_bytes(cnn_vtc.read_bytes())
    with h5py.File(newer, "r+") as f:
        f.attrs["format_version"] = 99
        f.attrs["verify_version"] = "9.0.0"
    code, _, err = verify(capsys, "run", newer)
    assert code == 2
    assert only_line(err) == (f"error: {newer}: written in archive format version 99 by verify "
                              f"9.0.0; this verify {__version__} reads up to version 3: upgrade verify")


def test_unknown_input_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = verify(capsys, "pack", MODELS / "cnn.onnx", "-d", "image:rand", "-o", tmp_path / "x.vtc")
    assert code == 2
    assert only_line(err) == ("error: -d 'image:rand': no input named 'image' and no file "
                              "'image:rand'; the model's inputs are 'data'")
    assert leftovers(tmp_path) == []


def test_wrong_shape(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 224, 224, 3), np.float32))
    code, _, err = verify(capsys, "pack", MODELS / "cnn.onnx", "-d", tmp_path / "x.npy",
                          "-o", tmp_path / "x.vtc")
    assert code == 2
    line = only_line(err)
    assert "input 'data' expects (1,3,224,224), got (1,224,224,3)" in line
    assert leftovers(tmp_path) == ["x.npy"]


def test_wrong_dtype(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = MODELS / "int_bool.onnx"
    import onnx

    graph = onnx.load(model).graph
    first = graph.input[0]
    dims = [d.dim_value for d in first.type.tensor_type.shape.dim]
    np.save(tmp_path / "x.npy", np.full(dims, 0.5, np.float32))
    code, _, err = verify(capsys, "pack", model, "-d", f"{first.name}:{tmp_path / 'x.npy'}",
                          "-o", tmp_path / "x.vtc")
    assert code == 2
    line = only_line(err)
    assert f"'{first.name}'" in line and "float32" in line and "int64" in line
    assert leftovers(tmp_path) == ["x.npy"]


def test_image_that_cannot_be_decoded(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    broken = tmp_path / "cat.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    code, _, err = verify(capsys, "pack", MODELS / "cnn.onnx", "-d", broken, "-o", tmp_path / "x.vtc")
    assert code == 2
    assert only_line(err).startswith(f"error: {broken}: ")
    assert leftovers(tmp_path) == ["cat.png"]


def test_model_whose_op_onnxruntime_cannot_run(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    code, _, err = verify(capsys, "pack", MODELS / "unsupported_op.onnx", "-o", tmp_path / "x.vtc")
    assert code == 2
    line = only_line(err)
    assert f"onnxruntime {ort.__version__} cannot run this model" in line
    assert "Frobnicate" in line
    assert leftovers(tmp_path) == []


def test_bad_tolerance_spec(capsys: pytest.CaptureFixture[str], cnn_vtc: Path) -> None:
    code, _, err = verify(capsys, "run", cnn_vtc, "--tol", "prob:atol=lots")
    assert code == 2
    assert only_line(err) == ("error: bad tolerance 'prob:atol=lots': 'lots' is not a number "
                              "(write 1e-3 or 2^-12)")


# --- device-side failures -------------------------------------------------------------------------
def test_runner_that_crashes_is_a_device_error(capsys: pytest.CaptureFixture[str], cnn_vtc: Path,
                                               device_dir: Path, tmp_path: Path) -> None:
    write_profile(device_dir, "crashy", [sys.executable, "-c",
                                         "import os, sys; sys.stderr.write('segfault in kernel\\n'); "
                                         "sys.stderr.flush(); os.abort()"])
    dump = tmp_path / "outs"
    code, _, err = verify(capsys, "run", cnn_vtc, "--device", "crashy", "--bin-out-dump", dump)
    assert code == 3
    assert only_line(err) == ("error: crashy: the runner was killed by signal 6 without writing "
                              "a result: segfault in kernel")
    assert not dump.exists()


def test_nan_in_an_output_is_a_mismatch_with_the_count(capsys: pytest.CaptureFixture[str],
                                                       cnn_vtc: Path, device_dir: Path) -> None:
    write_profile(device_dir, "nanny", [sys.executable, str(TESTS / "nan_runner.py"), "--count", "3"])
    code, out, err = verify(capsys, "run", cnn_vtc, "--device", "nanny", "--iter", "1")
    assert code == 1, err
    line = next(ln for ln in out.splitlines() if ln.startswith("check #0: prob"))
    assert "NaN 3/0" in line and line.endswith("FAIL")
    assert "NaN/Inf positions differ at 3 elements (NaN 3 vs 0, Inf 0 vs 0)" in out
    assert "=== FAIL: 1 output(s) over tolerance" in out
    code, out, _ = verify(capsys, "run", cnn_vtc, "--device", "nanny", "--iter", "1", "--json")
    assert code == 1
    check = json.loads(out)["cases"][0]["check"][0]
    assert (check["nan_actual"], check["nan_reference"], check["passed"]) == (3, 0, False)

    # every element NaN: no figure is computable, and none reads as perfect
    write_profile(device_dir, "blank", [sys.executable, str(TESTS / "nan_runner.py"),
                                        "--count", "1000000"])
    code, out, err = verify(capsys, "run", cnn_vtc, "--device", "blank", "--iter", "1")
    assert code == 1, err
    line = next(ln for ln in out.splitlines() if ln.startswith("check #0: prob"))
    assert line.startswith("check #0: prob: max_abs=- max_rel=- cos=- NaN 10/0") and \
        line.endswith("FAIL")
    assert "    note: no element is finite on both sides: no metric can be computed" in \
        out.splitlines()
    code, out, _ = verify(capsys, "run", cnn_vtc, "--device", "blank", "--iter", "1", "--json")
    check = json.loads(out)["cases"][0]["check"][0]
    assert (check["cosine"], check["max_abs"], check["topk"]["top1"]) == ("nan", "nan", 0.0)


def test_inspect_shows_stored_tolerances(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "tol.vtc"
    assert verify(capsys, "pack", MODELS / "two_io.onnx", "-o", out, "--atol", "1e-4",
                  "--tol", "prod:k=2^-12")[0] == 0
    code, text, _ = verify(capsys, "inspect", out)
    assert code == 0
    assert "tolerances: allclose atol=0.0001 rtol=0; --tol prod:k=2^-12" in text
    doc = json.loads(verify(capsys, "inspect", out, "--json")[1])
    assert doc["tolerances"] == {"atol": 1e-4, "specs": ["prod:k=2^-12"]}


def test_an_escaped_eof_error_is_a_bug_not_an_interrupt(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """paramiko raises EOFError when a link dies; one that escapes a driver reaches click, which
    turns it into Abort. It was reported as "interrupted", exit 130, as if the user had pressed
    Ctrl-C."""
    from verify import execute

    def lost_link(*_args: object, **_kwargs: object) -> None:
        raise EOFError()

    monkeypatch.setattr(execute, "run", lost_link)
    code, _, err = verify(capsys, "run", cnn_vtc)
    assert code == 4
    assert "Traceback (most recent call last)" in err and "EOFError" in err
    assert "interrupted" not in err


def test_a_bug_is_exit_4_with_the_traceback(capsys: pytest.CaptureFixture[str], cnn_vtc: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from verify import execute

    def broken(*_args: object, **_kwargs: object) -> None:
        raise ZeroDivisionError("deliberate")

    monkeypatch.setattr(execute, "run", broken)
    code, _, err = verify(capsys, "run", cnn_vtc)
    assert code == 4
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError: deliberate" in err
    assert err.rstrip().endswith("error: internal error (a bug in verify; please report it with "
                                 "the trace above)")


def test_keep_says_where_the_work_directory_is(capsys: pytest.CaptureFixture[str], cnn_vtc: Path,
                                               device_dir: Path) -> None:
    code, out, _ = verify(capsys, "run", cnn_vtc, "--iter", "1", "--keep")
    assert code == 0
    m = re.search(r"^kept work directory on local: (\S+) \(remove it with `verify devices clean "
                  r"local`\)$", out, re.M)
    assert m, out
    kept = Path(m.group(1))
    assert (kept / "job.json").is_file() and (kept / "result.json").is_file()
    code, out, _ = verify(capsys, "run", cnn_vtc, "--iter", "1", "--json")
    assert json.loads(out)["kept_workdir"] is None


def test_inspect_of_an_archive_whose_model_is_corrupt(capsys: pytest.CaptureFixture[str],
                                                      cnn_vtc: Path, tmp_path: Path) -> None:
    import dataclasses

    from verify.archive_reader import read_archive
    from verify.testcase import write_archive

    bad = tmp_path / "bad.vtc"  # packed with checksums around a model that is not ONNX
    write_archive(bad, dataclasses.replace(read_archive(cnn_vtc),
                                           model_bytes=b"\x08\x07garbage" * 9))
    code, _, err = verify(capsys, "inspect", bad)
    assert code == 2
    assert only_line(err).startswith(f"error: {bad}: the archive's model: not an ONNX model")
    edited = tmp_path / "edited.vtc"  # the model replaced behind the archive's back
    edited.write_bytes(cnn_vtc.read_bytes())
    with h5py.File(edited, "r+") as f:
        sha = f["model"].attrs["sha256"]
        del f["model"]
        f["model"] = np.frombuffer(b"\x08\x07garbage" * 9, np.uint8)
        f["model"].attrs.create("sha256", sha)
    code, _, err = verify(capsys, "inspect", edited)
    assert code == 2
    assert only_line(err) == (f"error: {edited}: corrupt archive: the model does not match its "
                              "sha256 (re-pack it, or get an intact copy)")


def test_iter_layers_reads_only_the_names_asked_for(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    from verify.archive_reader import iter_layers

    out = tmp_path / "layers.vtc"
    assert verify(capsys, "pack", MODELS / "two_io.onnx", "-o", out, "--layers")[0] == 0
    everything = dict(iter_layers(out))
    assert {"a", "b", "prod", "sum_relu"} <= set(everything)
    some = dict(iter_layers(out, names={"prod", "a"}))
    assert sorted(some) == ["a", "prod"]
    for name, value in some.items():
        np.testing.assert_array_equal(value, everything[name])


def test_run_atol_replaces_a_stored_glob_and_says_so(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path, device_dir: Path) -> None:
    """Packed with --tol '*:atol=1', run with --atol 1e-12: the stricter check applies (it
    passed under the stored glob) and a note names the glob set aside."""
    archive = tmp_path / "loose.vtc"
    assert verify(capsys, "pack", MODELS / "cnn.onnx", "--tol", "*:atol=1", "-o", archive)[0] == 0
    code, out, _ = verify(capsys, "run", archive, "--iter", "1", "--atol", "1e-12", "--rtol", "0")
    assert code == 1 and "[allclose atol=1e-12 rtol=0]  FAIL" in out
    assert ("note: --atol/--rtol replace the archive's stored tolerances (--tol '*:atol=1'); "
            "add --tol to keep one") in out.splitlines()
    assert verify(capsys, "run", archive, "--iter", "1")[0] == 0  # the stored glob otherwise
    # diff and localize say the same, in their reports' notes
    note = ("--atol/--rtol replace the archive's stored tolerances (--tol '*:atol=1'); add "
            "--tol to keep one")
    assert verify(capsys, "run", archive, "--iter", "1", "--bin-io-dump", tmp_path / "d")[0] == 0
    code, out, _ = verify(capsys, "diff", tmp_path / "d", archive, "--atol", "1", "--json")
    assert code == 0 and note in json.loads(out)["cases"][0]["notes"]
    code, out, _ = verify(capsys, "localize", archive, "--atol", "1", "--no-repro", "--json")
    assert code == 0 and note in json.loads(out)["notes"]
