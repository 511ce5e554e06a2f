"""The adb driver against a real adb server and the device end in tests/adb_device.py.

Every test asserts the exception type and the key words of its message. The first group checks
the device end itself with clients that are not ours (adbutils, the adb command line), so the
driver tests below stand on a device end known to speak the protocol.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import adbutils
import pytest

from adb_device import A_VERSION_MIN, DeviceEndProcess
from fixtures_adb import AdbServer, adb_profile_for, free_port
from verify.devices import Profile
from verify.drivers import make_driver
from verify.drivers.adb import AdbDriver
from verify.errors import (EXIT_DEVICE, EXIT_USAGE, ConnectError, DeviceError, DeviceTimeout,
                           RemoteCommandFailed, TransferError, UsageError)

PYTHON = sys.executable


@pytest.fixture(autouse=True)
def _no_android_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)


@pytest.fixture(params=["shell_v2", "no_shell_v2"])
def any_profile(request: pytest.FixtureRequest) -> Profile:
    """Both shell paths: the shell protocol, and the marker fallback of old devices."""
    return request.getfixturevalue("adb_profile" if request.param == "shell_v2"
                                   else "adb_profile_v1")


def _random_file(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _gone(pid: int) -> bool:
    """Dead: no such process, or a zombie (an orphan waits for PID 1, which may reap lazily)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


# --- the device end, seen by clients that are not ours -----------------------------------------
def test_device_end_serves_adbutils(adb_server: AdbServer, adb_device: DeviceEndProcess) -> None:
    client = adbutils.AdbClient(port=adb_server.port)
    info = {i.serial: i for i in client.list(extended=True)}[adb_device.address]
    assert (info.state, info.tags["model"]) == ("device", "VerifyTest")
    device = client.device(adb_device.address)
    assert {"shell_v2", "stat_v2", "ls_v2", "sendrecv_v2"} <= set(device.get_features().split(","))
    assert device.shell("echo out; echo err >&2") == "out\nerr"  # v1: one merged stream
    result = device.shell2("echo out; echo err >&2; exit 5", v2=True)
    assert (result.returncode, result.stdout, result.stderr) == (5, "out\n", "err\n")

    path = str(adb_device.sandbox / "adbutils" / "file.bin")
    device.sync.push(b"\x00\x01payload", path, mode=0o640)
    assert device.sync.read_bytes(path) == b"\x00\x01payload"
    assert device.sync.stat(path).size == 9
    assert "file.bin" in [e.path for e in device.sync.list(str(Path(path).parent))]
    with pytest.raises(adbutils.AdbError, match="open failed: No such file or directory"):
        device.sync.read_bytes(path + ".missing")


def _sync(device: adbutils.AdbDevice) -> adbutils.AdbConnection:
    conn = device.open_transport()
    conn.send_command("sync:")
    conn.check_okay()
    return conn


def _request(conn: adbutils.AdbConnection, sid: bytes, path: str) -> None:
    conn.conn.sendall(sid + struct.pack("<I", len(path.encode())) + path.encode())


