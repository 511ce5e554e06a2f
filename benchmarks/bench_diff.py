"""`verify diff` speed: throughput against the machine's memory read bandwidth, and capture plus
diff end to end against Polygraphy, measured side by side in one run.

    python benchmarks/bench_diff.py [--skip-polygraphy]

1. Read bandwidth ceiling: np.sum over a 1 GiB float32 array on one thread, and split over two
   threads (the ceiling the fused two-thread kernel can approach).
2. Diff throughput: two dumps of PP-OCRv4 det at 1x3x640x640 (--model det640, the default: a real
   dynamic-shape model from scripts/fetch_models.py, ~330 tensors, ~0.7 GB per side) or of the
   ResNet-50-like model (--model r50: scripts/build_resnet50_like.py; 122 tensors, ~106 MB per
   side), taken with --threads 1 and 2 (every tensor compared), in GB/s of both sides read, as
   a fraction of the ceiling: in process (warm) and as a whole `verify diff` process. Targets:
   kernel >= 40%, whole process >= 25% of 1-thread read bandwidth.
   Engines: numpy (blocked, ~14 passes a block), numba's fused kernel (the `fast` extra) and
   the same kernel compiled from C (verify/scan_native.py; where a C compiler is, the default
   install's), each asked for, then auto; whole processes as installed, without numba (the
   default install) and without numba or a C compiler.
3. Where the time goes: reading both dumps (mapped, or copied into buffers), comparing on the
   mapping vs copied memory, the kernel tensor by tensor vs on one concatenated array.
4. End to end, fresh processes as a user runs them: `verify run --bin-io-dump` twice plus
   `verify diff`, against `polygraphy run --onnxrt --onnx-outputs mark all --save-outputs` twice
   plus `polygraphy run --load-outputs A B` (its comparison of the saved files), in wall time
   and in CPU time of each process tree (robust to a shared machine). Target: verify >= 10x
   faster. Printed beside it, the floor: a plain `verify run` without a dump, the CLI's
   start, and a bare interpreter importing numpy and onnxruntime, and the ratio two plain runs
   plus the diff would reach. Polygraphy is not a dependency of verify: when it is missing this script runs
   `python -m pip install polygraphy` (or install the `bench` extra).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
VERIFY = [sys.executable, "-c",
          "import sys; from verify.cli import main; sys.exit(main(sys.argv[1:]))"]
CPU: dict[str, float] = {}  # CPU seconds of the last `sh`'s process tree, under "cpu"

from verify.compare import MagnitudeRule, ToleranceSet, compare, numba_available  # noqa: E402
from verify.scan_native import native_available, native_problem  # noqa: E402
from verify.diff import diff_captures  # noqa: E402
from verify.dump import open_dump  # noqa: E402
from verify.dump_read import Scratch  # noqa: E402

from bench_compare import best_seconds  # noqa: E402  (this folder is on sys.path)


NO_NUMBA = "numba is not installed (the default install): pip install 'onnx-verify[fast]'"
# the fused engines this install has: the C kernel (where a C compiler built it) and numba
FUSED = [e for e, ok in (("native", native_available()), ("numba", numba_available())) if ok]
FAST = FUSED[0] if FUSED else "numpy"   # the one auto uses


def best_cpu(fn, reps: int) -> float:
    """The least CPU time (user + system, every thread of this process) of `reps` calls: on a
    shared machine wall time measures the neighbours; CPU time measures the work."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def read_bandwidth() -> tuple[float, float, float]:
    """np.sum over 1 GiB: GB/s on 1 thread and split over 2 (wall), and per CPU second."""
    big = np.ones(1 << 28, np.float32)  # 1 GiB
    halves = [big[: big.size // 2], big[big.size // 2:]]
    one = big.nbytes / best_seconds(big.sum, 3) / 1e9
    with ThreadPoolExecutor(2) as pool:
        two = big.nbytes / best_seconds(lambda: list(pool.map(np.sum, halves)), 3) / 1e9
    cpu = big.nbytes / best_cpu(big.sum, 3) / 1e9
    return one, two, cpu


def breakdown(dumps: list[Path], pairs: list[tuple[np.ndarray, np.ndarray]],
              nbytes: int) -> None:
    """Where diff's time goes beyond the kernel: reading both dumps (mapped as diff does, or
    copied into reusable buffers), comparing on the mapping vs on anonymous memory, and the
    kernel tensor by tensor vs on one concatenated array."""
    engine = FAST
    da, db = open_dump(dumps[0]), open_dump(dumps[1])
    ea, eb = da.entries(0), db.entries(0)
    rule = MagnitudeRule()

    def walk(sa: Scratch | None, sb: Scratch | None, cmp: bool) -> None:
        for x, y in zip(ea, eb, strict=True):
            a, b = da.load(x, sa), db.load(y, sb)
            if cmp:
                compare("t", a, b, rule, engine=engine)
            del a, b

    ms = {}
    ms["map"] = best_seconds(lambda: walk(None, None, False), 5)
    ms["map+compare"] = best_seconds(lambda: walk(None, None, True), 5)
    sa, sb = Scratch(), Scratch()
    ms["copy"] = best_seconds(lambda: walk(sa, sb, False), 5)
    ms["copy+compare"] = best_seconds(lambda: walk(sa, sb, True), 5)
    ms["per tensor"] = best_seconds(
        lambda: [compare("t", a, r, rule, engine=engine) for a, r in pairs], 5)
    big = [np.concatenate([p[k].ravel() for p in pairs]) for k in (0, 1)]
    ms["concatenated"] = best_seconds(lambda: compare("t", big[0], big[1], rule,
                                                      engine=engine), 5)
    print(f"where the time goes (ms, both sides, best of 5; engine {engine}):")
    print(f"  read: mapped {ms['map'] * 1e3:.0f}, copied into buffers {ms['copy'] * 1e3:.0f}")
    print(f"  compare on the mapping {(ms['map+compare'] - ms['map']) * 1e3:.0f}, on copied "
          f"memory {(ms['copy+compare'] - ms['copy']) * 1e3:.0f}")
    print(f"  kernel on the tensors in memory one by one {ms['per tensor'] * 1e3:.0f}, on one "
          f"concatenated array {ms['concatenated'] * 1e3:.0f} "
          f"({nbytes / ms['concatenated'] / 1e9:.2f} GB/s)")


def sh(argv: list[str], **kw) -> float:
    # every command in a session of its own, as verify's local driver starts the runner: each
    # then gets its own scheduler autogroup, so wall times on a loaded host compare alike
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   start_new_session=True, **kw)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU["cpu"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall


def start_cpu(argv: list[str], runs: int = 5) -> float:
    """The least CPU time (user + sys) of `runs` starts of argv."""
    best = float("inf")
    for _ in range(runs):
        sh(argv)
        best = min(best, CPU["cpu"])
    return best


def ensure_polygraphy() -> str | None:
    try:
        import polygraphy  # noqa: F401
    except ImportError:
        print("polygraphy missing: installing it for this benchmark (python -m pip install "
              "polygraphy)")
        if subprocess.run([sys.executable, "-m", "pip", "install", "-q", "polygraphy"]).returncode:
            return None
    exe = Path(sys.executable).with_name("polygraphy")
    return str(exe) if exe.exists() else "polygraphy"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-polygraphy", action="store_true")
    ap.add_argument("--model", choices=["det640", "r50"], default="det640")
    args = ap.parse_args(argv)
    one, two, one_cpu = read_bandwidth()
    print(f"read bandwidth: np.sum 1 thread {one:.1f} GB/s, 2 threads {two:.1f} GB/s (wall); "
          f"{one_cpu:.1f} GB per CPU second")
    with tempfile.TemporaryDirectory(prefix="bench-diff-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"),
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        verify = VERIFY  # this tree's verify, whatever is installed
        poly_inputs: list[str] = []
        if args.model == "r50":
            model = tmp / "r50.onnx"
            sh([sys.executable, str(REPO / "scripts" / "build_resnet50_like.py"), str(model)])
            sh([*verify, "pack", str(model), "-o", str(tmp / "r50.vtc")], env=env)
        else:
            from corpus import model_path

            model = model_path("ppocr_det")
            np.save(tmp / "x.npy", np.random.default_rng(0).random((1, 3, 640, 640),
                                                                 dtype=np.float32))
            sh([*verify, "pack", str(model), "-d", f"x:{tmp / 'x.npy'}", "-o",
                str(tmp / "r50.vtc")], env=env)
            poly_inputs = ["--input-shapes", "x:[1,3,640,640]"]
        dumps = []
        t_capture = c_capture = 0.0
        for threads in (1, 2):
            out = tmp / f"dump{threads}"
            t_capture += sh([*verify, "run", str(tmp / "r50.vtc"), "--iter", "1", "--warmup", "0",
                             "--opt-level", "disable", "--threads", str(threads),
                             "--bin-io-dump", str(out)], env=env)
            c_capture += CPU["cpu"]
            dumps.append(out)
        nbytes = sum(p.stat().st_size for d in dumps for p in d.iterdir()
                     if p.name != "manifest.json")
        print(f"dumps: 2 x {nbytes / 2 / 1e6:.0f} MB")
        for engine in ("numpy", "numba", "native", "auto"):
            if engine not in ("numpy", "auto", *FUSED):
                print(f"diff engine={engine}: skipped ("
                      f"{NO_NUMBA if engine == 'numba' else native_problem()})")
                continue
            secs = best_seconds(lambda e=engine: diff_captures(dumps[0], dumps[1],
                                                               ToleranceSet(), engine=e), 3)
            cpu = best_cpu(lambda e=engine: diff_captures(dumps[0], dumps[1], ToleranceSet(),
                                                          engine=e), 2)
            gbs = nbytes / secs / 1e9
            print(f"diff engine={engine:<6}: {secs:.3f} s, {gbs:.2f} GB/s = {gbs / one:.0%} of "
                  f"1-thread read, {gbs / two:.0%} of 2-thread read; CPU {cpu:.3f} s, "
                  f"{nbytes / cpu / 1e9:.2f} GB per CPU second = "
                  f"{nbytes / cpu / 1e9 / one_cpu:.0%} of np.sum's")
        da, db = open_dump(dumps[0]), open_dump(dumps[1])
        pairs = [(np.array(da.load(a)), np.array(db.load(b)))
                 for a, b in zip(da.entries(0), db.entries(0), strict=True)]
        for engine in ("numpy", *FUSED):  # numpy: an install without a compiler or numba
            secs = best_seconds(lambda e=engine: [compare("t", a, r, MagnitudeRule(), engine=e)
                                                  for a, r in pairs], 3)
            cpu = best_cpu(lambda e=engine: [compare("t", a, r, MagnitudeRule(), engine=e)
                                             for a, r in pairs], 2)
            print(f"kernel, compare() on the tensors already in memory, {engine}: "
                  f"{nbytes / secs / 1e9:.2f} GB/s = {nbytes / secs / 1e9 / one:.0%} of 1-thread "
                  f"read (wall); {nbytes / cpu / 1e9:.2f} GB per CPU second = "
                  f"{nbytes / cpu / 1e9 / one_cpu:.0%} of np.sum's (target >= 40%)")
        breakdown(dumps, pairs, nbytes)
        pairs.clear()
        default = {**env, "VERIFY_NO_NUMBA": "1"}  # as installed without the fast extra
        bare = {**default, "VERIFY_NO_NATIVE": "1"}  # nor a C compiler
        # the default install's figures last: the end-to-end totals below use them
        for label, how in (("as installed", env), ("without numba or a C compiler (numpy)", bare),
                           (f"default install ({'C kernel' if 'native' in FUSED else 'numpy'})",
                            default)):
            if how is env and not numba_available():
                continue
            walls, cpus = [], []
            for _ in range(2):
                walls.append(sh([*verify, "diff", str(dumps[0]), str(dumps[1])], env=how))
                cpus.append(CPU["cpu"])
            t_diff, c_diff = min(walls), min(cpus)
            gbs = nbytes / t_diff / 1e9
            print(f"verify diff, whole process, {label}: {t_diff:.2f} s, {gbs:.2f} GB/s = "
                  f"{gbs / one:.0%} of 1-thread read bandwidth (wall); CPU {c_diff:.2f} s, "
                  f"{nbytes / c_diff / 1e9:.2f} GB per CPU second = "
                  f"{nbytes / c_diff / 1e9 / one_cpu:.0%} of np.sum's (target >= 25%)")
        ours, c_ours = t_capture + t_diff, c_capture + c_diff
        print(f"verify: capture 2 x {t_capture / 2:.1f} s + diff {t_diff:.1f} s = {ours:.1f} s "
              f"wall; CPU {c_capture:.1f} + {c_diff:.1f} = {c_ours:.1f} s")
        # The floor under any capture: a run without a dump, and inside it a bare interpreter
        # importing numpy and onnxruntime (the runner's process) and verify's CLI start.
        t_plain = min(sh([*verify, "run", str(tmp / "r50.vtc"), "--iter", "1", "--warmup", "0",
                          "--opt-level", "disable"], env=env) for _ in range(2))
        t_ort = min(sh([sys.executable, "-c", "import numpy, onnxruntime"]) for _ in range(3))
        t_cli = min(sh([*verify, "--help"]) for _ in range(3))
        floor = 2 * t_plain + t_diff
        print(f"floor: a plain run (no dump) {t_plain:.2f} s, of which `verify --help` "
              f"{t_cli:.2f} s and python + numpy + onnxruntime import {t_ort:.2f} s; "
              f"two plain runs + diff = {floor:.1f} s")
        c_ort, c_cli = start_cpu([sys.executable, "-c", "import numpy, onnxruntime"]), \
            start_cpu([*verify, "--help"])
        print(f"start CPU (user+sys, best of 5): `verify --help` {c_cli:.3f} s vs `python -c "
              f"'import numpy, onnxruntime'` {c_ort:.3f} s = {c_cli / c_ort:.2f}x (target <= 1)")
        if args.skip_polygraphy:
            print("polygraphy end to end: skipped (--skip-polygraphy)")
            return 0
        poly = ensure_polygraphy()
        if poly is None:
            print("polygraphy could not be installed: end-to-end comparison skipped")
            return 0
        t_pcap = c_pcap = 0.0
        saved = []
        for k in range(2):
            out = tmp / f"poly{k}.json"
            t_pcap += sh([poly, "run", str(model), "--onnxrt", "--onnx-outputs", "mark", "all",
                          *poly_inputs, "--save-outputs", str(out)])
            c_pcap += CPU["cpu"]
            saved.append(str(out))
        t_pcmp = sh([poly, "run", "--load-outputs", *saved])
        c_pcmp = CPU["cpu"]
        theirs, c_theirs = t_pcap + t_pcmp, c_pcap + c_pcmp
        print(f"polygraphy: capture 2 x {t_pcap / 2:.1f} s + compare {t_pcmp:.1f} s = "
              f"{theirs:.1f} s wall; CPU {c_pcap:.1f} + {c_pcmp:.1f} = {c_theirs:.1f} s (saved "
              f"JSON {sum(Path(s).stat().st_size for s in saved) / 2e6:.0f} MB per run)")
        print(f"verify end to end {theirs / ours:.1f}x faster than polygraphy in wall time, "
              f"{c_theirs / c_ours:.1f}x in CPU time (target >= 10x); two plain runs + diff "
              f"would be {theirs / floor:.1f}x in wall time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
