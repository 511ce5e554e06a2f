"""Device sessions kept open from one job to the next (`verify ci`'s device workers): one
connection and one runner push per device, not per job (session.py's DeviceSession each)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from verify.devices import Profile
from verify.session import DeviceSession


class Sessions:
    """Device sessions kept open from one job to the next on one thread (`verify ci`, whose
    worker runs one device's jobs in turn): one connection and one runner push per device,
    not per job. A job that fails closes its device's session, so the next job or a retry
    connects afresh, as a command of its own would."""

    def __init__(self) -> None:
        self._open: dict[str, DeviceSession] = {}

    @contextmanager
    def use(self, profile: Profile) -> Iterator[DeviceSession]:
        session = self._open.get(profile.spec)
        if session is not None and session.profile != profile:  # the profile file changed
            self._close(profile.spec)
            session = None
        if session is None:
            session = DeviceSession(profile).__enter__()
            self._open[profile.spec] = session
        try:
            yield session
        except BaseException:
            self._close(profile.spec, failing=True)
            raise

    def close(self) -> None:
        for spec in list(self._open):
            self._close(spec)

    def _close(self, spec: str, failing: bool = False) -> None:
        session = self._open.pop(spec)
        if not failing:
            session.close()
            return
        try:  # quiet: the job's own error says what went wrong
            session.close(failing=True)
        except Exception:  # noqa: BLE001 - a second failure must not hide the first
            pass
