"""The device end of the adb transport protocol on loopback TCP, so tests can drive a real adb
server (and verify's adb driver through it) without a phone.

It speaks what adbd speaks over TCP (AOSP adb: protocol.txt, SERVICES.TXT, SYNC.TXT,
shell_protocol.h, daemon/{shell_service,file_sync_service}.cpp):

- transport: CNXN without AUTH (the banner lists only the features implemented here), version
  and max payload negotiated from the host's CNXN, checksums sent and checked while the
  negotiated version is below A_VERSION_SKIP_CHECKSUM, magic checked always;
  OPEN/OKAY/WRTE/CLSE with the local/remote ids in the right order, one WRTE in flight per
  stream until the host's OKAY, and backpressure on what the host sends (OKAY is withheld while
  a service has too much unread input); CLSE(0, id) refuses an OPEN, a CLSE from the host is
  answered with CLSE as adbd's local_socket_close does.
- `shell:CMD` and `exec:CMD`: raw, stdout and stderr merged, no exit status.
- `shell,v2[,raw|pty|TERM=..]:CMD` (when shell_v2 is advertised): shell protocol packets
  (1-byte id, 4-byte little-endian length), stdout=1, stderr=2, exit=3 (0x80|signal when
  killed); stdin=0 goes to the command's stdin and close-stdin=4 closes it (as adbd's
  shell_service does), window-size=5 is read and ignored.
- `sync:`: STAT (lstat v1), STA2/LST2, LIST/LIS2, SEND (path,mode; DATA <= 64 KiB; DONE with
  mtime; parents created; symlinks), SND2 and RCV2 (no compression flags), RECV, QUIT; FAIL with
  adbd's reasons ("open failed: No such file or directory").

Commands run as `/bin/sh -c CMD` on this machine in its own process group, with cwd = the
sandbox directory, stdin closed and real exit statuses. The device's "filesystem" is the host's:
tests give base directories inside the sandbox; relative sync paths resolve in the sandbox.
When the host closes a shell stream, the command's process group gets SIGHUP (what a PTY or
adbd's shell protocol gives it), then SIGKILL if it is still there a second later.

Use it as a thread (`DeviceEnd(...).start()`) or as a process, which tests can kill to
simulate a pulled cable: `python tests/adb_device.py --port 0 --sandbox DIR [--no-shell-v2]`
prints `listening on 127.0.0.1:PORT` once it accepts connections (`start_process()` wraps it).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("adb_device")

A_SYNC = 0x434E5953
A_CNXN = 0x4E584E43
A_AUTH = 0x48545541
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_STLS = 0x534C5453
A_VERSION_MIN = 0x01000000
A_VERSION_SKIP_CHECKSUM = 0x01000001
A_VERSION = 0x01000001
MAX_PAYLOAD_V1 = 4 * 1024
MAX_PAYLOAD = 1024 * 1024
SYNC_DATA_MAX = 64 * 1024
INPUT_HIGH_WATER = 1024 * 1024   # unread bytes a stream holds before it withholds OKAY
OUTPUT_HIGH_WATER = 256 * 1024   # unsent bytes a service may queue before its writes block

_HEADER = struct.Struct("<6I")
_NAMES = {A_SYNC: "SYNC", A_CNXN: "CNXN", A_AUTH: "AUTH", A_OPEN: "OPEN", A_OKAY: "OKAY",
          A_CLSE: "CLSE", A_WRTE: "WRTE", A_STLS: "STLS"}

SHELL_STDIN, SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT, SHELL_CLOSE_STDIN, SHELL_WINDOW = range(6)

# The sync flags of SND2/RCV2 (file_sync_protocol.h); none is advertised, so none is accepted.
SYNC_FLAG_BROTLI, SYNC_FLAG_LZ4, SYNC_FLAG_ZSTD, SYNC_FLAG_DRY_RUN = 1, 2, 4, 0x80000000


@dataclass
class DeviceOptions:
    """What the fake device looks like to the adb server."""

    sandbox: Path
    shell_v2: bool = True
    version: int = A_VERSION
    max_payload: int = MAX_PAYLOAD
    product: str = "verifytest"
    model: str = "VerifyTest"
    device: str = "verifytest"
    env: dict[str, str] = field(default_factory=dict)

    @property
    def features(self) -> list[str]:
        names = ["shell_v2"] if self.shell_v2 else []
        return names + ["stat_v2", "ls_v2", "fixed_push_mkdir", "fixed_push_symlink_timestamp",
                        "sendrecv_v2"]

    @property
    def banner(self) -> bytes:
        props = [f"ro.product.name={self.product}", f"ro.product.model={self.model}",
                 f"ro.product.device={self.device}", f"features={','.join(self.features)}"]
        return ("device::" + ";".join(props)).encode()


class ProtocolError(Exception):
    """The host sent something adbd would drop the connection for."""


class StreamClosed(Exception):
    """The stream was closed (by the host, or because the transport went away)."""


# --- one stream: a local socket in adbd's terms ------------------------------------------------
class Stream:
    """One OPENed service: a byte pipe each way with adb's flow control on the wire side."""

    def __init__(self, transport: "Transport", local_id: int, remote_id: int) -> None:
        self.transport = transport
        self.local_id = local_id
        self.remote_id = remote_id
        self._cond = threading.Condition()
        self._in = bytearray()
        self._in_eof = False
        self._owe_okay = False
        self._out = bytearray()
        self._peer_ready = True  # adbd writes its first WRTE right after its OKAY to the OPEN
        self._finishing = False
        self.closed = False
        self.discard_input = False
        self.on_peer_close: Callable[[], None] | None = None
        self._pump = threading.Thread(target=self._pump_out, daemon=True,
                                      name=f"adb-stream-{local_id}")

    def start(self) -> None:
        self._pump.start()

    # service side ---------------------------------------------------------------------------
    def read(self, limit: int = 1 << 16) -> bytes:
        """Up to `limit` bytes the host sent; b"" once the stream is closed."""
        with self._cond:
            while not self._in and not self._in_eof:
                self._cond.wait()
            data = bytes(self._in[:limit])
            del self._in[:limit]
            okay_now = self._owe_okay and len(self._in) <= INPUT_HIGH_WATER and not self.closed
            if okay_now:
                self._owe_okay = False
        if okay_now:  # the withheld OKAY: the host may send the next WRTE now
            self.transport.send(A_OKAY, self.local_id, self.remote_id)
        return data

    def read_exact(self, n: int) -> bytes:
        parts = []
        while n > 0:
            chunk = self.read(n)
            if not chunk:
                raise StreamClosed("stream closed mid-message")
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def write(self, data: bytes) -> None:
        """Queue bytes for the host; blocks while too much is queued (a full socket buffer)."""
        with self._cond:
            while len(self._out) >= OUTPUT_HIGH_WATER and not self.closed:
                self._cond.wait()
            if self.closed or self._finishing:
                raise StreamClosed("stream closed")
            self._out += data
            self._cond.notify_all()

    def finish(self) -> None:
        """The service is done: send what is queued, then CLSE."""
        with self._cond:
            self._finishing = True
            self._cond.notify_all()

    # transport side -------------------------------------------------------------------------
    def on_write(self, payload: bytes) -> None:
        with self._cond:
            if self.closed:
                return
            if self.discard_input:
                okay_now = True
            else:
                self._in += payload
                okay_now = len(self._in) <= INPUT_HIGH_WATER
                self._owe_okay = not okay_now
                self._cond.notify_all()
        if okay_now:
            self.transport.send(A_OKAY, self.local_id, self.remote_id)

    def on_okay(self) -> None:
        with self._cond:
            self._peer_ready = True
            self._cond.notify_all()

    def peer_closed(self, reply: bool) -> None:
        """The host sent CLSE (reply with our own, as adbd does) or the transport died."""
        with self._cond:
            if self.closed:
                return
            self.closed = True
            self._in_eof = True
            self._out.clear()
            self._cond.notify_all()
        self.transport.forget(self)
        if reply:
            self.transport.send(A_CLSE, self.local_id, self.remote_id)
        if self.on_peer_close is not None:
            self.on_peer_close()

    def _pump_out(self) -> None:
        max_payload = self.transport.max_payload
        while True:
            with self._cond:
                while not self.closed and not (self._out and self._peer_ready) \
                        and not (self._finishing and not self._out):
                    self._cond.wait()
                if self.closed:
                    return
                if self._out and self._peer_ready:
                    chunk = bytes(self._out[:max_payload])
                    del self._out[:max_payload]
                    self._peer_ready = False
                    self._cond.notify_all()
                    command = A_WRTE
                else:
                    self.closed = True
                    self._in_eof = True
                    self._cond.notify_all()
                    chunk, command = b"", A_CLSE
            if command == A_CLSE:
                self.transport.forget(self)
            try:
                self.transport.send(command, self.local_id, self.remote_id, chunk)
            except OSError:
                self.peer_closed(reply=False)
                return
            if command == A_CLSE:
                return


