"""`verify --ort-log LEVEL`: onnxruntime's own log only on request, from the host's sessions
(pack's ground truth) and from the device's runner (run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from corpus import model_path
from helpers_cli import only_line, verify

REPO = Path(__file__).resolve().parents[2]


def _pack_bad_sr(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """silero-vad packed with a sample rate it refuses: onnxruntime logs an error."""
    argv = [sys.executable, "-c", "from verify.cli import main; main()", *options, "pack",
            str(model_path("silero_vad")), "--shape", "input:1x512", "--shape", "state:2x1x128",
            "-d", "sr:7", "-o", str(tmp_path / "v.vtc")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("VERIFY_ORT_LOG", None)
    return subprocess.run(argv, capture_output=True, text=True, env=env)


def test_pack_shows_onnxruntime_log_only_with_the_flag(tmp_path: Path) -> None:
    quiet = _pack_bad_sr(tmp_path)
    assert quiet.returncode == 2
    assert "sequential_executor" not in quiet.stderr
    assert len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr
    loud = _pack_bad_sr(tmp_path, "--ort-log", "error")
    assert loud.returncode == 2
    assert "sequential_executor" in loud.stderr  # onnxruntime's own error log, as asked
    assert loud.stderr.rstrip().splitlines()[-1].startswith("error: ")


def test_run_shows_the_device_runners_log_with_the_flag(tmp_path: Path, capsys) -> None:
    vtc = tmp_path / "cnn.vtc"
    assert verify(capsys, "pack", REPO / "goldens" / "models" / "cnn.onnx", "-o", vtc)[0] == 0
    code, _, err = verify(capsys, "run", vtc, "--iter", "1")
    assert code == 0 and err == ""
    code, _, err = verify(capsys, "--ort-log", "verbose", "run", vtc, "--iter", "1")
    assert code == 0
    # onnxruntime's verbose log of the session the runner made on the device
    assert "[V:onnxruntime:" in err, err[:500]
    assert os.environ.get("VERIFY_ORT_LOG") is None  # the flag does not outlive the command


def test_unknown_level_is_a_usage_error(capsys) -> None:
    code, _, err = verify(capsys, "--ort-log", "loud", "--help")
    assert (code, only_line(err)) == (
        2, "error: --ort-log 'loud': expected one of verbose, info, warning, error, fatal "
           "(or 0..4)")


def test_a_bad_level_in_the_environment_is_refused_by_every_command(capsys, monkeypatch) -> None:
    """`inspect`, which makes no session, exited 0 with VERIFY_ORT_LOG=9 where run refused it."""
    monkeypatch.setenv("VERIFY_ORT_LOG", "9")
    code, out, err = verify(capsys, "inspect", REPO / "goldens" / "testcases" / "cnn.vtc")
    assert (code, out, only_line(err)) == (
        2, "", "error: VERIFY_ORT_LOG='9': expected one of verbose, info, warning, error, fatal "
               "(or 0..4)")


def test_help_documents_the_flag(capsys) -> None:
    code, out, _ = verify(capsys, "--help")
    assert code == 0
    assert "--ort-log LEVEL" in out and "onnxruntime's own log" in out