def test_device_end_sync_v2_requests(adb_server: AdbServer, adb_device: DeviceEndProcess) -> None:
    device = adbutils.AdbClient(port=adb_server.port).device(adb_device.address)
    path = str(adb_device.sandbox / "v2" / "data.bin")
    payload = os.urandom(200_000)
    with _sync(device) as conn:
        _request(conn, b"STA2", path)  # missing: the errno comes back in the error field
        reply = conn.read_exact(72)
        assert reply[:4] == b"STA2" and struct.unpack_from("<I", reply, 4)[0] == errno.ENOENT

        _request(conn, b"SND2", path)
        conn.conn.sendall(b"SND2" + struct.pack("<II", 0o100644, 0))
        for at in range(0, len(payload), 65536):
            chunk = payload[at:at + 65536]
            conn.conn.sendall(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
        conn.conn.sendall(b"DONE" + struct.pack("<I", 1_000_000_000))
        assert conn.read_exact(8) == b"OKAY" + bytes(4)
        assert os.stat(path).st_mtime == 1_000_000_000

        _request(conn, b"RCV2", path)
        conn.conn.sendall(b"RCV2" + struct.pack("<I", 0))
        received = b""
        while (head := conn.read_exact(8))[:4] == b"DATA":
            received += conn.read_exact(struct.unpack("<I", head[4:])[0])
        assert head[:4] == b"DONE" and received == payload

        _request(conn, b"LIS2", str(Path(path).parent))
        names = []
        while (head := conn.read_exact(76))[:4] == b"DNT2":
            names.append(conn.read_exact(struct.unpack_from("<I", head, 72)[0]).decode())
        assert sorted(names) == [".", "..", "data.bin"]

        _request(conn, b"SND2", path)  # no compression is advertised, so none is accepted
        conn.conn.sendall(b"SND2" + struct.pack("<II", 0o100644, 1))
        assert conn.read_exact(4) == b"FAIL"
        assert conn.read_exact(conn.read_uint32()) == b"unknown flags: 1"


def test_device_without_shell_v2_refuses_the_shell_protocol(
        adb_server: AdbServer, adb_device_v1: DeviceEndProcess) -> None:
    device = adbutils.AdbClient(port=adb_server.port).device(adb_device_v1.address)
    assert "shell_v2" not in device.get_features().split(",")
    with device.open_transport() as conn:
        conn.send_command("shell,v2,raw:true")
        with pytest.raises(adbutils.AdbError, match="closed"):  # the server's word for CLSE(0, id)
            conn.check_okay()


def test_legacy_protocol_with_checksums_and_small_packets(adb_server: AdbServer,
                                                          tmp_path: Path) -> None:
    """Version 0x01000000 makes both sides checksum every packet; 4 KiB packets split all."""
    device = adb_server.attach(tmp_path / "sandbox", version=A_VERSION_MIN, max_payload=4096)
    try:
        src = _random_file(tmp_path / "src.bin", 300_000)
        dst = device.sandbox / "dst.bin"
        adb_server.adb("-s", device.address, "push", str(src), str(dst))
        assert _sha(dst) == _sha(src)
        back = tmp_path / "back.bin"
        adb_server.adb("-s", device.address, "pull", str(dst), str(back))
        assert _sha(back) == _sha(src)

        profile = adb_profile_for(adb_server, device, device.sandbox / "verify")
        with make_driver(profile) as driver:
            assert driver.run(["printf", "%s", "x" * 10_000]).stdout == "x" * 10_000
            driver.put(src, str(device.sandbox / "via-driver.bin"))
            assert _sha(device.sandbox / "via-driver.bin") == _sha(src)
    finally:
        adb_server.detach(device)


# --- transfers ---------------------------------------------------------------------------------
def test_put_get_round_trip_is_byte_identical(adb_profile: Profile, tmp_path: Path) -> None:
    src = _random_file(tmp_path / "model.onnx", 3 * 1024 * 1024 + 17)
    pushed: list[int] = []
    pulled: list[int] = []
    with make_driver(adb_profile) as driver:
        assert isinstance(driver, AdbDriver)
        remote = driver.make_workdir() + "/model.onnx"
        driver.put(src, remote, progress=pushed.append)
        back = tmp_path / "back" / "model.onnx"
        driver.get(remote, back, progress=pulled.append)
        assert _sha(back) == _sha(src)
        assert sum(pushed) == sum(pulled) == src.stat().st_size
        assert driver.stats.as_dict() == {"bytes_put": src.stat().st_size, "files_put": 1,
                                          "files_cached": 0, "bytes_got": src.stat().st_size,
                                          "files_got": 1}
        assert not [p for p in Path(remote).parent.iterdir() if ".part-" in p.name]


def test_push_cached_sends_once(adb_profile: Profile, tmp_path: Path) -> None:
    src = _random_file(tmp_path / "a" / "runner.py", 100_000)
    same = tmp_path / "b" / "other-name.py"
    same.parent.mkdir()
    same.write_bytes(src.read_bytes())
    with make_driver(adb_profile) as driver:
        first = driver.push_cached(src)
        assert driver.push_cached(src) == first
        assert driver.push_cached(same) == first
        assert (driver.stats.files_put, driver.stats.files_cached) == (1, 2)
        assert _sha(Path(first)) == _sha(src)


def test_get_of_a_missing_file_names_the_reason(adb_profile: Profile, tmp_path: Path) -> None:
    local = tmp_path / "out.bin"
    with make_driver(adb_profile) as driver:
        with pytest.raises(TransferError, match=r"fetching .*/missing\.bin failed: open failed: "
                                                r"No such file or directory"):
            driver.get(driver.base_dir + "/missing.bin", local)
    assert list(tmp_path.iterdir()) == []


def test_put_refused_by_the_device_names_its_reason(adb_profile: Profile, tmp_path: Path) -> None:
    src = _random_file(tmp_path / "x.bin", 200_000)
    with make_driver(adb_profile) as driver:
        blocker = driver.make_workdir() + "/plain-file"
        driver.run(["touch", blocker])
        with pytest.raises(TransferError, match="pushing .* failed: couldn't create file: "
                                                "Not a directory"):
            driver.put(src, blocker + "/x.bin")


# --- commands ----------------------------------------------------------------------------------
AWKWARD_ARGS = ["a b", "it's", '"quoted"', "$(echo nope)", "`echo nope`", "a;b", "x && y", "*",
                "\\", "new\nline", "", "-n", "$HOME", "tab\there", "ünï"]


def test_argv_arrives_literally(any_profile: Profile) -> None:
    with make_driver(any_profile) as driver:
        result = driver.run([PYTHON, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))",
                             *AWKWARD_ARGS])
    assert json.loads(result.stdout) == AWKWARD_ARGS


