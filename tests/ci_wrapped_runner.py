"""The real device runner with a fault injected inside the timed call (for verify ci's tests).

A device profile names it as its native runner:
    runner = [PYTHON, "tests/ci_wrapped_runner.py", "--sleep-ms", "5", RUNNER_PY]
and verify appends the job file. `--sleep-ms N` sleeps N ms inside every
InferenceSession.run (a slower device); `--repeat N` runs every inference N times (a model or
runtime that got N times slower: more of the same work, so load slows it like the real one);
`--noise` adds a few ulp of random noise to float
outputs (a non-deterministic device). Then verify/runner/runner.py runs as usual.
"""

import argparse
import runpy
import sys
import time

import numpy as np
import onnxruntime as ort


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sleep-ms", type=float, default=0.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--noise", action="store_true")
    ap.add_argument("runner")
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    real_run = ort.InferenceSession.run
    rng = np.random.default_rng()

    def run(self, *a, **k):  # type: ignore[no-untyped-def]
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000.0)
        for _ in range(args.repeat - 1):
            real_run(self, *a, **k)
        outputs = real_run(self, *a, **k)
        if args.noise:
            outputs = [o * (1 + rng.uniform(-4e-7, 4e-7, o.shape)).astype(o.dtype)
                       if o.dtype.kind == "f" else o for o in outputs]
        return outputs

    ort.InferenceSession.run = run
    sys.argv = [args.runner, *args.rest]
    runpy.run_path(args.runner, run_name="__main__")


if __name__ == "__main__":
    main()
