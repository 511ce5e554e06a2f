"""The adb transport: an Android device (or anything adbd runs on) through an adb server.

adbutils is imported only here. It provides the server client, the device list, the device's
features and one connection per device service (`open_transport`). On those connections this
module speaks the device services itself, because adbutils' helpers fall short for verify:
- `shell,v2,raw:` (the shell protocol) gives stdout, stderr and the exit status apart; we read
  it against a deadline (adbutils' `shell2` only has a per-recv timeout, which a command that
  prints now and then never trips).
- `shell:` when the device lacks `shell_v2` (Android < 7): one merged stream and no status, so
  the command is wrapped to print a unique marker, its status and its captured stderr last
  (stdout stays byte-exact; stderr, held in a shell variable, loses its trailing newlines).
- `sync:` SEND/RECV in 64 KiB chunks with progress and a stall timeout, reporting the device's
  FAIL reason (adbutils' `Sync.push` sends 4 KiB chunks, has no progress hook, reports a
  refused push as just "FAIL", and its sync sockets never time out).

A timed-out or interrupted command is stopped by closing its stream: adbd then hangs the
command up (SIGHUP through the PTY, or explicitly with the shell protocol).
Options: `adb_host` (default 127.0.0.1), `adb_port` (default $ANDROID_ADB_SERVER_PORT or 5037),
`io_timeout` (seconds a transfer may stall, default 60). The driver never starts a server.
Reading the sockets against deadlines and the fallback's parsing live in adb_wire.py.
"""

from __future__ import annotations

import os
import posixpath
import re
import secrets
import shlex
import socket
import stat
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from adbutils import AdbClient, AdbConnection, AdbDevice
from adbutils.errors import AdbError, AdbTimeout

from verify.drivers.adb_wire import (
    DEFAULT_SERVER_PORT,
    Expired,
    Lost,
    not_ready,
    parse_marked,
    positive,
    recv,
    recv_exact,
    server_port,
    why,
)
from verify.drivers.channel import LineChannel, command_text
from verify.drivers.base import (
    CommandResult,
    Driver,
    DriverConfig,
    Progress,
    shell_command,
)
from verify.errors import (ConnectError, DeviceError, DeviceTimeout, TransferError, UsageError,
                           VerifyError)

SYNC_DATA_MAX = 64 * 1024
# An OPEN must fit the device's max payload, 4 KiB before Android 9, and Debian's adb 29 server
# aborts (dropping every device) when asked for more. A longer command (with the fallback's
# wrapper around it) is therefore pushed as a script and run with sh.
MAX_INLINE_COMMAND = 3584
SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT, SHELL_CLOSE_STDIN = 1, 2, 3, 4


