"""The dump folder's life: made ready and locked (a previous dump kept whole meanwhile), the
tensor files staged inside it, then swapped in with the manifest last (`commit_dump`), or the
staged files removed after a failure (`discard_dump`). The format itself is `dump`'s. The
folder of final outputs (`run --bin-out-dump`, its index outputs.json) lives the same life:
each function takes the folder's `Layout` (`DUMP` by default, or `OUTPUTS`).

One run at a time writes into a folder: it holds an advisory lock (flock) on the folder from
`prepare_dir` to `commit_dump` or `discard_dump`, and the kernel lets go of it when a run dies.
So a staging folder found while the lock is held is a killed run's, whoever ran it (another
container, another user), and goes. Where locks are not to be had (Windows, a file system
without them), nothing is locked and nothing left behind is removed."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verify.dump import MANIFEST, STAGING, is_tensor_file, write_manifest
from verify.errors import UsageError
from verify.files import output_errors, remove_empty_dirs, write_json_atomic

_STAGING = STAGING  # + random: a dump being written (or one being replaced)
_locks: dict[str, int] = {}  # folder -> the descriptor holding its lock


@dataclass(frozen=True)
class Layout:
    """A kind of folder verify writes: its index file (written last: without it the folder is
    incomplete), the names of its data files, and how its index is written."""

    what: str                                               # "a verify dump"
    holds: str                                              # "the dump"
    index: str                                              # the index file's name
    data: Callable[[str], bool]                             # a data file's name?
    write_index: Callable[[Path, Mapping[str, Any]], Path]  # (folder, document) -> the file

    def file(self, name: str) -> bool:
        """Its index, a data file, or an atomic write's temporary file of either
        (`.NAME.RANDOM.part`, files.atomic_path)."""
        return (name == self.index or self.data(name)
                or (name.startswith(".") and name.endswith(".part")
                    and self.file(name[1:].rsplit(".", 2)[0])))


def _write_outputs_index(folder: Path, doc: Mapping[str, Any]) -> Path:
    path = folder / "outputs.json"
    write_json_atomic(path, doc)
    return path


_OUTPUT_FILE = re.compile(r"case\d+-out\d+\.npy")
DUMP = Layout("a verify dump", "the dump", MANIFEST, is_tensor_file,
              lambda folder, doc: write_manifest(folder, doc))  # (the name looked up at a call)
OUTPUTS = Layout("a --bin-out-dump folder", "the outputs", "outputs.json",
                 lambda name: _OUTPUT_FILE.fullmatch(name) is not None, _write_outputs_index)


def _ours(name: str, layout: Layout) -> bool:
    """The folder's own entry: one of its files or a staging folder. Anything else (a user's
    .env or .gitignore included) is not ours."""
    return layout.file(name) or name.startswith(_STAGING)


def prepare_dir(path: Path, *, stage: bool = True, layout: Layout = DUMP) -> Path | None:
    """Make `path` ready to receive a dump, lock it, and return the staging folder inside it
    that the tensor files go to (None without `stage`: a dump of stats only has no files). A
    previous dump in `path` stays whole until `commit_dump` replaces it, so a run that fails
    (a bad filter, an unreachable device, a full disk) loses nothing. A folder holding anything
    that is not a dump's is refused rather than mixed into, as is a folder another run is
    writing into."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path}: exists and is not a folder; give a folder for "
                         f"{layout.holds}")
    path.mkdir(parents=True, exist_ok=True)
    entries = list(path.iterdir())
    foreign = [p.name for p in entries if not _ours(p.name, layout)]
    if foreign:
        raise UsageError(f"{path}: folder is not empty and not {layout.what} (holds "
                         f"{', '.join(sorted(foreign)[:3])}); give an empty or new folder")
    if _lock(path):
        for p in entries:  # no live run holds the lock: what a run left staged is abandoned
            if p.name.startswith(_STAGING):
                _remove_staging(p, layout)
    if not stage:
        return None
    try:
        with output_errors(path):  # the folder named, not the staging folder inside it
            return Path(tempfile.mkdtemp(prefix=_STAGING, dir=path))
    except BaseException:
        _unlock(path)
        raise


