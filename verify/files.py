"""Atomic file writes: every file a user gets appears whole or not at all.

A write goes to a temporary name beside the target (so the final rename stays on one file
system), is flushed to disk, gets the permissions the user's umask gives a new file (the
temporary file is created 0600), and is renamed over the target. On any failure, Ctrl-C
included, the temporary file is removed and the target is left as it was.

This is also the one place an OSError met while writing becomes a one-line error naming the
path and the reason (`output_errors`, `os_reason`): a read-only folder, a full disk, a folder
where a file belongs are the user's side (OutputError, exit 2); folders made for an output
that failed are removed again (`made_dirs`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
import tokenize
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from verify.errors import OutputError, UsageError, VerifyError


def read_user_file(path: Path, error: type[VerifyError], expected: str,
                   label: str | None = None) -> bytes:
    """The bytes of a file the user named; a missing, directory or unreadable path is one
    `error` line (`expected` says what should be there, e.g. "an .onnx file"), naming it as
    `label` (what the user typed, when `path` was resolved from it) or else `path`."""
    name = label or path
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise error(f"{name}: no such file") from None
    except IsADirectoryError:
        raise error(f"{name}: is a directory, expected {expected}") from None
    except OSError as exc:
        raise error(f"{name}: cannot read: {exc.strerror or exc}") from None


def read_head(path: Path | str, n: int) -> bytes:
    """A file's first `n` bytes; b"" where it cannot be read (its reader says why later)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


def os_reason(exc: OSError) -> str:
    """The reason of an OSError in a few words ('No space left on device'), also for h5py's
    multi-line messages that carry the errno only in their text."""
    if exc.errno:
        return os.strerror(exc.errno)
    text = str(exc)
    match = re.search(r"errno = (\d+)", text)
    if match:
        return os.strerror(int(match.group(1)))
    match = re.fullmatch(r"(\d+) requested and (\d+) written", text.strip())
    if match:  # numpy's tofile (np.save of a large array) on a short write: errno is lost
        return (f"{os.strerror(errno.ENOSPC)}? (a short write: {match.group(2)} of "
                f"{match.group(1)} bytes written)")
    return (exc.strerror or text or type(exc).__name__).splitlines()[0][:200]


# What numpy's .npy/.npz reader raises on a damaged or hostile file besides ValueError: a
# version 1.0 header is tokenized before it is evaluated (tokenize's error), a shape past
# int64 overflows, one of terabytes fails to allocate before any data is read, and an .npz
# member is inflated by zlib from a zip archive
NPY_READ_ERRORS = (ValueError, OSError, EOFError, SyntaxError, tokenize.TokenError,
                   OverflowError, MemoryError, zlib.error, zipfile.BadZipFile)


def npy_reason(exc: BaseException) -> str:
    """numpy's complaint about an .npy file in one line (some run to three, the last advising
    allow_pickle=True, which verify never uses)."""
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]


def npy_refusal(exc: BaseException, head: bytes) -> str:
    """What numpy's refusal of an .npy/.npz means, given the file's first bytes (`head`):
    "pickled" for object arrays ("... when allow_pickle=False") or a file that is a pickle (a
    pickle protocol's opcode first); "no magic" for any other file without the .npy or zip
    magic, which numpy calls pickled too (a text file, a cut-off header); "" for the rest, a
    damaged file (numpy's advice to pass allow_pickle=True about an oversized header
    included)."""
    text = str(exc)
    if not isinstance(exc, ValueError):
        return ""
    if "allow_pickle=False" in text or ("pickled" in text and head[:1] == b"\x80"):
        return "pickled"
    return "no magic" if "pickled" in text else ""


@contextmanager
def output_errors(path: Path | str, error: type[VerifyError] = OutputError) -> Iterator[None]:
    """An OSError raised inside becomes one `error` line: '<path>: cannot write: <reason>'
    (the reason alone is its `reason`)."""
    try:
        yield
    except OSError as exc:
        failure = error(f"{path}: cannot write: {os_reason(exc)}")
        failure.reason = os_reason(exc)
        raise failure from None


@contextmanager
def made_dirs(path: Path | str) -> Iterator[Path]:
    """Create folder `path` (and missing parents) for an output; when the block fails, remove
    the folders made here that are empty again. OSErrors are one OutputError line."""
    path = Path(path)
    made = missing_dirs(path)
    try:
        with output_errors(path):
            if path.exists() and not path.is_dir():
                raise OutputError(f"{path}: exists and is not a folder")
            path.mkdir(parents=True, exist_ok=True)
        yield path
    except BaseException:
        remove_empty_dirs(made)
        raise


def missing_dirs(path: Path | str) -> list[Path]:
    """`path` and its ancestors that do not exist yet, deepest first: what making it makes."""
    made, probe = [], Path(path)
    while not probe.exists() and probe != probe.parent:
        made.append(probe)
        probe = probe.parent
    return made


