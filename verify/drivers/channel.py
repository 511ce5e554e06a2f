"""A command left running on the device and spoken to in lines (a serving runner): what every
transport's `Driver.spawn` returns. The transport fills in five primitives (write, read with a
deadline, end of input, wait, kill); this class frames lines, keeps the end of stderr for
messages, and turns an overrun into DeviceTimeout after killing the command."""

from __future__ import annotations

import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence

from verify.errors import DeviceError, DeviceTimeout


def command_text(argv: Sequence[str], width: int = 120) -> str:
    """A command as one line of an error message: quoted as a shell would take it, newlines
    shown as \\n, and a long one cut in the middle with an ellipsis, so that its end (the
    arguments, the work folder) stays and the cut shows."""
    text = shlex.join(argv).replace("\n", "\\n")
    if len(text) <= width:
        return text
    tail = width // 3
    return text[:width - tail - 3] + " … " + text[-tail:]


class LineChannel(ABC):
    """A command left running on the device, spoken to in lines: lines in on its stdin, lines
    out of its stdout, the end of its stderr kept for messages. A transport that can hold a
    process open returns one from `Driver.spawn`; everything the transport's library raises
    comes out as verify's errors, as from `Driver.run`."""

    STDERR_KEEP = 1 << 16  # bytes of stderr kept (the end of it)

    def __init__(self, argv: Sequence[str], where: str) -> None:
        self.argv = tuple(argv)
        self.where = where
        self._out = bytearray()
        self._err = bytearray()
        self._eof = False

    @abstractmethod
    def _write(self, data: bytes) -> None:
        """Send bytes to its stdin (a process that is gone: ignore, its EOF will tell)."""

    @abstractmethod
    def _read(self, deadline: float) -> bytes | None:
        """Wait until `deadline` (monotonic) at most for stdout: bytes (b'' when none came),
        None at EOF. Keeps draining stderr into `_keep_err`."""

    @abstractmethod
    def _end_input(self) -> None:
        """Close its stdin."""

    @abstractmethod
    def _wait(self, timeout: float) -> int | None:
        """Its exit status once it ended (-N: killed by signal N), None if still running."""

    @abstractmethod
    def kill(self) -> None:
        """Kill it and everything it started; never raises."""

    def _keep_err(self, data: bytes) -> None:
        self._err += data
        del self._err[:-self.STDERR_KEEP]

    def send(self, line: str) -> None:
        self._write(line.encode() + b"\n")

    def receive(self, deadline: float, limit: float, what: str = "") -> str | None:
        """The next line of its stdout (without the newline); None at EOF. Past `deadline`
        (time.monotonic(), `limit` s after the job went in) it is killed and DeviceTimeout
        raised."""
        while True:
            end = self._out.find(b"\n")
            if end >= 0:
                line = bytes(self._out[:end])
                del self._out[:end + 1]
                return line.decode(errors="replace")
            if self._eof:
                return None
            if time.monotonic() >= deadline:
                self.kill()
                shown = what or command_text(self.argv)
                raise DeviceTimeout(f"{self.where}: {shown} did not finish within {limit:g} s")
            data = self._read(deadline)
            if data is None:
                self._eof = True
            else:
                self._out += data

    def stderr_tail(self) -> str:
        return bytes(self._err).decode(errors="replace")

    def close(self, grace: float) -> int | None:
        """End its input and wait up to `grace` s for it to exit, else kill it; its status."""
        try:
            self._end_input()
            deadline = time.monotonic() + grace
            while not self._eof and time.monotonic() < deadline:  # drain to EOF
                data = self._read(deadline)
                if data is None:
                    self._eof = True
            status = self._wait(max(0.0, deadline - time.monotonic()))
        except DeviceError:
            status = None
        if status is None:
            self.kill()
        return status
