"""Cleaning up after a failure or an interrupt: each command capped at a short timeout (an adb
device that stopped answering made Ctrl-C wait out the whole 600 s command timeout per
cleanup step), and the cache's last-use touch never run while a failure is on its way up nor
allowed to replace it (over a dead link, "connection lost (running touch)" replaced the
transfer that failed, and Ctrl-C's 130 with exit 3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from verify.drivers.base import CLEANUP_TIMEOUT, CommandResult, Driver, DriverConfig, Progress
from verify.errors import ConnectError


class Recording(Driver):
    """A transport that records each command and its time limit; `dead` fails them all."""

    transport = "recording"

    def __init__(self, config: DriverConfig) -> None:
        super().__init__(config)
        self.calls: list[tuple[str, float]] = []
        self.dead = False

    def _open_impl(self) -> None:
        pass

    def _close_impl(self) -> None:
        pass

    def _exec_impl(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str],
                   cwd: str | None) -> CommandResult:
        self.calls.append((argv[0], timeout))
        if self.dead:
            raise ConnectError("recording: connection lost")
        return CommandResult(tuple(argv), 0, "", "")

    def _put_impl(self, local: Path, remote: str, progress: Progress | None) -> None:
        raise AssertionError("not used")

    def _get_impl(self, remote: str, local: Path, progress: Progress | None) -> None:
        raise AssertionError("not used")


def _driver() -> Recording:
    return Recording(DriverConfig("recording", command_timeout=600.0)).open()


def test_a_quiet_removal_is_capped_and_other_commands_are_not() -> None:
    d = _driver()
    d.remove("/work/job", quiet=True)
    d.run(["true"])
    d.remove("/work/job")
    assert d.calls == [("rm", CLEANUP_TIMEOUT), ("true", 600.0), ("rm", 600.0)]
    assert CLEANUP_TIMEOUT <= 10


def test_closing_touches_the_cache_only_when_nothing_failed() -> None:
    d = _driver()
    d._used.add("/cache/m.onnx")
    with pytest.raises(KeyboardInterrupt):
        try:
            raise KeyboardInterrupt
        finally:
            d.close()  # as the session's __exit__ does while Ctrl-C unwinds
    assert d.calls == []
    d = _driver()
    d._used.add("/cache/m.onnx")
    d.close()
    assert d.calls == [("touch", CLEANUP_TIMEOUT)]


def test_a_failing_touch_is_not_the_commands_error() -> None:
    d = _driver()
    d._used.add("/cache/m.onnx")
    d.dead = True
    d.close()  # the link died after the last job: its results stand
    assert d.calls == [("touch", CLEANUP_TIMEOUT)]


def test_a_failed_file_command_names_the_device() -> None:
    """adb's `base_dir` under /proc said "mkdir on device exited with status 1: …", not which
    device (ssh's own makedirs named it)."""
    from verify.errors import RemoteCommandFailed

    class Refusing(Recording):
        def _exec_impl(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str],
                       cwd: str | None) -> CommandResult:
            return CommandResult(tuple(argv), 1, "", f"{argv[0]}: cannot create directory")

    d = Refusing(DriverConfig("recording", address="board7", spec="phone")).open()
    with pytest.raises(RemoteCommandFailed) as err:
        d._makedirs_impl("/proc/verify")
    assert str(err.value).startswith(f"{d.describe_address()}: mkdir exited with status 1"), \
        str(err.value)
