"""A cancelled nightly run stops: SIGTERM (a CI system cancelling the job) while one device's
job is running and another's, judged per layer, is done. It hung forever (the comparison's
idle threads were joined), and before that let the running job go on to its end, up to its
timeout, printing and keeping its result after "terminated". Neither does it leave the
finished job's new baseline beside the others' old ones, nor an earlier run's report in
place; a run killed outright leaves its staged baselines, which the next run removes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
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


# the baseline an earlier --update-goldens left for the job that finishes before the signal
OLD = {"format": "verify-ci-baseline", "version": 2, "job": "cnn/local/off", "outputs": {}}


def _old_baseline(folder: Path) -> Path:
    path = folder / "baselines" / "stop" / "cnn" / "local" / "off.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(OLD), encoding="utf-8")
    return path


def _started(device_env: DeviceEnv, folder: Path,
             *extra: str) -> tuple[subprocess.Popen[str], list[str], threading.Thread, Path]:
    """`verify ci --update-goldens` of the suite, once the local job is done and the slow
    device's runner hangs: the process, its stdout lines, their reader, the runner's pid file."""
    pidfile = folder / "runner.pid"
    device_env.write_profile("slow", {"transport": "local", "runner": [
        sys.executable, "-c", SLEEPER.format(pidfile=str(pidfile))]})
    suite = _suite(folder)
    proc = verify_process(["ci", suite, "--update-goldens", *extra], device_env.env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    # the per-layer job on local is judged (the comparison's threads exist), the slow one runs
    while not (pidfile.exists() and any("cnn/local/off" in ln for ln in lines)):
        assert proc.poll() is None, (lines, proc.stderr.read())
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)
    return proc, lines, reader, pidfile


def test_sigterm_stops_ci_and_its_running_job(device_env: DeviceEnv, tmp_path: Path) -> None:
    old = _old_baseline(tmp_path)
    stale = tmp_path / "ci.xml"  # an earlier run's report, all green
    stale.write_text('<testsuites tests="1" failures="0"/>\n', encoding="utf-8")
    proc, lines, reader, pidfile = _started(device_env, tmp_path, "--junit", str(stale))
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
    # the finished job's new baseline was not put beside the others' old ones: the set is the
    # one before the run, byte for byte, and nothing staged is left
    assert json.loads(old.read_text()) == OLD
    assert sorted(p for p in (tmp_path / "baselines").rglob("*") if p.is_file()) == [old]
    assert not stale.exists()  # no earlier run's report stands for this one
    pid = int(pidfile.read_text())
    gone = time.monotonic() + 10
    while process_alive(pid) and time.monotonic() < gone:
        time.sleep(0.05)
    assert not process_alive(pid)  # the runner was stopped with it
    assert list(device_env.local_jobs().iterdir()) == []


def test_a_run_killed_outright_leaves_the_old_set_and_the_next_run_removes_what_it_staged(
        device_env: DeviceEnv, tmp_path: Path, capsys) -> None:
    from fixtures_ci import run_ci

    old = _old_baseline(tmp_path)
    proc, _, reader, pidfile = _started(device_env, tmp_path)
    proc.kill()
    proc.wait(timeout=30)
    reader.join(5)
    os.kill(int(pidfile.read_text()), signal.SIGKILL)  # its runner, which nothing stopped
    assert json.loads(old.read_text()) == OLD
    staged = list((tmp_path / "baselines").glob(".stop.staging~*"))
    assert len(staged) == 1 and (staged[0] / "new" / "cnn" / "local" / "off.json").is_file()
    run = run_ci([_suite(tmp_path), "--only", "local"], capsys, tmp_path)
    assert (f"note: removed {staged[0].name}: the staged baselines of a run that did not "
            "finish (the baselines were left as they were)\n") in run.err
    assert not staged[0].exists() and json.loads(old.read_text()) == OLD
    # judged against the old baseline (recorded without layers), not the staged one
    assert "not judged: the baseline was recorded without layers" in run.gate(
        "cnn/local/off", "regression")["message"]
