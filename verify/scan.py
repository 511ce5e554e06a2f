"""The comparison kernel: one streaming pass over two arrays, per-block partial results.

`scan(a, r, ...)` returns a `Scan` with every sum and maximum `compare()` needs (max|a-r|, peak
|r|, max relative error, tolerance units, float64 sums for cosine and SQNR, NaN/Inf counts and
position mismatches), computed in blocks without full-size temporaries. Two engines give the same
results: a numpy blocked engine (here), and a fused kernel (float64 accumulators) that runs at
memory bandwidth, compiled from C (`scan_native`) or by numba (`scan_numba`, which also holds
`choose_engine`: see `compare`'s module doc for the policy, `VERIFY_NO_NATIVE` and
`VERIFY_NO_NUMBA`); all spread a call's blocks over one small thread pool
(`scan_numba.thread_pool`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from verify.scan_numba import (_INFA, _INFR, _MAXD, _MAXREL, _MAXTR, _NANA, _NANR,
                               _NB_BLOCK, _NCMP, _NCOL, _NFMIS, _NV, _PEAK, _SAA, _SD, _SDD, _SRR,
                               THREADS, native_rows, nb_rows, spread)

# --- the scan: one streaming pass, per-block partial results -----------------------------------

_NP_BLOCK = 1 << 16  # elements per numpy block (its five float64 buffers stay in cache)
_CHUNK = 1 << 20  # elements per buffered chunk when inputs need casting or are strided


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    """x.y through BLAS in pieces of 8192: OpenBLAS threads dot products above 10000 elements,
    and its spinning threads then fight numba's for the cores. Squares past float64's range
    (|values| > 1e154) make inf quietly: `cosine` reports them as NaN, not numpy's warning."""
    with np.errstate(over="ignore"):
        return sum(float(np.dot(x[i:i + 8192], y[i:i + 8192])) for i in range(0, x.size, 8192))


