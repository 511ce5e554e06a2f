"""A real sshd without an SFTP subsystem (no `Subsystem sftp` line): files travel over exec
channels (`cat`), quoted, atomically renamed, cached, size- and sha256-checked; `verify run`,
a layer dump and `verify devices check` work through it. A second sshd puts lying `sha256sum`
and `wc` first on the session's PATH (SetEnv), so the checks are seen to fail."""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("paramiko",
                    reason="the ssh extra is not installed: pip install 'onnx-verify[ssh]'")

from fixtures_devices import DeviceEnv  # noqa: E402
from fixtures_dump import pack  # noqa: E402
from fixtures_ssh import SshServer, start_sshd  # noqa: E402
from helpers_cli import verify  # noqa: E402
from verify.compare import ToleranceSet  # noqa: E402
from verify.diff import diff_captures  # noqa: E402
from verify.drivers import make_driver  # noqa: E402
from verify.dump import open_dump  # noqa: E402
from verify.errors import TransferError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def no_sftp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    server = start_sshd(tmp_path_factory.mktemp("sshd-nosftp"), sftp=False)
    try:
        yield server
    finally:
        server.stop()


def _liar(tmp_path: Path, sshd_factory, tool: str, output: str) -> SshServer:
    """An sftp-less sshd whose sessions find a `tool` that prints `output` first on PATH."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    script = fake / tool
    script.write_text(f"#!/bin/sh\ncat >/dev/null\necho '{output}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return sshd_factory(sftp=False, extra=(f"SetEnv PATH={fake}:/usr/local/bin:/usr/bin:/bin",))


def test_the_server_really_has_no_sftp(no_sftp: SshServer, tmp_path: Path) -> None:
    import paramiko

    client = paramiko.SSHClient()
    client.load_system_host_keys(str(no_sftp.known_hosts))
    client.connect("127.0.0.1", no_sftp.port, username=no_sftp.user,
                   key_filename=str(no_sftp.client_key), allow_agent=False, look_for_keys=False)
    try:
        with pytest.raises(paramiko.SSHException):
            client.open_sftp()
    finally:
        client.close()


def test_round_trip_cache_and_file_ops_over_exec(no_sftp: SshServer, tmp_path: Path) -> None:
    with make_driver(no_sftp.profile(str(tmp_path / "dev"))) as d:
        assert d.transfer_method() == "cat over exec (the server has no sftp subsystem)"
        d.makedirs(posixpath.join(d.base_dir, "a", "b"))
        assert d.exists(posixpath.join(d.base_dir, "a", "b"))
        src = tmp_path / "in.bin"
        data = os.urandom(3 << 20)
        src.write_bytes(data)
        # A name a shell would act on if it were not quoted.
        remote = posixpath.join(d.base_dir, "a", "b", "it's $(touch pwned) `x`; a b.bin")
        sent: list[int] = []
        d.put(src, remote, progress=sent.append)
        assert sum(sent) == len(data) and Path(remote).read_bytes() == data
        assert not list(Path(remote).parent.glob("*.part-*"))
        got: list[int] = []
        d.get(remote, tmp_path / "out" / "back.bin", progress=got.append)
        assert (tmp_path / "out" / "back.bin").read_bytes() == data and sum(got) == len(data)
        assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
        assert not any(p.name == "pwned" for p in (tmp_path / "dev").rglob("*"))
        empty = tmp_path / "empty.bin"
        empty.write_bytes(b"")
        d.put(empty, posixpath.join(d.base_dir, "empty.bin"))
        d.get(posixpath.join(d.base_dir, "empty.bin"), tmp_path / "empty-back.bin")
        assert (tmp_path / "empty-back.bin").read_bytes() == b""
        first = d.push_cached(src)
        again = d.push_cached(src)
        assert first == again and d.stats.files_cached == 1 and d.stats.files_put == 3


def test_missing_file_and_bad_destination_are_one_line_errors(no_sftp: SshServer,
                                                             tmp_path: Path) -> None:
    with make_driver(no_sftp.profile(str(tmp_path / "dev"))) as d:
        d.makedirs(d.base_dir)
        missing = posixpath.join(d.base_dir, "nope.npy")
        dest = tmp_path / "out" / "x.npy"
        with pytest.raises(TransferError, match=rf"fetching {missing} failed: No such file"):
            d.get(missing, dest)
        assert not dest.exists() and not dest.parent.exists()  # nor the folder made for it
        src = tmp_path / "in.bin"
        src.write_bytes(b"x" * 1000)
        blocker = posixpath.join(d.base_dir, "file")
        d.put(src, blocker)
        with pytest.raises(TransferError, match=rf"copying {src} to {blocker}/x.bin.part-\w+ "
                                                r"failed: Not a directory$"):
            d.put(src, posixpath.join(blocker, "x.bin"))
        assert d.run(["true"]).status == 0  # the connection survived


def test_a_wrong_digest_fails_both_directions(tmp_path: Path, sshd_factory) -> None:
    server = _liar(tmp_path, sshd_factory, "sha256sum", "0" * 64 + "  -")
    with make_driver(server.profile(str(tmp_path / "dev"))) as d:
        d.makedirs(d.base_dir)
        src = tmp_path / "in.bin"
        src.write_bytes(os.urandom(100_000))
        remote = posixpath.join(d.base_dir, "in.bin")
        with pytest.raises(TransferError, match=r"copying .* failed: sha256 differs: \w+… here, "
                                                r"0000000000000000… on the device"):
            d.put(src, remote)
        assert not os.path.exists(remote) and not list(Path(d.base_dir).glob("*.part-*"))
        Path(remote).write_bytes(src.read_bytes())  # put there by hand
        dest = tmp_path / "out" / "in.bin"
        with pytest.raises(TransferError, match=rf"fetching {remote} failed: sha256 differs"):
            d.get(remote, dest)
        assert not dest.exists() and not dest.parent.exists()  # nor the folder made for it


def test_a_wrong_size_fails(tmp_path: Path, sshd_factory) -> None:
    server = _liar(tmp_path, sshd_factory, "wc", "7")
    with make_driver(server.profile(str(tmp_path / "dev"))) as d:
        d.makedirs(d.base_dir)
        src = tmp_path / "in.bin"
        src.write_bytes(b"y" * 5000)
        with pytest.raises(TransferError, match=r"failed: 5000 bytes crossed the link but the "
                                                r"file on the device has 7"):
            d.put(src, posixpath.join(d.base_dir, "in.bin"))


def test_cli_check_run_and_dump_without_sftp(no_sftp: SshServer, device_env: DeviceEnv,
                                             tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = device_env.ssh_profile("nosftp", no_sftp, tmp_path / "board")
    code, out, err = verify(capsys, "devices", "check", spec)
    assert code == 0, err
    assert "transfers    cat over exec (the server has no sftp subsystem)" in out
    code, out, err = verify(capsys, "run", REPO / "goldens" / "testcases" / "cnn.vtc",
                            "--device", spec, "--iter", "2")
    assert code == 0, err
    assert "=== PASS" in out
    archive = pack(REPO / "goldens" / "models" / "two_io.onnx", tmp_path / "two_io.vtc",
                   "--layers")
    dump = tmp_path / "dump"
    code, out, err = verify(capsys, "run", archive, "--device", spec, "--iter", "1",
                            "--bin-io-dump", dump, "--dump-budget-mb", "0.001")
    assert code == 0, err
    assert len(open_dump(dump).entries(0)) >= 6
    report = diff_captures(dump, archive, ToleranceSet())
    assert report.passed and len(report.compared) >= 6, report.verdict()
