"""How fast verify.compare is, next to what this machine's memory allows. Run on demand:

    python benchmarks/bench_compare.py [--mb 100] [--reps 7]

Everything is measured in the same run on the same two float32 arrays (--mb each, a reference
and a copy carrying a few ulp of noise): the read bandwidth ceiling (np.sum over both arrays;
np.copyto of both), naive numpy with one full-size pass per metric, the numpy blocked engine,
the fused numba kernel, the same kernel compiled from C (verify/scan_native.py), and the
ratios. Then each fused kernel's first-call cost in a fresh process, with an empty cache and
with a warm one. The machines are shared and noisy: each
figure is the best of --reps runs, and the ratios are what to trust.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verify.compare import AllcloseRule, compare, numba_available
from verify.scan_native import native_available, native_problem

NO_NUMBA = "numba is not installed (the default install): pip install 'onnx-verify[fast]'"


def best_seconds(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm caches and page tables
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def naive_metrics(a: np.ndarray, r: np.ndarray, atol: float = 1e-5, rtol: float = 1e-5) -> dict:
    """One numpy expression per metric over the whole arrays: the code people write first."""
    x, y = a.astype(np.float64), r.astype(np.float64)
    d = np.abs(x - y)
    return {
        "max_abs": d.max(),
        "mean_abs": d.mean(),
        "max_rel": (d / np.maximum(np.abs(y), np.finfo(np.float32).tiny)).max(),
        "ref_peak": np.abs(y).max(),
        "cosine": np.dot(x, y) / math.sqrt(np.dot(x, x) * np.dot(y, y)),
        "sqnr_db": 10 * math.log10(np.dot(y, y) / np.dot(x - y, x - y)),
        "frac_outside": np.mean(d > atol + rtol * np.abs(y)),
        "nan": (np.isnan(a).sum(), np.isnan(r).sum()),
        "inf": (np.isinf(a).sum(), np.isinf(r).sum()),
    }


FIRST_CALL = """
import json, time
t0 = time.perf_counter()
import numpy as np
from verify.compare import compare, numba_available
t1 = time.perf_counter()
numba_available()
t2 = time.perf_counter()
compare("x", np.ones(100, np.float32), np.ones(100, np.float32), engine="numba")
t3 = time.perf_counter()
compare("x", np.ones(100), np.ones(100), engine="numba")
t4 = time.perf_counter()
print(json.dumps({"import verify.compare": t1 - t0,
                  "import numba + build float32 kernel": t2 - t1,
                  "first float32 compare": t3 - t2,
                  "first float64 compare (builds it)": t4 - t3}))
