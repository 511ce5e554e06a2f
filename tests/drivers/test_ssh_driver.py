"""The ssh driver against a real OpenSSH sshd on loopback (tests/fixtures_ssh.py).

The device is this machine, so a test may look at the "remote" files and processes directly.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import posixpath
import secrets
import shlex
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("paramiko",
                    reason="the ssh extra is not installed: pip install 'onnx-verify[ssh]'")

from fixtures_ssh import SshServer, free_port, keygen, process_alive  # noqa: E402
from verify.drivers import make_driver  # noqa: E402
from verify.drivers.base import DriverConfig  # noqa: E402
from verify.errors import (ConnectError, DeviceError, DeviceTimeout, ProfileError,  # noqa: E402
                           RemoteCommandFailed, TransferError, UsageError)

PY = sys.executable
MB = 1 << 20


@pytest.fixture(autouse=True)
def _no_user_ssh_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drivers made here without a profile must not read the developer's ~/.ssh/config."""
    monkeypatch.setenv("VERIFY_SSH_CONFIG", "none")


def _driver(profile):
    return make_driver(profile)


def _random_file(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


def _wait_gone(pids: list[int]) -> list[int]:
    """The pids still running after at most 10 s (killed processes may take a moment to reap)."""
    import time

    end = time.monotonic() + 10
    while time.monotonic() < end and any(process_alive(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if process_alive(p)]


# --- addresses and defaults (no server) --------------------------------------------------------
def test_address_defaults_and_base_dir() -> None:
    from verify.drivers.ssh import SshDriver

    d = SshDriver(DriverConfig(transport="ssh", address="alice@board.lan:2222"))
    assert (d.target.user, d.target.host, d.target.port) == ("alice", "board.lan", 2222)
    assert d.base_dir == "/tmp/verify-alice"
    d = SshDriver(DriverConfig(transport="ssh", address="board.lan"))
    assert (d.target.user, d.target.port) == (getpass.getuser(), 22)
    assert d.base_dir == f"/tmp/verify-{getpass.getuser()}"
    d = SshDriver(DriverConfig(transport="ssh", address="bob@h", base_dir="/data/v"))
    assert d.base_dir == "/data/v"


@pytest.mark.parametrize("address", ["me@host:port", "me@:22", "me@host:70000", ""])
def test_bad_address_is_a_usage_error(address: str) -> None:
    from verify.drivers.ssh import SshDriver

    with pytest.raises(UsageError, match="expected ssh:user@host"):
        SshDriver(DriverConfig(transport="ssh", address=address))


def test_bad_insecure_flag_is_a_profile_error() -> None:
    from verify.drivers.ssh import SshDriver

    with pytest.raises(ProfileError, match="options.insecure_host_key must be true or false"):
        SshDriver(DriverConfig(transport="ssh", address="h",
                               options={"insecure_host_key": "maybe"}))


# --- files ----------------------------------------------------------------------------------
def test_put_get_round_trip(ssh_profile, tmp_path: Path) -> None:
    src = tmp_path / "blob.bin"
    data = _random_file(src, 3 * MB + 12345)
    moved: list[int] = []
    with _driver(ssh_profile) as d:
        d.makedirs(d.base_dir)
        remote = posixpath.join(d.base_dir, "blob.bin")
        d.put(src, remote, progress=moved.append)
        assert sum(moved) == len(data)
        back = tmp_path / "back" / "blob.bin"
        d.get(remote, back, progress=moved.append)
        assert d.stats.bytes_put == d.stats.bytes_got == len(data)
    assert back.read_bytes() == data
    assert sum(moved) == 2 * len(data)
    assert [p.name for p in back.parent.iterdir()] == ["blob.bin"]  # no temp file left


def test_put_replaces_an_existing_file(ssh_profile, tmp_path: Path) -> None:
    src = tmp_path / "f.txt"
    with _driver(ssh_profile) as d:
        d.makedirs(d.base_dir)
        remote = posixpath.join(d.base_dir, "f.txt")
        for text in ("first", "second"):
            src.write_text(text)
            d.put(src, remote)
        assert Path(remote).read_text() == "second"
        assert sorted(os.listdir(d.base_dir)) == ["f.txt"]


def test_push_cached_sends_once(ssh_profile, tmp_path: Path) -> None:
    src = tmp_path / "model.onnx"
    data = _random_file(src, MB)
    with _driver(ssh_profile) as d:
        first = d.push_cached(src)
        assert d.stats.as_dict() == {"bytes_put": len(data), "files_put": 1, "files_cached": 0,
                                     "bytes_got": 0, "files_got": 0}
        second = d.push_cached(src)
        assert second == first and first.endswith(".onnx")
        assert d.stats.as_dict() == {"bytes_put": len(data), "files_put": 1, "files_cached": 1,
                                     "bytes_got": 0, "files_got": 0}
        assert d.exists(first)
    assert Path(first).read_bytes() == data


def test_get_missing_file_leaves_nothing(ssh_profile, tmp_path: Path) -> None:
    dest = tmp_path / "out" / "x.npy"
    with _driver(ssh_profile) as d:
        missing = posixpath.join(d.base_dir, "nope.npy")
        with pytest.raises(TransferError, match=rf"fetching {missing} failed: No such file"):
            d.get(missing, dest)
    assert not dest.exists() and not dest.parent.exists()  # nor the folder made for it


def test_makedirs_exists_remove_workdir(ssh_profile) -> None:
    with _driver(ssh_profile) as d:
        deep = posixpath.join(d.base_dir, "a b", "c'd", "e")
        d.makedirs(deep)
        d.makedirs(deep)  # idempotent
        assert d.exists(deep) and Path(deep).is_dir()
        work = d.make_workdir()
        assert work.startswith(posixpath.join(d.base_dir, "jobs") + "/") and d.exists(work)
        d.remove(posixpath.join(d.base_dir, "a b"))
        assert not d.exists(deep)
        Path(d.base_dir, "file").write_text("x")
        with pytest.raises(TransferError, match="exists and is not a directory"):
            d.makedirs(posixpath.join(d.base_dir, "file"))


# --- commands -------------------------------------------------------------------------------
def test_argv_arrives_literally(ssh_profile) -> None:
    args = ["a b", "it's", '"dq"', "$(echo pwned)", "`id`", "x; echo injected", "a && b | c",
            "*", "", "back\\slash", "new\nline", "~", "$HOME", "ünï"]
    with _driver(ssh_profile) as d:
        r = d.run([PY, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *args])
        assert json.loads(r.stdout) == args
        r = d.run(["printf", "%s|", *args])
        assert r.stdout == "".join(f"{a}|" for a in args)
        assert r.stderr == "" and r.status == 0


def test_env_and_cwd(ssh_profile) -> None:
    with _driver(ssh_profile) as d:
        cwd = posixpath.join(d.base_dir, "dir with 'quote' $x")
        d.makedirs(cwd)
        r = d.run([PY, "-c", "import os; print(os.getcwd()); print(os.environ['VERIFY_T'])"],
                  env={"VERIFY_T": "a b $(x) 'q'"}, cwd=cwd)
    assert r.stdout.splitlines() == [cwd, "a b $(x) 'q'"]


def test_exit_status_and_stderr_tail(ssh_profile) -> None:
    script = "for i in 1 2 3 4 5 6 7; do echo line$i >&2; done; echo oops >&2; exit 3"
    with _driver(ssh_profile) as d:
        r = d.run(["sh", "-c", script], check=False)
        assert (r.status, r.stdout) == (3, "")
        assert r.stderr.endswith("line7\noops\n")
        with pytest.raises(RemoteCommandFailed, match="sh exited with status 3: oops") as info:
            d.run(["sh", "-c", script])
    assert info.value.status == 3 and info.value.argv == ["sh", "-c", script]
    assert info.value.stderr_tail == "line4\nline5\nline6\nline7\noops"
    assert str(info.value).startswith(f"{ssh_profile.spec} (ssh:{ssh_profile.address}): ")


def test_killed_by_signal_is_a_status_not_a_lost_link(ssh_profile) -> None:
    with _driver(ssh_profile) as d:
        r = d.run(["sh", "-c", "kill -KILL $$"], check=False)
        assert r.status == -9  # which signal, as the local driver says it
        assert d.run(["echo", "still here"]).stdout == "still here\n"


def test_large_stdout_and_stderr_together(ssh_profile) -> None:
    # Repeated: a lost wake-up between the two streams once stalled 1 run in 5 until the timeout.
    script = ("import sys\n"
              "for i in range(96):\n"
              "    sys.stdout.buffer.write(b'o' * 65536)\n"
              "    sys.stderr.buffer.write(b'e' * 65536)\n")
    with _driver(ssh_profile) as d:
        for _ in range(8):
            r = d.run([PY, "-c", script], timeout=60)
            assert r.stdout == "o" * (96 * 65536)
            assert r.stderr == "e" * (96 * 65536)


def test_timeout_kills_the_remote_process_group(ssh_profile, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    # sh and a background child, both in the session's process group; nothing ever exits.
    tmp, final = shlex.quote(f"{pidfile}.tmp"), shlex.quote(str(pidfile))
    script = f'sleep 300 & echo "$$ $!" > {tmp} && mv {tmp} {final}; wait'
    with _driver(ssh_profile) as d:
        with pytest.raises(DeviceTimeout, match=r"sh -c .* did not finish within 2 s$"):
            d.run(["sh", "-c", script], timeout=2)
        pids = [int(p) for p in pidfile.read_text().split()]
        assert len(pids) == 2
        assert _wait_gone(pids) == []
        assert d.run(["echo", "usable"]).stdout == "usable\n"


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("script, timeout", [
    ("exec sleep {token}", 0.001),                # expires before the shell printed its pid
    ("exec >&- 2>&-; exec sleep {token}", 0.5),   # outputs closed (EOF), still running
])
def test_timeout_leaves_nothing_running(ssh_profile, script: str, timeout: float) -> None:
    token = f"301.{secrets.randbelow(10**9):09d}"  # a sleep length no other process uses
    with _driver(ssh_profile) as d:
        with pytest.raises(DeviceTimeout, match=rf"did not finish within {timeout:g} s$"):
            d.run(["sh", "-c", script.format(token=token)], timeout=timeout)
    assert _wait_gone(_processes_with(token)) == []


# --- connecting -------------------------------------------------------------------------------
def test_unknown_host_is_refused(sshd_server: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    profile = sshd_server.profile(str(tmp_path / "dev"), known_hosts=str(known))
    port = sshd_server.port
    with pytest.raises(ConnectError) as info:
        _driver(profile).open()
    message = str(info.value)
    assert message.startswith(f"{profile.spec} (ssh:{sshd_server.address}): host key not in "
                              f"{known}; add it with "
                              f"ssh-keyscan -p {port} 127.0.0.1 >> {known} ")
    assert message.endswith("or pass --insecure-host-key") and "\n" not in message


def test_missing_known_hosts_file_is_an_unknown_host(sshd_server: SshServer,
                                                     tmp_path: Path) -> None:
    known = tmp_path / "absent" / "known_hosts"
    profile = sshd_server.profile(str(tmp_path / "dev"), known_hosts=str(known))
    with pytest.raises(ConnectError, match=f"host key not in {known}; add it with ssh-keyscan"):
        _driver(profile).open()


def test_changed_host_key_is_refused(sshd_server: SshServer, tmp_path: Path) -> None:
    other = keygen(tmp_path / "other_key")
    known = tmp_path / "known_hosts"
    known.write_text(f"{sshd_server.host_entry} {' '.join(other.split()[:2])}\n")
    profile = sshd_server.profile(str(tmp_path / "dev"), known_hosts=str(known))
    with pytest.raises(ConnectError, match=r"the host key changed: .* ssh-keygen -R "
                                           rf"'\[127\.0\.0\.1\]:{sshd_server.port}'"):
        _driver(profile).open()


@pytest.mark.parametrize("known_text", ["", "wrong"])
def test_insecure_host_key_opt_out(sshd_server: SshServer, tmp_path: Path,
                                   known_text: str) -> None:
    known = tmp_path / "known_hosts"
    if known_text:
        other = keygen(tmp_path / "other_key")
        known_text = f"{sshd_server.host_entry} {' '.join(other.split()[:2])}\n"
    known.write_text(known_text)
    profile = sshd_server.profile(str(tmp_path / "dev"), known_hosts=str(known),
                                  insecure_host_key=True)
    with pytest.warns(UserWarning, match=r"not checking the host key .* ssh-ed25519"):
        with _driver(profile) as d:
            assert d.run(["echo", "in"]).stdout == "in\n"


def test_wrong_identity_fails_authentication(sshd_server: SshServer, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    keygen(tmp_path / "stranger")
    profile = sshd_server.profile(str(tmp_path / "dev"), identity=str(tmp_path / "stranger"))
    with pytest.raises(ConnectError, match=f"authentication failed for user {sshd_server.user} "
                                           r"\(tried ssh-agent, ~/.ssh keys, .*stranger\)"):
        _driver(profile).open()


def test_missing_identity_file(sshd_server: SshServer, tmp_path: Path) -> None:
    profile = sshd_server.profile(str(tmp_path / "dev"), identity=str(tmp_path / "nokey"))
    with pytest.raises(ProfileError, match=f"identity file {tmp_path / 'nokey'} does not exist"):
        _driver(profile).open()


def test_connection_refused(sshd_server: SshServer, tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    profile = sshd_server.profile(str(tmp_path / "dev"))
    profile = dataclasses.replace(profile, address=f"{sshd_server.user}@127.0.0.1:{port}")
    with pytest.raises(ConnectError, match=f"connection refused by 127.0.0.1 port {port}"):
        _driver(profile).open()


def test_silent_server_hits_the_connect_timeout(sshd_server: SshServer, tmp_path: Path) -> None:
    with socket.socket() as mute:  # accepts TCP (backlog) but never says a word
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)
        port = mute.getsockname()[1]
        profile = sshd_server.profile(str(tmp_path / "dev"))
        profile = dataclasses.replace(profile, connect_timeout=0.5,
                                      address=f"{sshd_server.user}@127.0.0.1:{port}")
        with pytest.raises(ConnectError, match=rf"127.0.0.1 port {port} did not answer within "
                                               r"0.5 s \(connect timeout\)"):
            _driver(profile).open()


# --- a server that dies ------------------------------------------------------------------------
def _killer(server: SshServer) -> tuple[list[int], Callable[[int], None]]:
    """A progress callback that kills the server's sessions once a megabyte has moved, and the
    byte counts it saw."""
    seen: list[int] = []

    def kill_after_first_megabyte(n: int) -> None:
        seen.append(n)
        if sum(seen) >= MB and server.session_pids():
            server.kill_sessions()

    return seen, kill_after_first_megabyte


# Downloads stream over an exec channel, with no helper thread (paramiko's SFTP prefetch thread
# died with an uncaught exception here): a thread dying now fails the test.
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_server_killed_during_get(sshd_factory, tmp_path: Path) -> None:
    server: SshServer = sshd_factory()
    profile = server.profile(str(tmp_path / "dev"))
    remote = tmp_path / "dev" / "big.bin"
    remote.parent.mkdir()
    _random_file(remote, 48 * MB)
    dest = tmp_path / "out" / "big.bin"
    seen, kill_after_first_megabyte = _killer(server)
    with _driver(profile) as d:
        with pytest.raises(DeviceError, match=f"connection lost while fetching {remote}"):
            d.get(str(remote), dest, progress=kill_after_first_megabyte)
        assert MB <= sum(seen) < 48 * MB
        with pytest.raises(ConnectError, match=r"connection lost \(running true\)"):
            d.run(["true"])
    assert not dest.exists() and not dest.parent.exists()  # nor the folder made for it


def test_server_killed_during_put(sshd_factory, tmp_path: Path) -> None:
    server: SshServer = sshd_factory()
    profile = server.profile(str(tmp_path / "dev"))
    src = tmp_path / "big.bin"
    _random_file(src, 48 * MB)
    _, kill_after_first_megabyte = _killer(server)
    with _driver(profile) as d:
        d.makedirs(d.base_dir)
        remote = posixpath.join(d.base_dir, "big.bin")
        with pytest.raises(TransferError, match=f"connection lost while copying {src} to "
                                                f"{remote}.part-"):
            d.put(src, remote, progress=kill_after_first_megabyte)
        assert d.stats.files_put == 0
    assert not Path(remote).exists()


def test_server_killed_during_a_command(sshd_factory, tmp_path: Path) -> None:
    server: SshServer = sshd_factory()
    with _driver(server.profile(str(tmp_path / "dev"))) as d:
        own_sshd = server.session_pids()  # this connection's sshd processes, nothing else yet
        assert own_sshd
        with pytest.raises(ConnectError, match="connection lost while running kill"):
            d.run(["kill", "-KILL", *map(str, own_sshd)])