# --- one TCP connection from the adb server: an atransport in adbd's terms -----------------------
class Transport:
    def __init__(self, sock: socket.socket, options: DeviceOptions) -> None:
        self.sock = sock
        self.options = options
        self.version = A_VERSION_MIN
        self.max_payload = MAX_PAYLOAD_V1
        self.online = False
        self._send_lock = threading.Lock()
        self._streams: dict[int, Stream] = {}
        self._streams_lock = threading.Lock()
        self._next_id = 1

    # wire -----------------------------------------------------------------------------------
    def send(self, command: int, arg0: int, arg1: int, payload: bytes = b"") -> None:
        check = 0 if self.version >= A_VERSION_SKIP_CHECKSUM else sum(payload) & 0xFFFFFFFF
        header = _HEADER.pack(command, arg0, arg1, len(payload), check, command ^ 0xFFFFFFFF)
        with self._send_lock:
            if len(payload) <= 4096:
                self.sock.sendall(header + payload)
            else:  # no need to copy a big payload just to glue 24 bytes on
                self.sock.sendall(header)
                self.sock.sendall(payload)
        log.debug("send %s %x %x %d", _NAMES.get(command, "????"), arg0, arg1, len(payload))

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise EOFError("connection closed")
            got += k
        return bytes(buf)

    def _read_packet(self) -> tuple[int, int, int, bytes]:
        command, arg0, arg1, length, check, magic = _HEADER.unpack(self._recv_exact(24))
        if magic != command ^ 0xFFFFFFFF:
            raise ProtocolError(f"bad magic {magic:08x} for command {command:08x}")
        if length > MAX_PAYLOAD:
            raise ProtocolError(f"payload of {length} bytes exceeds {MAX_PAYLOAD}")
        payload = self._recv_exact(length) if length else b""
        if self.version < A_VERSION_SKIP_CHECKSUM and sum(payload) & 0xFFFFFFFF != check:
            raise ProtocolError(f"bad checksum on {_NAMES.get(command, hex(command))}")
        return command, arg0, arg1, payload

    # streams --------------------------------------------------------------------------------
    def forget(self, stream: Stream) -> None:
        with self._streams_lock:
            if self._streams.get(stream.local_id) is stream:
                del self._streams[stream.local_id]

    def _find(self, local_id: int, remote_id: int) -> Stream | None:
        with self._streams_lock:
            stream = self._streams.get(local_id)
        if stream is None or (remote_id and stream.remote_id != remote_id):
            return None
        return stream

    def _close_all(self) -> None:
        with self._streams_lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.peer_closed(reply=False)

    # dispatch -------------------------------------------------------------------------------
    def serve(self) -> None:
        try:
            while True:
                command, arg0, arg1, payload = self._read_packet()
                log.debug("recv %s %x %x %d", _NAMES.get(command, "????"), arg0, arg1, len(payload))
                if command == A_CNXN:
                    self._on_connect(arg0, arg1, payload)
                elif not self.online:
                    continue  # adbd ignores everything but CNXN (and AUTH) until online
                elif command == A_OPEN:
                    self._on_open(arg0, arg1, payload)
                elif command == A_OKAY:
                    if arg0 and arg1 and not payload and (s := self._find(arg1, arg0)):
                        s.on_okay()
                elif command == A_WRTE:
                    if arg0 and arg1 and (s := self._find(arg1, arg0)):
                        s.on_write(payload)
                elif command == A_CLSE:
                    if arg1 and (s := self._find(arg1, arg0)):
                        s.peer_closed(reply=True)
        except (EOFError, OSError) as exc:
            log.info("transport closed: %s", exc)
        except ProtocolError as exc:
            log.warning("dropping the connection: %s", exc)
        finally:
            self._close_all()
            try:
                self.sock.close()
            except OSError:
                pass

    def shutdown(self) -> None:
        """Drop the connection now, hanging up every running command first."""
        self._close_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _on_connect(self, version: int, max_payload: int, banner: bytes) -> None:
        self._close_all()
        # atransport::update_version: each side keeps the smaller version and payload.
        self.version = min(version, self.options.version)
        self.max_payload = min(max_payload, self.options.max_payload, MAX_PAYLOAD)
        self.online = True
        log.info("CNXN from %r: version %08x, max payload %d", banner[:40], self.version,
                 self.max_payload)
        self.send(A_CNXN, self.options.version, self.max_payload, self.options.banner)

    def _on_open(self, remote_id: int, send_bytes: int, payload: bytes) -> None:
        if remote_id == 0:
            return
        if send_bytes != 0:  # delayed acks are not advertised, so arg1 must be 0
            self.send(A_CLSE, 0, remote_id)
            return
        name = payload.rstrip(b"\0").decode("utf-8", errors="replace")
        service = find_service(name, self.options)
        if service is None:
            log.info("refusing service %r", name)
            self.send(A_CLSE, 0, remote_id)
            return
        with self._streams_lock:
            local_id = self._next_id
            self._next_id += 1
            stream = Stream(self, local_id, remote_id)
            self._streams[local_id] = stream
        log.info("OPEN %r as %d", name, local_id)
        self.send(A_OKAY, local_id, remote_id)
        stream.start()
        threading.Thread(target=_run_service, args=(service, stream), daemon=True,
                         name=f"adb-service-{local_id}").start()


