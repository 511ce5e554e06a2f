"""A command left running over ssh, spoken to in lines (a serving runner): one exec channel.

The command goes to the login shell as `echo <marker> $$; CMD; exit $?`, as the driver's own
commands do: the shell leads the command's process group, so killing the group leaves nothing
behind, and a command killed by signal N ends the shell with 128+N (SSH's exit-signal, which
paramiko drops, would say nothing). Lines go in on the channel's stdin; stdout is read as it
comes and stderr kept drained (an unread stream would stall the channel's window).
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Callable, Sequence

import paramiko

from verify.drivers.channel import LineChannel
from verify.errors import ConnectError

_CHUNK = 1 << 16
_POLL = 0.05


class SshChannel(LineChannel):
    def __init__(self, chan: paramiko.Channel, argv: Sequence[str], where: str, marker: str,
                 alive: Callable[[], bool], kill_group: Callable[[int | None], None]) -> None:
        super().__init__(argv, where)
        self.chan = chan
        self._key = marker.encode() + b" "
        self._head: bytearray | None = bytearray()  # None once the marker line is read
        self.pid: int | None = None
        self._alive = alive
        self._kill_group = kill_group
        self._ready = selectors.DefaultSelector()
        self._ready.register(chan, selectors.EVENT_READ)
        self._ended = False
        self._killed = False

    def _write(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (paramiko.SSHException, OSError, EOFError):
            pass  # gone: reading says whether the command ended or the link did

    def _read(self, deadline: float) -> bytes | None:
        if self._ended:
            return None
        self._ready.select(max(0.0, min(deadline - time.monotonic(), _POLL)))
        out = bytearray()
        try:
            while self.chan.recv_ready():
                out += self.chan.recv(_CHUNK)
            while self.chan.recv_stderr_ready():
                self._keep_err(self.chan.recv_stderr(_CHUNK))
            if self.chan.eof_received or self.chan.closed:
                while data := self.chan.recv(_CHUNK):
                    out += data
                while data := self.chan.recv_stderr(_CHUNK):
                    self._keep_err(data)
                self._ended = True
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(f"{self.where}: connection lost while running "
                               f"{self.argv[0]} ({type(exc).__name__})") from exc
        data = self._strip_marker(bytes(out))
        if self._ended and not data:
            return None
        return data

    def _strip_marker(self, data: bytes) -> bytes:
        """Take the shell's `<marker> <pid>` line (and what a chatty rc file printed before
        it) off the front of stdout."""
        if self._head is None:
            return data
        self._head += data
        start = self._head.find(self._key)
        end = self._head.find(b"\n", start) if start >= 0 else -1
        if end < 0:
            return b""
        text = bytes(self._head[start + len(self._key):end])
        self.pid = int(text) if text.isdigit() and int(text) > 1 else None
        rest = bytes(self._head[end + 1:])
        self._head = None
        return rest

    def _end_input(self) -> None:
        try:
            self.chan.shutdown_write()
        except (paramiko.SSHException, OSError, EOFError):
            pass

    def _wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while not self.chan.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.chan.exit_status_ready():
            return None
        status = self.chan.recv_exit_status()
        if status == -1 and not self._alive():
            raise ConnectError(f"{self.where}: connection lost while running {self.argv[0]}")
        if 128 < status <= 128 + 64:  # the shell's way of saying "killed by signal N"
            status = 128 - status
        self._close()
        return status

    def kill(self) -> None:
        if not self._killed:
            self._killed = True
            self._kill_group(self.pid)
        self._close()

    def _close(self) -> None:
        self._ready.close()
        try:
            self.chan.close()
        except (paramiko.SSHException, OSError, EOFError):
            pass
