"""Inputs of real third-party models: dynamic dims written as -1, as unnamed and as shared
symbols, an image into dynamic H/W, an int64 scalar, and onnxruntime's log kept off the
terminal. Every hint verify prints is run as printed."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from corpus import model_path
from helpers_cli import only_line, verify
from verify.archive_reader import read_archive


def _hint_args(message: str) -> list[str]:
    """The `--shape ...` options a hint names, as the user would paste them."""
    tail = message.split(": pass " if ": pass " in message else "; pass ", 1)[1]
    return shlex.split(tail.split(" (", 1)[0].split(" to keep")[0])


def test_ppocr_cls_minus_one_batch_takes_a_fitting_array(tmp_path, capsys):
    """ch_ppocr_mobile_v2.0_cls_infer.onnx declares x as (-1,3,?,?): -1 is dynamic."""
    np.save(tmp_path / "img.npy", np.random.default_rng(0).random((1, 3, 48, 192), np.float32))
    code, out, err = verify(capsys, "pack", model_path("ppocr_cls"), "-d",
                            f"x:{tmp_path / 'img.npy'}", "-o", tmp_path / "cls.vtc")
    assert (code, err) == (0, ""), err
    tc = read_archive(tmp_path / "cls.vtc")
    assert tc.cases[0].inputs["x"].shape == (1, 3, 48, 192)
    assert tc.cases[0].outputs["save_infer_model/scale_0.tmp_1"].shape == (1, 2)
    code, _, err = verify(capsys, "pack", model_path("ppocr_cls"), "--shape", "x:2x3x48x192",
                          "-o", tmp_path / "cls2.vtc")
    assert code == 0, err
    assert read_archive(tmp_path / "cls2.vtc").cases[0].inputs["x"].shape == (2, 3, 48, 192)
    code, _, err = verify(capsys, "pack", model_path("ppocr_cls"), "--shape", "x:1x4x48x192",
                          "-o", tmp_path / "bad.vtc")
    assert (code, only_line(err)) == (2, "error: --shape x:1x4x48x192 conflicts with input 'x' "
                                         "declared as (?,3,?,?); only dynamic dims can be set")


@pytest.mark.parametrize("name, hint", [("ppocr_det", "x:1x3x224x224"),
                                        ("yolov8n", "images:1x3x224x224"),
                                        ("magika", "bytes:1x2048")])
def test_random_data_hint_is_a_working_command(tmp_path, capsys, name, hint):
    """The hint is a shape the model runs with here; an image input gets an image's size
    (it was 1x3x1x1, which a detector runs but which is no image)."""
    code, _, err = verify(capsys, "pack", model_path(name), "-o", tmp_path / "m.vtc")
    line = only_line(err)
    assert code == 2 and "has dynamic dims" in line and line.endswith("(the model runs with it here)")
    assert f"pass --shape {hint} (" in line, line
    code, _, err = verify(capsys, "pack", model_path(name), *_hint_args(line),
                          "-o", tmp_path / "m.vtc")
    assert code == 0, err


def test_image_never_silently_fixes_dynamic_hw(tmp_path, capsys):
    """PP-OCR rec: x is (N,3,?,W); an image is not laid in at its own size unasked."""
    Image.fromarray(np.full((60, 200, 3), 128, np.uint8)).save(tmp_path / "line.png")
    rec = model_path("ppocr_rec")
    code, _, err = verify(capsys, "pack", rec, "-d", f"x:{tmp_path / 'line.png'}",
                          "-o", tmp_path / "r.vtc")
    line = only_line(err)
    assert code == 2 and line.endswith(  # (tried on the model first: it runs at that size)
        "has dynamic height or width; the image is 200x60 (WxH): pass --shape x:1x3x60x200 to "
        "keep that size (the model runs with it here)")
    code, _, err = verify(capsys, "pack", rec, "-d", f"x:{tmp_path / 'line.png'}",
                          *_hint_args(line), "-o", tmp_path / "r.vtc")
    assert code == 0, err
    code, _, err = verify(capsys, "pack", rec, "-d", f"x:{tmp_path / 'line.png'}",
                          "--shape", "x:1x3x48x320", "-o", tmp_path / "r.vtc")
    assert code == 0, err
    assert read_archive(tmp_path / "r.vtc").cases[0].inputs["x"].shape == (1, 3, 48, 320)


def test_silero_int64_sample_rate_and_shared_symbols(tmp_path, capsys):
    vad = model_path("silero_vad")  # input (?,?), state (2,?,128), sr int64 scalar
    code, _, err = verify(capsys, "pack", vad, "--shape", "input:1x512", "--shape",
                          "state:2x1x128", "-o", tmp_path / "v.vtc")
    line = only_line(err)
    assert code == 2 and line.endswith(
        "(random ints in [0, 10) went to 'sr'; if one takes a specific value, give it: "
        "-d sr:VALUE)")
    code, _, err = verify(capsys, "pack", vad, "--shape", "input:1x512", "--shape",
                          "state:2x1x128", "-d", "sr:16000", "-o", tmp_path / "v.vtc")
    assert code == 0, err
    # silero_vad_half: input (batch, sequence), state (2, batch, 128): --shape on input fixes
    # 'batch' in state too
    code, _, err = verify(capsys, "pack", model_path("silero_vad_half"), "--shape",
                          "input:3x512", "-o", tmp_path / "h.vtc")
    assert code == 0, err
    assert read_archive(tmp_path / "h.vtc").cases[0].inputs["state"].shape == (2, 3, 128)


def test_onnxruntime_log_only_on_request(tmp_path):
    argv = [sys.executable, "-c", "from verify.cli import main; main()", "pack", str(model_path("silero_vad")),
            "--shape", "input:1x512", "--shape", "state:2x1x128", "-d", "sr:7",
            "-o", str(tmp_path / "v.vtc")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("VERIFY_ORT_LOG", None)
    quiet = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert quiet.returncode == 2
    assert len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr
    assert "onnxruntime rejected the inputs" in quiet.stderr
    loud = subprocess.run(argv, capture_output=True, text=True,
                          env={**env, "VERIFY_ORT_LOG": "3"})
    assert loud.returncode == 2
    assert "sequential_executor" in loud.stderr  # onnxruntime's own error log, as asked


def test_an_image_size_a_detector_cannot_take_is_rounded_up_to_what_it_can(tmp_path, capsys):
    """PP-OCR det needs sides that are multiples of 32: a 400x300 image's own size fails in
    the model (a broadcast error deep inside), so pack tries it and suggests 416x320, which it
    saw run; a size neither runs with keeps the plain hint (the test above)."""
    Image.fromarray(np.full((300, 400, 3), 128, np.uint8)).save(tmp_path / "page.png")
    det = model_path("ppocr_det")
    code, _, err = verify(capsys, "pack", det, "-d", f"x:{tmp_path / 'page.png'}",
                          "-o", tmp_path / "d.vtc")
    line = only_line(err)
    assert code == 2 and line.endswith(
        "the image is 400x300 (WxH): pass --shape x:1x3x320x416 (its size rounded up to a "
        "multiple of 32: the model runs with that here, not with its own)")
    code, _, err = verify(capsys, "pack", det, "-d", f"x:{tmp_path / 'page.png'}",
                          *_hint_args(line), "-o", tmp_path / "d.vtc")
    assert code == 0, err
    assert read_archive(tmp_path / "d.vtc").cases[0].inputs["x"].shape == (1, 3, 320, 416)
