"""`verify run` / `verify devices check` when the device or the way to it fails: exit codes and
the one-line messages, against the real sshd and adb server (no driver internals patched)."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from fixtures_adb import free_port as adb_free_port
from fixtures_devices import DeviceEnv, run_cli, verify_process
from fixtures_ssh import SshServer, free_port, keygen, process_alive

MB = 1 << 20

BIG_OUTPUT_RUNNER = """\
import json, os, sys
import numpy as np
job = json.load(open(sys.argv[1]))
os.makedirs("out", exist_ok=True)
np.save("out/big.npy", np.arange(12 * 1024 * 1024, dtype=np.float32))
json.dump({"contract": "verify-runner", "version": 1, "status": "ok", "load_ms": 0,
           "prepare_ms": 0, "cases": [{"warmup_ms": [], "iter_ms": [1.0],
                                       "outputs": {"sum_relu": "out/big.npy"}}]},
          open("result.json", "w"))
"""

SLEEPER = "import os, sys, time; open({pidfile!r}, 'w').write(str(os.getpid())); time.sleep(120)"


@pytest.fixture(autouse=True)
def _no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def _one_line_error(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("error: "), err
    return err[len("error: "):-1]


# --- ssh: host keys, authentication, reachability ---------------------------------------------
def test_unknown_host_is_refused(device_env: DeviceEnv, sshd_server, small_vtc: Path,
                                 tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    spec = device_env.ssh_profile("b", sshd_server, tmp_path / "d",
                                  options={"known_hosts": str(known)})
    code, out, err = run_cli(["run", small_vtc, "--device", spec], capsys)
    assert (code, out) == (3, "")
    message = _one_line_error(err)
    assert message.startswith(f"{spec} (ssh:{sshd_server.address}): host key not in {known}; add it with "
                              f"ssh-keyscan -p {sshd_server.port} 127.0.0.1 >> {known} ")
    assert message.endswith("or pass --insecure-host-key")
    assert not (tmp_path / "d").exists()  # refused before anything was done on the device

    with pytest.warns(UserWarning, match="not checking the host key"):
        code, out, err = run_cli(["run", small_vtc, "--device", spec, "--insecure-host-key",
                                  "--iter", "1"], capsys)
    assert code == 0, err


def test_changed_host_key_is_refused(device_env: DeviceEnv, sshd_server, small_vtc: Path,
                                     tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = keygen(tmp_path / "other_key")
    known = tmp_path / "known_hosts"
    known.write_text(f"{sshd_server.host_entry} {' '.join(other.split()[:2])}\n")
    spec = device_env.ssh_profile("b", sshd_server, tmp_path / "d",
                                  options={"known_hosts": str(known)})
    code, out, err = run_cli(["run", small_vtc, "--device", spec], capsys)
    assert (code, out) == (3, "")
    message = _one_line_error(err)
    assert re.fullmatch(
        rf"{re.escape(spec)} \(ssh:{re.escape(sshd_server.address)}\): the host key changed: {re.escape(str(known))} "
        r"has ssh-ed25519 \S+, the server sent ssh-ed25519 \S+; if the device was reinstalled, "
        rf"remove the old key with ssh-keygen -R '\[127\.0\.0\.1\]:{sshd_server.port}' -f "
        rf"{re.escape(str(known))}, otherwise someone may be intercepting the connection",
        message), message


def test_authentication_failure(device_env: DeviceEnv, sshd_server, small_vtc: Path,
                                tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keygen(tmp_path / "stranger")
    spec = device_env.ssh_profile("b", sshd_server, tmp_path / "d",
                                  options={"identity": str(tmp_path / "stranger")})
    code, out, err = run_cli(["run", small_vtc, "--device", spec], capsys)
    assert (code, out) == (3, "")
    assert _one_line_error(err) == (
        f"{spec} (ssh:{sshd_server.address}): authentication failed for user {sshd_server.user} "
        f"(tried ssh-agent, ~/.ssh keys, {tmp_path / 'stranger'}); add your public key to the "
        "device's ~/.ssh/authorized_keys or set options.identity")


def test_devices_check_unreachable_ssh(device_env: DeviceEnv,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code, out, err = run_cli(["devices", "check", f"ssh:me@127.0.0.1:{port}"], capsys)
    assert (code, out) == (3, "")
    assert _one_line_error(err) == (f"ssh:me@127.0.0.1:{port}: connection refused by 127.0.0.1 "
                                    f"port {port}; is sshd running there?")


def test_devices_check_without_an_adb_server(device_env: DeviceEnv,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    port = adb_free_port()
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(port))
    code, out, err = run_cli(["devices", "check", "adb:SERIAL1"], capsys)
    assert (code, out) == (3, "")
    assert re.fullmatch(rf"cannot reach the adb server at 127\.0\.0\.1:{port} \(.+\); start it "
                        rf"with `adb -P {port} start-server`", _one_line_error(err))


# --- adb: which device ------------------------------------------------------------------------
def test_several_adb_devices_without_a_serial(device_env: DeviceEnv, adb_server, adb_device,
                                              adb_second_device, small_vtc: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(adb_server.port))
    code, out, err = run_cli(["run", small_vtc, "--device", "adb"], capsys)
    assert (code, out) == (2, "")
    message = _one_line_error(err)
    listed = re.fullmatch(r"several adb devices attached \((.+)\); pick one with "
                          r"--device adb:SERIAL or ANDROID_SERIAL=SERIAL", message)
    assert listed, message
    assert {adb_device.address, adb_second_device.address} <= set(listed.group(1).split(", "))
    # a profile with its own adb server port: `--device adb:SERIAL` would leave it behind (and
    # ask the server on 5037), so the advice names the profile's address key
    spec = device_env.adb_profile("twin", adb_server, None, device_env.cache / "twin")
    monkeypatch.delenv("ANDROID_ADB_SERVER_PORT")
    code, out, err = run_cli(["run", small_vtc, "--device", spec], capsys)
    assert (code, out) == (2, "")
    assert _one_line_error(err).endswith(
        f"; pick one with address = \"SERIAL\" in the profile of {spec} or "
        "ANDROID_SERIAL=SERIAL")


def test_adb_serial_not_attached(device_env: DeviceEnv, adb_server, adb_device,
                                 small_vtc: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(adb_server.port))
    code, out, err = run_cli(["devices", "check", "adb:127.0.0.1:1"], capsys)
    assert (code, out) == (3, "")
    message = _one_line_error(err)
    assert message.startswith("adb device '127.0.0.1:1' is not attached; attached: ")
    assert f"{adb_device.address} (device)" in message


# --- the device runs too long, or dies --------------------------------------------------------
def test_command_timeout_kills_the_runner_and_cleans_up(
        device_env: DeviceEnv, sshd_server, small_vtc: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    pidfile = tmp_path / "runner.pid"
    base = tmp_path / "d"
    spec = device_env.ssh_profile("slow", sshd_server, base,
                                  runner=[sys.executable, "-c", SLEEPER.format(pidfile=str(pidfile))])
    code, out, err = run_cli(["run", small_vtc, "--device", spec, "--timeout", "2"], capsys)
    assert (code, out) == (3, "")
    message = _one_line_error(err)
    assert message.startswith(f"{spec} (ssh:{sshd_server.address}): {sys.executable} -c ")
    assert " did not finish within 2 s (the runner's job: " in message
    assert message.endswith("allow more with --timeout SECONDS (a suite's timeout) or the "
                            "device profile's [timeouts] command")
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(pid)
    assert list((base / "jobs").iterdir()) == []


def _killed_while(growing: Callable[[], Iterable[Path]], server: SshServer,
                  argv: list[object], env: dict[str, str]) -> str:
    """Run `verify ARGV` as a process and kill the server's sessions as soon as one of the files
    `growing()` lists has passed 1 MB; the run must exit 3 with one line: returned."""
    def passed_a_megabyte() -> bool:
        for path in growing():
            try:
                if path.stat().st_size > MB:
                    return True
            except OSError:  # renamed or removed meanwhile
                pass
        return False

    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if passed_a_megabyte():
                server.kill_sessions()
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    proc = verify_process(argv, env)
    out, err = proc.communicate(timeout=120)
    stop.set()
    watcher.join()
    assert (proc.returncode, out) == (3, ""), err
    return _one_line_error(err)


@pytest.mark.parametrize("cache", ["empty", "warm"])
def test_server_killed_while_pulling_outputs(device_env: DeviceEnv, sshd_factory, small_vtc: Path,
                                             tmp_path: Path, cache: str, capsys) -> None:
    """Exit 3 naming the transfer; no half-written output or temp file left on this side.
    With the device's cache already holding the model (any run after the first), closing the
    session touched the files it reused over the dead link, and "connection lost (running
    touch)" replaced what was being done."""
    server = sshd_factory()
    runner = tmp_path / "big_runner.py"
    runner.write_text(BIG_OUTPUT_RUNNER)
    spec = device_env.ssh_profile("dying", server, tmp_path / "d",
                                  runner=[sys.executable, str(runner)])
    if cache == "warm":
        # the big-output runner gives none of the model's outputs: exit 3, after the model
        # and its inputs reached the device cache
        code, _, err = run_cli(["run", small_vtc, "--device", spec, "--iter", "1"], capsys)
        assert code == 3 and "returned no value for output(s)" in err, err
        assert list((tmp_path / "d" / "cache").iterdir())
    host_tmp = tmp_path / "host-tmp"
    host_tmp.mkdir()
    out_dir = tmp_path / "bin-out"

    message = _killed_while(lambda: host_tmp.glob("verify-run-*/.out_*.part"), server,
                            ["run", small_vtc, "--device", spec, "--bin-out-dump", out_dir],
                            {**device_env.env, "TMPDIR": str(host_tmp)})
    assert re.fullmatch(rf"{re.escape(spec)} \(ssh:{re.escape(server.address)}\): connection lost while fetching "
                        r"\S+/jobs/[0-9a-f]+/out/big\.npy", message), message
    assert not out_dir.exists()
    assert list(host_tmp.iterdir()) == []