def remove_empty_dirs(dirs: list[Path]) -> None:
    """Remove each folder of `dirs` (deepest first, as `made_dirs` lists them) if empty."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            break


SPACE_MARGIN = 256 << 10  # bytes kept free beyond a write's own size (metadata, the rename)


def ensure_space(path: Path, nbytes: int, written: int = 0) -> None:
    """Refuse, as one OutputError line, to write `nbytes` more into `path`'s folder when its
    file system has less free. For writers whose library does not survive a failed write:
    the HDF5 library, after ENOSPC, fails its own close and then crashes the process.
    `written`: what the file already holds (removed with it), so the message says what the
    whole file needs rather than its next part alone."""
    try:
        st = os.statvfs(Path(path).parent if str(Path(path).parent) else ".")
    except (OSError, AttributeError):  # no statvfs (Windows) or no folder: the write says
        return
    free = st.f_bavail * st.f_frsize
    if free < nbytes + SPACE_MARGIN:
        need = (written + nbytes + SPACE_MARGIN) / 2**20
        raise OutputError(f"{path}: cannot write: No space left on device (needs at least "
                          f"{need:.1f} MB, {(free + written) / 2**20:.1f} MB free"
                          + (f" before it was started; {written / 2**20:.1f} MB written, "
                             "then removed" if written else "") + ")")


def check_output_file(path: Path | str, option: str,
                      inputs: Iterable[tuple[str, Path | str | None]] = ()) -> None:
    """UsageError, before any work, where the output file `option` names cannot be one: a
    folder, a path through a file (a missing folder is made when the file is written), a
    folder no file can be made in, or the same file as one of `inputs` ((what, path): the
    command's model, archive, suite, or another output), which writing it would destroy."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a folder; give a file name")
    if path.is_symlink() or (path.exists() and not path.is_file()):
        # the finished file is renamed onto the path: a link, a device (/dev/null, as root)
        # or a FIFO would be replaced by it, not written through
        kind = "a symbolic link" if path.is_symlink() else "not a regular file"
        raise UsageError(f"{option} {path}: is {kind}, which the written file would replace; "
                         "give a file name")
    for what, other in inputs:
        if other is not None and same_file(path, other):
            raise UsageError(f"{option} {path}: is {what}; writing there would destroy it, "
                             "give another file name")
    _check_writable(path, path.parents, option)


def check_output_dir(folder: Path | str, option: str) -> None:
    """UsageError, before any work, where the folder `option` names cannot take a file: a
    file, a path through a file, or a folder no file can be made in (a missing folder is
    made when the file is written)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{option} {folder}: is a file, not a folder")
    _check_writable(folder, (folder, *folder.parents), option)


def _check_writable(path: Path, folders: Iterable[Path], option: str) -> None:
    """The first of `folders` that exists must be a folder a file can be made in."""
    for parent in folders:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{option} {path}: {parent} is a file, not a folder")
            try:  # made and removed at once: a read-only or pseudo file system fails here
                with tempfile.NamedTemporaryFile(dir=parent, prefix=".verify-check-"):
                    pass
            except OSError as exc:
                raise OutputError(f"{path}: cannot write: {exc.strerror or exc} ({option}, "
                                  f"in {parent})") from None
            return


def same_file(a: Path | str, b: Path | str) -> bool:
    """Whether two paths name one file: the same inode where both exist (links, `./x`),
    else the same absolute path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def umask() -> int:
    """The process's umask (reading it means setting it: restore at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path`; renamed onto it when the block ends without error.

    For writers that want a file name (h5py); `atomic_write` is simpler for the rest.
    """
    path = Path(path)
    with output_errors(path):
        if path.is_dir():
            raise OutputError(f"{path}: is a folder; give a file name")
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part",
                                        dir=path.parent if str(path.parent) else ".")
        os.close(fd)
    tmp = Path(tmp_name)
    try:
        with output_errors(path):
            yield tmp
            os.chmod(tmp, 0o666 & ~umask())
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call `write` with a binary file object, then put the file at `path` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data))


def write_text_atomic(path: Path, text: str) -> None:
    """Write UTF-8 text atomically, creating the parent folder if needed."""
    path = Path(path)
    with made_dirs(path.parent):
        write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, doc: Any) -> None:
    """Strict JSON (no NaN), numpy scalars and tuples converted, written atomically."""
    write_bytes_atomic(Path(path), json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False,
                                              default=json_value).encode("utf-8"))


def save_npy_atomic(path: Path, value: np.ndarray) -> None:
    """An .npy file (never pickled objects), written atomically."""
    atomic_write(path, lambda fh: np.save(fh, np.asarray(value), allow_pickle=False))


def json_value(obj: Any) -> Any:
    """`json.dumps`'s `default`: paths, numpy scalars and arrays, tuples and sets, and anything
    with a `to_dict()` (verify's result dataclasses)."""
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
