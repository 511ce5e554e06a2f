"""The local transport: a work directory on this machine and a subprocess.

It goes through exactly the same Driver path as the remote transports (cache, atomic
transfers, job files), so what the tests exercise locally is what runs on a device.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import selectors
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from verify.devices import verify_cache_dir
from verify.drivers.channel import LineChannel
from verify.drivers.base import (
    CacheFile,
    CommandResult,
    Driver,
    DriverConfig,
    Progress,
)
from verify.errors import DeviceError, DeviceTimeout, TransferError
from verify.files import umask


def default_local_base() -> str:
    return str(verify_cache_dir() / "local")


class LocalDriver(Driver):
    transport = "local"

    def __init__(self, config: DriverConfig) -> None:
        super().__init__(config)
        if not config.base_dir:
            self.base_dir = default_local_base()

    def _open_impl(self) -> None:
        Path(self.base_dir).mkdir(parents=True, exist_ok=True)

    def _close_impl(self) -> None:
        pass

    def _exec_impl(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str],
                   cwd: str | None) -> CommandResult:
        full_env = {**os.environ, **env}
        try:
            proc = subprocess.Popen(list(argv), cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            return CommandResult(tuple(argv), 127, "", f"{argv[0]}: {exc.strerror or exc}")
        try:
            out, err = _communicate(proc, time.monotonic() + timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise DeviceTimeout(f"{self.describe_address()}: {Path(argv[0]).name} did not finish "
                                f"within {timeout:g} s")
        except BaseException:
            _kill_group(proc)
            raise
        return CommandResult(tuple(argv), proc.returncode,
                             out.decode(errors="replace"), err.decode(errors="replace"))

    def _spawn_impl(self, argv: Sequence[str], *, env: Mapping[str, str],
                    cwd: str | None) -> LineChannel | None:
        try:
            proc = subprocess.Popen(list(argv), cwd=cwd, env={**os.environ, **env},
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise DeviceError(f"{self.describe_address()}: cannot start {argv[0]}: "
                              f"{exc.strerror or exc}") from None
        return _LocalChannel(proc, argv, self.describe_address())

    def transfer_method(self) -> str:
        return "file copy on this machine"

    def _put_impl(self, local: Path, remote: str, progress: Progress | None) -> None:
        _copy(local, remote, f"copying {local}", progress, where=self.describe_address())

    def _get_impl(self, remote: str, local: Path, progress: Progress | None) -> None:
        _copy(remote, local, f"fetching {remote}", progress, host_side=True,
              where=self.describe_address())

    def _hand_over_impl(self, remote: str, local: Path) -> bool:
        """A rename onto `local` where both sit on one file system (123 files, 106 MB: ~1 ms
        instead of ~40 ms copying, and the bytes are not held twice in the page cache);
        anything else (another file system, a folder in the way, a missing file) fails the
        rename and goes the copying way, which reports it."""
        try:
            os.chmod(remote, 0o666 & ~umask())  # as a copy would have it
            os.replace(remote, local)
        except OSError:
            return False
        return True

    def cache_files(self) -> list[CacheFile]:
        files = []
        try:
            with os.scandir(self.cache_dir) as it:
                for e in it:
                    if e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        files.append(CacheFile(e.path, st.st_size, st.st_mtime))
        except FileNotFoundError:
            pass
        return files

    def mark_used(self, paths: Sequence[str]) -> None:
        for path in paths:
            with contextlib.suppress(OSError):
                os.utime(path)

    def _device_time(self) -> float:
        return time.time()

    def _rename_impl(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def _makedirs_impl(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def _remove_impl(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)

    def _exists_impl(self, path: str) -> bool:
        return os.path.exists(path)


SLICE_S = 0.25  # the longest a wait on a command goes without running Python code


def _communicate(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes]:
    """proc.communicate() until `deadline` (monotonic; TimeoutExpired past it), in slices: an
    interruption raised in this thread from another (`verify ci` stopping its device workers)
    lands between two, where one wait of the whole timeout held it off to the job's end.
    Retrying communicate after its TimeoutExpired loses no output (subprocess's docs)."""
    while True:
        remaining = deadline - time.monotonic()
        try:
            return proc.communicate(timeout=max(0.0, min(remaining, SLICE_S)))
        except subprocess.TimeoutExpired:
            if remaining <= SLICE_S:
                raise


def _copy(src: str | Path, dst: str | Path, what: str, progress: Progress | None,
          host_side: bool = False, where: str = "local") -> None:
    """Copy a file; a failure is the device's (TransferError, naming it `where`: the profile
    as the user named it), except writing `dst` when it is on the host (`host_side`: a full
    or read-only disk of the user's), which stays an OSError for the host's writer to report
    (files.output_errors: exit 2)."""
    try:
        source = open(src, "rb")
    except OSError as exc:
        raise TransferError(f"{where}: {what} failed: {exc.strerror or exc}") from exc
    with source:
        try:
            with open(dst, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
        except OSError as exc:
            if host_side:
                raise
            raise TransferError(f"{where}: {what} failed: {exc.strerror or exc}") from exc
    if progress:
        progress(os.path.getsize(dst))


class _LocalChannel(LineChannel):
    """A local process spoken to in lines; a thread keeps its stderr drained."""

    def __init__(self, proc: subprocess.Popen[bytes], argv: Sequence[str], where: str) -> None:
        super().__init__(argv, where)
        self.proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        self._fd = proc.stdout.fileno()
        self._ready = selectors.DefaultSelector()
        self._ready.register(self._fd, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._drain = threading.Thread(target=self._drain_err, args=(proc.stderr,), daemon=True)
        self._drain.start()

    def _drain_err(self, stream: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):  # closed under it: done
            while data := stream.read1(1 << 16):  # type: ignore[attr-defined]
                with self._lock:
                    self._keep_err(data)

    def stderr_tail(self) -> str:
        if self.proc.poll() is not None:
            self._drain.join(timeout=1.0)
        with self._lock:
            return super().stderr_tail()

    def _write(self, data: bytes) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # it has ended: reading its stdout says so

    def _read(self, deadline: float) -> bytes | None:
        if not self._ready.select(max(0.0, min(deadline - time.monotonic(), 0.5))):
            return b""
        return os.read(self._fd, 1 << 16) or None

    def _end_input(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()

    def _wait(self, timeout: float) -> int | None:
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._release()
        return status

    def kill(self) -> None:
        _kill_group(self.proc)
        self._release()

    def _release(self) -> None:
        self._ready.close()
        self._drain.join(timeout=1.0)  # stderr is at EOF once the process group is gone
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
