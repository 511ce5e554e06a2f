"""What profiling costs, and how fast `verify profile` reads a large trace. Run on demand:

    python benchmarks/bench_profile.py [--runs 1000] [--reps 5]

1. Profiler overhead: the sample CNN (goldens/models/cnn.onnx) run in one onnxruntime session
   with profiling off and on, alternating, median latency per inference of each; the ratio is
   what `verify run --profile` adds to each timed iteration.
2. Analysis speed: a real trace of --runs inferences of the same model, read with `json.load`
   (the floor: decoding the file), then with verify.profile.load_profile, then load_profile +
   analyze with the model (FLOPs for every node); ratios against json.load.
The machines are shared and noisy: each figure is the best (or median) of --reps, and the
ratios are what to trust.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_compare import best_seconds  # noqa: E402  (this folder is on sys.path)
from verify.profile import ModelIndex, analyze, load_profile

CNN = Path(__file__).resolve().parent.parent / "goldens" / "models" / "cnn.onnx"


def session(profile_prefix: str | None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(CNN), so, providers=["CPUExecutionProvider"])


def overhead(runs: int, tmp: Path) -> tuple[float, float]:
    """Median latency (ms) without and with the profiler, sessions alternating per block."""
    x = {"data": np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)}
    plain, profiled = session(None), session(str(tmp / "overhead"))
    off: list[float] = []
    on: list[float] = []
    for _ in range(10):  # warm both
        plain.run(None, x)
        profiled.run(None, x)
    for block in range(runs // 20):
        for sess, into in ((plain, off), (profiled, on)) if block % 2 else \
                ((profiled, on), (plain, off)):
            for _ in range(10):
                t0 = time.perf_counter()
                sess.run(None, x)
                into.append((time.perf_counter() - t0) * 1e3)
    profiled.end_profiling()
    return statistics.median(off), statistics.median(on)


def make_trace(runs: int, tmp: Path) -> Path:
    sess = session(str(tmp / "trace"))
    x = {"data": np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)}
    for _ in range(runs):
        sess.run(None, x)
    return Path(sess.end_profiling())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(f"onnxruntime {ort.__version__}, model {CNN.name}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        off, on = overhead(args.runs, tmp)
        print(f"latency, median of {args.runs // 2} each: profiler off {off:.3f} ms, "
              f"on {on:.3f} ms; ratio {on / off:.2f}x")
        trace = make_trace(args.runs, tmp)
        events = len(json.loads(trace.read_text()))
        index = ModelIndex.of(onnx.load(str(CNN)))
        t_json = best_seconds(lambda: json.loads(trace.read_text()), args.reps)
        t_load = best_seconds(lambda: load_profile(trace), args.reps)
        t_all = best_seconds(lambda: analyze(load_profile(trace), index, top=0), args.reps)
        mb = trace.stat().st_size / 1e6
        print(f"trace: {args.runs} runs, {events} events, {mb:.1f} MB")
        print(f"json.load          {t_json * 1e3:8.1f} ms  1.00x")
        print(f"load_profile       {t_load * 1e3:8.1f} ms  {t_load / t_json:.2f}x")
        print(f"+ analyze (model)  {t_all * 1e3:8.1f} ms  {t_all / t_json:.2f}x")


if __name__ == "__main__":
    main()
