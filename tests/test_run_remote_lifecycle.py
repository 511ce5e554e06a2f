"""Work directories, concurrency, Ctrl-C and progress bars of `verify run` on a device.

Each run gets a private work directory on the device; it is removed on success, on failure
and on Ctrl-C (`--keep` keeps it). Two runs on one device at once must not collide.
"""

from __future__ import annotations

import json
import os
import pty
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures_devices import DeviceEnv, run_cli, run_json, verify_process
from fixtures_ssh import process_alive

# A python "prefix" that makes the two runners meet: each notes its work directory, then waits
# until the other has arrived too (so both runners are provably running on the device at once),
# notes how many it saw, then runs the real runner. (Waiting for two work directories is not
# enough: a run creates its directory before it pushes its files and starts its runner, so the
# first run could finish before the second runner started.)
GATED = """\
import glob, os, runpy, sys, time
log = {log!r}
open(os.path.join(log, "arrived-%d" % os.getpid()), "w").write(os.getcwd())
deadline = time.monotonic() + 120
while len(glob.glob(os.path.join(log, "arrived-*"))) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
seen = len(glob.glob(os.path.join(log, "arrived-*")))
open(os.path.join(log, "seen-%d" % os.getpid()), "w").write(str(seen))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

SLEEPER = "import os, time; open({pidfile!r}, 'w').write(str(os.getpid())); time.sleep(120)"


def _device(kind: str, device_env: DeviceEnv, request: pytest.FixtureRequest,
            tmp_path: Path, **extra: object) -> tuple[str, Path]:
    """A profile `dev` of that kind; (its spec, its jobs folder as seen from this machine)."""
    if kind == "local":
        device_env.write_profile("dev", {"transport": "local", **extra})
        return "dev", device_env.local_jobs()
    if kind == "adb":
        dev = request.getfixturevalue("adb_device")
        base = dev.sandbox / f"l-{secrets.token_hex(4)}" / "verify"
        return device_env.adb_profile("dev", request.getfixturevalue("adb_server"), dev, base,
                                      **extra), base / "jobs"
    base = tmp_path / "board"
    return device_env.ssh_profile("dev", request.getfixturevalue("sshd_server"), base,
                                  **extra), base / "jobs"


def _wait_for(path: Path, proc: subprocess.Popen[str], limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not process_alive(pid)


def test_two_runs_on_one_device_at_once(device_env: DeviceEnv, sshd_server, small_vtc: Path,
                                        tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    base = tmp_path / "board"
    spec = device_env.ssh_profile("shared", sshd_server, base,
                                  python=[sys.executable, "-c", GATED.format(log=str(log))])
    procs = [verify_process(["run", small_vtc, "--device", spec, "--iter", "2", "--json"],
                            device_env.env) for _ in range(2)]
    results = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    docs = [json.loads(out) for out, _ in results]
    assert all(d["passed"] is True for d in docs)
    seen = [p.read_text() for p in log.glob("seen-*")]
    assert seen == ["2", "2"]  # both runners were running at once
    jobs = {Path(p.read_text()) for p in log.glob("arrived-*")}
    assert len(jobs) == 2 and all(j.parent == base / "jobs" for j in jobs)  # each in its own
    assert list((base / "jobs").iterdir()) == []


# Ctrl-C, and SIGTERM (`timeout 100 verify run ...`, a cancelled CI job), which killed verify at
# once and left its runner running on the device (local: in its own session) and its work
# directory behind. click starts a fresh line after the ^C the terminal echoed, then verify says
# why it stopped.
@pytest.mark.parametrize("kind", ["local", "ssh", "adb"])
@pytest.mark.parametrize("sig, code, said", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated")],
                         ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_stops_the_runner_and_leaves_no_work_directory(
        kind: str, sig: int, code: int, said: str, device_env: DeviceEnv, small_vtc: Path,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pidfile = tmp_path / "runner.pid"
    spec, jobs = _device(kind, device_env, request, tmp_path,
                         runner=[sys.executable, "-c", SLEEPER.format(pidfile=str(pidfile))])
    proc = verify_process(["run", small_vtc, "--device", spec], device_env.env)
    _wait_for(pidfile, proc)
    assert len(list(jobs.iterdir())) == 1  # the runner is running in its work directory
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (code, "", f"\n{said}\n")
    assert list(jobs.iterdir()) == []
    assert _wait_gone(int(pidfile.read_text()))  # the runner was stopped too


@pytest.mark.parametrize("kind", ["local", "ssh", "adb"])
def test_keep_keeps_the_work_directory(kind: str, device_env: DeviceEnv, small_vtc: Path,
                                       tmp_path: Path, request: pytest.FixtureRequest,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    spec, jobs = _device(kind, device_env, request, tmp_path)
    doc = run_json(["run", small_vtc, "--device", spec, "--iter", "1", "--keep"], capsys)
    assert doc["passed"] is True
    [kept] = list(jobs.iterdir())
    assert {p.name for p in kept.iterdir()} >= {"job.json", "result.json", "out"}
    assert json.loads((kept / "result.json").read_text())["status"] == "ok"


@pytest.mark.parametrize("kind", ["local", "ssh", "adb"])
def test_a_crashing_runner_is_exit_3_and_cleaned_up(kind: str, device_env: DeviceEnv,
                                                    small_vtc: Path, tmp_path: Path,
                                                    request: pytest.FixtureRequest,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    crash = "import sys; sys.stderr.write('loading libonnxruntime.so\\nboom: bad op\\n'); sys.exit(7)"
    spec, jobs = _device(kind, device_env, request, tmp_path,
                               runner=[sys.executable, "-c", crash])
    code, out, err = run_cli(["run", small_vtc, "--device", spec], capsys)
    assert (code, out) == (3, "")
    assert err == (f"error: {spec}: the runner exited with status 7 without writing a "
                   "result: boom: bad op\n")
    assert list(jobs.iterdir()) == []


@pytest.mark.parametrize("kind", ["ssh", "adb"])
def test_progress_bars_on_a_terminal(kind: str, device_env: DeviceEnv, small_vtc: Path,
                                     tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A large push shows a progress bar on a terminal; the same run in CI prints none."""
    big = tmp_path / "libbig.so"
    with open(big, "wb") as fh:
        fh.truncate(24 << 20)
    push = [{"src": str(big), "dest": "lib/libbig.so"}]
    if kind == "ssh":
        spec = device_env.ssh_profile("dev", request.getfixturevalue("sshd_server"),
                                      tmp_path / "board", push=push)
    else:
        dev = request.getfixturevalue("adb_device")
        spec = device_env.adb_profile("dev", request.getfixturevalue("adb_server"), dev,
                                      dev.sandbox / f"p-{secrets.token_hex(4)}" / "verify",
                                      push=push)
    env = {k: v for k, v in device_env.env.items() if k != "CI"}
    env.update(COLUMNS="100", TERM="xterm")
    main_fd, sub_fd = pty.openpty()
    proc = verify_process(["run", small_vtc, "--device", spec, "--iter", "1"], env,
                          stderr=sub_fd)
    os.close(sub_fd)
    screen = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    out, _ = proc.communicate(timeout=120)
    os.close(main_fd)
    assert proc.returncode == 0, screen.decode(errors="replace")
    assert b"push libbig.so" in screen
    assert "push libbig.so" not in out  # the bar goes to the terminal's stderr, never into stdout

    device_env.write_profile("dev2", {"transport": "local", "push": push})  # CI: quiet
    ci = verify_process(["run", small_vtc, "--device", "dev2", "--iter", "1"], device_env.env)
    out, err = ci.communicate(timeout=120)
    assert ci.returncode == 0 and "push libbig" not in err + out


