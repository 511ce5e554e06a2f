"""verify.scan's counts and cosine where its other code paths start: integer outputs past one
buffered chunk (counted a chunk at a time, in any layout), a magnitude failure recounted over
several chunks, the numpy engine on an install without numba, and cosine at its edges (a dead
output, orthogonal outputs, rounding past +-1, sums near float64's range)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from verify.compare import compare, numba_available, parse_tolerance
from verify.scan import _CHUNK
from verify.scan_native import native_available

ENGINES = [
    "numpy",
    pytest.param("numba", marks=pytest.mark.skipif(not numba_available(), reason="no numba")),
    pytest.param("native", marks=pytest.mark.skipif(not native_available(),
                                                     reason="no compiled kernel")),
]

SHAPE = (1100, 2000)  # 2.2M elements: more than two of scan's buffered chunks
assert SHAPE[0] * SHAPE[1] > 2 * _CHUNK


def _place(x: np.ndarray, how: str) -> np.ndarray:
    """The same values laid out as a device's output buffer might be."""
    if how == "C":
        return x
    if how == "F":  # column-major (a runner writing Fortran order)
        return np.asfortranarray(x)
    if how == "strided":  # every other element of a buffer twice as wide
        wide = np.empty(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    if how == "transposed":  # a transposed view (neither C- nor F-contiguous as a pair)
        return np.ascontiguousarray(x.T).T
    raise AssertionError(how)


def _differing(size: int, seed: int) -> np.ndarray:
    """Positions in every chunk, the first and the last element included."""
    rng = np.random.default_rng(seed)
    return np.unique(np.concatenate([[0, size - 1, _CHUNK - 1, _CHUNK, 2 * _CHUNK],
                                     rng.integers(0, size, 40)]))


def _int_pair(kind: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    size = SHAPE[0] * SHAPE[1]
    where = _differing(size, 4)
    if kind == "int64_past_2^53":  # ids float64 cannot tell apart: 2^62 + k and 2^62 + k + 1
        r = (2 ** 62 + rng.integers(0, 1000, size)).astype(np.int64)
        a = r.copy()
        a[where] += 1
    elif kind == "bool":
        r = rng.random(size) < 0.5
        a = r.copy()
        a[where] = ~a[where]
    elif kind == "uint8":
        r = rng.integers(0, 200, size).astype(np.uint8)
        a = r.copy()
        a[where] += 7
    elif kind == "int32_vs_int64":  # a runner writing int32 class ids for an int64 output
        r = rng.integers(0, 80, size).astype(np.int64)
        a = r.astype(np.int32)
        a[where] += 1
    else:
        raise AssertionError(kind)
    return a.reshape(SHAPE), r.reshape(SHAPE)


@pytest.mark.parametrize("how", ["C", "F", "strided", "transposed"])
@pytest.mark.parametrize("kind", ["int64_past_2^53", "bool", "uint8", "int32_vs_int64"])
def test_integer_outputs_past_one_chunk_count_every_differing_element(kind: str, how: str) -> None:
    """A class map or an id tensor of 2.2M elements is judged exactly a chunk at a time: the
    count of differing elements (and the reason a user reads) is numpy's own count, whatever
    the dtypes and the layout of either side."""
    a, r = _int_pair(kind)
    want = int(np.count_nonzero(a != r))
    assert want >= 40
    d = compare("ids", _place(a, how), _place(r, "C" if how == "F" else how))
    assert d.rule == "exact" and not d.passed
    assert d.n_outside == want and d.size == a.size
    total = f"{want} of {a.size} elements differ"
    if kind == "int64_past_2^53":  # float64 reads both sides equal: no max|a-r| to show
        assert d.reason == total and d.max_abs == 0.0
    elif kind == "int32_vs_int64":
        assert d.reason == f"dtype int32 vs int64; {total} (max|a-r| 1)"
    else:
        assert d.reason.startswith(total + " (max|a-r| ")
    same = compare("ids", _place(r, how), _place(r.copy(), "C" if how == "F" else how))
    assert same.passed and same.n_outside == 0


def test_int64_against_uint64_past_one_chunk_stays_exact() -> None:
    """int64 and uint64 have no common integer type (numpy promotes the pair to float64), yet
    their comparison is exact: a chunked count must not go through float64, where 2^62 and
    2^62 + 1 are one number. Counted as for a small tensor."""
    a, r = _int_pair("int64_past_2^53")
    want = int(np.count_nonzero(a != r))
    d = compare("ids", a, r.astype(np.uint64))
    assert d.n_outside == want
    assert d.reason == f"dtype int64 vs uint64; {want} of {a.size} elements differ"
    small = compare("ids", a[:2, :5], r[:2, :5].astype(np.uint64))
    assert small.n_outside == int(np.count_nonzero(a[:2, :5] != r[:2, :5]))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("how", ["float16", "strided"])
def test_a_magnitude_failure_past_one_chunk_counts_every_element_outside(how: str,
                                                                        engine: str) -> None:
    """A float16 output (cast a chunk at a time) or a strided float32 one (gathered a chunk at
    a time) of 2.2M elements, failing the magnitude rule in every chunk: the elements outside
    are recounted in each chunk and added up, as a plain float64 count gives."""
    rng = np.random.default_rng(5)
    r64 = rng.uniform(-1, 1, SHAPE)
    a64 = r64.copy()
    where = _differing(a64.size, 6)
    a64.reshape(-1)[where] += 0.75  # past float16's 2^-1 * peak and float32's 2^-14 * peak
    dt = np.float16 if how == "float16" else np.float32
    a, r = a64.astype(dt), r64.astype(dt)
    d = compare("t", _place(a, "C" if how == "float16" else "strided"),
                _place(r, "C" if how == "float16" else "strided"), engine=engine)
    dx = np.abs(a.astype(np.float64) - r.astype(np.float64))
    want = int(np.count_nonzero(dx > d.threshold))
    assert not d.passed and want == where.size
    assert d.n_outside == want
    assert d.max_abs == float(dx.max())


_NO_NUMBA = """
import json, sys
sys.modules["numba"] = None  # as installed without the fast extra: `import numba` fails
import numpy as np
from verify.compare import compare
from verify import scan_numba
rng = np.random.default_rng(7)
r = rng.standard_normal((3, 70001)).astype(np.float32)
a = r.copy()
a[1, ::997] += 1.0  # fails the magnitude rule: the elements outside are recounted
out = [compare(n, x, y, engine=e).to_dict() for n, x, y in
       (("same", r.copy(), r), ("off", a, r), ("ids", a.astype(np.int64), r.astype(np.int64)))
       for e in ("numpy", "auto")]
print(json.dumps({"state": scan_numba._nb_state, "diffs": out}))
"""


def test_the_numpy_engine_compares_on_an_install_without_numba() -> None:
    """The default install has no numba: the numpy engine (asked for, or chosen by auto) runs
    every pass, the magnitude rule's recount included, and gives what it gives beside numba."""
    env = {k: v for k, v in os.environ.items() if k != "VERIFY_NO_NUMBA"}
    env["VERIFY_NO_NATIVE"] = "1"  # nor a C compiler
    done = subprocess.run([sys.executable, "-c", _NO_NUMBA], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["state"] in ("unloaded", "missing")  # never loaded
    rng = np.random.default_rng(7)
    r = rng.standard_normal((3, 70001)).astype(np.float32)
    a = r.copy()
    a[1, ::997] += 1.0
    want = [compare(n, x, y, engine="numpy").to_dict() for n, x, y in
            (("same", r.copy(), r), ("off", a, r), ("ids", a.astype(np.int64), r.astype(np.int64)))
            for _ in range(2)]
    assert got["diffs"] == json.loads(json.dumps(want))
    off = got["diffs"][2]
    assert off["n_outside"] == 71 and not off["passed"]


# --- cosine --------------------------------------------------------------------------------

def test_a_dead_output_and_an_orthogonal_one_have_cosine_zero() -> None:
    """A device writing all zeros, or a one-hot output on the wrong class, is as far from the
    reference as cosine goes for it (0): a `cos>=` gate fails and says so, in one line."""
    gate = parse_tolerance("*:cos>=0.5").rule
    r = np.float32([0.0, 1.0, 0.0, 0.0])
    for a in (np.zeros(4, np.float32), np.float32([1.0, 0.0, 0.0, 0.0])):
        d = compare("probs", a, r, gate)
        assert d.cosine == 0.0 and not d.passed
        assert d.reason == "cos 0 < 0.5"
    same = compare("probs", r.copy(), r, gate)
    assert same.cosine == 1.0 and same.passed
    both_zero = compare("probs", np.zeros(4, np.float32), np.zeros(4, np.float32), gate)
    assert both_zero.cosine == 1.0 and both_zero.passed


@pytest.mark.parametrize("scale", [3.0, 0.1, -0.1, -3.0])
def test_cosine_of_scaled_outputs_stays_within_minus_one_and_one(scale: float) -> None:
    """a = c * r: cosine +1 or -1, which rounding in the sums can push a few ulps past; the
    reported figure (and a gate's tolerance units) never leaves [-1, 1]."""
    rng = np.random.default_rng(11)
    for n in range(2, 60):
        r = rng.standard_normal(n)
        d = compare("x", r * scale, r)
        assert -1.0 <= d.cosine <= 1.0
        assert d.cosine == pytest.approx(math.copysign(1.0, scale), abs=1e-13)


def test_cosine_near_the_top_of_float64() -> None:
    """float64 outputs near 1e154: sum a^2 + sum r^2 + sum (a-r)^2 can pass float64's range
    while each sum is finite, and cosine is still measured (-1 for a = -r at 6e153); once a
    sum of squares passes it (sum (a-r)^2 at 6.8e153, sum a^2 + sum r^2 at 1e154, a square at
    2e154), cosine cannot be measured in float64 and reads NaN, never a figure."""
    r = np.array([6e153, 0.0])
    d = compare("x", -r, r)
    assert d.cosine == -1.0
    assert compare("x", r.copy(), r).cosine == 1.0
    for a, r in ((-6.8e153, 6.8e153), (1e154, 1e154), (-2e154, 2e154)):
        assert math.isnan(compare("x", np.array([a, 1.0]), np.array([r, 1.0])).cosine)


def test_sqnr_near_the_top_of_float64_reads_nan_not_a_traceback() -> None:
    """Once sum (a-r)^2 or sum r^2 passes float64's range (a = -r at 6.8e153, squares of 2e154,
    even with a 1e-10 apart from r), SQNR cannot be measured: NaN, never a figure, and an
    `sqnr>=` gate fails saying so. (sum r^2 / inf made log10(0): a ValueError out of compare,
    exit 4 for the user.)"""
    gate = parse_tolerance("*:sqnr>=40").rule
    for a, r in ((-6.8e153, 6.8e153), (-2e154, 2e154), (1.0, 2e154), (2e154 + 2e144, 2e154)):
        d = compare("x", np.array([a, 1.0]), np.array([r, 1.0]), gate)
        assert math.isnan(d.sqnr_db) and not d.passed
        assert d.reason == "sqnr nan dB < 40 dB"
    big = np.array([2e154, 1.0])
    assert compare("x", big.copy(), big).sqnr_db == math.inf  # equal: no error at all


@pytest.mark.skipif(not numba_available(), reason="no numba")
def test_the_numba_kernel_keeps_one_compiled_signature() -> None:
    """Tensors of one block, several blocks and a batch all call numba's kernel with the same
    argument types: a second signature is a second compilation (~0.2 s) in every process
    whose numba cache cannot be written. (Counted for float32: tests run before this one in
    the same process may have compiled other dtypes.)"""
    from verify import scan_numba

    rng = np.random.default_rng(3)
    for n in (5, 70_000, 300_000):
        a = rng.random(n, dtype=np.float32)
        compare("t", a, a + np.float32(1e-3), engine="numba")
    float32 = [s for s in scan_numba._load_numba().signatures if str(s[0].dtype) == "float32"]
    assert len(float32) == 1, float32
