#!/usr/bin/env python3
"""What a bench round costs beyond the runner's own work: per-round wall time over the time the
runner measured itself, with one device session per command (one connection, one serving
runner) against a session per job (the old path: connect, push, start a runner, every round).

    python3 benchmarks/bench_session.py [--model yolov8n] [--rounds 8] [--iter 10]
                                        [--transports local,ssh]

Each round is one `verify bench` job (`pipeline.run_model`: job file pushed, runner runs
warmup + iterations, result and outputs pulled, work directory removed), alternating the
settings opt=all and opt=disable as bench does. The runner's own time is what its result
reports: model load + session creation + warmup + timed iterations. Printed per transport and
path: the median round's wall time, the runner's median, and the median of the per-round
ratios (target: <= 1.2x for the session path). ssh runs against a real sshd on loopback
(tests/sshd_host.py); a transport that cannot run here is skipped with the reason.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from verify.devices import Profile  # noqa: E402
from verify.options import SessionSettings, TimedRuns  # noqa: E402
from verify.pipeline import DeviceRun, RunOptions, run_model, run_on_device  # noqa: E402
from verify.session import DeviceSession  # noqa: E402

SETTINGS = ("all", "disable")


def runner_ms(run: DeviceRun) -> float:
    """What the runner timed itself: load, session creation, warmup and iterations."""
    return run.load_ms + run.prepare_ms + sum(
        sum(c.warmup_ms) + sum(c.iter_ms) for c in run.cases)


def feeds_for(model: Path) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    dtypes = {"tensor(float)": np.float32, "tensor(int64)": np.int64}
    # symbolic sizes: 1 for the batch, 320 for the others (yolov8n's 320n image size)
    return [{i.name: rng.random([d if isinstance(d, int) else (1 if k == 0 else 320)
                                 for k, d in enumerate(i.shape)])
             .astype(dtypes.get(i.type, np.float32)) for i in sess.get_inputs()}]


def rounds(profile: Profile, model_bytes: bytes, feeds: list[dict[str, np.ndarray]],
           n: int, iterations: int, one_session: bool) -> list[tuple[float, float]]:
    """(wall ms, runner ms) per round, after one warm-up round (cache filled, runner started)."""
    out = []
    options = [RunOptions(session=SessionSettings(opt_level=s),
                          timed=TimedRuns(iterations=iterations, warmup=1)) for s in SETTINGS]

    @contextmanager
    def job_runner() -> Iterator[Callable[[RunOptions], DeviceRun]]:
        if one_session:
            with DeviceSession(profile, serve=True) as session:
                yield lambda o: run_model(session, model_bytes, feeds, o)
        else:
            yield lambda o: run_on_device(profile, model_bytes, feeds, o)

    with job_runner() as job:
        job(options[0])  # warm: the device cache, and the serving runner's start
        for k in range(n):
            t0 = time.perf_counter()
            run = job(options[k % len(options)])
            out.append(((time.perf_counter() - t0) * 1000.0, runner_ms(run)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yolov8n")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--iter", type=int, default=10)
    parser.add_argument("--transports", default="local,ssh")
    args = parser.parse_args()
    from corpus import model_path

    model = model_path(args.model)
    model_bytes = model.read_bytes()
    feeds = feeds_for(model)
    wanted = args.transports.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-session-") as tmp_name:
        tmp = Path(tmp_name)
        profiles: dict[str, Profile] = {}
        stops: list[Callable[[], None]] = []
        if "local" in wanted:
            profiles["local"] = Profile(name="local", transport="local",
                                        base_dir=str(tmp / "local"))
        if "ssh" in wanted:
            try:
                from sshd_host import start_sshd

                server = start_sshd(tmp / "sshd")
                stops.append(server.stop)
                profiles["ssh"] = server.profile(str(tmp / "ssh-dev"))
            except Exception as exc:  # noqa: BLE001 - any reason: say it, go on
                print(f"ssh: skipped ({exc})")
        try:
            for name, profile in profiles.items():
                # the two paths interleaved per transport, so drift hits both alike
                for one_session in (False, True, False, True):
                    measured = rounds(profile, model_bytes, feeds, args.rounds // 2 or 1,
                                      args.iter, one_session)
                    rows.append((name, one_session, measured))
        finally:
            for stop in reversed(stops):
                stop()
    print(f"model {args.model}, {args.iter} iteration(s) + 1 warmup per round, settings "
          f"{'/'.join(SETTINGS)} alternating, {args.rounds} rounds per path")
    print(f"{'transport':10} {'path':24} {'wall ms':>9} {'runner ms':>10} {'wall/runner':>12}")
    for name in profiles:
        for one_session in (False, True):
            measured = [m for n, s, ms in rows if n == name and s == one_session for m in ms]
            wall = statistics.median(w for w, _ in measured)
            own = statistics.median(r for _, r in measured)
            ratio = statistics.median(w / r for w, r in measured)
            path = "one session, serving" if one_session else "a session per job (old)"
            print(f"{name:10} {path:24} {wall:9.1f} {own:10.1f} {ratio:11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
