"""Edits of an archive pack wrote, as a tool, a person or a damaged disk would make them: the
archive checksum re-sealed after an edit (so that the reader's structural checks alone must
catch it), a dataset stored compressed with a byte of its chunk damaged (HDF5 cannot read it
back), and the archive laid out as format 1 (no checksums) wrote it."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from onnx import TensorProto

from verify import schema
from verify.archive_reader import read_archive
from verify.digest import archive_digest
from verify.errors import ArchiveError


def _text(obj: h5py.HLObject, key: str) -> str:
    value = obj.attrs.get(key, b"")
    return value.decode() if isinstance(value, bytes) else str(value)


def reseal(path: Path) -> None:
    """Give `path` the archive checksum of what it now holds, walked in the writer's order
    (testcase.write_archive): what someone who edits an archive and re-seals it would do. The
    checks that hold against a re-sealed archive are the structural ones alone."""
    with h5py.File(path, "r+") as f:
        meta: dict[str, object] = {k: (int(f.attrs[k]) if k == schema.ATTR_VERSION
                                       else _text(f, k)) for k in schema.META_ATTRS}
        meta.update({k: bytes(f[k][()]).decode() for k in schema.META_RECORDS})
        entries: list[list[object]] = [[schema.MODEL, "", _text(f[schema.MODEL],
                                                                schema.ATTR_SHA256)]]
        for i in range(len(f[schema.CASES])):
            case = f[schema.case_path(i)]
            entries.append([schema.case_path(i), schema.ATTR_SOURCE,
                            _text(case, schema.ATTR_SOURCE)])
            for kind in schema.TENSOR_KINDS:
                if kind in case:
                    entries.append([f"{schema.case_path(i)}/{kind}", "", ""])
                    for k in range(len(case[kind])):
                        ds = case[kind][str(k)]
                        entries.append([f"{schema.case_path(i)}/{kind}/{k}",
                                        _text(ds, schema.ATTR_NAME),
                                        _text(ds, schema.ATTR_SHA256)])
        group = f.get(schema.EXTERNAL)
        for k in range(len(group) if isinstance(group, h5py.Group) else 0):
            ds = group[str(k)]
            entries.append([f"{schema.EXTERNAL}/{k}", _text(ds, schema.ATTR_NAME),
                            _text(ds, schema.ATTR_SHA256)])
        f.attrs[schema.ATTR_CHECKSUM] = np.bytes_(archive_digest(meta, entries).encode())


def set_record(path: Path, key: str, text: str) -> None:
    """The JSON record `key` of a format-2 archive replaced by `text`, the archive re-sealed."""
    with h5py.File(path, "r+") as f:
        del f[key]
        data = text.encode()
        f.create_dataset(key, data=np.array(data, dtype=f"S{max(1, len(data))}"))
    reseal(path)


def damage_chunk(path: Path, where: str) -> None:
    """`where` stored again gzip-compressed in one chunk (as `h5repack -f GZIP` would store
    it), a byte in the middle of that chunk flipped on disk: HDF5 cannot read it back (the
    archive checksum does not cover storage)."""
    with h5py.File(path, "r+") as f:
        attrs, data = dict(f[where].attrs), f[where][()]
        del f[where]
        ds = f.create_dataset(where, data=data, chunks=data.shape, compression="gzip")
        for k, v in attrs.items():
            ds.attrs[k] = v
        info = ds.id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))


def to_format_1(path: Path, keep_checksum: bool = False) -> None:
    """A format-2 archive laid out as format 1 wrote it: version 1, the JSON records as
    variable-length root attributes, no digest on any tensor, no archive checksum (kept with
    `keep_checksum`, which format 1 never wrote)."""
    with h5py.File(path, "r+") as f:
        f.attrs[schema.ATTR_VERSION] = np.int64(schema.UNCHECKED_VERSION)
        for key in schema.META_RECORDS:
            text = bytes(f[key][()]).decode()
            del f[key]
            f.attrs.create(key, text, dtype=h5py.string_dtype())
        if not keep_checksum:
            del f.attrs[schema.ATTR_CHECKSUM]

        def strip(name: str, obj: h5py.HLObject) -> None:
            if isinstance(obj, h5py.Dataset) and name.startswith(schema.CASES):
                del obj.attrs[schema.ATTR_SHA256]
        f.visititems(strip)


def refused_line(path: Path) -> str:
    """The reader's one line for `path`, with its `archive: corrupt archive: ` prefix cut."""
    with pytest.raises(ArchiveError) as e:
        read_archive(path)
    prefix = f"{path}: corrupt archive: "
    assert str(e.value).startswith(prefix), str(e.value)
    return str(e.value)[len(prefix):]


def external_tensor(name: str, value: np.ndarray, location: str) -> TensorProto:
    """A float initializer `name` whose data lies at offset 0 of the external file `location`."""
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(value.shape),
                    data_location=TensorProto.EXTERNAL)
    for k, v in (("location", location), ("offset", "0"), ("length", str(value.nbytes))):
        entry = t.external_data.add()
        entry.key, entry.value = k, v
    return t