def _run_service(service: Callable[[Stream], None], stream: Stream) -> None:
    try:
        service(stream)
    except StreamClosed:
        pass
    except Exception:  # noqa: BLE001 - a service bug must not take the transport down
        log.exception("service failed")
    finally:
        stream.finish()


# --- services -----------------------------------------------------------------------------------
def find_service(name: str, options: DeviceOptions) -> Callable[[Stream], None] | None:
    """The service for an OPEN destination, or None to refuse it (CLSE(0, id))."""
    if name.startswith("sync:"):
        return lambda stream: sync_service(stream, options)
    if name.startswith("exec:"):
        return _raw_shell(name[len("exec:"):], options)
    if name.startswith("shell"):
        args, sep, command = name[len("shell"):].partition(":")
        if not sep or not command:
            return None  # interactive shells (a PTY) are not implemented
        flags = [a for a in args.split(",") if a]
        if not flags:
            return _raw_shell(command, options)
        if not options.shell_v2:
            return None  # an adbd without shell_v2 knows no `shell,ARGS:` services
        if "v2" in flags:
            return lambda stream: shell_v2_service(stream, command, options)
        return _raw_shell(command, options)
    return None


def _raw_shell(command: str, options: DeviceOptions) -> Callable[[Stream], None] | None:
    if not command:
        return None
    return lambda stream: raw_shell_service(stream, command, options)