def test_long_command_travels_as_a_script(any_profile: Profile) -> None:
    """An OPEN longer than the device's packet would abort adb 29's server; a script it is."""
    long_arg = "y" * 100_000 + " $(x) 'q'"
    with make_driver(any_profile) as driver:
        result = driver.run([PYTHON, "-c", "import sys; print(sys.argv[1] == sys.argv[2])",
                             long_arg, long_arg], env={"LONG": long_arg})
        assert result.stdout == "True\n"
        assert list(Path(driver.base_dir, "tmp").iterdir()) == []  # the script removed itself


def test_env_and_cwd(any_profile: Profile, tmp_path: Path) -> None:
    profile = Profile(**{**any_profile.__dict__, "env": {"LD_LIBRARY_PATH": "/opt/my libs"}})
    script = "import os; print(os.getcwd()); print(os.environ['V']); " \
             "print(os.environ['LD_LIBRARY_PATH'])"
    with make_driver(profile) as driver:
        work = driver.make_workdir()
        result = driver.run([PYTHON, "-c", script], env={"V": "a 'b' $HOME"}, cwd=work)
    assert result.stdout.splitlines() == [work, "a 'b' $HOME", "/opt/my libs"]


def test_exit_status_stdout_and_stderr(any_profile: Profile) -> None:
    with make_driver(any_profile) as driver:
        result = driver.run(["sh", "-c", "printf out; printf 'err\\n' >&2; exit 7"], check=False)
        assert (result.status, result.stdout, result.stderr.rstrip("\n")) == (7, "out", "err")
        ok = driver.run(["printf", "line\\n\\nlast\\n"])
        assert (ok.status, ok.stdout, ok.stderr) == (0, "line\n\nlast\n", "")
        binary_ish = driver.run([PYTHON, "-c", "import sys; sys.stdout.write('a\\r\\nb\\x00c')"])
        assert binary_ish.stdout == "a\r\nb\x00c"


def test_failing_command_carries_stderr_tail(any_profile: Profile) -> None:
    with make_driver(any_profile) as driver:
        with pytest.raises(RemoteCommandFailed) as info:
            driver.run(["sh", "-c", "echo first >&2; echo 'model.onnx: bad' >&2; exit 3"])
    assert info.value.status == 3 and info.value.exit_code == EXIT_DEVICE
    assert info.value.stderr_tail.splitlines() == ["first", "model.onnx: bad"]
    assert str(info.value).endswith("sh exited with status 3: model.onnx: bad")
    assert str(info.value).startswith("adb-test (adb:127.0.0.1:")  # as named, then where


def test_timeout_kills_the_command(any_profile: Profile) -> None:
    with make_driver(any_profile) as driver:
        work = driver.make_workdir()
        with pytest.raises(DeviceTimeout, match=r"sh -c .* did not finish within 1 s"):
            driver.run(["sh", "-c", "echo $$ > pid; exec sleep 300"], cwd=work, timeout=1)
        pid = int(Path(work, "pid").read_text())
        deadline = time.monotonic() + 30  # a guard against hanging, not a speed requirement
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(pid), f"the timed-out command (pid {pid}) is still running"
        assert driver.run(["echo", "still usable"]).stdout == "still usable\n"


# --- which device ------------------------------------------------------------------------------
def test_one_device_is_picked_without_an_address(private_adb_server: AdbServer,
                                                 tmp_path: Path) -> None:
    device = private_adb_server.attach(tmp_path / "sandbox")
    profile = adb_profile_for(private_adb_server, None, device.sandbox / "verify")
    with make_driver(profile) as driver:
        # the profile as named, then the device adb picked
        assert driver.describe_address() == f"{profile.spec} (adb:{device.address})"
        assert driver.run(["echo", "hi"]).stdout == "hi\n"


