"""The one small interface every transport implements, and the work they all share.

A subclass fills in the transport primitives (`_open_impl`, `_close_impl`, `_exec_impl`,
`_put_impl`, `_get_impl`); the base class adds what every transport needs on top of them:
atomic transfers (temp name + rename on both ends), the content-addressed cache on the
device, private work directories, transfer statistics, and `describe()`.

Remote paths are POSIX strings. Commands are argument lists; a transport that must hand a
string to a remote shell quotes them at its boundary with `shlex.join`, never by hand.
"""

from __future__ import annotations

__all__ = ["CacheFile", "CommandResult", "Driver", "DriverConfig", "Progress", "TransferStats",
           "sha256_file", "shell_command"]  # the plain parts live in basics.py

import hashlib
import posixpath
import secrets
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from verify.drivers.basics import (CacheFile, CommandResult, DriverConfig, Progress, TransferStats,
                                   host_write_error, sha256_file, shell_command)
from verify.drivers.channel import LineChannel
from verify.errors import DeviceError, OutputError, RemoteCommandFailed
from verify.files import atomic_path, made_dirs, os_reason

PART_MAX_AGE = 600.0  # seconds untouched before a partial transfer counts as abandoned
CLEANUP_TIMEOUT = 10.0  # seconds for each cleanup command after a failure or an interrupt


