#!/usr/bin/env python3
"""Transport costs on loopback, each against the local transport measured in the same run.

    python benchmarks/bench_devices.py [--mb 64] [--runs 5]

Starts its own sshd and adb server + device end (the test fixtures in tests/), then for each
transport: push of an N MB file (cold), the same push again (a cache hit), a pull, and a whole
`verify run` of goldens/models/two_io.onnx with a warm device cache (the job is all that is
sent). Prints medians and the ratio to `local`. ssh needs openssh-server and the `ssh` extra
(paramiko), adb the adb binary and the `adb` extra (adbutils); pytest is not needed. A
transport that cannot run here is skipped with the reason printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench_timing import median_s

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from verify.archive_reader import read_archive  # noqa: E402
from verify.devices import Profile  # noqa: E402
from verify.drivers import make_driver  # noqa: E402
from verify.options import TimedRuns  # noqa: E402
from verify.pipeline import RunOptions, run_on_device  # noqa: E402


def _missing_extra(module: str, extra: str) -> str | None:
    """Why the `extra` transport cannot run on this install, or None."""
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed: pip install 'onnx-verify[{extra}]'"
    return None


def bench(profile: Profile, big: Path, vtc: Path, runs: int, work: Path) -> dict[str, float]:
    tc = read_archive(vtc)
    feeds = [tc.cases[0].inputs]
    options = RunOptions(timed=TimedRuns(iterations=1, warmup=0))
    out: dict[str, float] = {}
    with make_driver(profile) as d:
        d.makedirs(d.base_dir)

        def cold() -> None:
            d.remove(d.cache_dir)
            d.push_cached(big)
        out["push cold"] = median_s(cold, runs)
        out["push cached"] = median_s(lambda: d.push_cached(big), runs)
        remote = d.push_cached(big)
        out["pull"] = median_s(lambda: d.get(remote, work / "pulled.bin"), runs)
    run_on_device(profile, tc.model_bytes, feeds, options)  # warm the cache
    out["verify run (warm)"] = median_s(
        lambda: run_on_device(profile, tc.model_bytes, feeds, options), runs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from verify.cli import main as cli

    with tempfile.TemporaryDirectory(prefix="bench-devices-") as tmp_name:
        tmp = Path(tmp_name)
        big = tmp / "big.bin"
        big.write_bytes(os.urandom(args.mb << 20))
        vtc = tmp / "two_io.vtc"
        cli(["pack", str(REPO / "goldens/models/two_io.onnx"), "-o", str(vtc)])
        profiles: dict[str, Profile] = {
            "local": Profile(name="local", transport="local", base_dir=str(tmp / "local"))}
        stops: list[Callable[[], None]] = []
        # the tests' real servers (tests/sshd_host.py, tests/adb_host.py: no pytest needed);
        # a transport that cannot run here is skipped, and the reason printed
        try:
            missing = _missing_extra("paramiko", "ssh")
            if missing:
                raise RuntimeError(missing)
            from sshd_host import start_sshd

            server = start_sshd(tmp / "sshd")
            stops.append(server.stop)
            profiles["ssh"] = server.profile(str(tmp / "ssh-dev"))
        except Exception as exc:  # noqa: BLE001 - any reason: say it, go on with the others
            print(f"ssh: skipped ({exc})")
        try:
            from adb_host import AdbServer, adb_missing, adb_profile_for

            missing = _missing_extra("adbutils", "adb") or adb_missing()
            if missing:
                raise RuntimeError(missing)
            adb = AdbServer(tmp / "adb-home").start()
            stops.append(adb.stop)
            device = adb.attach(tmp / "adb-sandbox")
            profiles["adb"] = adb_profile_for(adb, device, tmp / "adb-sandbox" / "verify")
        except Exception as exc:  # noqa: BLE001
            print(f"adb: skipped ({exc})")
        try:
            results = {name: bench(p, big, vtc, args.runs, tmp) for name, p in profiles.items()}
        finally:
            for stop in reversed(stops):
                stop()
    base = results["local"]
    print(f"\n{'transport':10} {'what':22} {'median':>10} {'MB/s':>8} {'x local':>8}")
    for name, row in results.items():
        for what, seconds in row.items():
            rate = f"{args.mb / seconds:8.0f}" if what.startswith(("push cold", "pull")) else " " * 8
            print(f"{name:10} {what:22} {seconds * 1000:8.1f}ms {rate} {seconds / base[what]:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
