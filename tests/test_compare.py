"""verify.compare: metrics against plain float64 numpy, rule boundaries, overrides, both kernels."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time

import numpy as np
import pytest

from verify.compare import (
    SATURATION_FLOOR,
    AllcloseRule,
    ExactRule,
    MagnitudeRule,
    TensorDiff,
    ToleranceSet,
    TopKAgreement,
    compare,
    first_divergent,
    numba_available,
    parse_tolerance,
    saturating_floor,
    topk_agreement,
)
from verify.errors import UsageError
from verify.scan_native import native_available

ENGINES = [
    "numpy",
    pytest.param("numba", marks=pytest.mark.skipif(not numba_available(), reason="no numba")),
    pytest.param("native", marks=pytest.mark.skipif(not native_available(),
                                                     reason="no compiled kernel")),
]

try:
    import ml_dtypes

    BF16 = [np.dtype(ml_dtypes.bfloat16)]
except ImportError:  # pragma: no cover
    BF16 = []


# --- reference computations: the plainest numpy, float64 / longdouble ------------------------

def reference_metrics(a: np.ndarray, r: np.ndarray, tiny: float) -> dict[str, float]:
    x = np.asarray(a).astype(np.float64).ravel()
    y = np.asarray(r).astype(np.float64).ravel()
    fin = np.isfinite(x) & np.isfinite(y)
    x, y = x[fin], y[fin]
    d = np.abs(x - y)
    xl, yl = x.astype(np.longdouble), y.astype(np.longdouble)
    saa, srr, sar = (xl * xl).sum(), (yl * yl).sum(), (xl * yl).sum()
    sdd = ((xl - yl) ** 2).sum()
    if saa == 0 or srr == 0:
        cosine = 1.0 if saa == srr else 0.0
    else:
        cosine = float(sar / np.sqrt(saa * srr))
    return {
        "max_abs": float(d.max(initial=0.0)),
        "mean_abs": float(d.mean()) if d.size else 0.0,
        "max_rel": float((d / np.maximum(np.abs(y), tiny)).max(initial=0.0)),
        "ref_peak": float(np.abs(y).max(initial=0.0)),
        "cosine": cosine,
        "sqnr_db": math.inf if sdd == 0 else (-math.inf if srr == 0 else
                                              float(10 * np.log10(srr / sdd))),
    }


def make_pair(dtype: np.dtype, shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        r = np.asarray(rng.random(shape) < 0.5)
        a = r.copy()
        a.reshape(-1)[::7] ^= True
        return a, r
    if dtype.kind in "iu":
        r = np.asarray(rng.integers(0, 100, size=shape)).astype(dtype)
        a = r.copy()
        a.reshape(-1)[::5] += 1
        return a, r
    r = np.asarray(rng.standard_normal(shape) * 3).astype(dtype)
    a = np.asarray(r.astype(np.float64) * (1 + rng.standard_normal(shape) * 1e-3)).astype(dtype)
    return a, r


def layout(x: np.ndarray, how: str) -> np.ndarray:
    """The same logical values with another memory layout."""
    if how == "C":
        return x
    if how == "F":
        return x.copy(order="F")
    if how == "strided":  # a view taking every other element of a twice-as-large array
        big = np.repeat(x.reshape(-1), 2).reshape(x.shape[:-1] + (2 * x.shape[-1],)) if x.ndim else x
        return big[..., ::2] if x.ndim else x
    raise AssertionError(how)


FLOAT_TINY = {"float16": float(np.finfo(np.float16).tiny), "float32": float(np.finfo(np.float32).tiny),
              "float64": float(np.finfo(np.float64).tiny), "bfloat16": float(np.finfo(np.float32).tiny)}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("how", ["C", "F", "strided"])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 0, 2), (33, 70), (3, 70001)])
@pytest.mark.parametrize("dtype", [np.dtype(t) for t in ("float32", "float64", "float16", "int64",
                                                          "int32", "uint8", "bool")] + BF16,
                         ids=str)
def test_metrics_match_float64_reference(dtype: np.dtype, shape, how: str, engine: str) -> None:
    a, r = make_pair(dtype, shape)
    la, lr = layout(a, how), layout(r, "C" if how == "F" else how)
    assert np.array_equal(la, a) and np.array_equal(lr, r)
    d = compare("t", la, lr, engine=engine)
    tiny = FLOAT_TINY.get(dtype.name, 1.0)
    ref = reference_metrics(a, r, tiny)
    assert d.size == a.size and d.actual_shape == shape and d.actual_dtype == str(dtype)
    assert d.max_abs == ref["max_abs"]
    assert d.ref_peak == ref["ref_peak"]
    assert d.max_rel == pytest.approx(ref["max_rel"], rel=1e-15)
    assert d.mean_abs == pytest.approx(ref["mean_abs"], rel=1e-12, abs=1e-300)
    assert d.cosine == pytest.approx(ref["cosine"], abs=2e-15)
    assert d.sqnr_db == pytest.approx(ref["sqnr_db"], rel=1e-10)
    if dtype.kind in "iub":
        assert d.rule == "exact"
        assert d.n_outside == int(np.count_nonzero(a != r))
        assert d.passed is (d.n_outside == 0)
    else:
        threshold = 2.0 ** 9 * max(float(ml_dtypes.finfo(dtype).eps) if dtype.kind == "V"
                                   else float(np.finfo(dtype).eps), 2.0 ** -23) * ref["ref_peak"]
        assert d.threshold == threshold
        assert d.passed is (ref["max_abs"] <= threshold)
        x = a.astype(np.float64)
        y = r.astype(np.float64)
        assert d.n_outside == int(np.count_nonzero(np.abs(x - y) > threshold))


@pytest.mark.parametrize("engine", ENGINES)
def test_allclose_rule_counts_and_tolerance_units(engine: str) -> None:
    a, r = make_pair(np.dtype(np.float32), (5, 40000), seed=3)
    rule = AllcloseRule(atol=1e-3, rtol=1e-3)
    d = compare("t", a[:, ::2], r[:, ::2], rule, engine=engine)
    x, y = a[:, ::2].astype(np.float64), r[:, ::2].astype(np.float64)
    tol = 1e-3 + 1e-3 * np.abs(y)
    outside = int(np.count_nonzero(np.abs(x - y) > tol))
    assert 0 < outside < x.size
    assert d.n_outside == outside and d.frac_outside == outside / x.size
    assert d.tol_units == pytest.approx(float((np.abs(x - y) / tol).max()), rel=1e-15)
    assert d.passed is False
    assert d.rule == "allclose atol=0.001 rtol=0.001"
    assert d.reason == (f"{outside} of 100000 elements outside allclose atol=0.001 rtol=0.001 "
                        f"(max|a-r| {d.max_abs:.2e}, {d.tol_units:.3g} tolerance units)")
    ok = compare("t", a, r, AllcloseRule(atol=1.0), engine=engine)
    assert ok.passed and ok.n_outside == 0 and ok.reason == ""


@pytest.mark.parametrize("engine", ENGINES)
def test_an_error_where_the_tolerance_is_zero_is_infinitely_many_tolerance_units(
        engine: str) -> None:
    """atol 0: an element whose tolerance is 0 (rtol 0, or a zero reference) and differs is
    inf tolerance units, not its error over the smallest double (2e+303 was shown); equal
    elements there are 0 units, and elsewhere the ratio is the plain one."""
    r = np.zeros(70000, np.float32)
    r[1::2] = 1.0
    a = r.copy()
    exact = compare("t", a, r, AllcloseRule(atol=0.0, rtol=0.0), engine=engine)
    assert exact.passed and exact.tol_units == 0.0
    a[3] = 1.5  # a nonzero reference: 0.5 / (1e-3 * 1.0) = 500 units with rtol 1e-3
    relative = compare("t", a, r, AllcloseRule(atol=0.0, rtol=1e-3), engine=engine)
    assert relative.tol_units == pytest.approx(500.0) and relative.n_outside == 1
    a[4] = 1e-7  # against a zero reference, whose tolerance is 0
    for rule in (AllcloseRule(atol=0.0, rtol=1e-3), AllcloseRule(atol=0.0, rtol=0.0)):
        d = compare("t", a, r, rule, engine=engine)
        assert d.tol_units == math.inf and not d.passed, rule
        assert d.reason.endswith("inf tolerance units)"), d.reason


def sprinkle(x: np.ndarray, rng: np.random.Generator, nan: int, inf: int) -> np.ndarray:
    x = x.copy()
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, nan, replace=False)] = np.nan
    flat[rng.choice(flat.size, inf, replace=False)] = np.inf
    return x


@pytest.mark.parametrize("engine", ENGINES[1:])
@pytest.mark.parametrize("rule", [None, AllcloseRule(1e-4, 1e-3), ExactRule(), MagnitudeRule(2.0 ** -20)],
                         ids=["magnitude", "allclose", "exact", "tight"])
def test_engines_agree(rule, engine: str) -> None:
    rng = np.random.default_rng(7)
    r = (rng.standard_normal((1500, 1500)) * 2).astype(np.float32)
    a = (r * (1 + rng.standard_normal(r.shape).astype(np.float32) * 1e-5)).astype(np.float32)
    a[700:702] *= 1.01  # a failing stretch inside two blocks
    a, r = sprinkle(a, rng, 5, 3), sprinkle(r, rng, 4, 3)
    for x, y in [(a, r), (a[:, ::2], r[:, ::2]), (a.T, r.T), (a.astype(np.float16), r.astype(np.float16))]:
        fast = compare("t", x, y, rule, engine=engine)
        slow = compare("t", x, y, rule, engine="numpy")
        for f in dataclasses.fields(TensorDiff):
            u, v = getattr(fast, f.name), getattr(slow, f.name)
            if isinstance(u, float) and f.name not in ("max_abs", "ref_peak", "max_rel", "tol_units"):
                assert u == pytest.approx(v, rel=1e-12), f.name
            else:
                assert u == v, f.name
        assert fast.nonfinite_mismatch > 0 and fast.nan_actual == np.count_nonzero(np.isnan(x))


@pytest.mark.skipif(not numba_available(), reason="no numba")
def test_a_large_call_is_split_over_the_threads_with_the_same_rows(monkeypatch) -> None:
    """A call of PARALLEL_MIN_BLOCKS blocks or more is split into contiguous runs of blocks,
    one per comparison thread, each run by the serial kernel; a smaller one runs on the calling
    thread alone. Every block's row is the same bit for bit either way."""
    from verify import scan_numba

    bs, n_min = scan_numba._NB_BLOCK, scan_numba.PARALLEL_MIN_BLOCKS
    rng = np.random.default_rng(3)
    r = rng.standard_normal(n_min * bs - 5).astype(np.float32)  # the last block 5 short
    a = (r * (1 + rng.standard_normal(r.size).astype(np.float32) * 1e-4)).astype(np.float32)
    starts = np.arange(0, r.size, bs, dtype=np.int64)
    stops = np.minimum(starts + bs, r.size)
    assert starts.size == n_min
    whole = np.zeros((n_min, scan_numba._NCOL))
    a.flags.writeable = r.flags.writeable = False  # the one signature nb_rows calls it with
    scan_numba._load_numba()(a, r, starts, stops, 1e-5, 1e-3, 1e-38, True, whole)
    runs: list[tuple[int, int]] = []
    real = scan_numba.thread_pool()

    class Pool:  # records each run of blocks it is given
        def submit(self, fn, lo, hi):
            runs.append((lo, hi))
            return real.submit(fn, lo, hi)

    monkeypatch.setattr(scan_numba, "THREADS", 2)
    monkeypatch.setattr(scan_numba, "thread_pool", lambda: Pool())
    split = scan_numba.nb_rows(a, r, starts, stops, 1e-5, 1e-3, 1e-38, True)
    assert runs == [(0, n_min // 2), (n_min // 2, n_min)]
    assert split.tobytes() == whole.tobytes() and split[:, 9].sum() == r.size
    runs.clear()
    below = scan_numba.nb_rows(a, r, starts[:-1], stops[:-1], 1e-5, 1e-3, 1e-38, True)
    assert runs == [] and below.tobytes() == whole[:-1].tobytes()


# --- the magnitude rule --------------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_magnitude_boundary(engine: str) -> None:
    r = np.linspace(-1, 1, 100_001, dtype=np.float32)  # peak exactly 1: threshold 2^-14
    a = r.copy()
    a[40_000] = np.float32(r[40_000] + 2.0 ** -14)
    assert abs(float(a[40_000]) - float(r[40_000])) == 2.0 ** -14
    at = compare("t", a, r, engine=engine)
    assert at.passed and at.threshold == 2.0 ** -14 and at.tol_units == 1.0 and at.n_outside == 0
    a[40_000] = np.nextafter(a[40_000], np.float32(np.inf))
    over = compare("t", a, r, engine=engine)
    assert not over.passed and over.n_outside == 1 and over.tol_units > 1.0
    assert over.reason == "max|a-r| 6.11e-05 > 6.10e-05"
    assert over.rule == "magnitude k=2^-14"


@pytest.mark.parametrize("engine", ENGINES)
def test_saturated_sigmoid_needs_the_floor(engine: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(-18, -11.6, size=200_000)
    r = (1 / (1 + np.exp(-x))).astype(np.float32)  # all below 1e-5
    assert r.max() < 1e-5
    a = r.copy()  # a device computing it as 1 - sigmoid(-x): noise of 1 ulp at 1.0
    a[::3] = np.maximum(np.float32(0), r[::3] + np.float32(2.0 ** -24) * rng.choice([-1, 1], a[::3].size))
    tols = ToleranceSet()
    floored = compare("sig", a, r,
                      tols.rule_for("sig", np.float32, floor=saturating_floor("Sigmoid")),
                      engine=engine)
    assert floored.passed, floored.reason
    assert floored.rule == "magnitude k=2^-14 floor=2^-4"
    assert floored.threshold == 2.0 ** -14 / 16
    bare = compare("sig", a, r, tols.rule_for("sig", np.float32), engine=engine)
    assert not bare.passed and bare.tol_units > 50 and bare.rule == "magnitude k=2^-14"
    assert bare.sqnr_db < 40  # why SQNR or relative rules cry wolf here


def test_saturating_floor_walks_shape_only_ops() -> None:
    assert saturating_floor("Sigmoid") == SATURATION_FLOOR == 1 / 16
    for op in ("HardSigmoid", "Tanh", "Softmax", "Erf"):
        assert saturating_floor(op) == 1 / 16
    assert saturating_floor("Reshape", ["Transpose", "Softmax"]) == 1 / 16
    assert saturating_floor("Flatten", ["Sigmoid", "Conv"]) == 1 / 16
    assert saturating_floor("Reshape", ["Conv", "Sigmoid"]) == 0.0
    assert saturating_floor("Mul", ["Sigmoid"]) == 0.0
    assert saturating_floor("LogSoftmax") == 0.0
    assert saturating_floor("Reshape", []) == 0.0


def test_magnitude_constant_scales_with_dtype() -> None:
    rule = MagnitudeRule()
    assert rule.k_for(np.dtype(np.float32)) == 2.0 ** -14
    assert rule.k_for(np.dtype(np.float64)) == 2.0 ** -14
    assert rule.k_for(np.dtype(np.float16)) == 2.0 ** -1
    for bf16 in BF16:
        assert rule.k_for(bf16) == 2.0 ** 2
    assert MagnitudeRule(k=1e-3).k_for(np.dtype(np.float16)) == 1e-3
    r = np.array([0.5, 1.0], dtype=np.float16)
    assert compare("h", r + np.float16(0.25), r).passed
    assert compare("h", r, r).rule == "magnitude k=0.5"
    assert AllcloseRule(1.0, 0.25).describe() == "allclose atol=1 rtol=0.25"


# --- NaN/Inf, integers, shapes, dtypes -----------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_nan_and_inf_positions(engine: str) -> None:
    r = np.array([1.0, np.nan, np.inf, -np.inf, 2.0], dtype=np.float32)
    same = compare("t", r.copy(), r, engine=engine)
    assert same.passed and same.max_abs == 0.0 and same.sqnr_db == math.inf
    assert (same.nan_actual, same.nan_reference, same.inf_actual, same.inf_reference) == (1, 1, 2, 2)
    a = r.copy()
    a[0] = np.nan
    moved = compare("t", a, r, engine=engine)
    assert not moved.passed and moved.nonfinite_mismatch == 1 and moved.n_outside == 1
    assert moved.tol_units == math.inf and same.tol_units == 0.0  # ranked worst by --top
    assert moved.reason == "NaN/Inf positions differ at 1 element (NaN 2 vs 1, Inf 2 vs 2)"
    a = r.copy()
    a[3] = np.inf
    a[4] = np.nan
    flipped = compare("t", a, r, engine=engine)
    assert flipped.reason == "NaN/Inf positions differ at 2 elements (NaN 2 vs 1, Inf 2 vs 2)"
    assert flipped.max_abs == 0.0  # the finite pairs that remain agree


@pytest.mark.parametrize("engine", ENGINES)
def test_an_all_nan_output_shows_no_metric_and_no_agreement(engine: str) -> None:
    """A classifier's output all NaN against a reference whose top class is 0: the verdict
    was FAIL, but its figures read max_abs 0, cosine 1, SQNR inf, 'reference is all zero' and
    top-1 1.0 (argmax of a NaN row is 0), all taken over no element at all."""
    r = np.array([[0.9, 0.05, 0.03, 0.01, 0.005, 0.005]], np.float32)
    blank = np.full_like(r, np.nan)
    d = compare("prob", blank, r, topk=True, engine=engine)
    assert not d.passed and d.nonfinite_mismatch == r.size and d.tol_units == math.inf
    for figure in (d.max_abs, d.max_rel, d.mean_abs, d.cosine, d.sqnr_db):
        assert math.isnan(figure)
    assert d.note == "no element is finite on both sides: no metric can be computed"
    assert d.topk == TopKAgreement(1, 0.0, 0.0)
    # NaN where the reference has NaN too is no disagreement: equal rows still agree
    twice = compare("prob", blank, blank.copy(), topk=True, engine=engine)
    assert twice.passed and twice.topk == TopKAgreement(1, 1.0, 1.0) and math.isnan(twice.cosine)
    # half NaN against a reference that is not zero: no "all zero" from the half compared
    half = r.copy()
    half[0, :3] = np.nan
    zeros_where_compared = np.array([[0.9, 0.05, 0.03, 0.0, 0.0, 0.0]], np.float32)
    assert compare("prob", half, zeros_where_compared, engine=engine).note == ""
    assert compare("prob", half, np.zeros_like(r), engine=engine).note == "reference is all zero"


@pytest.mark.parametrize("engine", ENGINES)
def test_integers_are_exact(engine: str) -> None:
    """By default, and under a global --atol or a catch-all glob: exact (an index off by one
    is wrong); the rule `ToleranceSet.rule_for` picks for the dtype is the one compare uses."""
    r = np.array([2 ** 62, 5, -7], dtype=np.int64)
    a = r.copy()
    a[0] += 1  # invisible in float64
    for rules in (ToleranceSet(), ToleranceSet.from_specs([], atol=10.0),
                  ToleranceSet.from_specs(["*:atol=10"])):
        d = compare("idx", a, r, rules.rule_for("idx", r.dtype), engine=engine)
        assert not d.passed and d.rule == "exact" and d.n_outside == 1
        assert d.tol_units == math.inf and d.reason == "1 of 3 elements differ"
    d = compare("idx", a, r, engine=engine)  # no rule: the default for the dtype
    assert not d.passed and d.rule == "exact" and d.reason == "1 of 3 elements differ"
    assert compare("idx", r.copy(), r, engine=engine).passed
    b = np.array([True, False])
    assert compare("mask", ~b, b, engine=engine).reason == "2 of 2 elements differ (max|a-r| 1)"


def test_shape_and_dtype_mismatch_are_results() -> None:
    d = compare("t", np.zeros((1, 3), np.float32), np.zeros((1, 4), np.float32))
    assert not d.passed and d.reason == "shape (1,3) vs (1,4)"
    assert math.isnan(d.max_abs) and d.to_dict()["max_abs"] == "nan"
    assert compare("t", np.zeros(3), np.zeros(())).reason == "shape (3,) vs ()"
    d = compare("t", np.arange(4, dtype=np.int64), np.arange(4, dtype=np.int32))
    assert not d.passed and d.reason == "dtype int64 vs int32" and d.max_abs == 0.0
    d = compare("t", np.arange(4, dtype=np.float16), np.arange(4, dtype=np.float32) + 1)
    assert d.reason == "dtype float16 vs float32; max|a-r| 1.00e+00 > 2.44e-04"
    s = compare("s", np.array(["a", "b"]), np.array(["a", "c"]))
    assert not s.passed and s.reason == "1 of 2 elements differ" and s.rule == "exact"


# --- tolerance specs -----------------------------------------------------------------------

def test_glob_overrides_first_match_wins() -> None:
    f32 = np.float32
    tols = ToleranceSet.from_specs(["conv*:atol=1e-3", "prob:atol=1e-4,rtol=1e-3",
                                    "block1/*:k=1e-3,floor=0", "input:0:exact", "*:k=2^-12"])
    assert tols.rule_for("conv1/out", f32) == AllcloseRule(1e-3, 0.0)
    assert tols.rule_for("prob", f32) == AllcloseRule(1e-4, 1e-3)
    assert tols.rule_for("block1/relu", f32, floor=1 / 16) == MagnitudeRule(1e-3, 0.0)
    assert tols.rule_for("input:0", f32) == ExactRule()
    assert tols.rule_for("fc", f32, floor=1 / 16) == MagnitudeRule(2.0 ** -12, 1 / 16)
    assert tols.rule_for("Conv1", f32) == MagnitudeRule(2.0 ** -12, 0.0)  # globs are case-sensitive
    assert ToleranceSet().rule_for("x", f32, floor=0.0625) == MagnitudeRule(None, 0.0625)
    assert ToleranceSet.from_specs([], atol=1e-3).rule_for("x", f32) == AllcloseRule(1e-3, 0.0)
    assert ToleranceSet.from_specs([], rtol=1e-2).default == AllcloseRule(0.0, 1e-2)
    assert ToleranceSet.from_specs(["x:atol=1"], atol=1e-3).rule_for("y", f32) == \
        AllcloseRule(1e-3, 0.0)
    assert parse_tolerance(" a* : atol = 2^-10 , rtol=2**-3").rule == AllcloseRule(2.0 ** -10, 0.125)


def test_describe() -> None:
    assert MagnitudeRule().describe() == "magnitude k=2^9*eps"
    assert MagnitudeRule(2.0 ** -14, 1 / 16).describe() == "magnitude k=2^-14 floor=2^-4"
    assert MagnitudeRule(1e-3, 0.0).describe() == "magnitude k=0.001"
    assert AllcloseRule(1e-5, 1e-5).describe() == "allclose atol=1e-05 rtol=1e-05"
    assert ExactRule().describe() == "exact"


EXPECTED_FORM = ("expected PATTERN:KEY=VALUE[,KEY=VALUE...] with keys atol, rtol, k, floor, "
                 "gates cos>=, sqnr>=, pNN_abs<=, or PATTERN:exact")
SYNTAX_ERRORS = [
    ("conv*", "bad tolerance 'conv*': " + EXPECTED_FORM),
    ("conv*:", "bad tolerance 'conv*:': " + EXPECTED_FORM),
    (":atol=1", "bad tolerance ':atol=1': empty tensor-name pattern before ':'"),
    ("x:atol", "bad tolerance 'x:atol': expected KEY=VALUE, got 'atol'"),
    ("x:tol=1", "bad tolerance 'x:tol=1': unknown key 'tol' (use atol, rtol, k, floor, "
     "cos>=, sqnr>=, pNN_abs<= or exact)"),
    ("x:atol=abc", "bad tolerance 'x:atol=abc': 'abc' is not a number (write 1e-3 or 2^-12)"),
    ("x:atol=nan", "bad tolerance 'x:atol=nan': 'nan' is not a number (write 1e-3 or 2^-12)"),
    ("x:atol=inf", "bad tolerance 'x:atol=inf': 'inf' is not a number (write 1e-3 or 2^-12)"),
    ("x:atol=1,atol=2", "bad tolerance 'x:atol=1,atol=2': 'atol' given twice"),
    ("x:atol=1,k=2", "bad tolerance 'x:atol=1,k=2': atol/rtol and k/floor cannot be mixed in one rule"),
    ("x:atol=-1", "bad tolerance 'x:atol=-1': atol must be finite and >= 0, got -1"),
    ("x:k=0", "bad tolerance 'x:k=0': k must be finite and > 0, got 0"),
]


@pytest.mark.parametrize("spec,message", SYNTAX_ERRORS, ids=[s for s, _ in SYNTAX_ERRORS])
def test_tolerance_syntax_errors(spec: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        ToleranceSet.from_specs(["ok:atol=1", spec])
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_global_tolerance_must_be_valid() -> None:
    with pytest.raises(UsageError, match=r"^rtol must be finite and >= 0, got -0.1$"):
        ToleranceSet.from_specs([], rtol=-0.1)


# --- reports --------------------------------------------------------------------------------

def test_to_dict_is_strict_json() -> None:
    r = np.ones((2, 3), np.float32)
    for d in (compare("same", r, r, topk=True), compare("shape", r, r[:1]),
              compare("zero", r, np.zeros_like(r))):
        out = d.to_dict()
        text = json.dumps(out, allow_nan=False)
        assert json.loads(text) == out
    same = compare("same", r, r, topk=True).to_dict()
    assert same["sqnr_db"] == "inf" and same["actual_shape"] == [2, 3]
    assert same["topk"] == {"rows": 2, "top1": 1.0, "top5": 1.0}
    zero = compare("zero", r, np.zeros_like(r)).to_dict()
    assert zero["sqnr_db"] == "-inf" and zero["tol_units"] == "inf" and zero["cosine"] == 0.0


@pytest.mark.parametrize("engine", ENGINES)
def test_cosine_keeps_float64_precision_near_one(engine: str) -> None:
    rng = np.random.default_rng(5)
    r = rng.standard_normal(3_000_000).astype(np.float32)
    a = (r * (1 + 1e-7 * rng.standard_normal(r.size))).astype(np.float32)
    xl, yl = a.astype(np.longdouble), r.astype(np.longdouble)
    ref = (xl * yl).sum() / np.sqrt((xl * xl).sum() * (yl * yl).sum())
    assert 1 - ref > 1e-15  # a real difference to resolve
    d = compare("t", a, r, engine=engine)
    assert abs(np.longdouble(d.cosine) - ref) <= 1e-15


def test_topk_agreement() -> None:
    r = np.array([[0.1, 0.5, 0.2, 0.0, 0.9, 0.3, -1.0],
                  [3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0]], np.float32)
    a = r.copy()
    a[0, 1] = 1.0  # new top-1 in row 0, same top-5 set
    a[1, 6] = 5.0  # row 1: new top-1, and index 6 pushes index 4 out of the top 5
    t = topk_agreement(a, r)
    assert t is not None and (t.rows, t.top1, t.top5) == (2, 0.0, 0.5)
    assert topk_agreement(r[0], r[0]).rows == 1
    assert topk_agreement(r[None], r[None]) is None  # 3-D: not classifier-shaped
    assert topk_agreement(r[:, :1], r[:, :1]) is None
    assert compare("p", a, r, topk=True).topk == t
    assert compare("p", a, r).topk is None


def test_topk_agreement_on_a_classifier_batch_with_one_row_changed() -> None:
    """What `verify diff` prints beside a classifier's output: a batch of three images whose
    second one now gets another class (top-1 2 of 3), while its five best classes stay the
    same set; and the shapes that are not a classifier's get no figure at all."""
    r = np.array([[0.1, 0.7, 0.05, 0.04, 0.02, 0.03, 0.06],
                  [0.6, 0.3, 0.02, 0.025, 0.03, 0.015, 0.01],
                  [0.0, 0.0, 0.1, 0.8, 0.05, 0.04, 0.01]], np.float32)
    a = r.copy()
    a[1, 1] = 0.65  # row 1's argmax moves from class 0 to class 1; the top-5 set is kept
    t = topk_agreement(a, r)
    assert t is not None and (t.rows, t.top1, t.top5) == (3, pytest.approx(2 / 3), 1.0)
    a[2, 0] = 0.09  # row 2: class 0 enters the top five, class 6 (0.01) leaves it
    t = topk_agreement(a, r)
    assert (t.rows, t.top1, t.top5) == (3, pytest.approx(2 / 3), pytest.approx(2 / 3))
    # fewer than five classes: top-5 is every class, so it always agrees; a top-1 flip shows
    r3 = np.array([[0.2, 0.5, 0.3]], np.float64)
    a3 = np.array([[0.5, 0.2, 0.3]], np.float64)
    assert topk_agreement(a3, r3) == TopKAgreement(1, 0.0, 1.0)
    # two classes are enough to be a classifier; one is not
    assert topk_agreement(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == TopKAgreement(1, 0.0, 1.0)
    assert topk_agreement(np.array([1.0]), np.array([1.0])) is None
    # integer scores (a quantized classifier) are ranked too, and may be compared with floats
    qi = np.array([[3, 9, 1, 0, 2, 5]], np.int8)
    assert topk_agreement(qi, qi) == TopKAgreement(1, 1.0, 1.0)
    assert topk_agreement(qi, qi.astype(np.float32)) == TopKAgreement(1, 1.0, 1.0)
    qa = qi.copy()
    qa[0, 3] = 10  # class 3 takes top-1 and enters the top five (class 2 leaves it)
    assert topk_agreement(qa, qi) == TopKAgreement(1, 0.0, 0.0)
    # not classifier-shaped: other shapes on the two sides, bools, strings, 3-D
    assert topk_agreement(r[:, :6], r) is None and topk_agreement(r, r[:2]) is None
    assert topk_agreement(r > 0.1, r > 0.1) is None
    assert topk_agreement(r > 0.1, r) is None and topk_agreement(r, r > 0.1) is None
    assert topk_agreement(np.array(["a", "b"]), np.array(["a", "b"])) is None
    assert topk_agreement(r[None], r[None]) is None
    # an empty batch agrees trivially
    empty = np.zeros((0, 4), np.float32)
    assert topk_agreement(empty, empty) == TopKAgreement(0, 1.0, 1.0)


def test_first_divergent_is_the_first_failing_in_order() -> None:
    diffs = []
    for i in range(4):
        r = np.full(10, float(i + 1), np.float32)
        diffs.append(compare(f"t{i}", r * (1.01 if i >= 2 else 1.0), r))
    assert [d.passed for d in diffs] == [True, True, False, False]
    assert first_divergent(diffs).name == "t2"
    assert first_divergent(reversed(diffs)).name == "t3"
    assert first_divergent(diffs[:2]) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_read_only_memmaps(tmp_path, engine: str) -> None:
    a, r = make_pair(np.dtype(np.float32), (300, 1000), seed=9)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "r.npy", r)
    ma = np.load(tmp_path / "a.npy", mmap_mode="r")
    mr = np.load(tmp_path / "r.npy", mmap_mode="r")
    assert not ma.flags.writeable
    assert compare("m", ma, mr, engine=engine) == compare("m", a, r, engine=engine)


def test_auto_engine_policy(monkeypatch) -> None:
    from verify import scan_numba as module

    monkeypatch.setattr(module, "_bytes_seen", 0)
    monkeypatch.setenv("VERIFY_NO_NATIVE", "1")  # the policy without a C compiler
    assert module.choose_engine("numpy", 1 << 40) == "numpy"
    assert module.choose_engine("auto", 1 << 10) == "numpy"  # small tensors never pay for numba
    monkeypatch.setenv("VERIFY_NO_NUMBA", "1")
    assert module.choose_engine("auto", module.NUMBA_AFTER_BYTES) == "numpy"
    monkeypatch.delenv("VERIFY_NO_NUMBA")
    expected = "numba" if numba_available() else "numpy"
    assert module.choose_engine("auto", module.NUMBA_AFTER_BYTES) == expected
    monkeypatch.delenv("VERIFY_NO_NATIVE")  # with one: the compiled kernel for every size
    assert module.choose_engine("auto", 1 << 10) == ("native" if native_available() else
                                                      "numpy")


def test_tol_rank_orders_failures_without_a_figure_worst_everywhere() -> None:
    """One ranking for diff --top, localize and bench: a shape mismatch (no figure) is the
    worst failure, a passing tensor the least bad, errors in between by tolerance units."""
    from verify.bench import Setting, SettingResult
    from verify.compare import tol_rank
    from verify.localize.search import worst
    from verify.timing import Timing

    r = np.linspace(0.5, 1.0, 64).astype(np.float32)
    ok = compare("ok", r, r)
    over = compare("over", r + np.float32(3e-3), r)
    shape = compare("shape", r[:32], r)
    assert (ok.passed, over.passed, shape.passed) == (True, False, False)
    assert math.isnan(shape.tol_units) and over.tol_units > 1
    assert sorted([ok, shape, over], key=tol_rank) == [ok, over, shape]
    assert worst([ok, over, shape]) == math.inf and worst([ok]) == ok.tol_units
    result = SettingResult(Setting(), (1.0,), Timing.of([1.0]), 1.0, 0.0,
                           (ok, over, shape))
    assert result.worst is shape


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.parametrize("engine", ENGINES)
def test_a_process_forked_after_a_comparison_compares_again(engine: str) -> None:
    """The comparison thread pool is made once per process; a child forked after a
    comparison (multiprocessing's fork start method, a test runner forking workers) inherits
    the pool without its threads, and its next comparison of a multi-block tensor hung. Both
    engines spread a large call over the pool (numba's from PARALLEL_MIN_BLOCKS blocks)."""
    from verify.scan_numba import _NB_BLOCK, PARALLEL_MIN_BLOCKS

    a, r = make_pair(np.dtype(np.float32), (PARALLEL_MIN_BLOCKS, _NB_BLOCK), seed=3)
    want = compare("t", a, r, engine=engine)  # several blocks: the pool is used
    pid = os.fork()
    if pid == 0:  # the child: compare again, report by exit status only
        try:
            os._exit(0 if compare("t", a, r, engine=engine) == want else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's comparison did not finish")


def test_a_batch_holding_a_transposed_pair_judges_it_as_compare_does() -> None:
    """diff batches small float32 pairs; one whose two sides have the same size but another
    shape ((2, 3) against (3, 2), a layout change) fails on its shape without a pass over the
    data, beside the batched ones, and the default engine gives what compare gives."""
    from verify.compare import compare_batch
    from verify.scan import Batch

    rng = np.random.default_rng(11)
    pairs = [(rng.standard_normal((2, 3)).astype(np.float32), None),
             (rng.standard_normal(50).astype(np.float32), None)]
    pairs = [(a, a.T.copy() if a.ndim == 2 else a + np.float32(1e-3)) for a, _ in pairs]
    batch = Batch(1 << 12)
    items = []
    for k, (a, r) in enumerate(pairs):
        xa, xr, span = batch.add(a, r)
        items.append((f"t{k}", xa, xr, None, True, span))
    got = compare_batch(items, batch)  # type: ignore[arg-type]
    want = [compare(f"t{k}", a, r, topk=True) for k, (a, r) in enumerate(pairs)]
    assert got == want
    assert not got[0].passed and got[0].reason == "shape (2,3) vs (3,2)"
    assert not got[1].passed and got[1].reason.startswith("max|a-r|")


def test_a_layer_whose_shape_changed_reads_as_no_figure_in_the_json() -> None:
    """`verify diff --json` for a layer another build gives another shape: failing, its reason,
    every metric "nan" (no figure: not 0, which would read as equal, nor null) and no element
    counted, for a CI job to read."""
    d = compare("conv1", np.zeros((1, 8, 4, 4), np.float32), np.zeros((1, 8, 2, 2), np.float32))
    doc = d.to_dict()
    assert json.loads(json.dumps(doc, allow_nan=False)) == {
        "name": "conv1", "passed": False, "rule": "magnitude k=2^-14",
        "reason": "shape (1,8,4,4) vs (1,8,2,2)", "actual_shape": [1, 8, 4, 4],
        "reference_shape": [1, 8, 2, 2], "actual_dtype": "float32",
        "reference_dtype": "float32", "size": 0, "max_abs": "nan", "max_rel": "nan",
        "mean_abs": "nan", "cosine": "nan", "sqnr_db": "nan", "ref_peak": "nan",
        "threshold": "nan", "tol_units": "nan", "n_outside": 0, "frac_outside": "nan",
        "nan_actual": 0, "nan_reference": 0, "inf_actual": 0, "inf_reference": 0,
        "nonfinite_mismatch": 0, "topk": None, "note": ""}
    assert all(type(doc[k]) is int for k in ("size", "n_outside", "nan_actual", "nan_reference",
                                             "inf_actual", "inf_reference",
                                             "nonfinite_mismatch"))


def test_string_and_complex_outputs_are_judged_by_equality_alone() -> None:
    """A classifier's label output (strings) or a complex FFT output: equal or not, element by
    element; no magnitude figure ("nan" in the JSON); values that cannot be compared (sequences
    in an object tensor) count as differing, never as a pass."""
    r = np.array(["cat", "dog", "fox"], object)
    same = compare("labels", r.copy(), r)
    assert same.passed and (same.n_outside, same.tol_units, same.size) == (0, 0.0, 3)
    doc = compare("labels", np.array(["cat", "dog", "eel"], object), r).to_dict()
    assert json.loads(json.dumps(doc, allow_nan=False)) == {
        "name": "labels", "passed": False, "rule": "exact", "reason": "1 of 3 elements differ",
        "actual_shape": [3], "reference_shape": [3], "actual_dtype": "object",
        "reference_dtype": "object", "size": 3, "max_abs": "nan", "max_rel": "nan",
        "mean_abs": "nan", "cosine": "nan", "sqnr_db": "nan", "ref_peak": "nan",
        "threshold": 0.0, "tol_units": "inf", "n_outside": 1, "frac_outside": 1 / 3,
        "nan_actual": 0, "nan_reference": 0, "inf_actual": 0, "inf_reference": 0,
        "nonfinite_mismatch": 0, "topk": None, "note": ""}
    # text stored as another type, and one label wrong: both said
    both = compare("labels", np.array(["cat", "dog", "eel"]), r)
    assert both.reason == "dtype <U3 vs object; 1 of 3 elements differ"
    empty = np.array([], object)  # no detections: nothing to differ
    e = compare("labels", empty, empty.copy())
    assert e.passed and (e.n_outside, e.frac_outside, e.tol_units) == (0, 0.0, 0.0)
    seq = np.empty(2, object)
    seq[0], seq[1] = np.array([1, 2]), np.array([3])
    d = compare("seq", seq, seq.copy())
    assert not d.passed and d.n_outside == 2 and d.reason == "2 of 2 elements differ"
    c = np.array([1 + 2j, 3j])
    assert compare("fft", c, c.copy()).passed
    assert compare("fft", c * 1j, c).reason == "2 of 2 elements differ"


def test_large_integer_ids_one_apart_are_reported_one_apart() -> None:
    """Integer outputs are read in float64 (exact to 2^53), never float32: two token ids
    2^25 + 1 and 2^25 + 2 differ, and the reason says by how much (float32 holds neither)."""
    r = np.array([7, 2**25 + 1], np.int64)
    a = np.array([7, 2**25 + 2], np.int64)
    for dt in (np.int64, np.int32):
        d = compare("ids", a.astype(dt), r.astype(dt))
        assert not d.passed and d.max_abs == 1.0
        assert d.reason == "1 of 2 elements differ (max|a-r| 1)"


def test_a_relative_error_below_one_over_eps_is_reported_as_is() -> None:
    """max_rel is taken again against eps * max|r| only past 1/eps (a reference element near
    zero blowing it up); an element at 1e-9 next to a peak of 1, off by 100%, reads 1.0."""
    d = compare("x", np.float32([1.0, 2e-9]), np.float32([1.0, 1e-9]))
    assert d.max_rel == pytest.approx(1.0, rel=1e-6)
    # at 1/eps exactly (2^23 for float32) it is still as is: 2^-7 off an element of 2^-30
    r = np.float32([1.0, 2.0 ** -30])
    a = np.float32([1.0, 2.0 ** -7 + 2.0 ** -30])
    assert compare("x", a, r).max_rel == 2.0 ** 23


def test_no_detections_and_integer_zeros_read_plainly() -> None:
    """A detector's box output with no box on either side (shape (0, 4)) passes with nothing
    outside (fraction 0, not 1); an integer output all zero (no class present) gets no
    "reference is all zero" note, which is said of float references only."""
    none = np.zeros((0, 4), np.float32)
    d = compare("boxes", none, none.copy())
    assert d.passed and (d.n_outside, d.frac_outside, d.size) == (0, 0.0, 0)
    z = np.zeros(6, np.int64)
    i = compare("classes", z, z.copy())
    assert i.passed and i.note == ""
    assert compare("scores", z.astype(np.float32), z.astype(np.float32)).note == \
        "reference is all zero"
