"""File transfers over an ssh exec channel: large downloads, and every transfer with a server
that has no SFTP subsystem; and the SFTP side's helpers: the removal of small trees
(`sftp_remove_small`), `mkdir -p` (`sftp_makedirs`), progress as verify counts it
(`adapt_progress`).

A download runs `wc -c < PATH; sha256sum < PATH; cat PATH` in one command and checks the bytes
it received against that size and digest; an upload sends the file to `cat > PATH`, then checks
the size and digest the device reports back. Paths are quoted with shlex.quote; nothing else
reaches the shell. A device without sha256sum (nor `shasum -a 256`) is checked on size alone.
Output that the login shell's rc files print before the command is skipped: the command
starts with a random marker line.

Why not SFTP for large downloads: paramiko pipelines SFTP reads only from a prefetch helper
thread, which dies with an uncaught exception when the link drops (silencing it took a
process-wide `threading.excepthook`); unpipelined reads cost a round trip per 32 KiB. A stream
over one channel needs neither.
"""

from __future__ import annotations

import errno
import hashlib
import posixpath
import secrets
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import paramiko

CHUNK = 1 << 16
_DIGEST = "{{ sha256sum < {p} 2>/dev/null || shasum -a 256 < {p} 2>/dev/null || echo -; }}"


class Stream(Protocol):
    """The part of paramiko's Channel this module uses (it imports no paramiko)."""

    def exec_command(self, command: str) -> None: ...
    def sendall(self, data: bytes) -> None: ...
    def shutdown_write(self) -> None: ...
    def recv(self, n: int) -> bytes: ...
    def recv_stderr(self, n: int) -> bytes: ...
    def recv_exit_status(self) -> int: ...


@dataclass(frozen=True)
class Outcome:
    """What the device said about a transfer: its exit status, and the size and digest it saw
    (digest '-' when it has no sha256 tool). `size` is None when the command failed first."""

    status: int
    size: int | None
    digest: str
    stderr: str
    sent_or_received: int
    local_digest: str

    def problem(self, remote: str) -> str | None:
        """Why the transfer of `remote` is not to be trusted, or None when it checks out."""
        if self.status != 0:
            last = self.stderr.strip().splitlines()[-1] if self.stderr.strip() else ""
            if remote in last:
                # "bash: line 1: PATH: No such file or directory" (each shell words it its own
                # way): the reason is what follows the last colon.
                last = last.rpartition(": ")[2]
            return last or f"the device's shell exited {self.status}"
        if self.size is None:
            return "the device did not report the file's size"
        if self.size != self.sent_or_received:
            return f"{self.sent_or_received} bytes crossed the link but the file on the " \
                   f"device has {self.size}"
        if self.digest != "-" and self.digest != self.local_digest:
            return f"sha256 differs: {self.local_digest[:16]}… here, {self.digest[:16]}… " \
                   "on the device"
        return None


def put(chan: Stream, local: Path, remote: str, progress: Callable[[int], None] | None) -> Outcome:
    """Send `local` to `remote` on the device through `cat`; the channel is fresh, unused."""
    marker = _marker()
    p = shlex.quote(remote)
    chan.exec_command(f"echo {marker}; cat > {p} && wc -c < {p} && {_DIGEST.format(p=p)}")
    digest, sent = hashlib.sha256(), 0
    with open(local, "rb") as fh:
        while block := fh.read(CHUNK):
            try:
                chan.sendall(block)
            except OSError:
                break  # the command ended early (no such directory...): its status says why
            digest.update(block)
            sent += len(block)
            if progress is not None:
                progress(len(block))
    chan.shutdown_write()
    out = _after_marker(_read_all(chan.recv), marker)
    size, remote_digest = _size_and_digest(out)
    err = _read_all(chan.recv_stderr).decode(errors="replace")
    return Outcome(chan.recv_exit_status(), size, remote_digest, err, sent, digest.hexdigest())


