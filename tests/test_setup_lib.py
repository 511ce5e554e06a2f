"""scripts/setup_lib.sh, the helpers setup.sh uses: it waits while another process holds the
package manager's locks (held here by real processes, both as dpkg holds them — an fcntl lock —
and with flock(1)), says who holds which, gives up after its bound, and retries a failing
download. Nothing is installed: the lock files are temporary files standing in for dpkg's.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "scripts" / "setup_lib.sh"

# Holds an fcntl (POSIX) write lock on argv[1] the way dpkg does, prints "held", sleeps argv[2].
FCNTL_HOLDER = ("import fcntl, sys, time\n"
                "fh = open(sys.argv[1], 'w')\n"
                "fcntl.lockf(fh, fcntl.LOCK_EX)\n"
                "print('held', flush=True)\n"
                "time.sleep(float(sys.argv[2]))\n")


def helper(script: str, locks: list[Path], timeout: float = 60, **env: str) -> \
        subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f'. "{LIB}"; {script}'], capture_output=True, text=True, timeout=timeout,
        env={"PATH": "/usr/bin:/bin", "VERIFY_APT_LOCKS": " ".join(map(str, locks)),
             "VERIFY_APT_LOCK_POLL": "1", **env})


def hold_fcntl(path: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", FCNTL_HOLDER, str(path), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_free_locks_pass_at_once_and_missing_lock_files_are_free(tmp_path: Path) -> None:
    free = tmp_path / "lock-frontend"
    free.touch()
    run = helper("wait_for_apt_locks", [free, tmp_path / "absent"], VERIFY_APT_LOCK_WAIT="5")
    assert run.returncode == 0 and run.stderr == ""


def test_waits_for_a_dpkg_style_lock_and_names_its_holder(tmp_path: Path) -> None:
    lists, frontend = tmp_path / "lists-lock", tmp_path / "lock-frontend"
    lists.touch()
    holder = hold_fcntl(frontend, 3)
    try:
        started = time.monotonic()
        run = helper("wait_for_apt_locks", [lists, frontend], VERIFY_APT_LOCK_WAIT="60")
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert lines[0].startswith(f"setup: waiting for {frontend} held by process {holder.pid} "
                               "(python") and lines[0].endswith(") (up to 60 s more)")
    assert lines[-1].startswith("setup: the package manager's locks are free after ")
    assert waited >= 1   # it did wait for the holder (3 s), not pass by


def test_gives_up_after_its_bound_naming_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    holder = subprocess.Popen(["flock", str(lock), "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while helper(f"lock_holder {lock}", []).stdout == "" and time.monotonic() < deadline:
            time.sleep(0.05)   # until flock has it
        run = helper("wait_for_apt_locks", [lock], VERIFY_APT_LOCK_WAIT="2")
    finally:
        holder.kill()
        holder.wait()
    assert run.returncode == 1
    last = run.stderr.splitlines()[-1]
    assert last.startswith(f"setup: error: gave up after 2 s waiting for {lock} held by process ")
    assert "VERIFY_APT_LOCK_WAIT=SECONDS" in last


def test_apt_get_waits_for_the_locks_before_running(tmp_path: Path) -> None:
    # apt_get on a lock held for good: it never reaches apt-get, and says why
    lock = tmp_path / "lock-frontend"
    holder = hold_fcntl(lock, 30)
    try:
        run = helper("apt_get update", [lock], VERIFY_APT_LOCK_WAIT="1")
    finally:
        holder.kill()
        holder.wait()
    assert run.returncode == 1 and "gave up after 1 s waiting for" in run.stderr


@pytest.mark.parametrize("fail_times, code", [(0, 0), (2, 0), (3, 5)])
def test_retry_runs_a_failing_step_again_and_reports(tmp_path: Path, fail_times: int,
                                                     code: int) -> None:
    count = tmp_path / "count"
    # fails (exit 5) its first `fail_times` runs, like a download on a flaky network
    step = (f'n=$(cat "{count}" 2>/dev/null || echo 0); echo $((n + 1)) > "{count}"; '
            f'[ "$n" -ge {fail_times} ] || exit 5')
    run = helper(f"retry bash -c '{step}'", [], VERIFY_SETUP_RETRY_DELAY="0")
    assert run.returncode == code, run.stderr
    assert int(count.read_text()) == min(fail_times + 1, 3)
    tries = [line for line in run.stderr.splitlines() if "failed (exit 5); try" in line]
    assert len(tries) == min(fail_times, 2)
    if tries:
        assert tries[0].endswith("failed (exit 5); try 2 of 3 in 0 s")
    if code:
        assert run.stderr.splitlines()[-1].endswith("failed 3 time(s) (exit 5); giving up")
