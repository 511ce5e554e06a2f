"""What a new user trips over on a first walk through the README (pack, run, dump, diff,
profile on real models, then wrong arguments): each a one-line error with its exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corpus import model_path
from helpers_cli import only_line, verify

REPO = Path(__file__).resolve().parents[2]
CNN = REPO / "goldens" / "models" / "cnn.onnx"


def test_run_past_its_timeout_names_the_option_that_allows_more(tmp_path: Path, capsys) -> None:
    # `verify run X --iter 100000` on the default 600 s limit said only
    # "local: python3 did not finish within 600 s": neither what ran nor how to allow more
    vtc = tmp_path / "cnn.vtc"
    assert verify(capsys, "pack", CNN, "-o", vtc)[0] == 0
    code, _, err = verify(capsys, "run", vtc, "--iter", "1000000", "--timeout", "1")
    line = only_line(err)
    assert code == 3, err
    assert line.startswith("error: local: ") and "did not finish within 1 s" in line, line
    assert "--timeout SECONDS" in line, line


@pytest.mark.parametrize("value", ["9", "loud"])
def test_a_bad_ort_log_variable_is_a_usage_error(tmp_path: Path, capsys,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 value: str) -> None:
    # --ort-log 9 was refused but VERIFY_ORT_LOG=9 was silently ignored (no log, no word)
    monkeypatch.setenv("VERIFY_ORT_LOG", value)
    code, _, err = verify(capsys, "pack", CNN, "-o", tmp_path / "cnn.vtc")
    assert (code, only_line(err)) == (
        2, f"error: VERIFY_ORT_LOG={value!r}: expected one of verbose, info, warning, error, "
           "fatal (or 0..4)")
    assert not (tmp_path / "cnn.vtc").exists()


def test_run_help_says_what_the_timeout_bounds(capsys) -> None:
    # it read "Seconds the device may take on the device (default: the profile's)."
    code, out, _ = verify(capsys, "run", "--help")
    text = " ".join(out.split())
    assert code == 0
    assert ("--timeout FLOAT Seconds the runner's job (load, warmups, iterations, dumps) may take "
            "on the device (default: the profile's [timeouts] command, 600 s if unset).") in text


def test_a_shape_too_large_for_an_archive_is_refused_before_allocating(tmp_path: Path,
                                                                         capsys) -> None:
    # random data for it was numpy's MemoryError ("Unable to allocate 335. TiB"): a traceback
    # and exit 4
    rec = model_path("ppocr_rec")  # x: (batch, 3, ?, width), all dynamic but the channels
    code, _, err = verify(capsys, "pack", rec, "--shape", "x:100000x3x4800x32000",
                          "-o", tmp_path / "big.vtc")
    assert (code, only_line(err)) == (
        2, "error: input 'x' of shape 100000x3x4800x32000 (float32) would be 1.75781e+08 MB "
           "of random data, over the 2048 MB an archive holds per tensor; give a smaller --shape "
           "x:DIMS (or raise verify --max-tensor-mb MB)")
    # the limit is the archive's: 36 MB of random floats, refused under --max-tensor-mb 32
    code, _, err = verify(capsys, "--max-tensor-mb", "32", "pack", rec, "--shape",
                          "x:1x3x48x65536", "-o", tmp_path / "mid.vtc")
    assert code == 2 and "36 MB of random data, over the 32 MB an archive" in only_line(err)
    assert not (tmp_path / "big.vtc").exists() and not (tmp_path / "mid.vtc").exists()


@pytest.mark.parametrize("command", [["run", "--iter", "1"], ["localize"], ["bench"], ["inspect"]])
def test_an_onnx_model_where_an_archive_is_expected_says_to_pack_it(tmp_path: Path, capsys,
                                                                    command: list[str]) -> None:
    # `verify run model.onnx` said "not a verify testcase archive (not HDF5, or
    # truncated/corrupt)": true, but not what to do
    model = tmp_path / "my model.onnx"
    model.write_bytes(model_path("silero_vad").read_bytes())
    code, _, err = verify(capsys, command[0], model, *command[1:])
    if command == ["inspect"]:  # inspect reads a plain model too
        assert code == 0
        return
    assert (code, only_line(err)) == (
        2, f"error: {model}: an ONNX model, not a testcase archive; pack it first (verify pack "
           f"'{model}' writes '{tmp_path / 'my model.vtc'}') and give that")


def test_a_tolerance_glob_that_matches_no_output_is_noted(tmp_path: Path, capsys) -> None:
    # `verify run mag.vtc --tol 'nosuch:atol=1'` ran under the default rule without a word
    vtc = tmp_path / "cnn.vtc"
    assert verify(capsys, "pack", CNN, "-o", vtc)[0] == 0  # its output: prob
    code, out, _ = verify(capsys, "run", vtc, "--iter", "1", "--tol", "pro:atol=1",
                          "--tol", "p*:atol=1e-3")
    assert code == 0
    notes = [ln for ln in out.splitlines() if ln.startswith("note: --tol")]
    assert notes == ["note: --tol 'pro:atol=1' matches no output (prob); the glob must match a "
                     "whole name, and run judges the outputs only"]
    code, out, _ = verify(capsys, "run", vtc, "--iter", "1", "--tol", "prob:atol=1", "--json")
    assert code == 0 and "--tol" not in out
    # pack says it too, of the tensors the archive's tolerances judge (outputs, and layers in
    # diff and localize): it said nothing
    code, out, _ = verify(capsys, "pack", CNN, "-o", vtc, "--tol", "pro:atol=1", "--tol",
                          "block2*:k=2^-10", "--json")
    assert code == 0
    assert json.loads(out)["notes"] == [
        "--tol 'pro:atol=1' matches no output or layer of the archive (prob); the glob must "
        "match a whole name"]


def test_export_never_replaces_a_changed_model_without_force(tmp_path: Path, capsys) -> None:
    # `verify export cnn.vtc` writes cnn.onnx beside it by default: the very file the user
    # packed, perhaps edited since; it was replaced silently
    import shutil

    model = tmp_path / "cnn.onnx"
    shutil.copy(CNN, model)
    vtc = tmp_path / "cnn.vtc"
    assert verify(capsys, "pack", model, "-o", vtc)[0] == 0
    exported = model.read_bytes() if verify(capsys, "export", vtc)[0] == 0 else None
    assert exported is not None  # the same bytes there: rewritten as they were
    edited = exported + b"\x00"  # stands for the user's later edit
    model.write_bytes(edited)
    code, _, err = verify(capsys, "export", vtc)
    assert (code, only_line(err)) == (
        2, f"error: {model}: already exists and differs from the archive's copy; pass another -o "
           "to write the model elsewhere, or --force to replace it")
    assert model.read_bytes() == edited
    assert verify(capsys, "export", vtc, "--force")[0] == 0
    assert model.read_bytes() == exported


def test_export_never_replaces_a_changed_external_data_file(tmp_path: Path, capsys) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(64, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])], [w])
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              src / "m.onnx", save_as_external_data=True, location="m.bin", size_threshold=0)
    vtc = tmp_path / "m.vtc"
    assert verify(capsys, "pack", src / "m.onnx", "--keep-external-data", "-o", vtc)[0] == 0
    out = tmp_path / "out"
    out.mkdir()
    (out / "m.bin").write_bytes(b"someone else's weights")
    code, _, err = verify(capsys, "export", vtc, "-o", out / "m.onnx")
    assert (code, only_line(err)) == (
        2, f"error: {out / 'm.bin'}: already exists and differs from the archive's copy; pass "
           "another -o to write the model elsewhere, or --force to replace it")
    assert (out / "m.bin").read_bytes() == b"someone else's weights"
    assert not (out / "m.onnx").exists()
    assert verify(capsys, "export", vtc, "-o", out / "m.onnx", "--force")[0] == 0
    assert (out / "m.bin").read_bytes() == (src / "m.bin").read_bytes()


def test_an_input_missing_from_a_test_runner_folder_is_noted(tmp_path: Path, capsys) -> None:
    """A test_data_set_0 without input_1.pb filled that input at random without a word (the
    given outputs then disagreed and the warning blamed the export)."""
    from verify.cli import main

    folder = tmp_path / "case"
    folder.mkdir()
    two_io = REPO / "goldens" / "testcases" / "two_io.vtc"
    assert main(["export", str(two_io), "-o", str(folder / "model.onnx"), "--data",
                 str(folder)]) == 0
    (folder / "test_data_set_0" / "input_1.pb").unlink()
    code, out, _ = verify(capsys, "pack", folder / "model.onnx", "-d", folder, "-o",
                          tmp_path / "x.vtc", "--json")
    assert code == 0
    assert f"case 0: {folder} holds no value for input(s) 'b': drawn at random (--seed); give " \
        "them in the folder or file if the model needs particular values" in \
        json.loads(out)["notes"]