class Driver(ABC):
    """A connection to one device. Use as a context manager: `with driver: ...`."""

    transport: str = ""
    default_base_dir: str = "/tmp/verify"

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self.base_dir = config.base_dir or self.default_base_dir
        self.stats = TransferStats()
        self._opened = False
        self._used: set[str] = set()     # cache files used this session (LRU bookkeeping)
        self._parts_swept = False
        self._cleaning = False  # within _cleaning_up: every command capped at CLEANUP_TIMEOUT

    # --- transport primitives: subclasses implement these ----------------------------------
    @abstractmethod
    def _open_impl(self) -> None: ...

    @abstractmethod
    def _close_impl(self) -> None: ...

    @abstractmethod
    def _exec_impl(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str],
                   cwd: str | None) -> CommandResult:
        """Run argv on the device; raise DeviceTimeout when it overruns, never hang."""

    @abstractmethod
    def _put_impl(self, local: Path, remote: str, progress: Progress | None) -> None: ...

    @abstractmethod
    def _get_impl(self, remote: str, local: Path, progress: Progress | None) -> None: ...

    # --- file-system primitives: POSIX commands by default, overridable ----------------------
    def _move_impl(self, remote: str, local: Path, progress: Progress | None) -> None:
        """Fetch a file the device will not need again: a copy, unless the transport can do
        better (the remote file may or may not be left behind)."""
        self._get_impl(remote, local, progress)

    def _hand_over_impl(self, remote: str, local: Path) -> bool:
        """Put a device file the device needs no more at `local` in one atomic step, where the
        transport can (a rename on one file system): True when done; False (the default) to
        fetch it through a temporary file instead."""
        return False

    def _rename_impl(self, src: str, dst: str) -> None:
        self.run(["mv", "-f", src, dst], what=f"{self.describe_address()}: rename")

    def _makedirs_impl(self, path: str) -> None:
        self.run(["mkdir", "-p", path], what=f"{self.describe_address()}: mkdir")

    def _remove_impl(self, path: str) -> None:
        self.run(["rm", "-rf", path], what=f"{self.describe_address()}: remove")

    def _exists_impl(self, path: str) -> bool:
        return self.run(["test", "-e", path], check=False).status == 0

    # --- lifecycle ----------------------------------------------------------------------------
    def open(self) -> "Driver":
        if not self._opened:
            self._open_impl()
            self._opened = True
        return self

    def close(self) -> None:
        if self._opened:
            self._opened = False
            try:
                # the cache files this session used: newest for LRU eviction. A hint only:
                # not while a failure or an interrupt is on its way up (over a dead link the
                # touch replaced the real error with "connection lost (running touch)", and
                # Ctrl-C's 130 with exit 3), and its own failure is never the command's
                if self._used and sys.exc_info()[1] is None:
                    with self._cleaning_up():
                        try:
                            self.mark_used(sorted(self._used))
                        except DeviceError:
                            pass
                self._used.clear()
            finally:
                self._close_impl()

    @contextmanager
    def _cleaning_up(self) -> Iterator[None]:
        """Commands run within are capped at CLEANUP_TIMEOUT: cleaning up after a failure or an
        interrupt on a device that stopped answering waited out the whole command timeout
        (600 s) for each step, so Ctrl-C looked hung for minutes."""
        old, self._cleaning = self._cleaning, True
        try:
            yield
        finally:
            self._cleaning = old

    def __enter__(self) -> "Driver":
        return self.open()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- the public interface -----------------------------------------------------------------
    def run(self, argv: Sequence[str], *, timeout: float | None = None,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            check: bool = True, what: str | None = None) -> CommandResult:
        """Run a command; with check, a non-zero exit raises RemoteCommandFailed."""
        merged = {**self.config.env, **(env or {})}
        limit = self.config.command_timeout if timeout is None else timeout
        if self._cleaning:
            limit = min(limit, CLEANUP_TIMEOUT)
        result = self._exec_impl(list(argv), timeout=limit, env=merged, cwd=cwd)
        if check and result.status != 0:
            raise RemoteCommandFailed(what or f"{self.describe_address()}: {argv[0]}",
                                      argv, result.status, result.stderr)
        return result

    def spawn(self, argv: Sequence[str], *, cwd: str | None = None,
              env: Mapping[str, str] | None = None) -> LineChannel | None:
        """Start a command left running, to be spoken to in lines (a serving runner); None
        where the transport cannot hold one open (the caller then runs one command a job)."""
        return self._spawn_impl(list(argv), env={**self.config.env, **(env or {})}, cwd=cwd)

    def _spawn_impl(self, argv: Sequence[str], *, env: Mapping[str, str],
                    cwd: str | None) -> LineChannel | None:
        return None

    def put(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        """Copy a local file to the device atomically (temp name, then rename)."""
        size = local.stat().st_size
        tmp = f"{remote}.part-{secrets.token_hex(4)}"
        try:
            self._put_impl(local, tmp, progress)
            self._rename_impl(tmp, remote)
        except BaseException:
            self._try_remove(tmp)
            raise
        self.stats.bytes_put += size
        self.stats.files_put += 1

    def get(self, remote: str, local: Path, progress: Progress | None = None, *,
            move: bool = False) -> None:
        """Copy a device file to the host atomically: a partial file never appears at `local`.
        With `move` the device no longer needs the file, and a transport that can hand it over
        without copying (the local one, on one file system) does so, renaming it straight
        onto `local` (already atomic: no temporary file and second rename per file, which
        cost a 673-tensor dump 0.4 s on the host; issue 14)."""
        with made_dirs(local.parent):  # folders made here go again when the get fails
            if move and self._hand_over_impl(remote, local):
                if progress:
                    progress(local.stat().st_size)
            else:
                self._get_atomic(remote, local, progress, move)
        self.stats.bytes_got += local.stat().st_size
        self.stats.files_got += 1

    def _get_atomic(self, remote: str, local: Path, progress: Progress | None,
                    move: bool) -> None:
        with atomic_path(local) as tmp:
            try:
                (self._move_impl if move else self._get_impl)(remote, tmp, progress)
            except DeviceError as exc:
                host = host_write_error(exc)
                if host is None:
                    raise
                # the host's disk, not the device: the one line the local driver gives, exit 2
                raise OutputError(f"{local}: cannot write: {os_reason(host)}") from None

    def push_cached(self, local: Path, progress: Progress | None = None,
                    digest: str | None = None, *, data: bytes | None = None) -> str:
        """Push a file into the device's content-addressed cache; skip it if already there.

        Returns the remote path. The name is the file's sha256 plus its suffix, so the same
        bytes are sent once per device whatever the local file is called. With `data` (bytes
        already in memory) they are hashed once and written to `local` only when the device
        lacks them, so a repeated run of a 100 MB model neither writes nor re-hashes a file.
        """
        if digest is None:
            digest = hashlib.sha256(data).hexdigest() if data is not None else sha256_file(local)
        remote = posixpath.join(self.cache_dir, digest + "".join(local.suffixes[-1:]))
        if self._exists_impl(remote):
            self.stats.files_cached += 1
            self._used.add(remote)
            return remote
        if data is not None:
            local.write_bytes(data)
        self.makedirs(self.cache_dir)
        if not self._parts_swept:  # transfers cut off earlier left these: gone on next use
            self._parts_swept = True
            self.remove_stale_parts()
        self.put(local, remote, progress)
        return remote

    # --- the device cache: what it holds, least recently used first out --------------------------
    def cache_files(self) -> list[CacheFile]:
        """The files in the device cache: path, size and last use (mtime, refreshed on each
        use), through `find … -exec stat` (GNU, busybox and toybox all have them)."""
        if not self._exists_impl(self.cache_dir):
            return []
        res = self.run(["find", self.cache_dir, "-maxdepth", "1", "-type", "f", "-exec",
                        "stat", "-c", "%s %Y %n", "{}", "+"], check=False,
                       what=f"{self.describe_address()}: listing the cache")
        files = []
        for line in res.stdout.splitlines():
            size, _, rest = line.partition(" ")
            mtime, _, path = rest.partition(" ")
            if size.isdigit() and mtime.isdigit() and path:
                files.append(CacheFile(path, int(size), float(mtime)))
        return files

    def cache_usage(self) -> dict[str, int]:
        """What the cache holds: files, bytes, partial transfers (`devices check` shows it)."""
        files = self.cache_files()
        parts = [f for f in files if ".part-" in posixpath.basename(f.path)]
        return {"files": len(files) - len(parts), "bytes": sum(f.size for f in files),
                "partial_transfers": len(parts)}

    def mark_used(self, paths: Sequence[str]) -> None:
        """Set the last-use time of cache files to now (one command for all of them)."""
        self.run(["touch", "-c", *paths], check=False)

    def remove_stale_parts(self, max_age: float = PART_MAX_AGE) -> list[str]:
        """Remove partial transfers (`*.part-*`) untouched for `max_age` seconds: left by a
        transfer that was cut off (one still under way keeps writing, so stays fresh)."""
        now = self._device_time()
        stale = [f.path for f in self.cache_files()
                 if ".part-" in posixpath.basename(f.path) and now - f.used > max_age]
        for path in stale:
            self._try_remove(path)
        return stale

    def evict(self, keep_bytes: int) -> list[CacheFile]:
        """Remove partial transfers, then the least recently used cache files until the cache
        holds at most `keep_bytes`; return what was removed."""
        files = self.cache_files()
        parts = [f for f in files if ".part-" in posixpath.basename(f.path)]
        whole = sorted((f for f in files if f not in parts), key=lambda f: f.used)
        total = sum(f.size for f in whole)
        removed = list(parts)
        for f in whole:
            if total <= keep_bytes:
                break
            removed.append(f)
            total -= f.size
        for f in removed:
            self._try_remove(f.path)
        return removed

    def _device_time(self) -> float:
        res = self.run(["date", "+%s"], check=False)
        text = res.stdout.strip()
        return float(text) if text.isdigit() else time.time()

    def makedirs(self, path: str) -> None:
        self._makedirs_impl(path)

    def remove(self, path: str, quiet: bool = False) -> None:
        """Remove a file or directory tree; with quiet, a failure is ignored (cleanup on error)."""
        if quiet:
            self._try_remove(path)
        else:
            self._remove_impl(path)

    def exists(self, path: str) -> bool:
        return self._exists_impl(path)

    def make_workdir(self) -> str:
        """A fresh private directory for one job, so concurrent runs never collide."""
        path = posixpath.join(self.jobs_dir, secrets.token_hex(8))
        self._makedirs_impl(path)
        return path

    @property
    def cache_dir(self) -> str:
        return posixpath.join(self.base_dir, "cache")

    @property
    def work_key(self) -> str:
        """The device's work folder, named the same by every profile that shares it (its
        lock, drivers/live.py)."""
        return f"{self.transport}:{self.config.address}:{self.base_dir}"

    @property
    def jobs_dir(self) -> str:
        """Where each job's private work directory is made."""
        return posixpath.join(self.base_dir, "jobs")

    def transfer_method(self) -> str:
        """How files travel to this device, in a few words (`verify devices check` shows it)."""
        return f"{self.transport} put/get"

    def describe_address(self) -> str:
        """The device in messages: as the user named it, then where that led where they
        differ (`ssh:board (ssh:root@192.0.2.10:2222)`)."""
        address = self._address()
        spec = self.config.spec
        return f"{spec} ({address})" if spec and spec != address else address

    def _address(self) -> str:
        return f"{self.transport}:{self.config.address}" if self.config.address else self.transport

    def _try_remove(self, path: str) -> None:
        with self._cleaning_up():
            try:
                self._remove_impl(path)
            except Exception:  # noqa: BLE001 - cleanup after a failure must not mask it
                pass
