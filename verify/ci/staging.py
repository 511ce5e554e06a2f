"""A run's baselines put in place together: all of them when the run finishes, none when not.

Every baseline a run writes (--update-goldens, or a latency recorded on a machine's first run)
goes first into a staging folder beside the suite's baselines,
`<baselines>/.<suite>.staging~XXXXXXXX/new/<the path under <suite>/>`, and is moved onto its
place only when the run has finished every job. A run interrupted (Ctrl-C, SIGTERM) or
failing removes the folder: the baselines stay the set they were, never half of one
generation and half of the next. `~` is in no suite name, so the folder is never read as
baselines.

A run killed outright (SIGKILL, a lost machine) leaves its folder behind; the next run on
these baselines removes it. Each run holds an exclusive lock on its folder's `lock` file while
it lives, so a leftover is told from another run's folder in progress (two shards recording
into one checkout) by trying that lock. A run killed while it was moving its files into
place (the marker `committing` is written first) is finished by the next run instead: its
set was complete.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from verify.ci import baseline as baselines
from verify.errors import OutputError
from verify.files import (missing_dirs, os_reason, output_errors, remove_empty_dirs,
                          write_text_atomic)

MARK = ".staging~"          # the folder: f".{suite}{MARK}XXXXXXXX"
LOCK, COMMITTING, NEW = "lock", "committing", "new"


class StagedBaselines:
    """The baselines of one run, staged; `commit` puts them in place, `discard` drops them.
    Thread-safe (each device's jobs write from their own thread). As a context manager: the
    staged files are discarded when the block ends without `commit`."""

    def __init__(self, root: Path, suite_name: str) -> None:
        self.suite_name = suite_name
        self.final = Path(root) / suite_name      # where the files go
        self.home = _home(root, suite_name)       # where they are staged
        self._lock = threading.Lock()
        self._folder: Path | None = None
        self._fd: int | None = None
        self._made: list[Path] = []   # folders made for the staging folder (the root, maybe)
        self._closed = False

    def __enter__(self) -> StagedBaselines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()

    def write(self, path: Path, doc: Mapping[str, Any]) -> None:
        """Stage `doc` as the baseline at `path` (a path under `<root>/<suite>/`)."""
        rel = Path(path).relative_to(self.final)
        with self._lock:
            if self._closed:  # a job that finished as the run was stopped: it keeps nothing
                raise OutputError(f"{path}: not written: the run was stopped before its "
                                  "baselines were put in place")
            baselines.write(self._staging() / NEW / rel, doc)

    def commit(self) -> int:
        """Move every staged file onto its place; returns how many. An interrupt while they
        move waits for the last one (they are renames on one file system: milliseconds)."""
        with self._lock:
            self._closed = True
            folder = self._folder
            if folder is None:
                return 0
            try:
                if next(_staged(folder / NEW), None) is None:
                    return 0
                write_text_atomic(folder / COMMITTING, "")
                return _move_all(folder, self.final)
            finally:
                self._remove()

    def discard(self) -> None:
        """Drop what is staged and refuse what comes after; the baselines stay as they were."""
        with self._lock:
            self._closed = True
            if self._folder is not None:
                self._remove()

    def _staging(self) -> Path:
        if self._folder is None:
            self._made = missing_dirs(self.home)
            try:
                with output_errors(self.home):
                    self.home.mkdir(parents=True, exist_ok=True)
                    self._folder, self._fd = _new_folder(self.home, self.suite_name)
            except OutputError:
                remove_empty_dirs(self._made)
                raise
        return self._folder

    def _remove(self) -> None:
        assert self._folder is not None
        shutil.rmtree(self._folder, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
        self._folder = self._fd = None
        remove_empty_dirs(self._made)


def _home(root: Path, suite_name: str) -> Path:
    """The folder the staging folders sit in: beside the suite's baselines as they lie on
    disk (a linked suite folder: beside its target), so each move is a rename."""
    return (Path(root) / suite_name).resolve().parent


def _new_folder(home: Path, suite_name: str) -> tuple[Path, int | None]:
    """A fresh staging folder and the descriptor holding its lock (None: no locks here)."""
    while True:
        folder = Path(tempfile.mkdtemp(prefix=f".{suite_name}{MARK}", dir=home))
        try:
            fd = _open_lock(folder)
        except FileNotFoundError:  # a run clearing leftovers took it, seeing no lock held
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # the same: that run removes it
            os.close(fd)
            continue
        except OSError:  # no locks on this file system: unguarded (a leftover then stays)
            return folder, fd
        if not _same_file(fd, folder / LOCK):  # the same, done before this lock was taken:
            os.close(fd)                       # a lock on a removed file guards nothing
            continue
        return folder, fd


def _open_lock(folder: Path) -> int:
    """A descriptor on `folder`'s lock file (made if missing), to flock: this run's folder,
    or a leftover whose lock nobody holds."""
    return os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _move_all(folder: Path, final: Path) -> int:
    """Rename every file under `folder/new` onto its place under `final`; an interrupt
    while they move is held until the last has moved, then raised."""
    moved, interrupted = 0, None
    while True:
        try:
            for src in _staged(folder / NEW):  # listed again after an interrupt
                dst = final / src.relative_to(folder / NEW)
                try:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(src, dst)
                except OSError as exc:
                    raise OutputError(f"{dst}: cannot write: {os_reason(exc)} ({moved} "
                                      "baseline(s) of this run were put in place before it, "
                                      "the rest not)") from None
                moved += 1
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted
    return moved


def _staged(new: Path) -> Iterator[Path]:
    """The staged files, sorted (a temporary file of an atomic write left by a kill, `.NAME.
    json.XXXX.part`: not; an option set named `.fast` is a staged `.fast.json`)."""
    return iter(sorted(p for p in new.rglob("*.json") if p.is_file()))


def clear_leftovers(root: Path, suite_name: str) -> list[str]:
    """Remove the staging folders that runs killed outright left beside `<root>/<suite>`;
    finish putting in place the set of one killed while it did so. Another run's folder in
    progress (its lock held) is left alone. Returns what was done, one line each."""
    home = _home(root, suite_name)
    done: list[str] = []
    try:
        found = sorted(home.glob(f".{suite_name}{MARK}*"))
    except OSError:
        return done
    for folder in found:
        try:
            fd = _open_lock(folder)
        except OSError:  # gone meanwhile, or not ours to touch
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a run in progress (or no locks here: cannot tell)
            os.close(fd)
            continue
        try:
            if (folder / COMMITTING).exists():
                n = _move_all(folder, Path(root) / suite_name)
                done.append(f"put in place the {n} remaining baseline(s) of a run killed while "
                            f"it put its set in place ({folder.name})")
            else:
                done.append(f"removed {folder.name}: the staged baselines of a run that did "
                            "not finish (the baselines were left as they were)")
            shutil.rmtree(folder, ignore_errors=True)
        except OutputError as exc:  # kept: the next run tries again
            done.append(f"could not finish putting in place the set of {folder.name}: {exc}")
        finally:
            os.close(fd)
    return done
