"""The datasets a command does not otherwise read, checked against their digests in a
background thread while the device works.

`run`, `bench`, `localize` and `ci` read an archive's model, inputs and ground truth (each
checked as it is read) but not its per-layer references, which are most of a `--layers` archive.
Hashing them all before the run would cost seconds on a large archive; instead a thread reads
them in bounded blocks (hashlib releases the GIL on large buffers) while the device runs, and
the command joins it before it gives any verdict: a mismatch is the usual one-line corrupt-
archive error, exit 2, and no PASS/FAIL is printed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from verify import schema
from verify.digest import TensorHasher
from verify.errors import ArchiveError, VerifyError

BLOCK_BYTES = 8 << 20  # the most read from the file and hashed at a time


def blocks(shape: Sequence[int], itemsize: int, limit: int = BLOCK_BYTES) -> Iterator[Any]:
    """Index expressions covering an array of `shape` in C order, each at most `limit` bytes
    (or one element, if that is larger); whatever the shape, so memory stays bounded."""
    shape = [int(d) for d in shape]
    if not shape or 0 in shape:
        yield ()
        return
    axis, inner = len(shape) - 1, itemsize
    while axis > 0 and inner * shape[axis] <= limit:
        inner *= shape[axis]
        axis -= 1
    # shape[axis + 1:] fits in `limit` (inner bytes); step along `axis`, every index before it
    step = max(1, limit // inner)
    for lead in itertools.product(*(range(d) for d in shape[:axis])):
        for start in range(0, shape[axis], step):
            yield (*lead, slice(start, start + step))


class LayerCheck:
    """Checks the per-layer references of an archive in a daemon thread.

    Use as a context manager around the work and the verdict: leaving it normally joins the
    thread and raises ArchiveError if a dataset did not match (so a `return` inside becomes that
    error); leaving it by an exception stops the thread and lets the exception through."""

    def __init__(self, path: Path | None, start: bool = True) -> None:
        self.path = path
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.checked = 0  # datasets verified so far
        if path is not None and start:
            self._thread = threading.Thread(target=self._work, name="verify-layer-check",
                                            daemon=True)
            self._thread.start()

    def _work(self) -> None:
        from verify.archive_reader import ArchiveReader

        try:
            with ArchiveReader(self.path) as reader:  # type: ignore[arg-type]
                if not reader.checked:
                    return
                for case in reader.cases:
                    for entry in case.get(schema.LAYERS, []):
                        if self._stop.is_set():
                            return
                        self._check(reader, entry)
                        self.checked += 1
        except VerifyError as exc:
            self._error = exc
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            self._error = exc

    def _check(self, reader: Any, entry: Any) -> None:
        ds = reader.dataset(entry)
        h = TensorHasher(entry.name, ds.dtype, ds.shape)
        try:
            for part in blocks(ds.shape, ds.dtype.itemsize):
                if self._stop.is_set():
                    return
                h.update(np.asarray(ds[part]))
        except (OSError, ValueError, TypeError, RuntimeError) as exc:
            raise reader.corrupt(f"{entry.key} ({entry.name!r}) cannot be read: {exc}") from None
        if h.hexdigest() != entry.digest:
            raise reader.corrupt(f"{entry.key} ({entry.name!r}) does not match its checksum "
                                 "(re-pack it, or get an intact copy)")

    def result(self) -> None:
        """Wait for the thread; the first mismatch (or read failure) as ArchiveError."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            if isinstance(self._error, VerifyError):
                raise self._error
            raise ArchiveError(f"{self.path}: corrupt archive: per-layer references cannot be "
                               f"checked: {type(self._error).__name__}: {self._error}")

    def cancel(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> "LayerCheck":
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is not None:
            self.cancel()
        else:
            self.result()
