"""A cancelled nightly run stops: SIGTERM (a CI system cancelling the job) while one device's
job is running and another's, judged per layer, is done. It hung forever (the comparison's
idle threads were joined), and before that let the running job go on to its end, up to its
timeout, printing and keeping its result after "terminated"."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

from fixtures_devices import DeviceEnv, verify_process
from fixtures_ssh import process_alive

TESTCASES = Path(__file__).resolve().parents[2] / "goldens" / "testcases"
SLEEPER = "import os, time; open({pidfile!r}, 'w').write(str(os.getpid())); time.sleep(300)"


def _suite(folder: Path) -> Path:
    path = folder / "suite.toml"
    path.write_text(f"""
[suite]
name = "stop"
baselines = "baselines"
gates = ["accuracy", "regression"]
iterations = 2
warmup = 0

[[device]]
name = "local"
spec = "local"

[[device]]
name = "slow"
spec = "slow"

[[options]]
name = "off"
opt_level = "disable"

[[testcase]]
path = "{TESTCASES / 'cnn.vtc'}"
layers = true
""", encoding="utf-8")
    return path


def test_sigterm_stops_ci_and_its_running_job(device_env: DeviceEnv, tmp_path: Path) -> None:
    pidfile = tmp_path / "runner.pid"
    device_env.write_profile("slow", {"transport": "local", "runner": [
        sys.executable, "-c", SLEEPER.format(pidfile=str(pidfile))]})
    suite = _suite(tmp_path)
    proc = verify_process(["ci", suite, "--update-goldens"], device_env.env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    # the per-layer job on local is judged (the comparison's threads exist), the slow one runs
    while not (pidfile.exists() and any("cnn/local/off" in ln for ln in lines)):
        assert proc.poll() is None, (lines, proc.stderr.read())
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    try:
        code = proc.wait(timeout=60)
    except Exception:
        proc.kill()
        raise
    reader.join(5)
    err = proc.stderr.read()
    assert code == 143 and err.endswith("terminated\n"), (code, lines, err)
    assert time.monotonic() - started < 30
    assert not any("slow" in ln for ln in lines)  # neither shown nor kept after the signal
    assert not list((tmp_path / "baselines").rglob("*slow*"))
    pid = int(pidfile.read_text())
    gone = time.monotonic() + 10
    while process_alive(pid) and time.monotonic() < gone:
        time.sleep(0.05)
    assert not process_alive(pid)  # the runner was stopped with it
    assert list(device_env.local_jobs().iterdir()) == []
