"""The contract every driver passes, run against each real transport: put, get, run, timeout,
missing file, dead peer. local, ssh (real sshd), adb with and without the shell protocol (real
adb server + device end). A third-party driver can be checked by adding it to DRIVERS."""

from __future__ import annotations

import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures_ssh import process_alive

from verify.devices import Profile
from verify.drivers import make_driver
from verify.drivers import base
from verify.drivers.base import Driver
from verify.errors import EXIT_DEVICE, DeviceError, DeviceTimeout, OutputError, TransferError
from verify.files import umask

DRIVERS = ["local", "ssh", "adb", "adb-v1"]


@dataclass
class Target:
    profile: Profile
    kill: Callable[[], None] | None  # makes the peer vanish (None: there is no peer)


def _target(kind: str, request: pytest.FixtureRequest, tmp_path: Path, own: bool) -> Target:
    """A device of that kind; `own` gives it a server/device end of its own that may be killed."""
    if kind == "local":
        return Target(Profile(name="local", transport="local", base_dir=str(tmp_path / "dev"),
                              python=(sys.executable,)), None)
    if kind == "ssh":
        server = request.getfixturevalue("sshd_factory")() if own \
            else request.getfixturevalue("sshd_server")
        return Target(server.profile(str(tmp_path / "dev")), server.kill_sessions)
    from fixtures_adb import adb_profile_for

    server = request.getfixturevalue("adb_server")
    if own:
        device = server.attach(tmp_path / "own-sandbox", shell_v2=kind == "adb")
        request.addfinalizer(lambda: server.detach(device))
    else:
        device = request.getfixturevalue("adb_device" if kind == "adb" else "adb_device_v1")
    base = device.sandbox / f"c-{secrets.token_hex(4)}" / "verify"
    return Target(adb_profile_for(server, device, base), device.kill)


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)
    with make_driver(_target(request.param, request, tmp_path, own=False).profile) as d:
        d.makedirs(d.base_dir)
        yield d


def test_put_get_round_trip_with_progress(driver: Driver, tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 17)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    remote = f"{driver.base_dir}/sub/dir/file.bin"
    driver.makedirs(f"{driver.base_dir}/sub/dir")
    pushed: list[int] = []
    driver.put(src, remote, progress=pushed.append)
    pulled: list[int] = []
    back = tmp_path / "back" / "file.bin"
    driver.get(remote, back, progress=pulled.append)
    assert back.read_bytes() == data
    assert sum(pushed) == sum(pulled) == len(data)
    assert (driver.stats.files_put, driver.stats.bytes_put) == (1, len(data))
    assert (driver.stats.files_got, driver.stats.bytes_got) == (1, len(data))
    assert [p.name for p in back.parent.iterdir()] == ["file.bin"]  # no temp file left


def test_get_with_move_hands_the_file_over(driver: Driver, tmp_path: Path) -> None:
    """get(move=True) is a get for a file the device no longer needs: same bytes, same
    permissions and bookkeeping; a missing file is a TransferError, nothing left behind."""
    data = os.urandom((1 << 20) + 5)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    remote = f"{driver.base_dir}/m/file.npy"
    driver.makedirs(f"{driver.base_dir}/m")
    driver.put(src, remote)
    back = tmp_path / "moved" / "file.npy"
    pulled: list[int] = []
    driver.get(remote, back, progress=pulled.append, move=True)
    assert back.read_bytes() == data and sum(pulled) == len(data)
    assert back.stat().st_mode & 0o777 == 0o666 & ~umask()  # as a copy would have it
    assert (driver.stats.files_got, driver.stats.bytes_got) == (1, len(data))
    assert [p.name for p in back.parent.iterdir()] == ["file.npy"]
    with pytest.raises(TransferError):
        driver.get(f"{driver.base_dir}/m/none.npy", tmp_path / "moved" / "none.npy", move=True)
    assert [p.name for p in back.parent.iterdir()] == ["file.npy"]