def _np_scratch(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Reused block buffers: fresh ones per block make glibc map and unmap pages each time."""
    return np.empty((5, n)), np.empty(n, dtype=bool)


def _np_block(x: np.ndarray, y: np.ndarray, atol: float, rtol: float, tiny: float,
              want_tr: bool, row: np.ndarray, scratch: tuple[np.ndarray, np.ndarray]) -> None:
    """Fill one row from one block with numpy; handles NaN/Inf (the numba kernel does not)."""
    n = x.size
    buf, gt = scratch[0][:, :n], scratch[1][:n]
    if x.dtype != np.float64:
        np.copyto(buf[0], x, casting="unsafe")
        x = buf[0]
    if y.dtype != np.float64:
        np.copyto(buf[1], y, casting="unsafe")
        y = buf[1]
    saa, srr = _dot(x, x), _dot(y, y)
    if not math.isfinite(saa + srr):
        nx, ny = np.isnan(x), np.isnan(y)
        fx, fy = np.isfinite(x), np.isfinite(y)
        row[_NANA], row[_NANR] = np.count_nonzero(nx), np.count_nonzero(ny)
        row[_INFA] = n - row[_NANA] - np.count_nonzero(fx)
        row[_INFR] = n - row[_NANR] - np.count_nonzero(fy)
        fin = fx & fy
        xb, yb = x[~fin], y[~fin]
        row[_NFMIS] = np.count_nonzero(~((xb == yb) | (np.isnan(xb) & np.isnan(yb))))
        x, y = x[fin], y[fin]
        n = x.size
        buf, gt = buf[:, :n], gt[:n]
        saa, srr = _dot(x, x), _dot(y, y)
    d, ay, t = buf[2], buf[3], buf[4]
    np.subtract(x, y, out=d)
    np.abs(d, out=d)
    np.abs(y, out=ay)
    row[_MAXD] = d.max(initial=0.0)
    row[_PEAK] = ay.max(initial=0.0)
    np.fmax(ay, tiny, out=t)
    np.divide(d, t, out=t)
    row[_MAXREL] = t.max(initial=0.0)
    if math.isinf(atol) and not want_tr:  # the magnitude rule's scan: nothing is outside
        row[_NV] = 0  # (d is finite here), so the per-element threshold is never built
    elif rtol == 0.0 and not want_tr:  # a constant threshold (the magnitude rule's recount)
        np.greater(d, atol, out=gt)
        row[_NV] = np.count_nonzero(gt)
    else:
        np.multiply(ay, rtol, out=t)
        t += atol
        np.greater(d, t, out=gt)
        row[_NV] = np.count_nonzero(gt)
    if want_tr:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # no tolerance:
            np.divide(d, t, out=t)            # d/0 is inf, 0/0 NaN (fmax skips it)
        row[_MAXTR] = np.fmax.reduce(t, initial=0.0)
    row[_SD] = d.sum()
    row[_SDD] = _dot(d, d)
    row[_SAA], row[_SRR] = saa, srr
    row[_NCMP] = n


def _np_rows(x: np.ndarray, y: np.ndarray, starts: np.ndarray, stops: np.ndarray, atol: float,
             rtol: float, tiny: float, want_tr: bool) -> np.ndarray:
    """One row per block x[starts[j]:stops[j]] (blocks of at most _NP_BLOCK elements)."""
    rows = np.zeros((starts.size, _NCOL))
    los, his = starts.tolist(), stops.tolist()

    def work(first: int, last: int) -> None:
        scratch = _np_scratch(min(_NP_BLOCK, x.size))
        for j in range(first, last):
            lo, hi = los[j], his[j]
            _np_block(x[lo:hi], y[lo:hi], atol, rtol, tiny, want_tr, rows[j], scratch)

    # numpy releases the GIL inside each block's ufuncs
    spread(len(los), min(THREADS, len(los) // 2), work)
    return rows


def _rows(x: np.ndarray, y: np.ndarray, engine: str, atol: float, rtol: float, tiny: float,
          want_tr: bool, select: np.ndarray | None = None) -> np.ndarray:
    """Per-block rows for one chunk (1-D, C-contiguous, float32 or float64); `select` limits
    the work to those block indices."""
    bs = _NP_BLOCK if engine == "numpy" else _NB_BLOCK
    if select is None and 0 < x.size <= bs:  # one block (most tensors): no arithmetic on bounds
        return _rows_at(x, y, engine, np.zeros(1, np.int64), np.array([x.size], np.int64),
                        atol, rtol, tiny, want_tr)  # (writeable, as numba's one signature has)
    blocks = np.arange(-(-x.size // bs), dtype=np.int64) if select is None else select
    starts = blocks * bs
    return _rows_at(x, y, engine, starts, np.minimum(starts + bs, x.size), atol, rtol, tiny,
                    want_tr)


def _rows_at(x: np.ndarray, y: np.ndarray, engine: str, starts: np.ndarray, stops: np.ndarray,
             atol: float, rtol: float, tiny: float, want_tr: bool) -> np.ndarray:
    """One row per block x[starts[j]:stops[j]], each at most one engine block long."""
    if engine == "numpy":
        return _np_rows(x, y, starts, stops, atol, rtol, tiny, want_tr)
    fused = native_rows if engine == "native" else nb_rows
    rows = fused(x, y, starts, stops, atol, rtol, tiny, want_tr)
    if len(rows) == 1:  # Python floats overflow to inf quietly; numpy's ufuncs cost 4 us here
        bad = [] if math.isfinite(float(rows[0, _SAA]) + float(rows[0, _SRR])) else [0]
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # the overflow is looked for
            bad = np.flatnonzero(~np.isfinite(rows[:, _SAA] + rows[:, _SRR])).tolist()
    if bad:  # NaN/Inf inside (or squares past float64's range): redo those blocks in numpy
        scratch = _np_scratch(min(_NB_BLOCK, x.size))
        for j in bad:
            lo, hi = int(starts[j]), int(stops[j])
            rows[j] = 0.0
            _np_block(x[lo:hi], y[lo:hi], atol, rtol, tiny, want_tr, rows[j], scratch)
    return rows


class Batch:
    """Many small float32 pairs packed in two reused buffers (each on a 64-byte boundary), so
    one kernel call scans them all: its blocks are listed per tensor (start, stop), so a block
    never straddles two tensors and each tensor gets exactly the block rows a call of its own
    would give (same blocks, same summation order: identical results, bit for bit). Padding
    every tensor to a whole block instead spread 54 MB of det-640's small tensors over 120 MB."""

    ALIGN = 16  # elements (64 bytes)

    def __init__(self, capacity: int = 1 << 22) -> None:
        self.capacity = capacity  # elements per side
        self._x = np.empty(capacity, np.float32)
        self._y = np.empty(capacity, np.float32)
        self.used = 0

    def room_for(self, n: int) -> bool:
        return self.used + n <= self.capacity

    def add(self, a: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
        """Copy a pair in (caller checks `room_for`): views of the copies and their span."""
        lo, n = self.used, int(a.size)
        xa, xr = self._x[lo:lo + n], self._y[lo:lo + n]
        np.copyto(xa, a.reshape(-1))
        np.copyto(xr, r.reshape(-1))
        self.used = lo + -(-n // self.ALIGN) * self.ALIGN
        return xa.reshape(a.shape), xr.reshape(r.shape), (lo, n)

    def reset(self) -> None:
        self.used = 0

    def rows(self, spans: list[tuple[int, int]], engine: str, atol: float, rtol: float,
             tiny: float, want_tr: bool) -> list[np.ndarray]:
        """The per-block rows of each span, from one kernel call over all of them."""
        bs = _NP_BLOCK if engine == "numpy" else _NB_BLOCK
        counts = [-(-n // bs) for _, n in spans]
        starts = np.concatenate([np.arange(lo, lo + n, bs, dtype=np.int64) if n else
                                 np.zeros(0, np.int64) for lo, n in spans])
        stops = np.concatenate([np.minimum(np.arange(lo, lo + n, bs, dtype=np.int64) + bs,
                                           lo + n) if n else np.zeros(0, np.int64)
                                for lo, n in spans])
        rows = _rows_at(self._x, self._y, engine, starts, stops, atol, rtol, tiny, want_tr)
        return np.split(rows, np.cumsum(counts)[:-1])


def _chunks(a: np.ndarray, r: np.ndarray, kd: np.dtype) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Matching 1-D C-contiguous `kd` pieces of a and r: views when possible, else two reused
    buffers of _CHUNK elements (casting and gathering strided data a chunk at a time), valid
    until the next piece. Gathered pieces are the elements in C order, cut every _CHUNK (a
    whole number of blocks), so every block holds what a C-contiguous copy's would: the
    figures, sums included, are that copy's to the last bit."""
    if a.dtype == kd and r.dtype == kd:
        if a.flags.c_contiguous and r.flags.c_contiguous:
            yield a.ravel("C"), r.ravel("C")
            return
        if a.flags.f_contiguous and r.flags.f_contiguous:
            yield a.ravel("F"), r.ravel("F")
            return
    # 'contig' makes nditer gather strided data into its buffers, mostly in pieces of _CHUNK
    # elements (numpy's stubs misspell the flag, hence the ignore). Not always: with one
    # operand C-ordered and the other not it gives a piece per row, which moved the block
    # boundaries and with them the sums' last bits. Other pieces are collected into whole
    # chunks; a whole chunk as nditer gives it is passed on as it is.
    it = np.nditer([a, r], flags=["external_loop", "buffered", "zerosize_ok"],  # type: ignore[call-overload]
                   op_flags=[["readonly", "contig"], ["readonly", "contig"]], op_dtypes=[kd, kd],
                   casting="unsafe", buffersize=_CHUNK, order="C")
    bx, by = np.empty(min(_CHUNK, a.size), kd), np.empty(min(_CHUNK, a.size), kd)
    fill = 0
    with it:
        for ca, cr in it:
            if fill == 0 and ca.size == bx.size:
                yield np.ascontiguousarray(ca), np.ascontiguousarray(cr)
                continue
            pos, n = 0, ca.size
            while pos < n:
                take = min(n - pos, bx.size - fill)
                bx[fill:fill + take] = ca[pos:pos + take]
                by[fill:fill + take] = cr[pos:pos + take]
                fill, pos = fill + take, pos + take
                if fill == bx.size:
                    yield bx, by
                    fill = 0
    if fill:
        yield bx[:fill], by[:fill]


def count_unequal(a: np.ndarray, r: np.ndarray) -> int:
    """Exact element inequality, a chunk at a time: numpy's own `!=` on each side's dtype, so
    integers above 2^53 stay exact, int64 against uint64 too (their promoted type, float64,
    would not be: each chunk is compared as the pair is, never cast to a common type)."""
    if a.size <= _CHUNK:
        return int(np.count_nonzero(a != r))
    it = np.nditer([a, r], flags=["external_loop", "buffered", "zerosize_ok"],
                   op_flags=[["readonly"], ["readonly"]], buffersize=_CHUNK, order="K")
    with it:
        return sum(int(np.count_nonzero(ca != cr)) for ca, cr in it)


@dataclass(frozen=True)
class Scan:
    max_abs: float
    ref_peak: float
    max_rel: float
    max_tr: float
    sum_abs: float
    sum_dd: float
    sum_aa: float
    sum_rr: float
    n_outside: int
    n_compared: int
    nan_a: int
    nan_r: int
    inf_a: int
    inf_r: int
    nonfinite_mismatch: int


def scan(a: np.ndarray, r: np.ndarray, kd: np.dtype, engine: str, atol: float, rtol: float,
          tiny: float, want_tr: bool, threshold_of: Callable[[float], float] | None,
          rows: np.ndarray | None = None) -> Scan:
    """All metrics in one pass. With `threshold_of` (peak -> threshold: the magnitude rule's
    threshold is known only at the end), count |a-r| > threshold in a second pass over only
    the blocks whose maximum exceeds it, so a passing tensor is read once. `rows`: this pass's
    block rows already computed (`Batch.rows`, for a C-contiguous pair of dtype `kd`)."""
    per_chunk = ([rows] if rows is not None else
                 [_rows(x, y, engine, atol, rtol, tiny, want_tr) for x, y in _chunks(a, r, kd)])
    rows = (per_chunk[0] if len(per_chunk) == 1 else np.concatenate(per_chunk) if per_chunk
            else np.zeros((0, _NCOL)))
    if len(rows) == 1:  # most tensors: one block, whose row is the whole (the maxima read from
        col = top = rows[0]  # `top` are >= 0 or NaN, as max(..., initial=0) would leave them)
    else:
        with np.errstate(over="ignore"):  # the maxima's columns are summed too, unused: a
            col = rows.sum(axis=0)  # float64 reference near 1e-308 makes relative errors 1e308
        top = rows.max(axis=0, initial=0.0)
    n_out = int(col[_NV])
    if threshold_of is not None:
        n_out = 0
        recount_above = threshold_of(float(top[_PEAK]))
        if top[_MAXD] > recount_above:
            for (x, y), crows in zip(_chunks(a, r, kd), per_chunk, strict=True):
                sel = np.flatnonzero(crows[:, _MAXD] > recount_above)
                if sel.size:
                    recount = _rows(x, y, engine, recount_above, 0.0, tiny, False, sel)
                    n_out += int(recount[:, _NV].sum())
    ints = [int(v) for v in col[[_NCMP, _NANA, _NANR, _INFA, _INFR, _NFMIS]]]
    return Scan(float(top[_MAXD]), float(top[_PEAK]), float(top[_MAXREL]), float(top[_MAXTR]),
                 float(col[_SD]), float(col[_SDD]), float(col[_SAA]), float(col[_SRR]),
                 n_out, *ints)


def cosine(saa: float, srr: float, sdd: float) -> float:
    if not (math.isfinite(saa + srr) and math.isfinite(sdd)):  # squares overflowed (|values|
        return math.nan  # > 1e154); all three added up may overflow where each is finite
    if saa == 0.0 or srr == 0.0:
        return 1.0 if saa == srr else 0.0
    na, nr = math.sqrt(saa), math.sqrt(srr)
    # a.r = (|a|^2 + |r|^2 - |a-r|^2) / 2, so 1 - cos = (|a-r|^2 - (|a|-|r|)^2) / (2|a||r|):
    # no cancellation when a ~ r, unlike a.r / (|a||r|) from rounded sums.
    return min(1.0, max(-1.0, 1.0 - (sdd - (na - nr) ** 2) / (2.0 * na * nr)))


def sqnr_db(srr: float, sdd: float) -> float:
    if sdd == 0.0:
        return math.inf
    if srr == 0.0:
        return -math.inf
    if not (math.isfinite(srr) and math.isfinite(sdd)):  # squares overflowed (|values| > 1e154)
        return math.nan  # (sum r^2 / inf is 0, whose log10 raised ValueError)
    return 10.0 * math.log10(srr / sdd)
