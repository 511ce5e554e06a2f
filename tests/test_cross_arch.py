"""x86 against ARM64: two real dumps of the sample CNN — this machine, and the emulated aarch64
target running its own NEON kernels — differ in the last bits, and `verify diff` must report
those non-zero errors and still pass them at its default tolerance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verify.cli import main

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.arm64, pytest.mark.slow]


def test_diff_of_x86_and_arm64_dumps_passes_and_shows_the_noise(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "cnn.vtc"
    assert main(["pack", str(REPO / "goldens/models/cnn.onnx"), "-d",
                 str(REPO / "goldens/images/sample.png"), "--scale", "0.00392",
                 "-o", str(archive)]) == 0
    for device in ("local", "arm64"):
        assert main(["run", str(archive), "--device", device, "--iter", "1", "--warmup", "0",
                     "--opt-level", "disable", "--bin-io-dump", str(tmp_path / device)]) == 0
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "arm64"), str(tmp_path / "local"), "--json"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)["cases"]
    rows = [r for r in doc["rows"] if r.get("diff")]
    assert len(rows) >= 30  # every tensor of the graph: both sides ran it unoptimized
    assert all(r["diff"]["passed"] for r in rows)
    noisy = [r for r in rows if r["diff"]["max_abs"] > 0]
    assert noisy, "aarch64 and x86 kernels agreed to the bit everywhere: nothing was compared"
    worst = max(r["diff"]["tol_units"] for r in noisy)
    assert 0 < worst < 1
    assert main(["diff", str(tmp_path / "arm64"), str(tmp_path / "local")]) == 0
    text = capsys.readouterr().out
    assert "=== PASS" in text
