"""`verify bench`: settings parsing, the timing statistics and notes, and real runs of the sample
CNN on the local device (onnxruntime for real) under several settings."""

from __future__ import annotations

import json
import math
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from fixtures_profile import only_line, verify
from verify.bench import (DISABLE_OPTIMIZERS, LAYOUT_TRANSFORMERS, Setting, SettingResult,
                          Timing, parse_setting, timing_notes)
from verify.bench import settings_from
from verify.errors import UsageError

TESTS = Path(__file__).resolve().parent



# --- settings ------------------------------------------------------------------------------------
def test_parse_setting_keys_and_label() -> None:
    s = parse_setting("opt=basic, threads=2,provider=cuda+cpu,layout=nchw,spin=0,prepack=0,"
                      "session.set_denormal_as_zero=1")
    assert (s.opt_level, s.threads, s.layout) == ("basic", 2, "nchw")
    assert s.providers == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert s.config() == {"session.intra_op.allow_spinning": "0",
                          "session.disable_prepacking": "1",
                          "session.set_denormal_as_zero": "1",
                          DISABLE_OPTIMIZERS: LAYOUT_TRANSFORMERS}
    assert s.label == ("opt=basic,threads=2,provider=CUDA+CPU,layout=nchw,"
                       "session.intra_op.allow_spinning=0,session.disable_prepacking=1,"
                       "session.set_denormal_as_zero=1")
    assert parse_setting("opt=all") == Setting() and Setting().label == "opt=all"
    both = parse_setting(f"layout=nchw,{DISABLE_OPTIMIZERS}=ConstantFolding")
    assert both.config()[DISABLE_OPTIMIZERS] == f"ConstantFolding;{LAYOUT_TRANSFORMERS}"


