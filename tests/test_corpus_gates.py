"""Gates beyond max error, on real models: cos>=, sqnr>= and pNN_abs<= per tensor glob, the rule
that judged named in the report; constant references flagged; max_rel kept finite and
meaningful where the reference touches zero."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from corpus import light_path, model_path, write_faulty_profile
from helpers_cli import verify
from verify.compare import compare

OUT = "save_infer_model/scale_0.tmp_1"  # PP-OCR cls's output, 2 class scores


@pytest.fixture(scope="module")
def cls_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from verify.cli import main

    out = tmp_path_factory.mktemp("gates") / "cls.vtc"
    assert main(["pack", str(model_path("ppocr_cls")), "--shape", "x:4x3x48x192", "-o",
                 str(out)]) == 0
    return out


@pytest.fixture
def scaled_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A device whose runtime scales the classifier head's input by 1.01."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    monkeypatch.setenv("VERIFY_DEVICES", str(profiles))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return write_faulty_profile(profiles, "scaled", "Add@19", value=1.05)


def _check(out: str) -> dict:
    [case] = json.loads(out)["cases"]
    [diff] = case["check"]
    return diff


def test_gates_judge_a_real_model_and_name_their_rule(cls_vtc, scaled_device, capsys):
    code, out, err = verify(capsys, "run", cls_vtc, "--device", scaled_device, "--iter", "1",
                            "--json")
    assert code == 1, err  # the default magnitude rule sees the fault
    d = _check(out)
    sqnr, cos = d["sqnr_db"], d["cosine"]
    assert 10 < sqnr < 80 and 0.99 < cos < 1.0
    # each gate set either side of what was measured: passes below, fails above
    for spec, passes in ((f"*:sqnr>={sqnr - 1:.3f}", True), (f"*:sqnr>={sqnr + 1:.3f}", False),
                         (f"{OUT}:cos>={cos - (1 - cos):.12f}", True),
                         (f"{OUT}:cos>={1 - (1 - cos) / 2:.12f}", False)):
        code, out, err = verify(capsys, "run", cls_vtc, "--device", scaled_device, "--iter", "1",
                                "--tol", spec, "--json")
        d = _check(out)
        assert (code, d["passed"]) == ((0, True) if passes else (1, False)), (spec, d)
        key = spec.split(":")[1].split(">=")[0]
        assert d["rule"].startswith(f"{key}>="), d["rule"]
        assert passes or d["reason"].startswith(f"{key} ")
    # the error quantile: p50 of |a-r| sits at or below the max, and the rule says which
    code, out, _ = verify(capsys, "run", cls_vtc, "--device", scaled_device, "--iter", "1",
                          "--tol", f"*:p50_abs<={d['max_abs']:.6g}", "--json")
    d = _check(out)
    assert (code, d["rule"]) == (0, f"p50_abs<={d['max_abs']:.6g}")
    code, out, _ = verify(capsys, "run", cls_vtc, "--device", scaled_device, "--iter", "1",
                          "--tol", "*:p50_abs<=1e-9")
    assert code == 1
    assert "[p50_abs<=1e-09]  FAIL" in out and "p50|a-r| " in out and "> 1e-09" in out


def test_gate_spec_errors_are_usage_errors(cls_vtc, capsys):
    for spec, msg in (("*:sqnr<=40", "bad tolerance '*:sqnr<=40': write sqnr>=40"),
                      ("*:cos>=2", "bad tolerance '*:cos>=2': cos>= takes a value in [-1, 1]"),
                      ("*:p101_abs<=1", "bad tolerance '*:p101_abs<=1': the percentile in "
                                        "p101_abs must lie in [0, 100]"),
                      ("*:snr>=3", "bad tolerance '*:snr>=3': unknown gate 'snr>=3' (use "
                                   "cos>=V, sqnr>=DB or pNN_abs<=V)")):
        code, _, err = verify(capsys, "run", cls_vtc, "--iter", "1", "--tol", spec)
        assert (code, err.strip()) == (2, f"error: {msg}")


def test_constant_reference_is_flagged(tmp_path, capsys):
    """The onnx wheel's light SqueezeNet has constant weights: its softmax is 0.001 everywhere."""
    vtc = tmp_path / "sq.vtc"
    assert verify(capsys, "pack", light_path("squeezenet"), "-o", vtc)[0] == 0
    code, out, _ = verify(capsys, "run", vtc, "--iter", "1")
    assert code == 0
    assert "    note: reference is constant (0.001 everywhere): this check can tell little" in out
    code, out, _ = verify(capsys, "run", vtc, "--iter", "1", "--json")
    assert _check(out)["note"] == "reference is constant (0.001 everywhere)"
    zero = compare("z", np.full((4, 4), 1e-30, np.float32), np.zeros((4, 4), np.float32))
    assert zero.note == "reference is all zero"
    varied = compare("v", np.arange(8.0), np.arange(8.0))
    assert varied.note == ""


def test_max_rel_is_not_blown_up_by_zeros_in_the_reference():
    """A ReLU output: zeros in the reference, a 1e-7 noise on the device side."""
    r = np.maximum(np.random.default_rng(0).standard_normal(10_000), 0).astype(np.float32)
    a = r + np.float32(1e-7)
    d = compare("relu", a, r)
    assert d.max_rel <= 1e-7 / (2.0 ** -23 * float(r.max())) * 1.001
    assert d.max_rel > 0.0 and math.isfinite(d.max_rel)
    # where no element of r is near zero the definition is the plain one
    r2 = np.linspace(1, 2, 100, dtype=np.float32)
    assert compare("x", r2 * np.float32(1.001), r2).max_rel == pytest.approx(1e-3, rel=1e-3)
