"""The adb driver's helpers below adbutils: reading a device service's socket against a
deadline or a stall limit, the fallback shell's marked output, the driver's options and its
messages about devices that are not ready. Imports no adbutils; raises `Lost` and `Expired`,
which the driver turns into verify's errors, naming what it was doing.
"""

from __future__ import annotations

import os
import socket
import time

from verify.errors import ProfileError

DEFAULT_SERVER_PORT = 5037
STATE_HINTS = {
    "unauthorized": "accept the USB debugging prompt on the device",
    "offline": "reconnect it, or run `adb reconnect`",
    "no permissions": "fix the udev rules for the device (see `adb devices`)",
}


class Lost(Exception):
    """The device or the server closed the connection before the service finished."""


class Expired(Exception):
    """A deadline passed while waiting for the device."""


def server_port(value: object) -> int:
    """The adb server's port: `options.adb_port`, else $ANDROID_ADB_SERVER_PORT, else 5037."""
    if value in (None, ""):
        value = os.environ.get("ANDROID_ADB_SERVER_PORT") or DEFAULT_SERVER_PORT
    try:
        port = int(str(value))
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise ProfileError(f"adb_port must be a TCP port number, got {value!r}")
    return port


def positive(value: object, name: str) -> float:
    """Option `name`, a positive number of seconds."""
    try:
        number = float(str(value))
    except ValueError:
        number = -1.0
    if number <= 0:
        raise ProfileError(f"{name} must be a positive number of seconds, got {value!r}")
    return number


def not_ready(serial: str, state: str) -> str:
    """Why the device `serial` cannot be used yet, and what to do about it."""
    hint = STATE_HINTS.get(state)
    return f"adb device {serial} is {state}" + (f": {hint}" if hint else "")


def why(exc: BaseException) -> str:
    """An OS error's own words (its strerror), else the exception's text or type."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


SLICE_S = 0.25  # the longest a wait goes without running Python code (`verify ci`'s stop)


def recv(sock: socket.socket, deadline: float) -> bytes:
    """What the socket has next (b'' at EOF); Expired once `deadline` (monotonic) passes."""
    while True:  # in slices of SLICE_S: an interruption from another thread lands between
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Expired()
        sock.settimeout(min(remaining, SLICE_S))
        try:
            return sock.recv(1 << 16)
        except TimeoutError:
            continue


def recv_exact(sock: socket.socket, n: int, stall: float) -> bytes:
    """Exactly n bytes; a stall of `stall` seconds raises TimeoutError, EOF raises Lost."""
    sock.settimeout(stall)
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise Lost("it closed the connection mid-transfer")
        got += k
    return bytes(buf)


def parse_marked(data: bytes, marker: bytes) -> tuple[int, bytes, bytes]:
    """Split the fallback shell's output into (status, stdout, stderr)."""
    at = data.find(b"\n" + marker)
    if at < 0:
        raise Lost("the shell ended before the command's status was printed")
    crlf = at > 0 and data[at - 1:at] == b"\r"
    stdout = data[:at - 1] if crlf else data[:at]
    status_text, _, stderr = data[at + 1 + len(marker):].partition(b"\n")
    if crlf:
        # An old adbd runs `shell:` on a PTY that turns every \n into \r\n; undo it.
        stdout = stdout.replace(b"\r\n", b"\n")
        stderr = stderr.replace(b"\r\n", b"\n")
    try:
        status = int(status_text.rstrip(b"\r"))
    except ValueError:
        raise Lost(f"unreadable exit status {status_text[:20]!r}") from None
    return status, stdout, stderr
