"""A dump's tensor files read back as hostile input: without pickle, each tensor checked
against its manifest entry (dtype, shape, length) before a byte of it is used.

A format-2 dump keeps one case's tensors in one pack file, `c<case>.npys`: the .npy images
(numpy's format: header, then C- or Fortran-ordered data) one after another, each starting at
a multiple of 64 bytes (zeros between), the manifest giving each tensor's offset. A tensor is
then `fh.seek(offset); numpy.load(fh)` for any reader. One file per case is one file to create,
pull and open instead of hundreds: creating PP-OCRv4 det 640's 673 tensor files cost 0.88 s of
CPU in a fresh folder, one file 0.15 s (issue 14). A format-1 dump has one .npy per tensor,
`c<case>_t<index>.npy` (offset absent); both are read here.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from verify.errors import DumpError
from verify.files import NPY_READ_ERRORS, npy_reason


class Entry(Protocol):
    """What a reader checks a tensor's file against (dump.DumpEntry)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


class Scratch:
    """A reusable read buffer, grown to the largest tensor read through it. Reading a tensor
    into it costs one copy from the page cache; a fresh memory map of each file would fault
    every page in again (2x slower for a whole ResNet-50 dump here)."""

    def __init__(self) -> None:
        self._buf = np.empty(0, np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        if self._buf.size < nbytes:
            self._buf = np.empty(0, np.uint8)  # drop the old one first
            self._buf = np.empty(nbytes, np.uint8)
        return self._buf[:nbytes]


class OpenFiles:
    """The pack files a dump is being read from, kept open (with their sizes) while it is read
    tensor by tensor, hundreds of times; at most `keep` of them (the most recently opened: a
    diff reads case after case), so a dump of a thousand cases holds no more descriptors or
    maps than one of a single case."""

    def __init__(self, window: int = 16 << 20, keep: int = 2) -> None:
        self._files: dict[Path, tuple[IO[bytes], int]] = {}  # in the order opened
        self._maps: dict[Path, tuple[int, int, memoryview]] = {}  # path -> (start, end, map)
        self.window, self.keep = window, keep

    def get(self, path: Path, what: str) -> tuple[IO[bytes], int]:
        got = self._files.get(path)
        if got is None:
            while len(self._files) >= self.keep:
                self._drop(next(iter(self._files)))
            fh = _open(path, what)
            got = self._files[path] = (fh, os.fstat(fh.fileno()).st_size)
        return got

    def mapped(self, path: Path, offset: int, length: int, what: str = "") -> memoryview:
        """`length` bytes of `path` (opened by `get`) from `offset`, from a read-only map of
        the file kept while reads fall inside it: a tensor and those after it up to `window`
        bytes in one map, mapped in one go (`map_readonly`)."""
        start, end, view = self._maps.get(path, (0, -1, memoryview(b"")))
        if not (start <= offset and offset + length <= end):
            fh, size = self._files[path]
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            end = max(offset + length, min(size, offset + self.window))
            try:
                view = map_readonly(fh, start, end - start)
            except (OSError, ValueError) as exc:
                raise DumpError(f"{what or path}: {path.name} cannot be mapped ({exc})") from None
            self._maps[path] = (start, end, view)
        return view[offset - start:offset - start + length]

    def _drop(self, path: Path) -> None:
        """Close `path` and let go of its map (arrays made from it keep their pages)."""
        self._maps.pop(path, None)
        fh, _ = self._files.pop(path)
        fh.close()

    def close(self) -> None:
        for path in list(self._files):
            self._drop(path)


def _open(path: Path, what: str) -> IO[bytes]:
    """`path` opened for reading, a regular file only: a FIFO or a device in a dump's place is
    refused, never waited on or read without end."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise DumpError(f"{what}: file {path.name} is missing (an incomplete or damaged "
                        "dump; re-run it)") from None
    except OSError as exc:
        raise DumpError(f"{what}: {path.name} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DumpError(f"{what}: {path.name} is not a regular file")
    return os.fdopen(fd, "rb")


def load_npy(path: Path, entry: Entry, what: str,
             scratch: Scratch | None = None) -> np.ndarray:
    """An .npy file that is the tensor's own (format 1): `read_npy` from its start, with no
    byte after the data."""
    with _open(path, what) as fh:
        return read_npy(fh, os.fstat(fh.fileno()).st_size, 0, path.name, entry, what,
                        scratch, whole=True)


def read_npy(fh: IO[bytes], size: int, start: int, name: str, entry: Entry, what: str,
             scratch: Scratch | None = None, whole: bool = False,
             mapper: Callable[[int, int], memoryview] | None = None,
             end: int | None = None) -> np.ndarray:
    """The .npy image at byte `start` of the open file `fh` (`size` bytes long, named `name`),
    without pickle; object arrays, truncation and manifest mismatches are refused, and with
    `whole` bytes after it too, and an image running past `end` (the next image's start).
    The header is parsed by numpy's own reader (never pickle), then the data is mapped in
    place (`map_readonly`: zero copy, pages mapped up front), or with `scratch` read into it
    (the array is then valid until the scratch's next use)."""
    try:
        fh.seek(start)
        known = _expected_header(fh, entry)
        if known is not None:
            shape, fortran, dtype = known
        else:
            fh.seek(start)
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        offset = fh.tell()
    except NPY_READ_ERRORS as exc:
        where = " file" if whole else f" image at byte {start}"
        raise DumpError(f"{what}: {name} is not a valid .npy{where} "
                        f"({npy_reason(exc)})") from None
    if dtype.hasobject:
        raise DumpError(f"{what}: {name} holds Python objects (a pickled .npy); "
                        "refusing to load it")
    if tuple(shape) != tuple(entry.shape) or str(dtype) != entry.dtype:
        raise DumpError(f"{what}: {name} holds {dtype} {shape_text(shape)} but the "
                        f"manifest says {entry.dtype} {shape_text(entry.shape)}")
    expected = offset + math.prod(int(d) for d in shape) * dtype.itemsize  # exact, no wrap
    if size < expected:
        raise DumpError(f"{what}: {name} is truncated ({size} bytes, expected "
                        f"{expected if whole else f'at least {expected}'})")
    if whole and size != expected:
        raise DumpError(f"{what}: {name} has {size - expected} bytes of trailing data")
    if end is not None and expected > end:
        raise DumpError(f"{what}: its image at byte {start} of {name} runs {expected - end} "
                        f"bytes into the next tensor's, at byte {end}")
    if expected == offset:
        try:
            return np.zeros(shape, dtype)
        except ValueError as exc:  # a zero beside a dimension numpy cannot index
            raise DumpError(f"{what}: {name} has an impossible shape "
                            f"{shape_text(shape)} ({exc})") from None
    order = "F" if fortran else "C"
    if scratch is None:
        data = (mapper or functools.partial(map_readonly, fh))(offset, expected - offset)
        return np.frombuffer(data, dtype=dtype).reshape(shape, order=order)
    buf = scratch.take(expected - offset)
    got = fh.readinto(memoryview(buf))
    if got != buf.size:
        raise DumpError(f"{what}: {name} is truncated (read {got} of {buf.size} bytes)")
    return buf.view(dtype).reshape(shape, order=order)


_MAGIC_1_0 = b"\x93NUMPY\x01\x00"
_HEAD_ROOM = 256  # bytes mapped before a packed tensor's data for its header (np.save: 128)


@functools.lru_cache(maxsize=32)
def _npy_form(dtype: str) -> tuple[np.dtype, str] | None:
    """The numpy dtype a manifest's dtype names, by its own name ("float32", not an alias
    such as "f4", as `read_npy` requires), and its .npy `descr`; None for any other string,
    an object or a subarray dtype (left to numpy's header reader; `read_npy` then says what
    is wrong)."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        return None
    if str(dt) != dtype or dt.hasobject or dt.subdtype is not None:
        return None
    return dt, np.lib.format.dtype_to_descr(dt)


def _saved_form(entry: Entry) -> tuple[np.dtype, tuple[int, ...], bytes] | None:
    """(dtype, shape, header dict text) of the .npy image `np.save` writes for the manifest
    entry's dtype and shape, or None where numpy has no such dtype (see _npy_form)."""
    form = _npy_form(entry.dtype)
    if form is None:
        return None
    shape = tuple(int(d) for d in entry.shape)
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (form[1], shape)
    return form[0], shape, text.encode("latin1")


def _is_saved_header(got: bytes, text: bytes) -> bool:
    """Whether a 1.0 header's dict `got` is `text` as np.save pads it (spaces, then "\\n")."""
    return got.endswith(b"\n") and got.rstrip(b" \n") == text


def packed_image(files: OpenFiles, path: Path, start: int, entry: Entry,
                 what: str, end: int | None = None) -> np.ndarray | None:
    """The tensor whose .npy image starts at byte `start` of the pack `path` (opened by
    `files.get`), when its header is byte for byte what `np.save` writes for the manifest's
    dtype and shape and its data lies inside the file: a view of the mapped window, header
    and data taken from one map with no read of the file. Else None: `read_npy` then reads
    it and says what is wrong. (Reading each header through the file cost a third of a
    diff's time outside the comparison on PP-OCRv4 det 640's 673 tensors.)"""
    form = _saved_form(entry)
    if form is None:
        return None
    dtype, shape, text = form
    nbytes = math.prod(shape) * dtype.itemsize
    size = files.get(path, what)[1]
    if end is not None:  # the image lies before the next one (else read_npy says so)
        size = min(size, end)
    length = min(size - start, _HEAD_ROOM + nbytes)
    if start < 0 or length < 10 + nbytes:
        return None
    view = files.mapped(path, start, length, what)
    if view[:8] != _MAGIC_1_0:
        return None
    head = 10 + (view[8] | view[9] << 8)
    if head + nbytes > length:
        return None
    if not _is_saved_header(bytes(view[10:head]), text):
        return None
    try:
        if nbytes == 0:
            return np.zeros(shape, dtype)
        return np.frombuffer(view[head:head + nbytes], dtype=dtype).reshape(shape)
    except ValueError:  # a shape numpy cannot make (a zero beside a dimension of 2**62)
        return None


def _expected_header(fh: Any, entry: Entry) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """(shape, fortran order, dtype) when the .npy 1.0 header at the file's position is, byte
    for byte, the one `np.save` writes for the manifest's dtype and shape, with the file
    positioned at the data; else None (the caller parses it with numpy's reader). numpy's
    reader evaluates the header with `ast.literal_eval`: 38 ms for det-640's 673 tensors,
    against 12 ms here (~2% of a whole diff's CPU time; issue 14)."""
    head = fh.read(10)
    form = _saved_form(entry)
    if len(head) < 10 or head[:8] != _MAGIC_1_0 or form is None:
        return None
    dtype, shape, text = form
    if not _is_saved_header(fh.read(int.from_bytes(head[8:10], "little")), text):
        return None
    return shape, False, dtype


def map_readonly(fh: Any, offset: int, length: int) -> memoryview:
    """`length` bytes of the open file from `offset`, memory-mapped read-only. On Linux the
    pages are mapped in one go (MAP_POPULATE): a ResNet-50 dump pair maps in ~6 ms, where
    copying it into a buffer takes ~45 ms and faulting a plain map page by page twice the
    compare time. The map lives as long as the returned view (and arrays made from it)."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    if hasattr(mmap, "MAP_POPULATE"):
        mm = mmap.mmap(fh.fileno(), offset + length - start, flags=mmap.MAP_SHARED
                       | mmap.MAP_POPULATE, prot=mmap.PROT_READ, offset=start)
    else:
        mm = mmap.mmap(fh.fileno(), offset + length - start, access=mmap.ACCESS_READ,
                       offset=start)
    return memoryview(mm)[offset - start:]


def shape_text(shape: Any) -> str:
    dims = list(shape)
    return "(" + ",".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"