class AdbDriver(Driver):
    transport = "adb"
    default_base_dir = "/data/local/tmp/verify"

    def __init__(self, config: DriverConfig) -> None:
        super().__init__(config)
        options = config.options
        self.server_host = str(options.get("adb_host") or "127.0.0.1")
        self.server_port = server_port(options.get("adb_port"))
        self.io_timeout = positive(options.get("io_timeout", 60.0), "io_timeout")
        self.serial = config.address
        self.features: frozenset[str] = frozenset()
        self._device: AdbDevice | None = None

    # --- lifecycle ------------------------------------------------------------------------
    def _open_impl(self) -> None:
        self._check_server()
        client = AdbClient(host=self.server_host, port=self.server_port,
                           socket_timeout=self.config.connect_timeout)
        with self._converted("listing adb devices", ConnectError):
            infos = client.list()
        self.serial = self._choose([(i.serial, i.state) for i in infos])
        device = client.device(serial=self.serial)
        with self._converted("reading the device's features", ConnectError):
            self.features = frozenset(f for f in device.get_features().split(",") if f)
        self._device = device

    def _close_impl(self) -> None:
        self._device = None  # every service has its own connection, closed when it ends

    def _address(self) -> str:
        return f"adb:{self.serial}" if self.serial else "adb"

    @property
    def shell_v2(self) -> bool:
        return "shell_v2" in self.features

    def _check_server(self) -> None:
        # adbutils would spawn `adb start-server` (on the default port) if nothing answers;
        # a driver must not start daemons behind the user's back, so say what to run instead.
        address = (self.server_host, self.server_port)
        try:
            socket.create_connection(address, timeout=self.config.connect_timeout).close()
        except OSError as exc:
            hint = "adb start-server" if self.server_port == DEFAULT_SERVER_PORT \
                else f"adb -P {self.server_port} start-server"
            raise ConnectError(f"cannot reach the adb server at {self.server_host}:"
                               f"{self.server_port} ({why(exc)}); start it with `{hint}`") \
                from exc

    def _choose(self, devices: list[tuple[str, str]]) -> str:
        """Pick the device: the address asked for, else $ANDROID_SERIAL, else the only one."""
        listing = ", ".join(f"{serial} ({state})" for serial, state in devices) \
            or "adb devices shows none"
        wanted = self.config.address or os.environ.get("ANDROID_SERIAL", "")
        if wanted:
            states = dict(devices)
            if wanted not in states:
                source = "" if self.config.address else " (from $ANDROID_SERIAL)"
                raise ConnectError(f"adb device {wanted!r}{source} is not attached; attached: "
                                   f"{listing}")
            if states[wanted] != "device":
                raise ConnectError(not_ready(wanted, states[wanted]))
            return wanted
        if not devices:
            raise ConnectError("no adb device attached (adb devices shows none)")
        ready = [serial for serial, state in devices if state == "device"]
        if len(ready) == 1:
            return ready[0]
        if not ready:
            raise ConnectError("no adb device is ready: " + "; ".join(
                not_ready(serial, state) for serial, state in devices))
        # Several usable devices is a question only the user can answer: a usage error.
        # `--device adb:SERIAL` would leave this profile (its adb_port, its base_dir) behind
        how = ("--device adb:SERIAL or ANDROID_SERIAL=SERIAL" if self.config.spec in ("", "adb")
               else f"address = \"SERIAL\" in the profile of {self.config.spec} or "
                    "ANDROID_SERIAL=SERIAL")
        raise UsageError(f"several adb devices attached ({', '.join(ready)}); pick one with "
                         f"{how}")

    # --- commands -------------------------------------------------------------------------
    def _exec_impl(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str],
                   cwd: str | None) -> CommandResult:
        command = shell_command(argv, env or None, cwd)
        deadline = time.monotonic() + timeout
        what = f"running {Path(argv[0]).name}"
        try:
            if len(command.encode()) > MAX_INLINE_COMMAND:
                command = self._command_script(command, what)
            with self._converted(what, ConnectError):
                if self.shell_v2:
                    status, out, err = self._run_shell_v2(command, deadline)
                else:
                    status, out, err = self._run_shell_v1(command, deadline)
        except Expired:
            raise DeviceTimeout(f"{self.describe_address()}: {command_text(argv)} did not "
                                f"finish within {timeout:g} s") from None
        return CommandResult(tuple(argv), status, out.decode(errors="replace"),
                             err.decode(errors="replace"))

    def _spawn_impl(self, argv: Sequence[str], *, env: Mapping[str, str],
                    cwd: str | None) -> LineChannel | None:
        if not self.shell_v2 or self._device is None:  # no stdin without the shell protocol
            return None
        from verify.drivers.adb_serve import AdbChannel

        what = f"starting {Path(argv[0]).name}"
        command = shell_command(argv, env or None, cwd)
        if len(command.encode()) > MAX_INLINE_COMMAND:
            command = self._command_script(command, what)
        with self._converted(what, ConnectError):
            conn = self._device.open_transport(timeout=self.config.connect_timeout)
            try:
                conn.send_command(f"shell,v2,raw:{command}")
                conn.check_okay()
            except BaseException:
                conn.close()
                raise
        return AdbChannel(conn.conn, argv, self.describe_address(), conn.close)

    def _run_shell_v2(self, command: str, deadline: float) -> tuple[int, bytes, bytes]:
        with self._service(f"shell,v2,raw:{command}", deadline) as conn:
            sock = conn.conn
            sock.sendall(bytes([SHELL_CLOSE_STDIN]) + bytes(4))  # the command reads no input
            pending, out, err = bytearray(), bytearray(), bytearray()
            while True:
                chunk = recv(sock, deadline)
                if not chunk:
                    raise Lost("the shell ended without an exit status")
                pending += chunk
                while len(pending) >= 5:
                    size = struct.unpack_from("<I", pending, 1)[0]
                    if len(pending) < 5 + size:
                        break
                    kind, data = pending[0], bytes(pending[5:5 + size])
                    del pending[:5 + size]
                    if kind == SHELL_STDOUT:
                        out += data
                    elif kind == SHELL_STDERR:
                        err += data
                    elif kind == SHELL_EXIT:
                        return (data[0] if data else 255), bytes(out), bytes(err)

    def _run_shell_v1(self, command: str, deadline: float) -> tuple[int, bytes, bytes]:
        # Without the shell protocol stdout and stderr share one stream and the status is lost.
        # Wrap the command: its stdout passes through untouched (fd 3), its stderr is captured
        # in a variable, and after it ends we print a newline, a marker nobody else can print,
        # the status, a newline and the stderr. The leading newline makes the marker findable
        # after output without a trailing newline; we strip exactly that newline again.
        marker = f":verify-exit-{secrets.token_hex(8)}:"
        wrapped = (f"{{ __verify_err=$( ( {command} ) </dev/null 2>&1 1>&3 3>&- ); "
                   f"__verify_status=$?; }} 3>&1; "
                   f"printf '\\n{marker}%d\\n%s' \"$__verify_status\" \"$__verify_err\"")
        with self._service(f"shell:{wrapped}", deadline) as conn:
            data = bytearray()
            while chunk := recv(conn.conn, deadline):
                data += chunk
        return parse_marked(bytes(data), marker.encode())

    def _command_script(self, command: str, what: str) -> str:
        """Push a too-long command as a script that deletes itself; return how to run it."""
        path = posixpath.join(self.base_dir, "tmp", f"cmd-{secrets.token_hex(8)}.sh")
        script = f'rm -f -- "$0"\n{command}\n'.encode()
        blocks = (script[i:i + SYNC_DATA_MAX] for i in range(0, len(script), SYNC_DATA_MAX))
        self._send(blocks, path, 0o600, int(time.time()), None, f"{what} (pushing its script)")
        return shlex.join(["sh", path])

    # --- transfers ------------------------------------------------------------------------
    def transfer_method(self) -> str:
        return "adb sync"

    def _put_impl(self, local: Path, remote: str, progress: Progress | None) -> None:
        info = local.stat()
        with open(local, "rb") as fh:
            self._send(iter(lambda: fh.read(SYNC_DATA_MAX), b""), remote,
                       stat.S_IMODE(info.st_mode), int(info.st_mtime), progress,
                       f"pushing {local} to {remote}")

    def _send(self, blocks: Iterator[bytes], remote: str, mode: int, mtime: int,
              progress: Progress | None, what: str) -> None:
        """SEND one file; the device creates missing parent directories."""
        spec = f"{remote},{stat.S_IFREG | mode}".encode()
        with self._converted(what, TransferError), self._sync() as sock:
            try:
                sock.sendall(b"SEND" + struct.pack("<I", len(spec)) + spec)
                for block in blocks:
                    sock.sendall(b"DATA" + struct.pack("<I", len(block)) + block)
                    if progress:
                        progress(len(block))
                sock.sendall(b"DONE" + struct.pack("<I", mtime & 0xFFFFFFFF))
            except OSError:
                # adbd refuses early (no space, read-only...) and may close before we finish:
                # its FAIL reason, if it got through, says more than the broken pipe.
                self._sync_status(sock, what, after_error=True)
                raise
            self._sync_status(sock, what)

    def _get_impl(self, remote: str, local: Path, progress: Progress | None) -> None:
        what = f"fetching {remote}"
        path = remote.encode()
        with self._converted(what, TransferError), self._sync() as sock, \
                open(local, "wb") as fh:
            sock.sendall(b"RECV" + struct.pack("<I", len(path)) + path)
            while True:
                kind, size = struct.unpack("<4sI", recv_exact(sock, 8, self.io_timeout))
                if kind == b"DATA":
                    fh.write(recv_exact(sock, size, self.io_timeout))
                    if progress:
                        progress(size)
                elif kind == b"DONE":
                    return
                elif kind == b"FAIL":
                    reason = recv_exact(sock, size, self.io_timeout).decode(errors="replace")
                    raise TransferError(f"{self.describe_address()}: {what} failed: {reason}")
                else:
                    raise TransferError(f"{self.describe_address()}: {what} failed: unexpected "
                                        f"sync reply {kind!r}")

    def _sync_status(self, sock: socket.socket, what: str, after_error: bool = False) -> None:
        """Read the reply to DONE: OKAY, or FAIL and the device's reason."""
        stall = min(self.io_timeout, 2.0) if after_error else self.io_timeout
        try:
            kind, size = struct.unpack("<4sI", recv_exact(sock, 8, stall))
            reason = recv_exact(sock, size, stall).decode(errors="replace") \
                if kind == b"FAIL" else ""
        except (OSError, Lost, Expired):
            if after_error:
                return
            raise
        if kind == b"FAIL":
            raise TransferError(f"{self.describe_address()}: {what} failed: {reason}")
        if kind != b"OKAY" and not after_error:
            raise TransferError(f"{self.describe_address()}: {what} failed: unexpected sync "
                                f"reply {kind!r}")

    # --- plumbing -------------------------------------------------------------------------
    @contextmanager
    def _service(self, name: str, deadline: float) -> Iterator[AdbConnection]:
        """A connection to one device service; closing it stops the service on the device."""
        if self._device is None:
            raise DeviceError(f"{self.describe_address()}: the driver is not open")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Expired()
        conn = self._device.open_transport(timeout=remaining)
        try:
            conn.send_command(name)
            conn.check_okay()
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _sync(self) -> Iterator[socket.socket]:
        with self._service("sync:", time.monotonic() + self.io_timeout) as conn:
            sock = conn.conn
            sock.settimeout(self.io_timeout)
            yield sock
            try:
                sock.sendall(b"QUIT" + bytes(4))  # as adb does; adbd then ends the service
            except OSError:
                pass

    @contextmanager
    def _converted(self, what: str, error: type[DeviceError]) -> Iterator[None]:
        """Turn adbutils' and the socket layer's exceptions into verify's, naming the action."""
        where = self.describe_address()
        try:
            yield
        except (VerifyError, Expired):
            raise
        except Lost as exc:
            raise error(f"{where}: {what} failed: the connection to the device was lost "
                        f"({exc})") from exc
        except AdbTimeout as exc:
            raise error(f"{where}: {what} failed: no answer from the adb server ({exc})") from exc
        except AdbError as exc:
            reason = str(exc) or type(exc).__name__
            if re.search(r"device .* not found|device offline", reason):
                reason += " (was it unplugged? see `adb devices`)"
            raise error(f"{where}: {what} failed: {reason}") from exc
        except TimeoutError as exc:
            raise error(f"{where}: {what} failed: the device stopped answering for "
                        f"{self.io_timeout:g} s") from exc
        except (OSError, EOFError) as exc:
            raise error(f"{where}: {what} failed: the connection to the device was lost "
                        f"({why(exc)})") from exc
