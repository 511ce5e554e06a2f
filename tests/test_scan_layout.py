"""verify.scan's ways into the kernel, each against the plainest float64 numpy.

`_chunks` walks a pair three ways: one view of each side when both are C-contiguous, another when
both are Fortran-ordered, and a buffered, casting gather for everything else (mixed layouts,
strided views, other dtypes). `_np_block` has a finite fast path and a NaN/Inf path, and three
ways to count elements outside a tolerance; `_np_rows` runs small tensors serially and larger
ones on a thread pool. Every path is checked here against a reference that knows nothing of
blocks, layouts or engines, on a pair whose elements only match when paired by position.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from verify import scan_numba
from verify.compare import AllcloseRule, compare, numba_available
from verify.scan_native import native_available

ENGINES = [
    "numpy",
    pytest.param("numba", marks=pytest.mark.skipif(not numba_available(), reason="no numba")),
    pytest.param("native", marks=pytest.mark.skipif(not native_available(),
                                                     reason="no compiled kernel")),
]


def reference(a: np.ndarray, r: np.ndarray, atol: float, rtol: float) -> dict[str, float]:
    """allclose counts and tolerance units, |a-r| figures: element by element, in float64."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(r, dtype=np.float64).reshape(-1)
    d = np.abs(x - y)
    tol = atol + rtol * np.abs(y)
    return {"n_outside": int(np.count_nonzero(d > tol)),
            "tol_units": float((d / np.maximum(tol, np.finfo(np.float64).tiny)).max(initial=0.0)),
            "max_abs": float(d.max(initial=0.0)), "ref_peak": float(np.abs(y).max(initial=0.0)),
            "mean_abs": float(d.mean()) if d.size else 0.0,
            "max_rel": float((d / np.maximum(np.abs(y), np.finfo(r.dtype).tiny)).max(initial=0.0))}


