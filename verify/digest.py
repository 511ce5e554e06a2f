"""Checksums of a `.vtc` archive: one sha256 per dataset, one over the metadata and them all.

A tensor's digest covers its name, dtype (little-endian form), shape and bytes, so a changed
name, type, shape or value is told apart from the original; it is computed in slices, so a
large tensor is checked without a second copy in memory. The archive's own digest covers the
root attributes, every case's attributes and every dataset's digest: an attribute, a dataset
added, removed or renamed all change it. These catch damage (a flipped bit, a truncated copy,
an edit by a tool that does not know them); an archive edited on purpose and re-packed with
fresh checksums is, by construction, a new archive.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

SLICE_BYTES = 16 << 20  # how much of a tensor is converted and hashed at a time


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def little_endian(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


class TensorHasher:
    """sha256 over a tensor's name, dtype, shape, then its bytes fed in C order by `update`."""

    def __init__(self, name: str, dtype: np.dtype, shape: Sequence[int]) -> None:
        self._dtype = little_endian(np.dtype(dtype))
        header = json.dumps([name, self._dtype.str, [int(d) for d in shape]])
        self._h = hashlib.sha256(header.encode("utf-8") + b"\0")

    def update(self, part: np.ndarray) -> None:
        part = np.ascontiguousarray(part, dtype=self._dtype)  # a copy only if it must convert
        self._h.update(part.reshape(-1).view(np.uint8) if part.size else b"")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def tensor_digest(name: str, value: np.ndarray) -> str:
    value = np.asarray(value)
    h = TensorHasher(name, value.dtype, value.shape)
    for part in slices(value.shape, value.dtype.itemsize):
        h.update(value[part])
    return h.hexdigest()


def slices(shape: Sequence[int], itemsize: int) -> Iterable[Any]:
    """Index expressions covering an array of `shape` in order, each about SLICE_BYTES."""
    if not shape:
        yield ()
        return
    row = int(np.prod(shape[1:], dtype=np.int64)) * itemsize
    step = max(1, SLICE_BYTES // max(row, 1))
    for start in range(0, int(shape[0]), step):
        yield slice(start, start + step)
    if int(shape[0]) == 0:
        yield slice(0, 0)


def archive_digest(attrs: Mapping[str, Any], entries: Sequence[Sequence[Any]]) -> str:
    """The digest of the metadata (`attrs`, JSON-able) and the list of every dataset's
    (path, name, digest) and every group's attributes, in a fixed order."""
    doc = json.dumps({"attrs": attrs, "entries": [list(e) for e in entries]}, sort_keys=True,
                     ensure_ascii=True, separators=(",", ":"))
    return sha256_hex(doc.encode("ascii"))