def _spawn(command: str, options: DeviceOptions, merge_stderr: bool,
           stdin: bool = False) -> subprocess.Popen[bytes]:
    env = {**os.environ, **options.env}
    return subprocess.Popen(["/bin/sh", "-c", command], cwd=options.sandbox, env=env,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            start_new_session=True)


def _hang_up(proc: subprocess.Popen[bytes]) -> None:
    """SIGHUP the command's process group (what a closed PTY does), SIGKILL it a second later."""
    def signal_group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    signal_group(signal.SIGHUP)

    def finish_off() -> None:
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        signal_group(signal.SIGKILL)

    threading.Thread(target=finish_off, daemon=True).start()


def _hang_up_on_close(stream: Stream, proc: subprocess.Popen[bytes]) -> None:
    stream.on_peer_close = lambda: _hang_up(proc)
    if stream.closed:  # the host closed the stream before the hook was in place
        _hang_up(proc)


def raw_shell_service(stream: Stream, command: str, options: DeviceOptions) -> None:
    """`shell:CMD`: stdout and stderr merged into the stream, no exit status, input ignored."""
    stream.discard_input = True
    proc = _spawn(command, options, merge_stderr=True)
    _hang_up_on_close(stream, proc)
    assert proc.stdout is not None
    try:
        while data := os.read(proc.stdout.fileno(), stream.transport.max_payload):
            stream.write(data)
    finally:
        stream.finish()
        proc.stdout.close()
        proc.wait()


