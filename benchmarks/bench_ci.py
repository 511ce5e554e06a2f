"""How much running devices in parallel saves, and what judging costs, on the sample suite.

    python benchmarks/bench_ci.py [--suite goldens/suites/sample.toml] [--rounds 3]

Prints, per round, the wall time of `verify ci`'s scheduler (devices in parallel, one job at
a time per device) against running the same jobs one after another in this process (the
baseline, measured in the same run), as a ratio; and the latency gate's bootstrap cost per
job. Baselines go to a temporary folder; nothing in the repository is written.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from verify.ci import gates  # noqa: E402
from verify.ci.jobs import expand  # noqa: E402
from verify.ci.results import Latency  # noqa: E402
from verify.ci.schedule import CiRun, run_job, run_jobs  # noqa: E402
from verify.ci.suite import GateSettings, load_suite  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", type=Path, default=ROOT / "goldens" / "suites" / "sample.toml")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    suite = load_suite(args.suite)
    # the scheduler's parallelism is what is measured: devices a suite groups (the sample's
    # local and emulated arm64 share this machine's cores) get lanes of their own here
    grouped = sorted({j.device.name for j in expand(suite) if j.device.group})
    if grouped:
        print(f"devices {', '.join(grouped)} share a group in {args.suite.name}; each gets its own "
              "lane here, to measure running devices in parallel")
    jobs = [replace(j, device=replace(j.device, group="")) for j in expand(suite)]
    with tempfile.TemporaryDirectory() as tmp:
        ci = CiRun(suite_name=suite.name, baselines=Path(tmp), update_goldens=True)
        run_jobs(jobs, ci)  # warm caches (device-side content-addressed cache, imports)
        ci = CiRun(suite_name=suite.name, baselines=Path(tmp))
        serial, parallel = [], []
        for r in range(args.rounds):
            t = time.perf_counter()
            for job in jobs:
                run_job(job, ci)
            serial.append(time.perf_counter() - t)
            t = time.perf_counter()
            results = run_jobs(jobs, ci)
            parallel.append(time.perf_counter() - t)
            print(f"round {r}: one after another {serial[-1]:.2f} s, devices in parallel "
                  f"{parallel[-1]:.2f} s ({serial[-1] / parallel[-1]:.2f}x)")
        assert all(res.status == "passed" for res in results), [r.summary() for r in results]
    print(f"median: one after another {statistics.median(serial):.2f} s, parallel "
          f"{statistics.median(parallel):.2f} s, speed-up "
          f"{statistics.median(serial) / statistics.median(parallel):.2f}x over "
          f"{len({j.device.name for j in jobs})} device(s), {len(jobs)} job(s)")
    rng = np.random.default_rng(0)
    a, b = Latency(tuple(rng.exponential(1, 30) + 10)), Latency(tuple(rng.exponential(1, 30) + 10))
    t = time.perf_counter()
    for _ in range(20):
        gates.latency(a, b, GateSettings(), "bench", "b")
    print(f"latency gate (2,000-round bootstrap, 30 vs 30 samples): "
          f"{(time.perf_counter() - t) / 20 * 1000:.1f} ms per job")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