def test_local_move_is_a_rename_on_one_file_system_and_a_copy_across(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local transport renames (the work directory's file is gone, the inode is the same),
    straight onto the destination: one rename, no temporary file beside it (a dump pulls
    hundreds of files); a folder in the way is the copy's one-line error, and across file
    systems it falls back to a copy (/dev/shm is a tmpfs beside the disk)."""
    profile = Profile(name="local", transport="local", base_dir=str(tmp_path / "dev"),
                      python=(sys.executable,))
    with make_driver(profile) as d:
        d.makedirs(d.base_dir)
        remote = Path(d.base_dir) / "a.npy"
        remote.write_bytes(b"x" * 4096)
        remote.chmod(0o600)
        inode = remote.stat().st_ino
        with monkeypatch.context() as m:
            m.setattr(base, "atomic_path", None)  # a temporary file would be a TypeError
            d.get(str(remote), tmp_path / "a.npy", move=True)
        assert not remote.exists() and (tmp_path / "a.npy").stat().st_ino == inode
        assert (tmp_path / "a.npy").stat().st_mode & 0o777 == 0o666 & ~umask()
        assert (d.stats.files_got, d.stats.bytes_got) == (1, 4096)
        remote.write_bytes(b"z" * 10)
        (tmp_path / "folder.npy").mkdir()
        with pytest.raises(OutputError, match="is a folder"):
            d.get(str(remote), tmp_path / "folder.npy", move=True)
        assert remote.read_bytes() == b"z" * 10  # still on the device
        shm = Path("/dev/shm")
        if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
            pytest.skip("no second file system here to move across")
        remote.write_bytes(b"y" * 4096)
        with tempfile.TemporaryDirectory(dir=shm) as other:
            d.get(str(remote), Path(other) / "b.npy", move=True)
            assert (Path(other) / "b.npy").read_bytes() == b"y" * 4096


def test_push_cached_sends_once(driver: Driver, tmp_path: Path) -> None:
    src = tmp_path / "model.onnx"
    src.write_bytes(os.urandom(1000))
    copy = tmp_path / "renamed.onnx"
    copy.write_bytes(src.read_bytes())
    first = driver.push_cached(src)
    assert driver.push_cached(copy) == first and driver.exists(first)
    assert (driver.stats.files_put, driver.stats.files_cached) == (1, 1)


def test_push_cached_from_memory_writes_the_file_only_when_sending(driver: Driver,
                                                                  tmp_path: Path) -> None:
    data = os.urandom(2000)
    first, second = tmp_path / "a" / "m.onnx", tmp_path / "b" / "m.onnx"
    first.parent.mkdir()
    second.parent.mkdir()
    remote = driver.push_cached(first, data=data)
    assert first.read_bytes() == data and driver.exists(remote)
    assert driver.push_cached(second, data=data) == remote
    assert not second.exists()  # the device had the bytes: nothing written, nothing sent
    assert (driver.stats.files_put, driver.stats.files_cached) == (1, 1)
    assert remote == driver.push_cached(first)  # the same name as hashing the file


def test_run_status_output_env_and_cwd(driver: Driver) -> None:
    work = driver.make_workdir()
    code = ("import os, sys; print(sys.argv[1:]); print(os.getcwd()); print(os.environ['V']); "
            "sys.stderr.write('warn\\n'); sys.exit(3)")
    res = driver.run([sys.executable, "-c", code, "a b", "$HOME", "'q'", ";rm -rf /"],
                     env={"V": "x y"}, cwd=work, check=False)
    assert res.status == 3
    lines = res.stdout.splitlines()
    assert (lines[0], lines[2]) == (str(["a b", "$HOME", "'q'", ";rm -rf /"]), "x y")
    assert lines[1] in (work, os.path.realpath(work))
    assert res.stderr.rstrip("\n") == "warn"  # adb without shell_v2 loses trailing newlines
    with pytest.raises(DeviceError) as info:
        driver.run([sys.executable, "-c", code, "x"], env={"V": "1"})
    assert info.value.exit_code == EXIT_DEVICE and "exited with status 3: warn" in str(info.value)
    driver.remove(work)
    assert not driver.exists(work)


def test_timeout_stops_the_command(driver: Driver, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    started = time.monotonic()
    with pytest.raises(DeviceTimeout, match="did not finish within 1 s"):
        driver.run([sys.executable, "-c", code], timeout=1)
    assert time.monotonic() - started < 30
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(pid)
    assert driver.run(["echo", "still usable"]).stdout == "still usable\n"


def test_get_of_a_missing_file(driver: Driver, tmp_path: Path) -> None:
    dest = tmp_path / "out" / "x.npy"
    with pytest.raises(TransferError) as info:
        driver.get(f"{driver.base_dir}/no/such.npy", dest)
    assert info.value.exit_code == EXIT_DEVICE and "no/such.npy" in str(info.value)
    assert not dest.exists() and not dest.parent.exists()  # nor the folder made for it
    assert not driver.exists(f"{driver.base_dir}/no/such.npy")


@pytest.mark.parametrize("kind", DRIVERS)
def test_dead_peer_is_a_device_error(kind: str, request: pytest.FixtureRequest, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)
    target = _target(kind, request, tmp_path, own=True)
    if target.kill is None:
        pytest.skip("the local transport has no peer that could die")
    with make_driver(target.profile) as d:
        assert d.run(["true"]).status == 0
        target.kill()
        with pytest.raises(DeviceError) as info:
            d.run(["echo", "anyone there?"], timeout=20)
        assert info.value.exit_code == EXIT_DEVICE


def _age(path: str, seconds: float) -> None:
    """Set a device file's last use `seconds` back (every device here keeps its files on
    this host's file system, under the test's folder)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_cache_evicts_least_recently_used_and_partial_transfers(driver: Driver,
                                                                tmp_path: Path) -> None:
    cached = []
    for i, age in enumerate((300, 100, 200)):
        src = tmp_path / f"f{i}.bin"
        src.write_bytes(bytes([i]) * (1 << 20))
        cached.append(driver.push_cached(src))
        _age(cached[-1], age)
    part = f"{driver.cache_dir}/{'0' * 64}.npy.part-1a2b3c4d"
    Path(part).write_bytes(b"cut off")
    assert driver.cache_usage() == {"files": 3, "bytes": 3 * (1 << 20) + 7,
                                    "partial_transfers": 1}
    removed = driver.evict(2 * (1 << 20) + 100)  # room for two: the oldest goes
    assert sorted(f.path for f in removed) == sorted([cached[0], part])
    assert sorted(f.path for f in driver.cache_files()) == sorted(cached[1:])
    assert [f.path for f in driver.evict(0)] and driver.cache_files() == []


def test_a_stale_partial_transfer_goes_on_the_next_push(driver: Driver, tmp_path: Path) -> None:
    driver.makedirs(driver.cache_dir)
    stale, fresh = (f"{driver.cache_dir}/{c * 64}.onnx.part-00000000" for c in "ab")
    for path in (stale, fresh):
        Path(path).write_bytes(b"half")
    _age(stale, 3600)  # a transfer under way keeps writing: `fresh` is left alone
    src = tmp_path / "model.onnx"
    src.write_bytes(b"model bytes")
    driver.push_cached(src)
    assert not driver.exists(stale) and driver.exists(fresh)


def test_a_cache_hit_counts_as_a_use(tmp_path: Path) -> None:
    profile = _target("local", None, tmp_path, own=False).profile  # type: ignore[arg-type]
    src = tmp_path / "runner.py"
    src.write_text("print()\n")
    with make_driver(profile) as d:
        remote = d.push_cached(src)
    _age(remote, 1000)
    with make_driver(profile) as d:
        assert d.push_cached(src) == remote and d.stats.files_cached == 1
    assert time.time() - os.stat(remote).st_mtime < 60


def test_devices_check_shows_the_cache_and_clean_keep_mb_trims_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from helpers_cli import verify

    (tmp_path / "box.toml").write_text(f'transport = "local"\nbase_dir = "{tmp_path / "dev"}"\n')
    monkeypatch.setenv("VERIFY_DEVICES", str(tmp_path))
    cache = tmp_path / "dev" / "cache"
    cache.mkdir(parents=True)
    for i, age in enumerate((30, 10, 20)):
        (cache / f"{i}.bin").write_bytes(bytes(1 << 20))
        _age(str(cache / f"{i}.bin"), age)
    (cache / "x.bin.part-00000000").write_bytes(b"half")
    code, out, _ = verify(capsys, "devices", "check", "box")
    assert code == 0
    # the three files, and the runner check itself pushed (just used: it stays)
    from verify.runner_files import runner_file

    mb = (3 * (1 << 20) + runner_file().stat().st_size + 4) / (1 << 20)
    assert re.search(rf"^  cache +{mb:.1f} MB in 4 file\(s\), 1 partial transfer\(s\) \(trim "
                     r"it: verify devices clean SPEC --keep-mb N\)$", out, re.M), out
    code, out, _ = verify(capsys, "devices", "clean", "box", "--keep-mb", "2.5")
    assert code == 0
    assert out.splitlines()[-1] == ("device box: cache trimmed to at most 2.5 MB (2 file(s) "
                                    "removed)")
    assert sorted(p.suffix for p in cache.iterdir()) == [".bin", ".bin", ".pyz"]
    assert not (cache / "0.bin").exists()
    code, _, err = verify(capsys, "devices", "clean", "box", "--keep-mb", "-1")
    assert (code, err.strip()) == (2, "error: --keep-mb -1: expected a number of MB >= 0")


def test_a_download_onto_a_full_host_disk_is_one_output_line(driver: Driver,
                                                            tmp_path: Path) -> None:
    """A full disk on the host while fetching is the user's side, on every transport: the one
    OutputError line (exit 2) the local driver gives, naming the file; no temp file left."""
    from test_os_conditions import tmpfs

    from verify.errors import EXIT_USAGE, OutputError

    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(1 << 20))
    remote = f"{driver.base_dir}/big.bin"
    driver.put(src, remote)
    with tmpfs(tmp_path / "full", size="256k") as full:
        dest = full / "out" / "big.bin"
        with pytest.raises(OutputError) as info:
            driver.get(remote, dest)
        assert info.value.exit_code == EXIT_USAGE
        assert str(info.value) == f"{dest}: cannot write: No space left on device"
        assert list(full.iterdir()) == []  # the temp file and the folder made for it are gone


def test_a_local_copy_that_fails_names_the_profile(tmp_path: Path) -> None:
    """A full or unwritable work folder of a local profile named as the user named it (the
    error said "local" for every local profile)."""
    profile = Profile(name="pysmall", transport="local", base_dir=str(tmp_path / "dev"),
                      python=(sys.executable,))
    src = tmp_path / "x.npy"
    src.write_bytes(b"x")
    with make_driver(profile) as d:
        d.makedirs(d.base_dir)
        (Path(d.base_dir) / "blocker").write_text("a file, not a folder")
        with pytest.raises(TransferError) as info:
            d.put(src, f"{d.base_dir}/blocker/x.npy")
    assert str(info.value).startswith("pysmall (local): copying ") and "failed: " in str(info.value)