def shell_v2_service(stream: Stream, command: str, options: DeviceOptions) -> None:
    """`shell,v2:CMD`: stdout and stderr as separate packets, then the exit status."""
    proc = _spawn(command, options, merge_stderr=False, stdin=True)
    _hang_up_on_close(stream, proc)
    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    stdin = proc.stdin

    def pump(fd: int, packet_id: int) -> None:
        try:
            while data := os.read(fd, 32 * 1024):
                stream.write(bytes([packet_id]) + struct.pack("<I", len(data)) + data)
        except StreamClosed:
            pass

    def swallow_input() -> None:
        # stdin packets go to the command's stdin, close-stdin closes it; window-size packets
        # are read and dropped (so the host's OKAYs keep coming).
        try:
            while True:
                header = stream.read_exact(5)
                data = stream.read_exact(struct.unpack("<I", header[1:])[0])
                if header[0] == SHELL_STDIN and not stdin.closed:
                    try:
                        stdin.write(data)
                        stdin.flush()
                    except (BrokenPipeError, ValueError):
                        pass
                elif header[0] == SHELL_CLOSE_STDIN and not stdin.closed:
                    stdin.close()
        except StreamClosed:
            pass
        finally:
            try:
                stdin.close()
            except (BrokenPipeError, ValueError):
                pass

    threading.Thread(target=swallow_input, daemon=True).start()
    pumps = [threading.Thread(target=pump, args=(proc.stdout.fileno(), SHELL_STDOUT), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr.fileno(), SHELL_STDERR), daemon=True)]
    for t in pumps:
        t.start()
    for t in pumps:
        t.join()
    proc.stdout.close()
    proc.stderr.close()
    status = proc.wait()
    code = status if status >= 0 else 0x80 | -status
    try:
        stream.write(bytes([SHELL_EXIT]) + struct.pack("<I", 1) + bytes([code & 0xFF]))
    except StreamClosed:
        pass


# --- sync: ------------------------------------------------------------------------------------
def _sync_fail(stream: Stream, reason: str) -> None:
    data = reason.encode()
    stream.write(b"FAIL" + struct.pack("<I", len(data)) + data)