def test_several_devices_without_an_address_is_a_usage_error(
        adb_server: AdbServer, adb_device: DeviceEndProcess,
        adb_second_device: DeviceEndProcess, tmp_path: Path) -> None:
    profile = adb_profile_for(adb_server, None, tmp_path / "verify")
    with pytest.raises(UsageError, match="several adb devices attached") as info:
        make_driver(profile).open()
    assert info.value.exit_code == EXIT_USAGE
    assert adb_device.address in str(info.value) and adb_second_device.address in str(info.value)
    # a profile (its own adb server port): the advice names its address key, not --device
    assert str(info.value).endswith('pick one with address = "SERIAL" in the profile of '
                                    'adb-test or ANDROID_SERIAL=SERIAL')


def test_unknown_serial_lists_the_attached_devices(adb_server: AdbServer,
                                                   adb_device: DeviceEndProcess,
                                                   tmp_path: Path) -> None:
    profile = Profile(name="x", transport="adb", address="emulator-5554",
                      base_dir=str(tmp_path), options={"adb_port": adb_server.port})
    with pytest.raises(ConnectError, match="adb device 'emulator-5554' is not attached; "
                                           "attached: .*" + adb_device.address + r" \(device\)"):
        make_driver(profile).open()


def test_no_device_attached(private_adb_server: AdbServer, tmp_path: Path) -> None:
    profile = adb_profile_for(private_adb_server, None, tmp_path)
    with pytest.raises(ConnectError, match=r"^no adb device attached \(adb devices shows none\)$"):
        make_driver(profile).open()


def test_no_adb_server(tmp_path: Path) -> None:
    port = free_port()
    profile = Profile(name="x", transport="adb", options={"adb_port": port})
    with pytest.raises(ConnectError, match=f"cannot reach the adb server at 127.0.0.1:{port} "
                                           fr".*; start it with `adb -P {port} start-server`"):
        make_driver(profile).open()


# --- a device that goes away ---------------------------------------------------------------------
def _killed_device(server: AdbServer, tmp_path: Path) -> tuple[DeviceEndProcess, Profile]:
    device = server.attach(tmp_path / "sandbox")
    return device, adb_profile_for(server, device, device.sandbox / "verify")


def test_device_killed_mid_pull(adb_server: AdbServer, tmp_path: Path) -> None:
    device, profile = _killed_device(adb_server, tmp_path)
    try:
        remote = device.sandbox / "big.bin"
        _random_file(remote, 48 * 1024 * 1024)
        local = tmp_path / "fetched" / "big.bin"
        with make_driver(profile) as driver:
            with pytest.raises(DeviceError, match=r"fetching .*big\.bin failed: .*lost") as info:
                driver.get(str(remote), local, progress=lambda n: device.kill())
        assert isinstance(info.value, (TransferError, ConnectError))
        assert not local.parent.exists()  # neither the file, a partial one, nor its folder
    finally:
        adb_server.detach(device)


def test_device_killed_mid_push(adb_server: AdbServer, tmp_path: Path) -> None:
    device, profile = _killed_device(adb_server, tmp_path)
    try:
        src = _random_file(tmp_path / "big.bin", 48 * 1024 * 1024)
        remote = device.sandbox / "pushed.bin"
        with make_driver(profile) as driver:
            with pytest.raises(TransferError, match=r"pushing .*big\.bin to .*pushed\.bin\.part-"
                                                    r"\w+ failed: the connection .* was lost"):
                driver.put(src, str(remote), progress=lambda n: device.kill())
            with pytest.raises(ConnectError, match=r"running echo failed: device (offline|'.*' "
                                                   r"not found) \(was it unplugged\?"):
                driver.run(["echo", "anyone?"])
        assert not remote.exists()
    finally:
        adb_server.detach(device)


def test_adb_cli_talks_to_the_device_end(adb_server: AdbServer, adb_device: DeviceEndProcess,
                                         tmp_path: Path) -> None:
    """The adb command line (push uses STA2, shell uses shell,v2,...,raw:) works as well."""
    src = _random_file(tmp_path / "cli.bin", 1_000_000)
    dst = adb_device.sandbox / "cli" / "cli.bin"
    adb_server.adb("-s", adb_device.address, "push", str(src), str(dst))
    assert _sha(dst) == _sha(src)
    proc = subprocess.run([str(adb_server.adb_path), "-P", str(adb_server.port), "-s",
                           adb_device.address, "shell", "echo out; echo err >&2; exit 4"],
                          env=adb_server.env, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    assert (proc.returncode, proc.stdout, proc.stderr) == (4, "out\n", "err\n")
