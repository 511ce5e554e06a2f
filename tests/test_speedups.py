"""The fast paths keep their results: zero-copy .npy reads, the diff engine choice, the
capture's fixed-cost cuts. (Speed itself is measured in benchmarks/, never asserted here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fixtures_devices import run_cli

from verify.dump import DumpEntry, open_dump
from verify.dump_read import Scratch, load_npy
from verify.errors import DumpError


def _entry(a: np.ndarray) -> DumpEntry:
    return DumpEntry(0, "t", "n", "Op", str(a.dtype), tuple(a.shape), "x.npy", {})


@pytest.mark.parametrize("array", [
    np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    np.array([True, False, True]),
    np.array(3.5, np.float32),
    np.zeros((0, 5), np.int64),
    np.arange(1 << 18, dtype=np.int32),  # spans many pages
])
def test_mapped_read_equals_np_load_and_is_read_only(tmp_path: Path, array: np.ndarray) -> None:
    path = tmp_path / "x.npy"
    np.save(path, array, allow_pickle=False)
    got = load_npy(path, _entry(array), "t")
    assert got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(got, array)
    assert got.flags.f_contiguous == array.flags.f_contiguous
    if array.size:
        assert not got.flags.writeable  # a map of the file, never written through
    buffered = load_npy(path, _entry(array), "t", Scratch())
    assert np.array_equal(buffered, array)


def test_mapped_array_outlives_the_file_handle_and_a_rewrite_of_the_name(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    a = np.arange(1000, dtype=np.float32)
    np.save(path, a, allow_pickle=False)
    got = load_npy(path, _entry(a), "t")
    tmp = tmp_path / "y.npy"
    np.save(tmp, np.zeros_like(a), allow_pickle=False)
    tmp.replace(path)  # a new dump written over the old one replaces files by rename
    assert np.array_equal(got, a)


def test_mapped_read_refuses_trailing_data(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    a = np.arange(10, dtype=np.float32)
    np.save(path, a, allow_pickle=False)
    with open(path, "ab") as fh:
        fh.write(b"\0" * 8)
    with pytest.raises(DumpError, match=r"^t: x.npy has 8 bytes of trailing data$"):
        load_npy(path, _entry(a), "t")


# --- the dump at opt-level disable: a forked child of the timed runner ------------------------

RUNNER_PY = Path(__file__).resolve().parent.parent / "verify" / "runner" / "runner.py"
# verify's runner on a platform without fork (Windows): the host must run the dump as a job.
NO_FORK = ("import os, runpy, sys; del os.fork; sys.argv = sys.argv[1:]; "
           "runpy.run_path(sys.argv[0], run_name='__main__')")


def _dump_run(device_env: Any, vtc: Path, device: str, level: str, dest: Path,
              capsys: pytest.CaptureFixture[str]) -> Path:
    """Run with a layer dump, keeping the work directory; return that directory."""
    before = set(device_env.local_jobs().iterdir()) if device_env.local_jobs().is_dir() else set()
    code, _, err = run_cli(["run", vtc, "--device", device, "--iter", "1", "--warmup", "0",
                            "--opt-level", level, "--bin-io-dump", dest, "--keep"], capsys)
    assert code == 0, err
    (workdir,) = set(device_env.local_jobs().iterdir()) - before
    return workdir


def test_dump_at_opt_disable_is_taken_by_a_forked_child_else_by_a_job_of_its_own(
        device_env: Any, small_vtc: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("nofork", {"transport": "local",
                                        "runner": [sys.executable, "-c", NO_FORK,
                                                   str(RUNNER_PY)]})
    forked = _dump_run(device_env, small_vtc, "local", "disable", tmp_path / "a", capsys)
    assert (forked / "dump_result.json").is_file()
    assert not (forked / "dump_job.json").exists()  # no second runner process
    result = json.loads((forked / "result.json").read_text())
    assert result["dump_result"] == "dump_result.json" and result["cases"][0]["iter_ms"]

    unforked = _dump_run(device_env, small_vtc, "nofork", "disable", tmp_path / "b", capsys)
    assert json.loads((unforked / "result.json").read_text())["dump_result"] is None
    assert (unforked / "dump_job.json").is_file()  # the fallback: a job of its own

    optimized = _dump_run(device_env, small_vtc, "local", "all", tmp_path / "c", capsys)
    assert "dump_result" not in json.loads((optimized / "result.json").read_text())
    assert (optimized / "dump_job.json").is_file()  # needs the optimized model: a second job

    a, b = open_dump(tmp_path / "a"), open_dump(tmp_path / "b")
    names = [e.name for e in a.entries(0)]
    assert names == [e.name for e in b.entries(0)] and len(names) > 2
    for ea, eb in zip(a.entries(0), b.entries(0), strict=True):
        assert np.array_equal(a.load(ea), b.load(eb))  # the same capture either way


# --- the auto engine loads numba up front for a big enough job --------------------------------

def test_expect_bytes_loads_numba_only_for_a_job_that_pays_it_back() -> None:
    code = ("import verify.scan_numba as C\n"
            "print(C.expect_bytes(C.NUMBA_UPFRONT_BYTES - 1), C._nb_state)\n"
            "print(C.expect_bytes(C.NUMBA_UPFRONT_BYTES), C._nb_state)\n")
    env = {k: v for k, v in os.environ.items() if k != "VERIFY_NO_NUMBA"}
    env["VERIFY_NO_NATIVE"] = "1"  # without a C compiler (with one, numba is never needed:
    # tests/test_scan_native.py)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout.split("\n")
    assert out[0] == "False unloaded"
    assert out[1] in ("True loaded", "False missing")  # missing: numba not installed
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**env, "VERIFY_NO_NUMBA": "1"}).stdout.split("\n")
    assert off[:2] == ["False unloaded", "False unloaded"]


def test_diff_results_do_not_depend_on_the_engine(tmp_path: Path) -> None:
    from verify.compare import ToleranceSet
    from verify.diff import diff_captures
    from verify.dump import MANIFEST
    from verify.files import write_json_atomic

    rng = np.random.default_rng(1)
    tensors = {"x": rng.standard_normal((4, 300_000)).astype(np.float32),
               "y": rng.standard_normal(1000).astype(np.float32)}
    for side, scale in (("a", 1.0 + 2.0 ** -20), ("r", 1.0)):
        (tmp_path / side).mkdir()
        entries = []
        for i, (name, value) in enumerate(tensors.items()):
            np.save(tmp_path / side / f"c0_t{i:05d}.npy", value * np.float32(scale))
            entries.append({"index": i, "name": name, "node": name, "op": "Relu",
                            "dtype": "float32", "shape": list(value.shape),
                            "file": f"c0_t{i:05d}.npy"})
        write_json_atomic(tmp_path / side / MANIFEST, {
            "format": "verify-dump", "format_version": 1, "complete": True,
            "cases": [{"case": 0, "tensors": entries}]})
    reports = [diff_captures(tmp_path / "a", tmp_path / "r", ToleranceSet(), engine=e)
               for e in ("numpy", "numba", "auto")]
    rows = [[(r.name, r.diff.max_abs, r.diff.n_outside, r.diff.passed) for r in rep.rows
             if r.diff is not None] for rep in reports]
    assert rows[0] == rows[1] == rows[2] and len(rows[0]) == 2


# --- the runner's per-tensor stats: a block's own min/max tell it holds no NaN/Inf ------------

def test_tensor_stats_count_nan_and_inf_in_any_block_and_summarize_the_finite_rest() -> None:
    from verify.runner import runner

    x = np.arange(3_000_000, dtype=np.float32) - 1000.0  # three stat blocks
    x[5], x[1_500_000], x[2_999_999] = np.nan, np.inf, -np.inf
    s = runner.tensor_stats(np, x)
    finite = x[np.isfinite(x)].astype(np.float64)
    assert (s["nan"], s["inf"]) == (1, 2)
    assert (s["min"], s["max"]) == (float(finite.min()), float(finite.max()))
    assert s["mean"] == pytest.approx(finite.mean(), rel=1e-12)
    assert s["std"] == pytest.approx(finite.std(), rel=1e-9)
    clean = runner.tensor_stats(np, np.array([-2.0, 0.5, 3.0], np.float32))
    assert (clean["nan"], clean["inf"], clean["min"], clean["max"]) == (0, 0, -2.0, 3.0)
    only_nan = runner.tensor_stats(np, np.full(4, np.nan, np.float32))
    assert (only_nan["nan"], only_nan["min"], only_nan["mean"]) == (4, None, None)


@pytest.mark.parametrize("mean, spread, dtype", [
    (0.0, 1.0, np.float32),      # spread dominates: sum and sum of squares in one pass
    (3.0, 1.0, np.float32),
    (1e4, 1e-2, np.float32),     # mean dominates 1e12 to 1: deviations summed instead
    (-7.5e5, 3.0, np.float64),
    (2.0, 0.0, np.float32),      # all equal: no spread at all
    (1e160, 0.0, np.float64),    # its square past float64: no NaN from the first block
    (1.0, 1e-9, np.float64),     # the block mean's rounding corrected (corrected two-pass)
])
def test_tensor_stats_match_float64_two_pass_whatever_the_mean_to_spread_ratio(mean, spread, dtype) -> None:
    from verify.runner import runner

    rng = np.random.default_rng(7)
    x = (mean + spread * rng.standard_normal(200_003)).astype(dtype)  # 4 blocks, a ragged one
    s = runner.tensor_stats(np, x)
    ref = x.astype(np.float64)
    assert s["mean"] == pytest.approx(ref.mean(), rel=1e-12, abs=1e-300)
    assert s["std"] == pytest.approx(ref.std(), rel=1e-9, abs=1e-12 * abs(mean))
    assert (s["min"], s["max"]) == (float(ref.min()), float(ref.max()))