def get(chan: Stream, remote: str, local: Path,
        progress: Callable[[int], None] | None) -> Outcome:
    """Fetch `remote` into `local` (created or truncated); the channel is fresh, unused."""
    marker = _marker()
    p = shlex.quote(remote)
    chan.exec_command(f"echo {marker}; wc -c < {p} && {_DIGEST.format(p=p)} && exec cat < {p}")
    chan.shutdown_write()
    head = bytearray()
    key = marker.encode() + b"\n"
    size: int | None = None
    remote_digest = "-"
    digest, received = hashlib.sha256(), 0
    with open(local, "wb") as fh:
        while data := chan.recv(CHUNK):
            if size is None:
                head += data
                start = head.find(key)
                lines = head[start + len(key):].split(b"\n", 2) if start >= 0 else []
                if len(lines) < 3:
                    continue  # the marker and the two header lines are not all here yet
                size, remote_digest = _size_and_digest(b"\n".join(lines[:2]))
                data = bytes(lines[2])
                head.clear()
            fh.write(data)
            digest.update(data)
            received += len(data)
            if progress is not None and data:
                progress(len(data))
    err = _read_all(chan.recv_stderr).decode(errors="replace")
    return Outcome(chan.recv_exit_status(), size, remote_digest, err, received,
                   digest.hexdigest())


def _marker() -> str:
    return f"verify-xfer-{secrets.token_hex(6)}"


def _read_all(recv: Callable[[int], bytes]) -> bytes:
    chunks = []
    while data := recv(CHUNK):
        chunks.append(data)
    return b"".join(chunks)


def _after_marker(out: bytes, marker: str) -> bytes:
    key = marker.encode() + b"\n"
    start = out.find(key)
    return out[start + len(key):] if start >= 0 else b""


def _size_and_digest(text: bytes) -> tuple[int | None, str]:
    words = text.split()
    size = int(words[0]) if words and words[0].isdigit() else None
    digest = words[1].decode(errors="replace").lower() if len(words) > 1 else "-"
    return size, digest if len(digest) == 64 else "-"


SFTP_REMOVE_MAX = 64  # entries a tree may have to be removed over SFTP (else one `rm -rf`)


def sftp_remove_small(sftp: paramiko.SFTPClient, path: str,
                      limit: int = SFTP_REMOVE_MAX) -> bool:
    """Remove a small tree (a job's folder: a few files) over SFTP, without starting a process
    on the device (an exec costs a login shell: 0.5-0.9 s on a loaded host, where an SFTP
    request is ~2 ms). False, with nothing removed, when it holds more than `limit` entries:
    one `rm -rf` is then faster. A path that does not exist is removed already. Symbolic
    links are removed, never followed."""
    try:
        top = sftp.lstat(path)
    except FileNotFoundError:
        return True
    files: list[str] = []
    dirs: list[str] = []
    pending = [path] if stat.S_ISDIR(top.st_mode or 0) else []
    if not pending:
        files.append(path)
    while pending:
        folder = pending.pop()
        dirs.append(folder)
        for entry in sftp.listdir_attr(folder):
            child = f"{folder}/{entry.filename}"
            (pending if stat.S_ISDIR(entry.st_mode or 0) else files).append(child)
            if len(files) + len(dirs) + len(pending) > limit:
                return False
    for file in files:
        sftp.remove(file)
    for folder in reversed(dirs):  # deepest first
        sftp.rmdir(folder)
    return True


def sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """`mkdir -p` over SFTP; a path that exists and is not a folder is NotADirectoryError."""
    try:
        mode = sftp.stat(path).st_mode
    except FileNotFoundError:
        parent = posixpath.dirname(path.rstrip("/"))
        if parent and parent != path:
            sftp_makedirs(sftp, parent)
        try:
            sftp.mkdir(path)
            return
        except OSError as exc:
            try:
                mode = sftp.stat(path).st_mode  # created meanwhile by someone else?
            except OSError:
                raise exc from None
    if mode is None or not stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, f"{path} exists and is not a directory")


def adapt_progress(progress: Callable[[int], None] | None) -> Callable[[int, int], None] | None:
    """paramiko reports bytes so far; verify's Progress wants bytes since the last call."""
    if progress is None:
        return None
    done = 0

    def callback(sofar: int, total: int) -> None:
        nonlocal done
        if sofar > done:
            progress(sofar - done)
            done = sofar
    return callback