def _strerror(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


def _stat_v2(sid: bytes, st: os.stat_result | None, error: int) -> bytes:
    if st is None:
        return sid + struct.pack("<IQQIIIIQqqq", error, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return sid + struct.pack("<IQQIIIIQqqq", 0, st.st_dev, st.st_ino, st.st_mode, st.st_nlink,
                             st.st_uid, st.st_gid, st.st_size, int(st.st_atime),
                             int(st.st_mtime), int(st.st_ctime))


def sync_service(stream: Stream, options: DeviceOptions) -> None:
    """The file service: one request after another until QUIT, a failure, or the stream ends."""
    def resolve(path: bytes) -> str:
        return os.path.join(options.sandbox, path.decode("utf-8", errors="surrogateescape"))

    while True:
        try:
            header = stream.read_exact(8)
        except StreamClosed:
            return
        sid, length = header[:4], struct.unpack("<I", header[4:])[0]
        if length > 1024:
            _sync_fail(stream, "path too long")
            return
        name = stream.read_exact(length)
        log.info("sync %s %r", sid.decode(errors="replace"), name)
        if sid == b"STAT":  # v1 STAT is an lstat
            try:
                st = os.lstat(resolve(name))
                reply = struct.pack("<III", st.st_mode, st.st_size & 0xFFFFFFFF,
                                    int(st.st_mtime) & 0xFFFFFFFF)
            except OSError:
                reply = bytes(12)
            stream.write(b"STAT" + reply)
        elif sid in (b"STA2", b"LST2"):
            try:
                path = resolve(name)
                st = os.stat(path) if sid == b"STA2" else os.lstat(path)
                stream.write(_stat_v2(sid, st, 0))
            except OSError as exc:
                stream.write(_stat_v2(sid, None, exc.errno or errno.EIO))
        elif sid in (b"LIST", b"LIS2"):
            _sync_list(stream, resolve(name), v2=sid == b"LIS2")
        elif sid == b"SEND":
            spec = name.decode("utf-8", errors="surrogateescape")
            path, comma, mode_text = spec.rpartition(",")
            if not comma:
                _sync_fail(stream, "missing , in ID_SEND_V1")
                return
            try:
                mode = _strtoul(mode_text)
            except ValueError:
                _sync_fail(stream, "bad mode")
                return
            if not _sync_send(stream, resolve(path.encode("utf-8", "surrogateescape")), mode):
                return
        elif sid == b"SND2":
            setup = stream.read_exact(12)
            sid2, mode, flags = setup[:4], *struct.unpack("<II", setup[4:])
            if sid2 != b"SND2":
                _sync_fail(stream, "send_v2 setup packet expected")
                return
            if flags:
                _sync_fail(stream, f"unknown flags: {flags}")
                return
            if not _sync_send(stream, resolve(name), mode):
                return
        elif sid in (b"RECV", b"RCV2"):
            if sid == b"RCV2":
                setup = stream.read_exact(8)
                flags = struct.unpack("<I", setup[4:])[0]
                if setup[:4] != b"RCV2" or flags:
                    _sync_fail(stream, f"unknown flags: {flags}")
                    return
            if not _sync_recv(stream, resolve(name)):
                return
        elif sid == b"QUIT":
            return
        else:
            _sync_fail(stream, f"unknown command {struct.unpack('<I', sid)[0]:08x}")
            return


def _strtoul(text: str) -> int:
    """strtoul(text, nullptr, 0): 0x.. is hex, 0.. octal, else decimal."""
    text = text.strip()
    if text[:2].lower() == "0x":
        return int(text[2:], 16)
    if len(text) > 1 and text.startswith("0"):
        return int(text[1:], 8)
    return int(text, 10)


def _sync_list(stream: Stream, path: str, v2: bool) -> None:
    try:
        names = [".", "..", *os.listdir(path)]
    except OSError:
        names = []
    for entry in names:
        raw = os.fsencode(entry)
        try:
            st = os.lstat(os.path.join(path, entry))
        except OSError as exc:
            if not v2:
                continue
            stream.write(_stat_v2(b"DNT2", None, exc.errno or errno.EIO)
                         + struct.pack("<I", len(raw)) + raw)
            continue
        if v2:
            stream.write(_stat_v2(b"DNT2", st, 0) + struct.pack("<I", len(raw)) + raw)
        else:
            stream.write(b"DENT" + struct.pack("<IIII", st.st_mode, st.st_size & 0xFFFFFFFF,
                                               int(st.st_mtime) & 0xFFFFFFFF, len(raw)) + raw)
    stream.write(b"DONE" + bytes(72 if v2 else 16))


def _discard_until_done(stream: Stream) -> None:
    """After a FAIL, adbd keeps reading (and dropping) DATA until DONE, so the host sees it."""
    try:
        while True:
            header = stream.read_exact(8)
            if header[:4] != b"DATA":
                return
            stream.read_exact(struct.unpack("<I", header[4:])[0])
    except StreamClosed:
        pass


def _sync_send(stream: Stream, path: str, mode: int) -> bool:
    """Receive one file (or symlink). Returns False when the sync service must end."""
    if stat.S_ISLNK(mode):
        return _sync_send_link(stream, path)
    mode &= 0o777
    mode |= (mode >> 3) & 0o070   # adbd copies the user bits to group and other
    mode |= (mode >> 3) & 0o007
    try:  # adbd unlinks a regular file or symlink first (not device nodes: `push img /dev/x`)
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            os.unlink(path)
    except OSError:
        pass
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), mode=0o775, exist_ok=True)  # fixed_push_mkdir
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        os.fchmod(fd, mode)
    except OSError as exc:
        _sync_fail(stream, f"couldn't create file: {_strerror(exc)}")
        _discard_until_done(stream)
        return False
    try:
        while True:
            header = stream.read_exact(8)
            sid, size = header[:4], struct.unpack("<I", header[4:])[0]
            if sid == b"DONE":
                timestamp = size
                break
            if sid != b"DATA":
                raise _SendFailure("invalid data message")
            if size > SYNC_DATA_MAX:
                raise _SendFailure("oversize data message")
            data = memoryview(stream.read_exact(size))
            try:
                while data:
                    data = data[os.write(fd, data):]
            except OSError as exc:
                raise _SendFailure(f"write failed: {_strerror(exc)}") from exc
    except _SendFailure as failure:
        os.close(fd)
        _sync_fail(stream, str(failure))
        _discard_until_done(stream)
        _unlink_quietly(path)
        return False
    except StreamClosed:
        os.close(fd)
        _unlink_quietly(path)  # adbd unlinks what a dropped push left behind
        raise
    os.close(fd)
    os.utime(path, (timestamp, timestamp))
    stream.write(b"OKAY" + bytes(4))
    return True


