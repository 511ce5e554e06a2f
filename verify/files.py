"""Atomic file writes: every file a user gets appears whole or not at all.

A write goes to a temporary name beside the target (so the final rename stays on one file
system), is flushed to disk, gets the permissions the user's umask gives a new file (the
temporary file is created 0600), and is renamed over the target. On any failure, Ctrl-C
included, the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from verify.errors import VerifyError


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
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
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
    path.parent.mkdir(parents=True, exist_ok=True)
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
