"""The plain parts every transport shares: what a command did, the transfer counts, a driver's
configuration, cache file records, and the helpers that need no connection (a file's sha256,
an argv quoted into one POSIX shell command, a host disk error behind a transport's)."""

from __future__ import annotations

import errno
import hashlib
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

Progress = Callable[[int], None]
"""Called with the number of bytes moved since the last call."""


@dataclass(frozen=True)
class CommandResult:
    """What a command on the device did."""

    argv: tuple[str, ...]
    status: int
    stdout: str
    stderr: str




@dataclass(frozen=True)
class CacheFile:
    """One file of a device's cache; `used` is its last use (mtime, seconds since epoch)."""

    path: str
    size: int
    used: float


@dataclass
class TransferStats:
    """Counts what actually crossed the wire, so tests and users can see the cache work."""

    bytes_put: int = 0
    files_put: int = 0
    files_cached: int = 0
    bytes_got: int = 0
    files_got: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class DriverConfig:
    """What a driver needs to know, taken from the device spec and its profile."""

    transport: str
    address: str = ""
    base_dir: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    connect_timeout: float = 15.0
    command_timeout: float = 600.0
    options: Mapping[str, object] = field(default_factory=dict)
    spec: str = ""  # the device as the user named it (`ssh:board`), for messages


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def shell_command(argv: Sequence[str], env: Mapping[str, str] | None = None,
                  cwd: str | None = None, exec_: bool = True) -> str:
    """Quote an argv (with optional env and cwd) into one POSIX shell command string; with
    `exec_` False the shell stays (to see how the command ended) instead of becoming it."""
    words = ["env", *(f"{k}={v}" for k, v in (env or {}).items()), *argv] if env else list(argv)
    cmd = shlex.join(words)
    run = f"exec {cmd}" if exec_ else cmd
    return f"cd {shlex.quote(cwd)} && {run}" if cwd else run


# errnos only writing the host's file can raise during a download (never a socket's)
_HOST_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def host_write_error(exc: BaseException) -> OSError | None:
    """The OSError behind a transport's error when it is the host's disk (full, read-only,
    over quota) that failed a download: ssh and adb wrap every OSError as the device's."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in _HOST_ERRNOS:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
