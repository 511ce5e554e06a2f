#!/usr/bin/env python3
"""Does `verify run` time the inference call alone? Its per-iteration figures against a bare
onnxruntime loop on the same model, settings and inputs, measured side by side in this run.

    python3 benchmarks/bench_run_overhead.py [--model goldens/models/cnn.onnx] [--iter 200]
                                             [--rounds 5] [--threads 1]

Rounds alternate between the two so drift on a shared machine hits both alike; the bare loop
runs in a new session of its own, as verify's runner does, so both get the same CPU share. Printed: the
median and p10 per-iteration time of each, and their ratio (verify / bare); a ratio within a few
percent of 1.00 means the runner adds nothing to what it reports.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from verify.execute import RunRequest, run  # noqa: E402
from verify.options import ArchiveSelection, SessionSettings, TimedRuns  # noqa: E402
from verify.pack import PackOptions, pack  # noqa: E402


# The bare loop runs in a process of its own, started in a new session exactly as verify's local
# driver starts its runner: each then has its own scheduler autogroup, so on a loaded host both
# get the same share of the CPU (an in-process loop would share this script's group and look
# slower, flattering verify).
BARE_LOOP = """
import json, sys, time
import numpy as np, onnxruntime as ort
model, feeds_file, iterations, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with np.load(feeds_file, allow_pickle=False) as npz:
    feeds = {k: npz[k] for k in npz.files}
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.intra_op_num_threads = threads
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
names = [o.name for o in sess.get_outputs()]
sess.run(names, feeds)  # warmup, as verify's default
times = []
for _ in range(iterations):
    t = time.perf_counter()
    sess.run(names, feeds)
    times.append((time.perf_counter() - t) * 1000.0)
print(json.dumps(times))
"""


def bare_loop(model: Path, feeds_file: Path, iterations: int, threads: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", BARE_LOOP, str(model), str(feeds_file),
                          str(iterations), str(threads)], capture_output=True, text=True,
                         check=True, start_new_session=True)
    return json.loads(out.stdout)


def verify_loop(archive: Path, iterations: int, threads: int) -> list[float]:
    outcome = run(RunRequest(ArchiveSelection(archive), timed=TimedRuns(iterations, 1),
                             session=SessionSettings("all", threads)))
    assert outcome.passed, "the sample must pass its own check"
    return list(outcome.run.cases[0].iter_ms)


def p10(xs: list[float]) -> float:
    return float(np.percentile(xs, 10))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=REPO / "goldens" / "models" / "cnn.onnx")
    ap.add_argument("--iter", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "bench.vtc"
        tc = pack(args.model, archive, PackOptions(seed=1))
        feeds_file = Path(tmp) / "feeds.npz"
        np.savez(feeds_file, **dict(tc.cases[0].inputs))
        bare: list[float] = []
        ours: list[float] = []
        for r in range(args.rounds):
            bare += bare_loop(args.model, feeds_file, args.iter, args.threads)
            ours += verify_loop(archive, args.iter, args.threads)
            print(f"round {r + 1}/{args.rounds}: bare median {statistics.median(bare):.4f} ms, "
                  f"verify median {statistics.median(ours):.4f} ms", file=sys.stderr)
    mb, mo = statistics.median(bare), statistics.median(ours)
    print(f"model {args.model.name}, {args.rounds} rounds x {args.iter} iterations, "
          f"{args.threads} thread(s)")
    print(f"{'':18}{'median ms':>12}{'p10 ms':>12}")
    print(f"{'bare onnxruntime':18}{mb:12.4f}{p10(bare):12.4f}")
    print(f"{'verify run':18}{mo:12.4f}{p10(ours):12.4f}")
    print(f"ratio verify/bare: median {mo / mb:.3f}, p10 {p10(ours) / p10(bare):.3f} "
          f"(target: within a few percent of 1.000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
