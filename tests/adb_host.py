"""A real adb server on a private port, and device ends attached to it: for the adb tests
(fixtures_adb.py) and the benchmarks. Without pytest: benchmarks/bench_devices.py starts the
same server on an install that has none.

The server is Debian's adb (`/usr/bin/adb`, adb 29; `$VERIFY_TEST_ADB` picks another binary).
Every call passes `-P PORT`: without it adb starts a detached server on 5037. Its environment
has ADB_LIBUSB=0 and ADB_MDNS=0 (else slow first connects and a UDP 5353 listener), ADB_EMU=0
(else anything listening on 5555-5585 shows up as an offline `emulator-5554`), and a private
HOME/ANDROID_USER_HOME/TMPDIR so its keys and its log (adb.UID.log) stay in a temp dir.
Devices are `tests/adb_device.py` processes on ephemeral ports (never 5555-5585), attached with
`adb -P PORT connect 127.0.0.1:DEVPORT`.
`adb_missing()` says why there is none to start (the tests then skip).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


from adb_device import DeviceEndProcess, start_process

ADB = Path(os.environ.get("VERIFY_TEST_ADB", "/usr/bin/adb"))

__all__ = ["ADB", "AdbServer", "adb_missing", "adb_profile_for", "free_port"]
_EMULATOR_PORTS = range(5554, 5586)


def free_port() -> int:
    """A free loopback port outside the emulator range and adb's default port."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _EMULATOR_PORTS and port != 5037:
            return port


class AdbServer:
    """One adb server on a private port, with its own HOME."""

    def __init__(self, home: Path, adb: Path = ADB) -> None:
        self.adb_path = adb
        self.home = home
        self.port = free_port()
        (home / ".android").mkdir(parents=True, exist_ok=True)
        (home / "tmp").mkdir(exist_ok=True)
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("ANDROID_SERIAL", "ADB_SERVER_SOCKET", "ANDROID_ADB_SERVER_PORT",
                                 "ADB_VENDOR_KEYS", "ANDROID_ADB_SERVER_ADDRESS")}
        self.env.update(HOME=str(home), ANDROID_USER_HOME=str(home / ".android"),
                        ANDROID_SDK_HOME=str(home), TMPDIR=str(home / "tmp"),
                        ADB_LIBUSB="0", ADB_MDNS="0", ADB_EMU="0")
        self.devices_attached: list[DeviceEndProcess] = []

    def adb(self, *args: str, check: bool = True, timeout: float = 30.0) -> str:
        """Run `adb -P PORT ARGS...`; return stdout and stderr together."""
        proc = subprocess.run([str(self.adb_path), "-P", str(self.port), *args], env=self.env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
        output = proc.stdout + proc.stderr
        if check and proc.returncode != 0:
            raise RuntimeError(f"adb {' '.join(args)} exited with {proc.returncode}: {output}")
        return output

    def start(self) -> "AdbServer":
        self.adb("start-server")
        return self

    def stop(self) -> None:
        for device in list(self.devices_attached):
            self.detach(device)
        self.adb("kill-server", check=False)

    def devices(self) -> dict[str, str]:
        """serial -> state, as `adb devices` shows them."""
        lines = self.adb("devices").splitlines()
        return dict(line.split("\t", 1) for line in lines if "\t" in line)

    def wait_for(self, serial: str, state: str | None = "device", timeout: float = 20.0) -> None:
        """Wait until `serial` is in `state` (None: until it is gone)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.devices().get(serial)
            if seen == state:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"adb device {serial} is {seen or 'absent'}, not "
                                   f"{state or 'absent'}, after {timeout:g} s")
            time.sleep(0.05)

    def attach(self, sandbox: Path, *, shell_v2: bool = True, **options: int) -> DeviceEndProcess:
        """Start a device end with `sandbox` as its working directory and `adb connect` it."""
        sandbox.mkdir(parents=True, exist_ok=True)
        device = start_process(sandbox, shell_v2=shell_v2,
                               log_file=sandbox.parent / f"{sandbox.name}.device.log", **options)
        try:
            output = self.adb("connect", device.address)
            if f"connected to {device.address}" not in output:
                raise RuntimeError(f"adb connect {device.address}: {output.strip()}")
            self.wait_for(device.address)
        except BaseException:
            device.kill()
            raise
        self.devices_attached.append(device)
        return device

    def detach(self, device: DeviceEndProcess) -> None:
        self.adb("disconnect", device.address, check=False)
        device.stop()
        if device in self.devices_attached:
            self.devices_attached.remove(device)


def adb_profile_for(server: AdbServer, device: DeviceEndProcess | None, base_dir: Path,
                    name: str = "adb-test"):
    """A profile for `device` (None: no address, the driver picks) on `server`."""
    from verify.devices import Profile

    return Profile(name=name, transport="adb", address=device.address if device else "",
                   base_dir=str(base_dir), python=(sys.executable,),
                   options={"adb_port": server.port})


def adb_missing() -> str | None:
    """Why no adb server can be started here, or None."""
    if not ADB.is_file() or not os.access(ADB, os.X_OK):
        return f"adb tests need an adb binary at {ADB} (apt-get install adb)"
    return None