"""


def first_call_costs(cache_dir: str) -> dict:
    # this checkout first, then whatever the caller's PYTHONPATH already held (replacing it
    # would lose packages installed there, numba among them)
    path = [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir,
               PYTHONPATH=os.pathsep.join(p for p in path if p))
    out = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of each array in MB")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()

    n = int(args.mb * 1e6) // 4
    rng = np.random.default_rng(0)
    r = rng.standard_normal(n, dtype=np.float32) * np.float32(4)
    noise = rng.standard_normal(n, dtype=np.float32) * np.float32(2.0 ** -22)
    a = r + r * noise  # a few ulp of cross-platform-like noise
    nbytes = a.nbytes + r.nbytes
    out_a, out_r = np.empty_like(a), np.empty_like(r)
    print(f"two float32 arrays of {a.nbytes / 1e6:.0f} MB ({n:,} elements each); "
          f"{os.cpu_count()} CPUs; best of {args.reps}")

    def gbps(seconds: float) -> float:
        return nbytes / seconds / 1e9

    rows: list[tuple[str, float]] = []
    read = gbps(best_seconds(lambda: (a.sum(), r.sum()), args.reps))
    rows.append(("np.sum over both (read bandwidth ceiling)", read))
    copy = gbps(best_seconds(lambda: (np.copyto(out_a, a), np.copyto(out_r, r)), args.reps))
    rows.append(("np.copyto of both (bytes read; x2 with writes)", copy))
    naive = gbps(best_seconds(lambda: naive_metrics(a, r), max(2, args.reps // 3)))
    rows.append(("naive numpy, one pass per metric", naive))
    blocked = gbps(best_seconds(lambda: compare("x", a, r, engine="numpy"), max(2, args.reps // 2)))
    rows.append(("compare, numpy blocked engine", blocked))
    kernel = kernel_allclose = math.nan
    if not numba_available():
        print(f"  numba kernel rows and ratios: skipped ({NO_NUMBA})")
    if numba_available():
        import numba

        kernel = gbps(best_seconds(lambda: compare("x", a, r, engine="numba"), args.reps))
        rows.append((f"compare, numba kernel, magnitude rule ({numba.get_num_threads()} threads)", kernel))
        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        one_thread = gbps(best_seconds(lambda: compare("x", a, r, engine="numba"), args.reps))
        numba.set_num_threads(threads)
        rows.append(("compare, numba kernel, magnitude rule, 1 thread", one_thread))
        rule = AllcloseRule(1e-5, 1e-5)
        kernel_allclose = gbps(best_seconds(lambda: compare("x", a, r, rule, engine="numba"), args.reps))
        rows.append(("compare, numba kernel, allclose rule", kernel_allclose))
        failing = (a * np.float32(1.001)).astype(np.float32)  # every block over the threshold
        kernel_failing = gbps(best_seconds(lambda: compare("x", failing, r, engine="numba"), args.reps))
        rows.append(("compare, numba kernel, failing everywhere (second pass)", kernel_failing))
        del failing
    native = math.nan
    if not native_available():
        print(f"  compiled C kernel rows: skipped ({native_problem()})")
    else:
        native = gbps(best_seconds(lambda: compare("x", a, r, engine="native"), args.reps))
        rows.append(("compare, compiled C kernel, magnitude rule", native))
        rule = AllcloseRule(1e-5, 1e-5)
        rows.append(("compare, compiled C kernel, allclose rule",
                     gbps(best_seconds(lambda: compare("x", a, r, rule, engine="native"),
                                       args.reps))))
    for label, value in rows:
        print(f"  {label:<62s} {value:6.2f} GB/s")
    small_a, small_r = a[:1000].copy(), r[:1000].copy()
    per_call = best_seconds(lambda: [compare("x", small_a, small_r) for _ in range(1000)], 3)
    print(f"  {'compare of a 1,000-element tensor, per call':<62s} {per_call * 1e3:6.1f} us")
    print("ratios")
    if numba_available():
        print(f"  kernel / read bandwidth       {kernel / read:6.2f}   (target >= 0.40)")
        print(f"  kernel / naive numpy          {kernel / naive:6.2f}")
        print(f"  kernel / numpy blocked        {kernel / blocked:6.2f}")
    if native_available():
        print(f"  C kernel / read bandwidth     {native / read:6.2f}   (target >= 0.40)")
        print(f"  C kernel / numpy blocked      {native / blocked:6.2f}")
    print(f"  numpy blocked / read bandwidth {blocked / read:5.2f}")
    print(f"  numpy blocked / naive numpy   {blocked / naive:6.2f}")

    if not numba_available():
        print(f"numba first-call costs: skipped ({NO_NUMBA})")
    else:
        with tempfile.TemporaryDirectory() as cache:
            cold = first_call_costs(cache)
            warm = first_call_costs(cache)
        print("first call in a fresh process (seconds)")
        for key in cold:
            print(f"  {key:<38s} empty cache {cold[key]:6.3f}   warm cache {warm[key]:6.3f}")
    native_first_call()


NATIVE_FIRST_CALL = """
import time
t0 = time.perf_counter()
from verify import scan_native
t1 = time.perf_counter()
ok = scan_native.native_available()
t2 = time.perf_counter()
print(ok, t1 - t0, t2 - t1)
"""


def native_first_call() -> None:
    """The compiled kernel's first use in a fresh process: building it into an empty cache,
    then loading it from the cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        env.pop("VERIFY_NO_NATIVE", None)
        got = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", NATIVE_FIRST_CALL], env=env, check=True,
                                 capture_output=True, text=True,
                                 cwd=Path(__file__).resolve().parent.parent).stdout.split()
            got.append(out)
    print("compiled C kernel, first use in a fresh process (seconds)")
    for label, (ok, imp, ready) in zip(("empty cache (builds)", "warm cache (loads)"), got):
        print(f"  {label:<22s} import {float(imp):6.3f}   ready {float(ready):6.3f}"
              f"{'' if ok == 'True' else '   (not available)'}")


if __name__ == "__main__":
    main()