class _SendFailure(Exception):
    pass


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _sync_send_link(stream: Stream, path: str) -> bool:
    header = stream.read_exact(8)
    if header[:4] != b"DATA":
        _sync_fail(stream, "invalid data message: expected ID_DATA")
        return False
    size = struct.unpack("<I", header[4:])[0]
    if size > SYNC_DATA_MAX:
        _sync_fail(stream, "oversize data message")
        return False
    target = stream.read_exact(size).rstrip(b"\0")
    try:
        if not os.path.islink(path) or os.fsencode(os.readlink(path)) != target:
            _unlink_quietly(path)
            try:
                os.symlink(target, path)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(path), mode=0o775, exist_ok=True)
                os.symlink(target, path)
    except OSError as exc:
        _sync_fail(stream, f"symlink failed: {_strerror(exc)}")
        return False
    header = stream.read_exact(8)
    if header[:4] != b"DONE":
        _sync_fail(stream, "invalid data message: expected ID_DONE")
        return False
    timestamp = struct.unpack("<I", header[4:])[0]
    os.utime(path, (timestamp, timestamp), follow_symlinks=False)  # fixed_push_symlink_timestamp
    stream.write(b"OKAY" + bytes(4))
    return True


def _sync_recv(stream: Stream, path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        _sync_fail(stream, f"open failed: {_strerror(exc)}")
        return False
    try:
        while True:
            try:
                data = os.read(fd, SYNC_DATA_MAX)
            except OSError as exc:
                _sync_fail(stream, f"read failed: {_strerror(exc)}")
                return False
            if not data:
                break
            stream.write(b"DATA" + struct.pack("<I", len(data)) + data)
    finally:
        os.close(fd)
    stream.write(b"DONE" + bytes(4))
    return True


# --- listening, and the Python API ------------------------------------------------------------
class DeviceEnd:
    """A fake device listening on 127.0.0.1, served by threads of this process.

    `DeviceEnd(sandbox).start()`; `.address` is what `adb connect` takes; `.stop()` closes the
    listener and every connection (the adb server then sees the device go away).
    """

    def __init__(self, sandbox: Path | str, *, port: int = 0, shell_v2: bool = True,
                 version: int = A_VERSION, max_payload: int = MAX_PAYLOAD) -> None:
        self.options = DeviceOptions(sandbox=Path(sandbox).resolve(), shell_v2=shell_v2,
                                     version=version, max_payload=max_payload)
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self._transports: list[Transport] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="adb-device")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "DeviceEnd":
        self.options.sandbox.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.options.sandbox.mkdir(parents=True, exist_ok=True)
        self._accept()

    def stop(self) -> None:
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            transports, self._transports = self._transports, []
        for transport in transports:
            transport.shutdown()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            transport = Transport(conn, self.options)
            with self._lock:
                self._transports.append(transport)
            log.info("connection from %s:%d", *peer)
            threading.Thread(target=transport.serve, daemon=True, name="adb-transport").start()