def pair(shape: tuple[int, ...], dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """A reference and an actual close to it everywhere but in a stripe of columns: paired by
    anything but position, nearly every element would be far from its partner."""
    rng = np.random.default_rng(11)
    r = (rng.standard_normal(shape) * 4).astype(dtype)
    a = (r.astype(np.float64) * (1 + rng.standard_normal(shape) * 1e-4)).astype(dtype)
    a[..., 3:5] += 0.5  # outside allclose atol=1e-2 rtol=1e-2 unless |r| is above ~50
    return a, r


def in_layout(x: np.ndarray, how: str) -> np.ndarray:
    """The same logical values in another memory layout."""
    if how == "C":
        return np.ascontiguousarray(x)
    if how == "F":
        return np.asfortranarray(x)
    if how == "strided":  # every other column of an array twice as wide
        wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    raise AssertionError(how)


LAYOUTS = [("C", "C"), ("F", "F"), ("F", "C"), ("C", "F"), ("strided", "strided"), ("strided", "C")]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("how", LAYOUTS, ids=["-".join(h) for h in LAYOUTS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=lambda t: t.__name__)
@pytest.mark.parametrize("shape", [(7, 13), (300, 1025)], ids=["one-block", "five-blocks"])
def test_every_layout_pairs_elements_by_position(shape, dtype, how, engine: str) -> None:
    """Both sides Fortran-ordered (a transposed or column-major capture) is a path of its own:
    reading one side in C order and the other in F order would pair the wrong elements."""
    a, r = pair(shape, dtype)
    la, lr = in_layout(a, how[0]), in_layout(r, how[1])
    assert np.array_equal(la, a) and np.array_equal(lr, r)
    if how == ("F", "F"):
        assert la.flags.f_contiguous and not la.flags.c_contiguous
    rule = AllcloseRule(atol=1e-2, rtol=1e-2)
    d = compare("t", la, lr, rule, engine=engine)
    ref = reference(a, r, 1e-2, 1e-2)
    assert 0 < ref["n_outside"] <= 2 * shape[0]  # the stripe, nothing else
    assert d.n_outside == ref["n_outside"] and not d.passed
    assert d.max_abs == ref["max_abs"] and d.ref_peak == ref["ref_peak"]
    assert d.tol_units == pytest.approx(ref["tol_units"], rel=1e-12)
    assert d.max_rel == pytest.approx(ref["max_rel"], rel=1e-12)
    assert d.mean_abs == pytest.approx(ref["mean_abs"], rel=1e-12)
    default = compare("t", la, lr, engine=engine)
    assert default.max_abs == ref["max_abs"] and default.n_outside == int(np.count_nonzero(
        np.abs(a.astype(np.float64) - r) > default.threshold))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_half_precision_run_against_a_float32_reference(engine: str) -> None:
    """An fp16 model's output judged against the fp32 reference (and the other way round): the
    dtype is named and the figures are those of the values, each side read as what it holds.
    numba has no float16: the engine gets both sides widened to float32."""
    a, r = pair((300, 1025), np.float32)
    half = a.astype(np.float16)
    d = compare("t", half, r, AllcloseRule(atol=1e-2, rtol=1e-2), engine=engine)
    ref = reference(half, r, 1e-2, 1e-2)
    assert d.reason.startswith("dtype float16 vs float32; ")
    assert d.n_outside == ref["n_outside"] and d.max_abs == ref["max_abs"]
    assert d.tol_units == pytest.approx(ref["tol_units"], rel=1e-12)
    back = compare("t", a, r.astype(np.float16), AllcloseRule(atol=1e-2, rtol=1e-2), engine=engine)
    assert back.reason.startswith("dtype float32 vs float16; ")
    assert back.n_outside == reference(a, r.astype(np.float16), 1e-2, 1e-2)["n_outside"]
    wide = compare("t", a.astype(np.float64), r, AllcloseRule(atol=1e-2, rtol=1e-2), engine=engine)
    assert wide.reason.startswith("dtype float64 vs float32; ")
    assert wide.n_outside == reference(a, r, 1e-2, 1e-2)["n_outside"]


def test_an_extended_precision_reference_is_compared_in_float64() -> None:
    """A reference computed in numpy's longdouble: read in float64 (the kernel's precision), not
    refused with a traceback because the cast loses precision."""
    a, r = pair((40, 50), np.float64)
    d = compare("t", a.astype(np.longdouble), r.astype(np.longdouble),
                AllcloseRule(atol=1e-2, rtol=1e-2), engine="numpy")
    ref = reference(a, r, 1e-2, 1e-2)
    assert d.n_outside == ref["n_outside"] > 0 and d.max_abs == ref["max_abs"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("n", [5, 70_000])
def test_an_output_that_is_nan_everywhere_is_reported(n: int, engine: str) -> None:
    """A diverged run whose output is NaN in every element (a whole block holds no finite
    pair): a FAIL naming the NaN count, not a traceback from an empty block."""
    r = np.linspace(-3, 3, n, dtype=np.float32)
    a = np.full(n, np.nan, np.float32)
    for rule in (None, AllcloseRule(atol=1e-3, rtol=1e-3)):
        d = compare("t", a, r, rule, engine=engine)
        assert not d.passed and d.n_outside == n and d.nonfinite_mismatch == n
        assert d.reason == f"NaN/Inf positions differ at {n} elements (NaN {n} vs 0, Inf 0 vs 0)"
        # no finite pair to measure (no figure, not a perfect 0), and no tolerance covers a
        # NaN: ranked worst of all
        assert math.isnan(d.max_abs) and d.tol_units == math.inf
        same = compare("t", a, a.copy(), rule, engine=engine)  # NaN at the same places: agreed
        assert same.passed and same.reason == "" and same.nan_actual == same.nan_reference == n
        assert same.tol_units == 0.0


@pytest.mark.parametrize("engine", ENGINES)
def test_allclose_tolerance_units_with_only_atol_or_only_rtol(engine: str) -> None:
    """`--atol X --rtol 0` and `--atol 0 --rtol X` on a ReLU output (exact zeros on both sides):
    the tolerance units are max |a-r| / (atol + rtol*|r|), a 0/0 counting as 0, below 1 for a
    pass and above it for a fail."""
    rng = np.random.default_rng(5)
    r = np.maximum(rng.standard_normal((64, 2000)), 0).astype(np.float32)  # half exact zeros
    a = (r * (1 + rng.standard_normal(r.shape).astype(np.float32) * 1e-4)).astype(np.float32)
    assert np.count_nonzero(r == 0) > r.size // 3 and np.array_equal(a == 0, r == 0)
    for atol, rtol, passes in [(1e-2, 0.0, True), (1e-5, 0.0, False), (0.0, 1e-3, True),
                               (0.0, 1e-5, False)]:
        d = compare("relu", a, r, AllcloseRule(atol=atol, rtol=rtol), engine=engine)
        ref = reference(a, r, atol, rtol)
        assert d.passed is passes and d.n_outside == ref["n_outside"]
        assert math.isfinite(d.tol_units) and (d.tol_units < 1.0) is passes
        assert d.tol_units == pytest.approx(ref["tol_units"], rel=1e-12)


def test_without_numba_the_numpy_engine_compares(monkeypatch) -> None:
    """As installed without numba (the default install): the numpy engine does every block."""
    monkeypatch.setattr(scan_numba, "_nb_state", "missing")
    monkeypatch.setattr(scan_numba, "_nb_kernel", None)
    monkeypatch.setattr(scan_numba, "_nb_error", "numba is not installed (test)")
    a, r = pair((300, 1025), np.float32)
    ref = reference(a, r, 1e-2, 1e-2)
    for engine in ("numpy", "auto"):
        d = compare("t", a, r, AllcloseRule(atol=1e-2, rtol=1e-2), engine=engine)
        assert d.n_outside == ref["n_outside"] > 0 and d.max_abs == ref["max_abs"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_strided_or_half_precision_pair_gives_the_figures_of_its_contiguous_copy(
        engine: str) -> None:
    """The gather path reads chunks in C order on block boundaries, so the figures of a strided
    view, of a pair with one side Fortran-ordered, or of float16 data widened chunk by chunk,
    are those of contiguous float32 copies to the last bit: a report does not change with how a
    capture was laid out in memory. (Only a pair Fortran-ordered on both sides is read in
    Fortran order, a view of each: its sums may differ from a C-ordered copy's in the last bit.)"""
    rng = np.random.default_rng(1)  # magnitudes over many decades: sums rounded at every add
    shape = (3, 700_001)  # 2.1 M elements: three chunks, 33 blocks
    r = (np.exp(rng.standard_normal(shape) * 3) * rng.choice([-1, 1], shape)).astype(np.float32)
    a = (r * (1 + rng.standard_normal(shape) * 1e-3)).astype(np.float32)
    contiguous = compare("t", a, r, engine=engine)
    strided = compare("t", in_layout(a, "strided"), in_layout(r, "strided"), engine=engine)
    assert strided == contiguous
    assert compare("t", np.asfortranarray(a), r, engine=engine) == contiguous
    assert compare("t", a, np.asfortranarray(r), engine=engine) == contiguous
    h, hr = pair(shape, np.float16)
    half = compare("t", h, hr, engine=engine)
    widened = compare("t", h.astype(np.float32), hr.astype(np.float32), engine=engine)
    fields = ("max_abs", "mean_abs", "cosine", "sqnr_db", "ref_peak")
    assert all(getattr(half, f) == getattr(widened, f) for f in fields), [
        (f, getattr(half, f), getattr(widened, f)) for f in fields]


@pytest.mark.parametrize("engine", ENGINES)
def test_gathered_pieces_hold_the_blocks_of_a_contiguous_copy(engine: str) -> None:
    """Block by block, not only the final figures: a pair read through the gathering path
    (one side Fortran-ordered: nditer gives a piece per row of 700,001 elements) is cut into
    the same blocks as its C-contiguous copy, so every row, sums included, is equal."""
    from verify.scan import _chunks, _rows

    rng = np.random.default_rng(4)
    r = (np.exp(rng.standard_normal((3, 700_001)) * 3)).astype(np.float32)
    a = (r * (1 + rng.standard_normal(r.shape) * 1e-3)).astype(np.float32)
    kd = np.dtype(np.float32)

    def rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.concatenate([_rows(cx, cy, engine, 1e-5, 1e-3, 1.2e-38, True)
                               for cx, cy in _chunks(x, y, kd)])

    want = rows(a, r)
    for x, y in ((np.asfortranarray(a), r), (a, np.asfortranarray(r)),
                 (in_layout(a, "strided"), in_layout(r, "strided")),
                 (a.astype(np.float64), r)):  # cast chunk by chunk
        assert np.array_equal(rows(x, y), want)