def _lock(path: Path) -> bool:
    """Take `path`'s lock for this run; False where locks are not to be had."""
    try:
        import fcntl
    except ImportError:  # Windows
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"{path}: another verify run is writing a dump into this folder; "
                         "wait for it, or give another folder") from None
    except OSError:  # no locks on this file system
        os.close(fd)
        return False
    _unlock(path)
    _locks[os.path.realpath(path)] = fd
    return True


def _unlock(path: Path) -> None:
    fd = _locks.pop(os.path.realpath(path), None)
    if fd is not None:
        os.close(fd)


def _remove_staging(staging: Path, layout: Layout) -> None:
    """A staging folder and the folder's files in it (nothing else is ever put there), as far
    as it can be removed: what cannot (another user's files) is left, never an error."""
    with contextlib.suppress(OSError):
        for p in staging.iterdir():
            if p.is_file() and layout.file(p.name):
                p.unlink(missing_ok=True)
        staging.rmdir()


def _dump_files(folder: Path, layout: Layout) -> list[Path]:
    """The folder's index and data files, its index first."""
    files = [p for p in folder.iterdir() if p.is_file() and (
        p.name == layout.index or layout.data(p.name))]
    return sorted(files, key=lambda p: p.name != layout.index)


def commit_dump(path: Path, staging: Path | None, manifest: Mapping[str, Any],
                layout: Layout = DUMP) -> Path:
    """After a run that succeeded: the previous dump in `path` is moved aside (its manifest
    first, so an interrupted swap reads as incomplete), the staged tensor files move in, and
    the manifest is written last, completing the folder. Should any of it fail (or be
    interrupted), the previous dump is put back as it was and the error raised."""
    path = Path(path)
    with output_errors(path):
        aside = Path(tempfile.mkdtemp(prefix=_STAGING, dir=path))
    moved: list[str] = []
    try:
        for p in _dump_files(path, layout):
            os.replace(p, aside / p.name)
        for p in path.iterdir():  # an interrupted write's leftover
            if p.is_file() and layout.file(p.name) and p.name.endswith(".part"):
                p.unlink(missing_ok=True)
        if staging is not None:
            for p in staging.iterdir():
                if layout.data(p.name):
                    os.replace(p, path / p.name)
                    moved.append(p.name)
        written = layout.write_index(path, manifest)
    except BaseException:
        _put_back(path, aside, staging, moved, layout)
        raise
    _remove_staging(aside, layout)
    if staging is not None:
        _remove_staging(staging, layout)
    _unlock(path)
    return written


def _put_back(path: Path, aside: Path, staging: Path | None, moved: list[str],
              layout: Layout) -> None:
    """Undo a commit that failed: the new files back to staging, the previous ones back in
    place (the index last), each step as far as it goes."""
    with contextlib.suppress(OSError):
        (path / layout.index).unlink(missing_ok=True)
    for name in moved:
        with contextlib.suppress(OSError):
            os.replace(path / name, (staging or aside) / name)
    for p in reversed(_dump_files(aside, layout)):
        with contextlib.suppress(OSError):
            os.replace(p, path / p.name)
    _remove_staging(aside, layout)


def discard_dump(path: Path, staging: Path | None, *, made: Sequence[Path] = (),
                 layout: Layout = DUMP) -> None:
    """After a failed run: the staged files go, and the folders the run made (`made`, deepest
    first: files.missing_dirs before the run) where nothing else is in them; a previous dump
    is left as it was. Harmless where nothing was prepared, or once committed."""
    if staging is not None:
        _remove_staging(staging, layout)
    _unlock(path)
    remove_empty_dirs(list(made))