@pytest.mark.parametrize("kind", ["local", "ssh", "adb"])
def test_devices_clean_removes_the_cache_and_leftover_work(
        kind: str, device_env: DeviceEnv, small_vtc: Path, tmp_path: Path,
        request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> None:
    spec, jobs = _device(kind, device_env, request, tmp_path)
    run_json(["run", small_vtc, "--device", spec, "--iter", "1", "--keep"], capsys)
    cache = jobs.parent / "cache"
    assert len(list(cache.iterdir())) == 4 and len(list(jobs.iterdir())) == 1
    code, out, err = run_cli(["devices", "clean", spec], capsys)
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"removed {cache}", f"removed {jobs}", f"device {spec}: clean"]
    assert not cache.exists() and not jobs.exists()
    again = run_json(["run", small_vtc, "--device", spec, "--iter", "1"], capsys)
    assert again["transfers"]["files_put"] == 5  # everything is sent again
    assert run_json(["devices", "clean", spec], capsys) == {
        "format": "verify-devices-clean", "version": 1, "spec": spec,
        "removed": [str(cache), str(jobs)]}
    assert run_json(["devices", "clean", spec], capsys)["removed"] == []


def test_a_device_python_without_numpy_is_told_what_to_do(
        device_env: DeviceEnv, small_vtc: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled runner on a device whose Python has no numpy said only "the runner failed:
    ModuleNotFoundError: No module named 'numpy'"."""
    blocked = tmp_path / "blocked" / "numpy"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    device_env.write_profile("nonumpy", {"transport": "local",
                                         "env": {"PYTHONPATH": str(blocked.parent)}})
    code, out, err = run_cli(["run", small_vtc, "--device", "nonumpy", "--iter", "1"], capsys)
    assert (code, out) == (3, "")
    assert "No module named 'numpy'" in err and err.rstrip().endswith(
        "(the device's Python lacks numpy: install numpy and onnxruntime there, or use the "
        "native runner, which needs no Python: docs/native-runner.md)"), err
