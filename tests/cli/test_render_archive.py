"""pack's and inspect's per-tensor summaries (range, mean, NaN/Inf counts) read the arrays in
place: copying the finite values and casting them to float64 took 9x a 2 GB uint8 input's size
(pack peaked at 18.9 GB RSS after writing the archive). numpy reports its buffers to
tracemalloc, so the summaries' own allocations are measured here, not timed."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from verify.cli.render_archive import _array_info


def _peak(a: np.ndarray) -> tuple[dict, int]:
    tracemalloc.start()
    try:
        info = _array_info(a)
        return info, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("dtype, share", [(np.uint8, 0.02), (np.int64, 0.02), (np.bool_, 0.02),
                                          (np.float32, 0.3)])
def test_summaries_allocate_a_small_share_of_the_tensor(dtype, share) -> None:
    a = np.ones(16 << 20, dtype)
    if a.dtype.kind == "f":
        a[::3] = np.nan  # a mask of the finite values: a quarter of float32's bytes
        a[1] = np.inf
    info, peak = _peak(a)
    assert peak < share * a.nbytes, (peak, a.nbytes)
    assert info["min"] == info["max"] == 1.0 and info["mean"] == 1.0
    if a.dtype.kind == "f":
        assert info["nan"] == len(range(0, a.size, 3)) and info["inf"] == 1


def test_summaries_of_edge_arrays() -> None:
    assert _array_info(np.array([1.0, np.nan, np.inf, -2.0], np.float32)) == {
        "dtype": "float32", "shape": [4], "min": -2.0, "max": 1.0, "mean": -0.5, "nan": 1,
        "inf": 1}
    assert _array_info(np.array([np.nan], np.float32)) == {
        "dtype": "float32", "shape": [1], "nan": 1, "inf": 0}
    assert _array_info(np.array([True, False])) == {
        "dtype": "bool", "shape": [2], "min": 0.0, "max": 1.0, "mean": 0.5}
    assert _array_info(np.zeros((0, 3), np.float32)) == {"dtype": "float32", "shape": [0, 3]}


def test_inspect_says_a_layers_archive_holds_no_tensor_of_an_if_body(tmp_path, capsys) -> None:
    """`inspect` of a --layers archive of a model with an If said "9 tensors" and nothing of
    the bodies' tensors, which no capture holds (onnxruntime marks none of them)."""
    import onnx
    from fixtures_localize import if_model
    from helpers_cli import verify

    onnx.save(if_model(), tmp_path / "if.onnx")
    code, _, err = verify(capsys, "pack", tmp_path / "if.onnx", "--layers", "-o",
                          tmp_path / "if.vtc")
    assert code == 0, err
    code, out, _ = verify(capsys, "inspect", tmp_path / "if.vtc")
    assert code == 0
    [line] = [ln for ln in out.splitlines() if ln.startswith("per-layer references:")]
    assert line.endswith("tensors in graph order; the tensors of the 2 nodes inside "
                         "If/Loop/Scan bodies are not among them)"), line