def test_server_killed_while_pushing(device_env: DeviceEnv, sshd_factory, small_vtc: Path,
                                     tmp_path: Path) -> None:
    server = sshd_factory()
    big = tmp_path / "libbig.so"
    with open(big, "wb") as fh:
        fh.truncate(256 * MB)
    base = tmp_path / "d"
    spec = device_env.ssh_profile("dying", server, base,
                                  push=[{"src": str(big), "dest": "lib/libbig.so"}])

    message = _killed_while(lambda: (base / "cache").glob("*.part-*"), server,
                            ["run", small_vtc, "--device", spec], device_env.env)
    assert re.fullmatch(rf"{re.escape(spec)} \(ssh:{re.escape(server.address)}\): connection lost while copying "
                        rf"{re.escape(str(big))} to \S+/cache/[0-9a-f]{{64}}\.so\.part-[0-9a-f]+",
                        message), message
    assert not [p for p in (base / "cache").iterdir() if p.name.endswith(".so")]  # no final .so
    assert not os.path.exists(base / "lib" / "libbig.so")


def test_a_runner_killed_by_sigkill_over_ssh_names_signal_9(
        device_env: DeviceEnv, sshd_server, small_vtc: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """SSH reports a signal death as exit-signal, which paramiko drops (it used to read as
    'signal 1', from paramiko's -1): the remote shell now waits and says 128+9."""
    spec = device_env.ssh_profile("killed", sshd_server, tmp_path / "d", runner=[
        sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    code, out, err = run_cli(["run", small_vtc, "--device", spec], capsys)
    assert (code, out) == (3, "")
    assert _one_line_error(err) == (f"{spec}: the runner was killed by signal 9 without "
                                    "writing a result: no output")


def test_a_full_device_disk_over_sftp_says_so(device_env: DeviceEnv, sshd_server, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """paramiko's pipelined SFTP upload reported a full disk as "size mismatch in put!": the
    device's free space is now asked for and named (the adb driver said as much already)."""
    from test_os_conditions import tmpfs

    from verify.cli import main

    vtc = tmp_path / "cnn.vtc"
    cnn = Path(__file__).resolve().parent.parent / "goldens" / "models" / "cnn.onnx"
    assert main(["pack", str(cnn), "-o", str(vtc)]) == 0
    with tmpfs(tmp_path / "small", size="24k") as small:
        spec = device_env.ssh_profile("smalldisk", sshd_server, small / "d")
        code, out, err = run_cli(["run", vtc, "--device", spec, "--iter", "1"], capsys)
        assert (code, out) == (3, "")
        message = _one_line_error(err)
        assert re.search(r" failed: No space left on device \([0-9.]+ MB free in \S+/cache, the "
                         r"file is [0-9.]+ MB\)$", message), message
