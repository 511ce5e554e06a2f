"""`ssh:ALIAS` through the user's OpenSSH client config, ProxyJump included, against real sshds on
loopback: a jump host (TCP forwarding on, debug log) and the device behind it.

Both sshds listen on 127.0.0.1, so "through the jump host" is proved, not assumed: while the
driver is connected, the TCP connection to the device's port belongs to a process of the jump
sshd and to none of this test process, and the jump sshd's log records the forwarding. HOME
points at a temp folder holding .ssh/config and .ssh/known_hosts; the user's own ~/.ssh is
never read.
"""

from __future__ import annotations

import os
import posixpath
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("paramiko",
                    reason="the ssh extra is not installed: pip install 'onnx-verify[ssh]'")

from fixtures_ssh import SshServer  # noqa: E402
from helpers_cli import only_line, verify  # noqa: E402
from verify.devices import Profile  # noqa: E402
from verify.drivers import make_driver  # noqa: E402
from verify.drivers.ssh_route import route  # noqa: E402
from verify.errors import EXIT_DEVICE, ConnectError, ProfileError, UsageError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of its own with an empty ~/.ssh; no agent, no config override."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.delenv("VERIFY_SSH_CONFIG", raising=False)
    return home


def _host_block(alias: str, server: SshServer, *lines: str) -> str:
    return "\n".join([f"Host {alias}", "  HostName 127.0.0.1", f"  Port {server.port}",
                      f"  User {server.user}", f"  IdentityFile {server.client_key}",
                      *(f"  {line}" for line in lines), ""])


def _write(home: Path, config: str, *known: SshServer) -> None:
    (home / ".ssh" / "config").write_text(config)
    (home / ".ssh" / "known_hosts").write_text(
        "".join(f"{s.host_entry} {s.host_key}\n" for s in known))


def _alias_profile(alias: str, base_dir: Path) -> Profile:
    """What `ssh:ALIAS` resolves to, with a private base_dir."""
    return Profile(name=f"ssh:{alias}", transport="ssh", address=alias, base_dir=str(base_dir),
                   python=(sys.executable,))