class DeviceEndProcess:
    """A device end in a child process: `kill()` is a pulled cable, `stop()` a clean exit."""

    def __init__(self, proc: subprocess.Popen[str], port: int, sandbox: Path) -> None:
        self.proc = proc
        self.port = port
        self.sandbox = sandbox

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def start_process(sandbox: Path | str, *, shell_v2: bool = True, version: int = A_VERSION,
                  max_payload: int = MAX_PAYLOAD, log_file: Path | None = None,
                  start_timeout: float = 30.0) -> DeviceEndProcess:
    """Start `python adb_device.py` and wait until it listens."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--port", "0", "--sandbox",
            str(sandbox), "--protocol-version", hex(version), "--max-payload", str(max_payload)]
    if not shell_v2:
        argv.append("--no-shell-v2")
    if log_file is not None:
        argv += ["--log", str(log_file)]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + start_timeout
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("listening on "):
            return DeviceEndProcess(proc, int(line.rsplit(":", 1)[1]), Path(sandbox).resolve())
        if not line:
            break
    proc.kill()
    proc.wait()
    raise RuntimeError(f"adb device end did not start (last output: {line!r})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free)")
    parser.add_argument("--sandbox", required=True, type=Path,
                        help="the commands' working directory; relative sync paths start here")
    parser.add_argument("--no-shell-v2", dest="shell_v2", action="store_false",
                        help="do not advertise shell_v2 (an Android < 7 device)")
    parser.add_argument("--protocol-version", type=lambda s: int(s, 0), default=A_VERSION,
                        help="0x01000000 makes checksums mandatory")
    parser.add_argument("--max-payload", type=int, default=MAX_PAYLOAD)
    parser.add_argument("--log", type=Path, help="append a protocol log here")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every packet")
    args = parser.parse_args(argv)
    logging.basicConfig(filename=args.log, level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(threadName)s %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    device = DeviceEnd(args.sandbox, port=args.port, shell_v2=args.shell_v2,
                       version=args.protocol_version, max_payload=args.max_payload)
    print(f"listening on {device.address}", flush=True)
    try:
        device.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        device.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
