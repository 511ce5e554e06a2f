"""A command left running over adb, spoken to in lines (a serving runner): one `shell,v2`
service held open. Lines go in as the shell protocol's stdin packets (id 0), close-stdin (4)
ends the input; stdout (1) and stderr (2) packets come back, then the exit status (3).
Closing the service ends the command: adbd hangs up its process group."""

from __future__ import annotations

import selectors
import socket
import struct
import time
from collections.abc import Callable, Sequence

from verify.drivers.channel import LineChannel
from verify.errors import ConnectError

SHELL_STDIN, SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT, SHELL_CLOSE_STDIN = 0, 1, 2, 3, 4
_POLL = 0.5


class AdbChannel(LineChannel):
    def __init__(self, sock: socket.socket, argv: Sequence[str], where: str,
                 close: Callable[[], None]) -> None:
        super().__init__(argv, where)
        self.sock = sock
        self._close = close
        self._pending = bytearray()
        self._status: int | None = None
        self._ended = False
        self._ready = selectors.DefaultSelector()
        self._ready.register(sock, selectors.EVENT_READ)

    def _packet(self, kind: int, data: bytes = b"") -> None:
        try:
            self.sock.sendall(bytes([kind]) + struct.pack("<I", len(data)) + data)
        except OSError:
            pass  # gone: reading says how it ended

    def _write(self, data: bytes) -> None:
        self._packet(SHELL_STDIN, data)

    def _end_input(self) -> None:
        self._packet(SHELL_CLOSE_STDIN)

    def _read(self, deadline: float) -> bytes | None:
        if self._ended:
            return None
        if not self._ready.select(max(0.0, min(deadline - time.monotonic(), _POLL))):
            return b""
        try:
            chunk = self.sock.recv(1 << 16)
        except OSError as exc:
            raise ConnectError(f"{self.where}: connection to the device lost while running "
                               f"{self.argv[0]} ({exc})") from exc
        if not chunk:
            self._ended = True
            return None
        self._pending += chunk
        out = bytearray()
        while len(self._pending) >= 5:
            size = struct.unpack_from("<I", self._pending, 1)[0]
            if len(self._pending) < 5 + size:
                break
            kind, data = self._pending[0], bytes(self._pending[5:5 + size])
            del self._pending[:5 + size]
            if kind == SHELL_STDOUT:
                out += data
            elif kind == SHELL_STDERR:
                self._keep_err(data)
            elif kind == SHELL_EXIT:
                self._status = data[0] if data else 255
                self._ended = True
        return bytes(out) if out or not self._ended else None

    def _wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self._status is None and not self._ended and time.monotonic() < deadline:
            self._read(deadline)
        if self._status is not None:
            self._shut()
        return self._status

    def kill(self) -> None:
        self._shut()  # adbd hangs up the command's process group

    def _shut(self) -> None:
        self._ready.close()
        try:
            self._close()
        except OSError:
            pass
