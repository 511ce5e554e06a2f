"""Which devices a verify command on this host is using now.

Each device session holds a shared lock on a file named for the device's work folder
(transport, address, base dir) in verify's cache, for as long as it is open; `verify devices
clean` takes that lock exclusively, without waiting. So a clean never removes the files of a
run, dump, localize or ci job in progress from this host (every `transport = "local"` profile
shares one folder), and no session starts while a clean runs. A command on another host is not
seen: clean a shared board only when nothing runs there.
"""

from __future__ import annotations

import fcntl
import hashlib
import os

from verify.devices import verify_cache_dir
from verify.errors import UsageError


class DeviceLock:
    """The lock of one device's work folder, `key` (`Driver.work_key`): shared while a
    session uses it; exclusive, refused at once when held, while it is cleaned."""

    def __init__(self, key: str, label: str, *, exclusive: bool = False) -> None:
        self.key, self.label, self.exclusive = key, label, exclusive
        self._fd: int | None = None

    def __enter__(self) -> DeviceLock:
        folder = verify_cache_dir() / "live"
        name = hashlib.sha256(self.key.encode()).hexdigest()[:32] + ".lock"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:  # a read-only or full cache: unguarded, as before there was a lock
            return self
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if self.exclusive else fcntl.LOCK_SH)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(f"{self.label}: a verify command on this host is using this "
                             "device now (a run, dump, localize or ci job); clean it when that "
                             "has ended") from None
        except OSError:  # no locks on this file system (ENOLCK on some NFS): unguarded
            os.close(fd)
            return self
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the lock
            self._fd = None

