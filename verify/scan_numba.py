"""The fused engines of the comparison kernel (numba's, and the same kernel compiled from C by
`scan_native`), and the auto engine's choice among them and numpy.

`nb_rows` fills the per-block rows `scan.py`'s numpy engine fills (same columns, defined here:
the kernel is compiled against them), as one fused numba kernel with float64 accumulators that
runs at memory bandwidth; `native_rows` fills them from the C kernel. Both kernels are serial and
release the GIL; a call of `PARALLEL_MIN_BLOCKS` blocks or more is split over verify's own
comparison threads (`thread_pool`, which the numpy engine uses too), never numba's threading
layer. numba is optional: it is imported and the kernel built on first use
(`numba_available`). `choose_engine` / `expect_bytes` take the C kernel wherever it builds (it
loads in a millisecond), and otherwise decide when loading numba pays (see `compare`'s module
doc for the policy, `VERIFY_NO_NATIVE` and `VERIFY_NO_NUMBA`).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from verify.scan_native import NCOL, native_available, native_fill

# Columns of a per-block row, as both engines fill them.
_MAXD, _PEAK, _MAXREL, _MAXTR, _SD, _SDD, _SAA, _SRR, _NV, _NCMP = range(10)
_NANA, _NANR, _INFA, _INFR, _NFMIS = range(10, 15)
_NCOL = NCOL
_NB_BLOCK = 1 << 16  # elements per numba block (per-thread unit of work)
NUMBA_AFTER_BYTES = 1 << 31  # auto engine: numpy until this many bytes were compared
NUMBA_UPFRONT_BYTES = 1 << 31  # auto engine: load numba at once for a job this big
_NUMBA_MIN_BYTES = 1 << 16  # auto engine: numpy for smaller pairs even once numba is loaded
# (per call once loaded: 8 KB 27 vs 41 us, 64 KB 30 vs 68 us, 512 KB 62 vs 320 us)

Engine = Literal["auto", "native", "numba", "numpy"]


# The numba kernel is written as plain Python at module level (so numba can cache it) and
# compiled on first use; `_fmax` and `_prange` are bound when numba is loaded.
_fmax: Any = max
_prange: Any = range


def _nb_rows_py(a, r, starts, stops, atol, rtol, tiny, want_tr, out):  # pragma: no cover, no mutate block (jitted)
    """scan._np_block's columns _MAXD.._NCMP for each block a[starts[j]:stops[j]], assuming every
    value finite."""
    for j in _prange(starts.size):
        lo = starts[j]
        hi = stops[j]
        av = a[lo:hi]  # indices from 0: provably non-negative, so plain vector loads (with
        rv = r[lo:hi]  # a[lo + i], negative-index handling made LLVM gather element by element)
        maxd = 0.0
        peak = 0.0
        mrel = 0.0
        mtr = 0.0
        sd = 0.0
        sdd = 0.0
        saa = 0.0
        srr = 0.0
        nv = 0
        for i in range(hi - lo):
            x = np.float64(av[i])
            y = np.float64(rv[i])
            d = abs(x - y)
            ay = abs(y)
            maxd = _fmax(maxd, d)
            peak = _fmax(peak, ay)
            mrel = _fmax(mrel, d / _fmax(ay, tiny))
            den = atol + rtol * ay
            nv += d > den
            if want_tr:
                mtr = _fmax(mtr, d / den if den > 0.0 else (np.inf if d > 0.0 else 0.0))
            sd += d
            sdd += d * d
            saa += x * x
            srr += y * y
        out[j, _MAXD] = maxd
        out[j, _PEAK] = peak
        out[j, _MAXREL] = mrel
        out[j, _MAXTR] = mtr
        out[j, _SD] = sd
        out[j, _SDD] = sdd
        out[j, _SAA] = saa
        out[j, _SRR] = srr
        out[j, _NV] = nv
        out[j, _NCMP] = hi - lo


_nb_kernel: Any = None
PARALLEL_MIN_BLOCKS = 64  # blocks (4 Mi elements) before a call is split over the threads
THREADS = min(4, os.cpu_count() or 1)  # comparison threads (both engines)
_nb_state = "unloaded"  # unloaded | loaded | missing
_nb_error = ""
_nb_lock = threading.Lock()  # one load
_bytes_seen = 0


@functools.lru_cache(maxsize=1)
def thread_pool() -> ThreadPoolExecutor:
    """One pool for the process: starting threads for every tensor cost ~0.1 ms each. Its
    threads sleep between calls. numba's own parallel kernel, used before, left its
    threads spinning after each launch: diffing det-640's 673 tensor pairs cost 1.2-1.5 CPU s
    on two threads against 0.14 s for the same kernel on one (issue 14)."""
    return ThreadPoolExecutor(THREADS, thread_name_prefix="verify-compare")


def stop_thread_pool() -> None:
    """Let the pool's threads go (idle ones exit at once), if it was ever made: an interrupted
    command joins every thread before it exits, and these never end on their own."""
    if thread_pool.cache_info().currsize:
        thread_pool().shutdown(wait=False, cancel_futures=True)
        thread_pool.cache_clear()


# A forked child inherits the pool but none of its threads: work submitted there would wait
# forever (a process forked after a comparison hung on its next one). The child makes its own.
os.register_at_fork(after_in_child=thread_pool.cache_clear)


def spread(n: int, threads: int, job: Callable[[int, int], None]) -> None:
    """`job(lo, hi)` over blocks [0, n) in `threads` contiguous runs on the comparison threads
    (or at once on this thread for fewer than two); each block's row is the same either way."""
    if threads <= 1:
        job(0, n)
        return
    cuts = [n * k // threads for k in range(threads + 1)]
    for f in [thread_pool().submit(job, lo, hi) for lo, hi in zip(cuts, cuts[1:])]:
        f.result()


def _load_numba() -> Any:
    """The jitted kernel, or None when numba cannot be imported or cannot build it."""
    global _nb_kernel, _nb_state, _nb_error, _fmax, _prange
    with _nb_lock:
        if _nb_state == "unloaded":
            try:
                import numba
                from llvmlite import ir
                from numba.core import types
                from numba.extending import intrinsic
            except ImportError as exc:
                _nb_state, _nb_error = "missing", f"numba is not installed ({exc})"
                return None

            # max() that vectorizes: maxnum with the no-NaN flag on this call only. Whole-kernel
            # fast-math would let LLVM assume the sums finite too; they must stay honest, as a
            # non-finite sum is how blocks holding NaN/Inf are found (and redone in numpy).
            @intrinsic
            def fmax(typingctx: Any, a: Any, b: Any) -> Any:
                def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                    dbl = ir.DoubleType()
                    fn = builder.module.declare_intrinsic(
                        "llvm.maxnum", [dbl], ir.FunctionType(dbl, [dbl, dbl]))
                    return builder.call(fn, args, fastmath=("nnan", "nsz"))
                return types.float64(types.float64, types.float64), codegen

            _fmax, _prange = fmax, numba.prange
            _prefer_512_bit_vectors()
            # reassoc lets the float64 sums vectorize; no 'contract', so atol + rtol*|r| rounds
            # exactly as numpy's and element counts agree between the two paths.
            kernel = numba.njit(nogil=True, cache=True, error_model="numpy",
                                fastmath={"reassoc", "nsz"})(_nb_rows_py)
            try:  # compile (or load from the cache) the float32 version now, so that a
                # platform where numba cannot build it falls back to numpy instead of failing
                one = np.ones(1, np.float32)
                one.flags.writeable = False
                kernel(one, one, np.zeros(1, np.int64), np.ones(1, np.int64), 0.0, 0.0, 1.0, False,
                       np.zeros((1, _NCOL)))
            except Exception as exc:  # noqa: BLE001 (numba's errors share no base class)
                _nb_state, _nb_error = "missing", f"numba cannot build the kernel: {exc}"
                return None
            _nb_kernel, _nb_state = kernel, "loaded"
    return _nb_kernel


def _prefer_512_bit_vectors() -> None:
    """On AVX-512 machines, let LLVM use 512-bit vectors (it prefers 256 by default): the
    kernel runs 1.3x faster per thread here. Only when the user has not set numba's CPU name
    or features (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES); compiled code is cached per feature
    set, so this costs one compile per machine."""
    try:
        import llvmlite.binding as llb
        from numba.core import config

        if config.CPU_NAME is not None or config.CPU_FEATURES is not None:
            return
        features = llb.get_host_cpu_features().flatten()
    except Exception:  # noqa: BLE001 (an llvmlite without the call: keep numba's defaults)
        return
    if "+avx512f" in features.split(","):
        config.CPU_FEATURES = features + ",-prefer-256-bit"


def numba_available() -> bool:
    """Whether the compiled kernel can be used (imports numba and builds it on first call)."""
    return _load_numba() is not None


def expect_bytes(nbytes: int) -> bool:
    """Tell the auto engine that about `nbytes` (both sides) are going to be compared. At
    `NUMBA_UPFRONT_BYTES` or more, numba is loaded now rather than after `NUMBA_AFTER_BYTES`:
    at 1.4 GB/s for numpy and 4.4 GB/s for the kernel (a whole det-640 diff in one process,
    reading included), its ~0.9 s load (import, the cached kernel) pays back from about 2 GB
    (benchmarks/bench_diff.py on a quiet 2-core machine: a 1.4 GB diff as a whole process took
    1.23 s on numpy, 1.51 s loading numba for it). Returns whether the kernel is loaded."""
    if native_available():
        return True  # as fast, and loaded in a millisecond: numba is not needed
    if (nbytes >= NUMBA_UPFRONT_BYTES and _nb_state == "unloaded"
            and os.environ.get("VERIFY_NO_NUMBA", "") in ("", "0")):
        _load_numba()
    return _nb_state == "loaded"


def choose_engine(engine: Engine, nbytes: int) -> str:
    global _bytes_seen
    if engine != "auto":
        return engine
    _bytes_seen += nbytes
    if native_available():
        return "native"
    if os.environ.get("VERIFY_NO_NUMBA", "") not in ("", "0") or nbytes < _NUMBA_MIN_BYTES:
        return "numpy"
    if _nb_state == "loaded" or (_bytes_seen >= NUMBA_AFTER_BYTES and _nb_state == "unloaded"):
        return "numba" if _load_numba() is not None else "numpy"
    return "numpy"


def _split_rows(n: int, fill: Callable[[int, int, np.ndarray], None]) -> np.ndarray:
    """Rows for n blocks: fill(lo, hi, rows[lo:hi]) over the comparison threads for a call of
    PARALLEL_MIN_BLOCKS or more, on this thread below that. Both fused kernels run this way."""
    rows = np.zeros((n, _NCOL))
    threads = min(THREADS, n // (PARALLEL_MIN_BLOCKS // 2)) if n >= PARALLEL_MIN_BLOCKS else 1
    spread(n, threads, lambda lo, hi: fill(lo, hi, rows[lo:hi]))
    return rows


def nb_rows(x: np.ndarray, y: np.ndarray, starts: np.ndarray, stops: np.ndarray, atol: float,
            rtol: float, tiny: float, want_tr: bool) -> np.ndarray:
    """The kernel's row per block x[starts[j]:stops[j]] (each at most _NB_BLOCK elements).
    A block holding NaN or Inf has a non-finite _SAA + _SRR: the caller redoes it in numpy."""
    kernel = _load_numba()
    if kernel is None:
        raise ImportError(f"{_nb_error}; use engine='numpy' or 'auto'")
    xv, yv = x.view(), y.view()
    xv.flags.writeable = yv.flags.writeable = False  # one compiled signature, memmaps included
    return _split_rows(starts.size, lambda lo, hi, out: kernel(
        xv, yv, starts[lo:hi], stops[lo:hi], atol, rtol, tiny, want_tr, out))


def native_rows(x: np.ndarray, y: np.ndarray, starts: np.ndarray, stops: np.ndarray,
                atol: float, rtol: float, tiny: float, want_tr: bool) -> np.ndarray:
    """nb_rows from the compiled C kernel (`scan_native`). Arrays not aligned to their dtype
    (a buffer read at an odd offset) are copied first: C may assume alignment where numba
    compiles a version of its own."""
    if not (x.flags.aligned and y.flags.aligned):
        x, y = np.array(x, copy=True), np.array(y, copy=True)
    starts = np.ascontiguousarray(starts, np.int64)
    stops = np.ascontiguousarray(stops, np.int64)
    return _split_rows(starts.size, lambda lo, hi, out: native_fill(
        x, y, starts[lo:hi], stops[lo:hi], atol, rtol, tiny, want_tr, out))
