"""The `.vtc` testcase archive: what it holds (`Case`, `Testcase`) and its writer (atomic).
Layout in `schema.py`; the reader, which treats the file as hostile, in `archive_reader.py`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from verify import __version__, schema
from verify.archive_file import max_tensor_bytes
from verify.digest import archive_digest, sha256_hex, tensor_digest
from verify.errors import ArchiveError, UsageError
from verify.external import ExternalFile, write_dataset
from verify.files import atomic_path, ensure_space, made_dirs, output_errors
from verify.graph import TensorInfo


@dataclass(frozen=True)
class Case:
    """One set of inputs and the ground-truth outputs computed from them."""

    inputs: Mapping[str, np.ndarray]
    outputs: Mapping[str, np.ndarray]
    source: str = ""          # where the inputs came from (the -d specs), for provenance


@dataclass(frozen=True)
class Testcase:
    model_bytes: bytes
    cases: tuple[Case, ...]
    tensor_order: tuple[TensorInfo, ...]
    tolerances: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)
    has_layers: bool = False
    format_version: int = schema.FORMAT_VERSION
    path: Path | None = None
    checked: bool = True      # False for a format-1 archive: no checksums to verify
    external: tuple[ExternalFile, ...] = ()   # the model's external data files (format 3)

    def case_indices(self, index: int | None = None) -> tuple[int, ...]:
        """Every case, or just `index` (a --case option); UsageError when out of range."""
        if index is None:
            return tuple(range(len(self.cases)))
        if not 0 <= index < len(self.cases):
            raise UsageError(f"{self.path}: --case {index} out of range (the archive holds "
                             f"{len(self.cases)} case(s), 0..{len(self.cases) - 1})")
        return (index,)


# --- writing ----------------------------------------------------------------------------------
def write_archive(path: Path, tc: Testcase,
                  layers: Sequence[Iterator[tuple[str, np.ndarray]]] | None = None) -> None:
    """Write the archive atomically: a temp file in the same folder, renamed when complete.

    `layers`, if given, holds one iterator per case yielding (tensor name, reference value);
    they are streamed into the file one tensor at a time. Every dataset gets its digest, the
    root the archive's checksum; the provenance's model_sha256 is that of the bytes written.
    """
    path = Path(path)
    if path.is_dir():
        raise ArchiveError(f"{path}: is a folder; give the archive's file name")
    model_sha = sha256_hex(tc.model_bytes)
    provenance = {**tc.provenance, "model_sha256": model_sha}
    limit = max_tensor_bytes()
    records = {
        schema.ATTR_PROVENANCE: json.dumps(provenance, sort_keys=True),
        schema.ATTR_TOLERANCES: json.dumps(tc.tolerances, sort_keys=True),
        schema.ATTR_TENSOR_ORDER: json.dumps([t.to_dict() for t in tc.tensor_order]),
    }
    # before any byte is written; each tensor is checked as it is written (`_write_named`)
    for what, nbytes in [("the model", len(tc.model_bytes)),
                         *((f"the {key} record", len(text.encode("utf-8")))
                           for key, text in records.items())]:
        _within(limit, path, what, nbytes)
    # a missing folder is made, as every other output's (and removed if the write fails)
    with made_dirs(path.parent if str(path.parent) else "."), output_errors(path), \
            atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        meta: dict[str, Any] = {
            schema.ATTR_FORMAT: schema.FORMAT_NAME,
            schema.ATTR_VERSION: schema.EXTERNAL_VERSION if tc.external else schema.FORMAT_VERSION,
            schema.ATTR_VERIFY_VERSION: __version__,
            schema.ATTR_CREATED: str(provenance.get("created_utc", "")),
        }
        for key, value in meta.items():
            if isinstance(value, int):
                f.attrs[key] = value
            else:
                _set_text(f, key, value)
        for key, text in records.items():
            data = text.encode("utf-8")
            f.create_dataset(key, data=np.array(data, dtype=f"S{max(1, len(data))}"))
        meta.update(records)
        ensure_space(path, len(tc.model_bytes) + sum(f.size for f in tc.external) + sum(
            np.asarray(v).nbytes for c in tc.cases for v in (*c.inputs.values(),
                                                              *c.outputs.values())))
        model = f.create_dataset(schema.MODEL, data=np.frombuffer(tc.model_bytes, np.uint8))
        _set_text(model, schema.ATTR_SHA256, model_sha)
        entries: list[list[Any]] = [[schema.MODEL, "", model_sha]]
        f.create_group(schema.CASES)  # even with no case, so the reader can say so
        for i, case in enumerate(tc.cases):
            group = f.create_group(schema.case_path(i))
            _set_text(group, schema.ATTR_SOURCE, case.source)
            entries.append([schema.case_path(i), schema.ATTR_SOURCE, case.source])
            kinds: list[tuple[str, Any]] = [(schema.INPUTS, case.inputs.items()),
                                            (schema.OUTPUTS, case.outputs.items())]
            if layers is not None:
                kinds.append((schema.LAYERS, layers[i]))
            for kind, items in kinds:
                entries.append([f"{schema.case_path(i)}/{kind}", "", ""])
                entries += _write_named(group.create_group(kind), items, path, limit,
                                        f"case {i} {kind[:-1]}")
        if tc.external:  # streamed from the files, never whole in memory
            group = f.create_group(schema.EXTERNAL)
            for k, ext in enumerate(tc.external):
                digest = write_dataset(group, str(k), ext)
                _set_text(group[str(k)], schema.ATTR_NAME, ext.location)
                _set_text(group[str(k)], schema.ATTR_SHA256, digest)
                entries.append([f"{schema.EXTERNAL}/{k}", ext.location, digest])
        _set_text(f, schema.ATTR_CHECKSUM, archive_digest(meta, entries))


_MAX_TEXT = 60_000  # bytes: an attribute must fit in its object's header (64 KB)


def _set_text(obj: Any, key: str, text: str) -> None:
    """A fixed-length UTF-8 attribute (never a variable-length one: see schema.py)."""
    data = text.encode("utf-8")
    if len(data) > _MAX_TEXT:
        raise ArchiveError(f"{key} {text[:40]!r}…: {len(data)} bytes, more than an archive "
                           f"attribute holds ({_MAX_TEXT})")
    obj.attrs.create(key, np.array(data, dtype=f"S{max(1, len(data))}"))


def _within(limit: int, path: Path, what: str, nbytes: int) -> None:
    """What no reader would open (`max_tensor_bytes`) is not written: pack stored a 2049 MB
    input that `run` and `inspect` then refused in the same archive."""
    if nbytes > limit:
        raise ArchiveError(f"{path}: {what} is {nbytes / 2**20:.4g} MB, over the "
                           f"{limit / 2**20:.4g} MB an archive holds per tensor (readers refuse "
                           f"it); raise the limit with verify --max-tensor-mb N or "
                           f"${schema.MAX_TENSOR_MB_ENV}, for packing and reading alike")


def _write_named(group: h5py.Group, items: Any, path: Path, limit: int,
                 what: str) -> list[list[Any]]:
    entries = []
    for k, (name, value) in enumerate(items):
        value = np.asarray(value)
        _within(limit, path, f"{what} '{name}'", value.nbytes)  # a streamed layer, too
        written = os.path.getsize(group.file.filename) if group.file.filename else 0
        ensure_space(path, value.nbytes, written)  # a failed HDF5 write can crash: never try one
        ds = group.create_dataset(str(k), data=value)
        digest = tensor_digest(str(name), value)
        _set_text(ds, schema.ATTR_NAME, str(name))
        _set_text(ds, schema.ATTR_SHA256, digest)
        entries.append([ds.name.lstrip("/"), str(name), digest])
    return entries