def _owners_of_connections_to(port: int) -> set[int]:
    """Pids holding an established TCP connection whose far end is 127.0.0.1:port."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if state == "01" and remote == f"0100007F:{port:04X}":
            inodes.add(f"socket:[{inode}]")
    owners = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    owners.add(int(proc.name))
            except OSError:
                pass
    return owners


def _forwarded(jump: SshServer, port: int) -> bool:
    """The jump sshd (LogLevel DEBUG1) logged a direct-tcpip request to 127.0.0.1:port."""
    return re.search(rf"server_request_direct_tcpip: originator .* target 127\.0\.0\.1 port "
                     rf"{port}$", jump.log_text(), re.M) is not None


@pytest.fixture
def jump_and_board(sshd_factory) -> tuple[SshServer, SshServer]:
    jump = sshd_factory(forwarding=True, log_level="DEBUG1")
    board = sshd_factory()
    return jump, board


def test_alias_with_proxyjump_goes_through_the_jump_host(home: Path, tmp_path: Path,
                                                         jump_and_board) -> None:
    jump, board = jump_and_board
    _write(home, _host_block("jumpbox", jump) + _host_block("myboard", board, "ProxyJump jumpbox"),
           jump, board)
    with make_driver(_alias_profile("myboard", tmp_path / "dev")) as d:
        assert [h.name for h in d.route] == ["jumpbox", "myboard"]
        assert d.run(["echo", "hello from", "myboard"]).stdout == "hello from myboard\n"
        owners = _owners_of_connections_to(board.port)
        assert owners and owners <= set(jump.session_pids()), (owners, jump.session_pids())
        assert os.getpid() not in owners
        src = tmp_path / "in.bin"
        src.write_bytes(os.urandom(300_000))
        remote = posixpath.join(d.base_dir, "in.bin")
        d.makedirs(d.base_dir)
        d.put(src, remote)
        d.get(remote, tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    assert _forwarded(jump, board.port), jump.log_text()[-2000:]


def test_two_jump_hosts_in_one_proxyjump(home: Path, tmp_path: Path, sshd_factory) -> None:
    first = sshd_factory(forwarding=True, log_level="DEBUG1")
    second = sshd_factory(forwarding=True, log_level="DEBUG1")
    board = sshd_factory()
    _write(home, _host_block("j1", first) + _host_block("j2", second)
           + _host_block("myboard", board, "ProxyJump j1,j2"), first, second, board)
    with make_driver(_alias_profile("myboard", tmp_path / "dev")) as d:
        assert [h.name for h in d.route] == ["j1", "j2", "myboard"]
        assert d.run(["true"]).status == 0
        assert _owners_of_connections_to(second.port) <= set(first.session_pids())
        assert _owners_of_connections_to(board.port) <= set(second.session_pids())
        assert _owners_of_connections_to(board.port)
    assert _forwarded(first, second.port) and _forwarded(second, board.port)
    assert not _forwarded(first, board.port)


def test_an_unknown_jump_host_key_is_refused_even_with_strict_checking_off(
        home: Path, tmp_path: Path, jump_and_board) -> None:
    jump, board = jump_and_board
    _write(home, _host_block("jumpbox", jump, "StrictHostKeyChecking no")
           + _host_block("myboard", board, "ProxyJump jumpbox"), board)  # the jump's key: absent
    known = home / ".ssh" / "known_hosts"
    with pytest.raises(ConnectError) as info:
        make_driver(_alias_profile("myboard", tmp_path / "dev")).open()
    assert str(info.value).startswith(
        f"ssh:myboard: jump host jumpbox (127.0.0.1) port {jump.port}: host key not in {known}; "
        f"add it with ssh-keyscan -p {jump.port} 127.0.0.1 >> {known}")
    assert "StrictHostKeyChecking no in the ssh config is not honoured" in str(info.value)
    assert "Accepted publickey" not in board.log_text()  # never got past the jump host


def test_an_unknown_device_key_behind_a_known_jump_host_is_refused(
        home: Path, tmp_path: Path, jump_and_board) -> None:
    jump, board = jump_and_board
    _write(home, _host_block("jumpbox", jump) + _host_block("myboard", board, "ProxyJump jumpbox"),
           jump)
    with pytest.raises(ConnectError, match=rf"^ssh:myboard: host key not in .*known_hosts; add it "
                                           rf"with ssh-keyscan -p {board.port} 127.0.0.1"):
        make_driver(_alias_profile("myboard", tmp_path / "dev")).open()


def test_a_changed_jump_host_key_is_refused(home: Path, tmp_path: Path, jump_and_board,
                                            sshd_server: SshServer) -> None:
    jump, board = jump_and_board
    _write(home, _host_block("jumpbox", jump) + _host_block("myboard", board, "ProxyJump jumpbox"),
           board)
    with open(home / ".ssh" / "known_hosts", "a") as fh:  # another server's key under its name
        fh.write(f"{jump.host_entry} {sshd_server.host_key}\n")
    with pytest.raises(ConnectError, match=rf"^ssh:myboard: jump host jumpbox \(127.0.0.1\) port "
                                           rf"{jump.port}: the host key changed"):
        make_driver(_alias_profile("myboard", tmp_path / "dev")).open()


def test_a_jump_host_without_forwarding_says_so(home: Path, tmp_path: Path,
                                                sshd_factory) -> None:
    jump, board = sshd_factory(), sshd_factory()  # AllowTcpForwarding no
    _write(home, _host_block("jumpbox", jump) + _host_block("myboard", board, "ProxyJump jumpbox"),
           jump, board)
    with pytest.raises(ConnectError, match=rf"^ssh:myboard: jump host jumpbox \(127.0.0.1\) port "
                                           rf"{jump.port} could not open a tunnel to 127.0.0.1 "
                                           rf"port {board.port}: .*AllowTcpForwarding"):
        make_driver(_alias_profile("myboard", tmp_path / "dev")).open()


def test_cli_devices_check_and_run_through_the_alias(home: Path, jump_and_board,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    jump, board = jump_and_board
    _write(home, _host_block("jumpbox", jump) + _host_block("myboard", board, "ProxyJump jumpbox"),
           jump, board)
    code, out, err = verify(capsys, "devices", "check", "ssh:myboard")
    assert code == 0, err
    assert re.search(r"transfers\s+sftp \(large downloads: cat over exec\)", out), out
    code, out, err = verify(capsys, "run", REPO / "goldens" / "testcases" / "cnn.vtc",
                            "--device", "ssh:myboard", "--iter", "2")
    assert code == 0, err
    assert "=== PASS" in out
    code, out, err = verify(capsys, "devices", "clean", "ssh:myboard")
    assert code == 0 and f"removed /tmp/verify-{board.user}/cache" in out
    assert _forwarded(jump, board.port)


def test_cli_unknown_alias_is_a_one_line_device_error(home: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _write(home, "Host myboard\n  HostName no-such-host.invalid\n")
    code, _, err = verify(capsys, "devices", "check", "ssh:myboard")
    assert code == EXIT_DEVICE
    assert only_line(err).startswith("error: ssh:myboard: cannot resolve host no-such-host.invalid")


# --- the route alone (no server) ---------------------------------------------------------------
def test_spec_values_win_over_the_config_and_missing_key_files_are_skipped(home: Path) -> None:
    key = home / ".ssh" / "board_key"
    key.write_text("not really a key")
    _write(home, "Host board\n  HostName 192.0.2.7\n  User pi\n  Port 2222\n"
                 f"  IdentityFile {key}\n  IdentityFile ~/.ssh/absent_key\n"
                 "  IdentitiesOnly yes\n  UserKnownHostsFile ~/kh1 ~/kh2\n")
    (hop,) = route("board", {})
    assert (hop.host, hop.user, hop.port) == ("192.0.2.7", "pi", 2222)
    assert hop.identities == (key,) and hop.identities_only
    assert hop.known_hosts == (home / "kh1", home / "kh2")
    (hop,) = route("me@board:22", {"known_hosts": "/tmp/kh", "identity": "~/id"})
    assert (hop.host, hop.user, hop.port) == ("192.0.2.7", "me", 22)
    assert hop.identities == (home / "id", key) and hop.known_hosts == (Path("/tmp/kh"),)
    (hop,) = route("other", {})
    assert (hop.host, hop.port, hop.known_hosts) == ("other", 22,
                                                     (home / ".ssh" / "known_hosts",))


def test_jump_chains_expand_as_ssh_does(home: Path) -> None:
    _write(home, "Host a\n  HostName 192.0.2.1\n  ProxyJump bastion\n"
                 "Host b\n  HostName 192.0.2.2\n  ProxyJump ignored-for-a-later-jump\n"
                 "Host board\n  ProxyJump a,ssh://eve@b:2200\n")
    hops = route("board", {})
    assert [(h.name, h.host, h.port) for h in hops] == [
        ("bastion", "bastion", 22), ("a", "192.0.2.1", 22), ("b", "192.0.2.2", 2200),
        ("board", "board", 22)]
    assert hops[2].user == "eve"


def test_config_file_choice_include_and_refusals(home: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (home / ".ssh" / "boards.conf").write_text("Host board\n  HostName 192.0.2.9\n")
    _write(home, "Include boards.conf\nHost loop\n  ProxyJump loop2\nHost loop2\n"
                 "  ProxyJump loop\nHost pc\n  ProxyCommand nc %h %p\n")
    assert route("board", {})[0].host == "192.0.2.9"
    assert route("board", {"ssh_config": "none"})[0].host == "board"
    monkeypatch.setenv("VERIFY_SSH_CONFIG", "none")
    assert route("board", {})[0].host == "board"
    other = tmp_path / "other.conf"
    other.write_text("Host board\n  HostName 192.0.2.10\n")
    assert route("board", {"ssh_config": str(other)})[0].host == "192.0.2.10"
    with pytest.raises(ProfileError, match=r"ssh config .*nope.conf does not exist "
                                           r"\(options.ssh_config; 'none' reads no config\)"):
        route("board", {"ssh_config": str(tmp_path / "nope.conf")})
    monkeypatch.delenv("VERIFY_SSH_CONFIG")
    with pytest.raises(ProfileError, match="ProxyJump"):
        route("loop", {})
    with pytest.raises(ProfileError, match="pc uses ProxyCommand, which verify does not run"):
        route("pc", {})
    with pytest.raises(UsageError, match="expected ssh:user@host"):
        route("me@board:99999", {})
