"""pytest fixtures around the real sshd of sshd_host.py: one shared per session, dedicated ones
per test, and a Profile reaching it. A machine without sshd or ssh-keygen skips those tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sshd_host
from sshd_host import (  # noqa: F401 - tests import the helpers from here
    ServerUnavailable,
    SshServer,
    free_port,
    keygen,
    process_alive,
)

# What conftest's star import exposes: the fixtures.
__all__ = ["sshd_server", "ssh_profile", "sshd_factory"]


def start_sshd(root: Path, attempts: int = 5, **config: object) -> SshServer:
    """sshd_host.start_sshd, skipping the test where sshd or ssh-keygen is missing."""
    try:
        return sshd_host.start_sshd(root, attempts, **config)  # type: ignore[arg-type]
    except ServerUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """One sshd shared by the session's ssh tests."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sshd_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Start dedicated servers (for tests that kill them, or that need another sshd_config:
    start_sshd's keywords); all stopped after the test."""
    servers: list[SshServer] = []

    def start(**config: object) -> SshServer:
        servers.append(start_sshd(tmp_path_factory.mktemp("sshd-own"), **config))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def ssh_profile(sshd_server: SshServer, tmp_path: Path):
    """A Profile for the shared sshd with a fresh base_dir (the device is this machine)."""
    return sshd_server.profile(str(tmp_path / "device"))
