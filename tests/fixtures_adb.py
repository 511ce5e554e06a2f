"""pytest fixtures around the real adb server of adb_host.py: the session's server, device ends
with and without shell_v2, profiles reaching them, a test's own server. Tests skip cleanly when
the adb binary is absent.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from adb_device import DeviceEndProcess
from adb_host import (  # noqa: F401 - tests import the helpers from here
    ADB,
    AdbServer,
    adb_missing,
    adb_profile_for,
    free_port,
)

# What conftest's star import exposes: the fixtures (helpers are imported by name).
__all__ = ["adb_server", "adb_device", "adb_device_v1", "adb_profile", "adb_profile_v1",
           "adb_second_device", "private_adb_server"]


def _job_dir(device: DeviceEndProcess) -> Path:
    """A fresh base directory inside the device's sandbox (not created: the driver does it)."""
    return device.sandbox / f"job-{secrets.token_hex(4)}" / "verify"


def _require_adb() -> None:
    missing = adb_missing()
    if missing:
        pytest.skip(missing)


@pytest.fixture(scope="session")
def adb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdbServer]:
    """The session's adb server (Debian's adb on a private port)."""
    _require_adb()
    server = AdbServer(tmp_path_factory.mktemp("adb-home")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def adb_device(adb_server: AdbServer,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeviceEndProcess]:
    """A device end advertising shell_v2, attached to the session server."""
    device = adb_server.attach(tmp_path_factory.mktemp("adb-device") / "sandbox")
    yield device
    adb_server.detach(device)


@pytest.fixture(scope="session")
def adb_device_v1(adb_server: AdbServer,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeviceEndProcess]:
    """A device end without shell_v2 (an Android < 7 device), attached to the session server."""
    device = adb_server.attach(tmp_path_factory.mktemp("adb-device-v1") / "sandbox",
                               shell_v2=False)
    yield device
    adb_server.detach(device)


@pytest.fixture
def adb_profile(adb_server: AdbServer, adb_device: DeviceEndProcess):
    """A Profile for the shell_v2 device, with a fresh base_dir inside its sandbox."""
    return adb_profile_for(adb_server, adb_device, _job_dir(adb_device))


@pytest.fixture
def adb_profile_v1(adb_server: AdbServer, adb_device_v1: DeviceEndProcess):
    """A Profile for the device without shell_v2, with a fresh base_dir inside its sandbox."""
    return adb_profile_for(adb_server, adb_device_v1, _job_dir(adb_device_v1))


@pytest.fixture
def adb_second_device(adb_server: AdbServer, adb_device: DeviceEndProcess,
                      tmp_path: Path) -> Iterator[DeviceEndProcess]:
    """Another device attached to the session server while the test runs (so there are two)."""
    device = adb_server.attach(tmp_path / "second-sandbox")
    yield device
    adb_server.detach(device)


@pytest.fixture
def private_adb_server(tmp_path: Path) -> Iterator[AdbServer]:
    """An adb server of the test's own, with no device: attach what the test needs."""
    _require_adb()
    server = AdbServer(tmp_path / "adb-home").start()
    try:
        yield server
    finally:
        server.stop()