@pytest.mark.parametrize("text,message", [
    ("opt=fast", "--setting 'opt=fast': opt must be one of disable, basic, extended, layout, all, "
                 "got 'fast'"),
    ("threads=-1", "--setting 'threads=-1': threads must be a whole number >= 0, got '-1'"),
    ("threads", "--setting 'threads': expected KEY=VALUE pairs joined by commas, "
                "got 'threads'"),
    ("speed=max", "--setting 'speed=max': unknown key 'speed'; valid: opt, threads, provider, "
                  "layout, spin, prepack, or a dotted onnxruntime session config key"),
    ("provider=gpu", "unknown provider 'gpu': give a full name such as CPUExecutionProvider "
                     "or one of cpu, cuda, tensorrt, rocm, openvino, dml, coreml, nnapi, qnn, "
                     "xnnpack, acl, armnn, webgpu"),
    ("layout=nhwc", "--setting 'layout=nhwc': layout must be one of auto, nchw, got 'nhwc'"),
    # onnxruntime would take it and ignore it: the row would time the default
    ("opt=all,session.intra_op.allow_spining=0",
     "--setting 'opt=all,session.intra_op.allow_spining=0': 'session.intra_op.allow_spining' is "
     "not an onnxruntime session config key; did you mean 'session.intra_op.allow_spinning'?"),
])
def test_bad_settings(text: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_setting(text)
    assert str(info.value) == message


def test_grid_is_cartesian_in_the_order_given() -> None:
    labels = [s.label for s in settings_from("disable,all", "1,2", None, None, ())]
    assert labels == ["opt=disable,threads=1", "opt=disable,threads=2",
                      "opt=all,threads=1", "opt=all,threads=2"]
    assert [s.label for s in settings_from(None, None, None, None, ())] == \
        ["opt=disable", "opt=basic", "opt=extended", "opt=all"]  # layout: opt-in
    assert [s.label for s in settings_from(None, "1", None, "auto,nchw", ("opt=disable",))] == \
        ["opt=all,threads=1", "opt=all,threads=1,layout=nchw", "opt=disable"]
    assert [s.label for s in settings_from(None, None, None, None, ("opt=basic",))] == \
        ["opt=basic"]


# --- timing statistics ---------------------------------------------------------------------------
def test_timing_statistics_by_hand() -> None:
    ms = [1.0, 2.0, 3.0, 4.0, 5.0]
    t = Timing.of(ms)
    sd = math.sqrt(2.5)  # sample variance of 1..5 is 10/4
    assert (t.n, t.avg, t.sd, t.min, t.max, t.median) == (5, 3.0, pytest.approx(sd), 1.0, 5.0,
                                                          3.0)
    half = 2.776 * sd / math.sqrt(5)  # Student t, 4 degrees of freedom
    assert (t.ci_low, t.ci_high) == (pytest.approx(3 - half), pytest.approx(3 + half))
    many = Timing.of([float(i % 7) for i in range(100)])
    assert many.ci_high - many.avg == pytest.approx(
        1.96 * statistics.stdev([float(i % 7) for i in range(100)]) / 10)
    assert Timing.of([2.0]).sd == 0.0
    two = Timing.of([1.0, 9.0])  # t = 12.706 for one degree of freedom: 5 +- 50.8
    assert (two.ci_low, two.ci_high) == (0.0, pytest.approx(5 + 12.706 * math.sqrt(32) /
                                                            math.sqrt(2)))


def _result(label: str, ms: list[float], base: float) -> SettingResult:
    t = Timing.of(ms)
    return SettingResult(parse_setting(label), tuple(ms), t, base / t.avg, 1.0, ())


def test_notes_say_when_a_comparison_means_nothing() -> None:
    base = [10.0, 10.1, 9.9, 10.0, 10.05, 9.95]
    clear = [5.0, 5.05, 4.95, 5.0, 5.02, 4.98]
    close = [10.05, 10.0, 10.15, 9.95, 10.1, 10.0]
    noisy = [3.0, 9.0, 4.0, 12.0, 5.0, 8.0]
    results = [_result("opt=disable", base, 10.0), _result("opt=all", clear, 10.0),
               _result("opt=basic", close, 10.0), _result("opt=extended", noisy, 10.0)]
    notes = timing_notes(results)
    assert not any(n.startswith("opt=all") for n in notes)  # 2x, well outside the noise
    assert any(n.startswith("opt=basic vs opt=disable: the 95% intervals of the mean overlap")
               and "within the noise" in n for n in notes)
    assert any(n.startswith("opt=extended: sd is ") and "of the mean" in n for n in notes)
    single = timing_notes([_result("opt=disable", [1.0], 1.0), _result("opt=all", [2.0], 1.0)])
    assert single == ["one timed iteration per setting: no spread to judge a difference by; "
                      "use --iter 5 or more"]


# --- real runs -------------------------------------------------------------------------------------
def test_bench_opt_levels_side_by_side_with_their_errors(
        capsys: pytest.CaptureFixture[str], cnn_two_cases: Path, private_cache: Path) -> None:
    code, out, err = verify(capsys, "bench", cnn_two_cases, "--opt-levels", "disable,all",
                            "--threads", "1", "--iter", "3", "--repeat", "2", "--json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    assert doc["baseline"] == "opt=disable,threads=1" and doc["passed"] is True
    assert (doc["cases"], doc["iterations"], doc["repeat"]) == ([0, 1], 3, 2)
    rows = doc["results"]
    assert [r["setting"]["label"] for r in rows] == ["opt=disable,threads=1", "opt=all,threads=1"]
    for r in rows:
        assert len(r["iter_ms"]) == 2 * 3 * 2  # cases x iterations x rounds
        t = r["timing"]
        assert t["n"] == 12 and t["min_ms"] <= t["avg_ms"] <= t["max_ms"]
        assert t["avg_ms"] == pytest.approx(statistics.fmean(r["iter_ms"]))
        assert r["passed"] is True and r["worst"]["rule"].startswith("magnitude")
        assert 0 <= r["max_abs"] <= r["worst"]["threshold"]
    assert rows[0]["speedup"] == 1.0
    assert rows[1]["speedup"] == pytest.approx(rows[0]["timing"]["avg_ms"]
                                               / rows[1]["timing"]["avg_ms"])

    code, out, _ = verify(capsys, "bench", cnn_two_cases, "--setting", "opt=disable",
                          "--setting", "opt=all,layout=nchw", "--case", "0", "--iter", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("device local: ") and "1 case(s), warmup 1, 2 iteration(s)" in lines[0]
    header = next(ln for ln in lines if ln.startswith("setting"))
    for col in ("avg ms", "sd", "min", "median", "max", "speed-up", "max error", "rule",
                "check"):  # the noise note sends the reader to min and median
        assert col in header
    assert "speed-up: opt=disable's mean (the first setting) over each setting's" in lines
    row = next(ln for ln in lines if ln.startswith("opt=all,layout=nchw"))
    assert "PASS" in row and "prob: magnitude" in row
    assert lines[-1] == "=== PASS: every setting within tolerance (2 settings)"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="onnxruntime's NCHWc layout transform is x86-only")
def test_layout_nchw_turns_the_layout_transform_off(cnn_two_cases: Path, private_cache: Path,
                                                    tmp_path: Path) -> None:
    from verify.archive_reader import read_archive
    from verify.devices import resolve
    from verify.options import TimedRuns
    from verify.pipeline import RunOptions, run_on_device
    from verify.profile import load_profile

    tc = read_archive(cnn_two_cases)
    ops = {}
    for layout in ("auto", "nchw"):
        s = parse_setting(f"opt=all,layout={layout}")
        run = run_on_device(resolve("local"), tc.model_bytes, [tc.cases[0].inputs],
                            RunOptions(session=s.session(), timed=TimedRuns(1, 0), profile=True),
                            profile_dest=tmp_path / f"{layout}.json")
        assert run.profile_file is not None
        ops[layout] = {n.op_type for n in load_profile(run.profile_file).nodes}
    assert "ReorderOutput" in ops["auto"]  # blocked NCHWc convolutions, converted back
    assert "ReorderOutput" not in ops["nchw"] and "FusedConv" in ops["nchw"]


def test_a_setting_over_tolerance_fails_the_bench(capsys: pytest.CaptureFixture[str],
                                                  cnn_two_cases: Path, private_cache: Path,
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # a device whose runner writes NaN into its outputs: every setting must fail the check
    runner = json.dumps([sys.executable, str(TESTS / "nan_runner.py"), "--count", "2"])
    (tmp_path / "nanny.toml").write_text(f'transport = "local"\nrunner = {runner}\n')
    monkeypatch.setenv("VERIFY_DEVICES", str(tmp_path))
    code, out, _ = verify(capsys, "bench", cnn_two_cases, "--device", "nanny",
                          "--opt-levels", "disable,all", "--iter", "2", "--case", "1")
    assert code == 1
    assert sum(1 for ln in out.splitlines() if ln.rstrip().endswith("FAIL")) == 2
    assert "opt=all: prob: NaN/Inf positions differ at 2 elements (NaN 2 vs 0, Inf 0 vs 0)" in out
    assert out.splitlines()[-1] == "=== FAIL: 2 of 2 setting(s) over tolerance"


def test_an_unknown_config_key_is_sent_with_a_note(capsys: pytest.CaptureFixture[str],
                                                   cnn_two_cases: Path,
                                                   private_cache: Path) -> None:
    # not a typo of a known key: a newer onnxruntime may know it, so it is passed on, but the
    # table says onnxruntime ignores it where it does not; a provider's own key passes quietly
    code, out, _ = verify(capsys, "bench", cnn_two_cases, "--iter", "1", "--setting", "opt=all",
                          "--setting", "opt=all,session.some_future_switch=1",
                          "--setting", "opt=all,ep.someprovider.knob=1")
    assert code == 0
    assert ("note: 'session.some_future_switch' is not a session config key onnxruntime's "
            "header lists; a build that does not know it ignores it") in out
    assert "'ep.someprovider.knob' is not" not in out


@pytest.mark.parametrize("args,message", [
    (["--setting", "opt=all", "--setting", "opt=all"], "setting 'opt=all' is given twice"),
    (["--threads", "1,x"], "--threads 'x': threads must be a whole number >= 0, "
                           "got 'x'"),
    (["--opt-levels", ","], "--opt-levels ',': give a comma-separated list"),
    (["--case", "5"], "{archive}: --case 5 out of range (the archive holds 2 case(s), 0..1)"),
])
def test_bad_bench_usage(capsys: pytest.CaptureFixture[str], cnn_two_cases: Path,
                         private_cache: Path, args: list[str], message: str) -> None:
    code, out, err = verify(capsys, "bench", cnn_two_cases, *args, "--iter", "1")
    assert (code, out) == (2, "")
    assert only_line(err) == "error: " + message.format(archive=cnn_two_cases)


def test_missing_archive(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = verify(capsys, "bench", tmp_path / "none.vtc")
    assert code == 2 and only_line(err) == f"error: {tmp_path / 'none.vtc'}: no such file"


@pytest.mark.arm64
@pytest.mark.slow
def test_bench_on_the_emulated_arm64_target(capsys: pytest.CaptureFixture[str],
                                            cnn_two_cases: Path, private_cache: Path) -> None:
    code, out, err = verify(capsys, "bench", cnn_two_cases, "--device", "arm64", "--case", "0",
                            "--opt-levels", "disable,all", "--iter", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["device"]["arch"] == "aarch64" and doc["passed"] is True
    assert [r["setting"]["label"] for r in doc["results"]] == ["opt=disable", "opt=all"]
    assert all(len(r["iter_ms"]) == 2 and r["max_abs"] is not None for r in doc["results"])
