"""A `.vtc` file opened as hostile input, below the archive's layout (archive_reader.py).

`open_archive` is the gate: an HDF5 file, labelled a verify archive, in a format version this
verify reads. `ArchiveFile` is typed, checked access to its parts: attributes of one type,
JSON records, groups numbered 0..n-1, numeric datasets whose declared size is within the limit
(`max_tensor_bytes`) before anything is read, and every name in a group the reader walks an object
stored in this file, every dataset's bytes in it: a soft or external link, external storage or a
virtual dataset is refused, never followed. Anything wrong is one ArchiveError line naming the
part, exit 2.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any, TypeVar

import h5py
import numpy as np
from h5py import h5d, h5l

from verify import __version__, schema
from verify.errors import ArchiveError, UsageError

_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")
_Self = TypeVar("_Self", bound="ArchiveFile")


def max_tensor_bytes() -> int:
    """The largest dataset a reader accepts: $VERIFY_MAX_TENSOR_MB (`verify --max-tensor-mb`)
    or the default; a file declaring more is refused before anything is read."""
    raw = os.environ.get(schema.MAX_TENSOR_MB_ENV, "")
    if not raw:
        return schema.DEFAULT_MAX_TENSOR_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        mb = float("nan")
    if not mb > 0 or mb == float("inf"):
        raise UsageError(f"{schema.MAX_TENSOR_MB_ENV}={raw!r}: expected a number of MB > 0")
    return int(mb * (1 << 20))


class ArchiveFile:
    """An archive file open for reading, with typed and checked access to its parts; what the
    parts must be is the subclass's (`ArchiveReader`). `checked` (format 2 and later: fixed-length
    text only, checksums) is set by the subclass once it has read the version. Use as a context
    manager."""

    checked: bool

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.limit = max_tensor_bytes()
        self._f = open_archive(self.path)
        # datasets found and checked, by key: the layout, a shape and each read looked a
        # layer up again (a 1,500-layer archive: 1.8 s to open, a third of diff's time)
        self._checked: dict[str, h5py.Dataset] = {}

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def close(self) -> None:
        self._f.close()

    def corrupt(self, what: str) -> ArchiveError:
        return ArchiveError(f"{self.path}: corrupt archive: {what}")

    def _only_attrs(self, obj: Any, *allowed: str) -> None:
        extra = set(obj.attrs.keys()) - set(allowed)
        if extra:
            raise self.corrupt(f"{obj.name} carries unexpected attribute(s) {sorted(extra)}")

    def _attr(self, obj: Any, key: str, kind: type, default: Any = None) -> Any:
        if kind is int:
            return int_attr(obj.attrs, key)
        if key not in obj.attrs:
            value = default
        else:
            # format 2 writes fixed-length text only: anything else is not read at all (a
            # variable-length value points into the global heap, see schema.py)
            dtype = obj.attrs.get_id(key).dtype
            if self.checked and (dtype.kind != "S" or obj.attrs.get_id(key).shape != ()):
                raise self.corrupt(f"attribute {key!r} of {obj.name} is not fixed-length text")
            value = obj.attrs[key]
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise self.corrupt(f"attribute {key!r} of {obj.name} is not UTF-8 text") from None
        if not isinstance(value, kind):
            raise self.corrupt(f"attribute {key!r} of {obj.name} is missing or not "
                               f"{kind.__name__}")
        return value

    def _over_limit(self, what: str, nbytes: float) -> ArchiveError:
        return ArchiveError(
            f"{self.path}: {what} declares {nbytes / 2**20:.4g} MB, over the "
            f"{self.limit / 2**20:.4g} MB limit (raise it with verify --max-tensor-mb N "
            f"or ${schema.MAX_TENSOR_MB_ENV})")

    def _record(self, key: str) -> str:
        """A format-2 JSON record: a scalar fixed-length string dataset."""
        ds = self._f.get(key)
        if not isinstance(ds, h5py.Dataset) or ds.dtype.kind != "S" or ds.shape != ():
            raise self.corrupt(f"the {key} record is missing or not text")
        self._own_data(ds, f"the {key} record")
        if ds.dtype.itemsize > self.limit:
            raise self._over_limit(f"the {key} record", ds.dtype.itemsize)
        try:
            return bytes(ds[()]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.corrupt(f"the {key} record is not UTF-8 text") from None

    def _names(self, group: h5py.Group, where: str) -> list[str]:
        """The names in `group` (at `where`, '' for the root), listed without following any: a
        soft link (an alias of another path) or an external link (a path to another file, which
        HDF5 would open and read as if it were this one) is refused by name and target. Every
        group the reader walks is listed here first, before anything in it is opened.

        A hard link is accepted: it is how every object is named, and an object stored under two
        names (which verify's writer never makes) reads exactly as two copies would: each name
        is checked for type, size and digest, the archive checksum covers every path, nothing
        outside the file is reached, and the walk has a fixed depth, so a group linked into
        itself cannot loop it. Telling a second name from a first would cost an object-header
        read per name (the object's reference count), for no damage it could catch."""
        found: list[tuple[bytes, int]] = []
        # one pass in the library, link types included: what keys() alone costs; keys() and a
        # get(name, getlink=True) per name cost 50 times more (3000 names: 1 ms against 50 ms)
        group.id.links.iterate(lambda name, info: found.append((name, info.type)), info=True)
        names = [name.decode("utf-8", "backslashreplace") for name, _ in found]
        for (raw, kind), name in zip(found, names):
            if kind != h5l.TYPE_HARD:
                link = group.get(raw, getlink=True)  # a user-defined type: TypeError, one line
                path = f"{where}/{name}" if where else name
                path = path if path.isprintable() else repr(path)
                if isinstance(link, h5py.ExternalLink):
                    what, target = "an external link", f"{link.filename}:{link.path}"
                else:
                    what, target = "a soft link", link.path
                raise self.corrupt(f"{path} is {what} to {target[:100]!r}; verify archives "
                                   "hold no links")
        return names

    def _own_data(self, ds: h5py.Dataset, named: str) -> None:
        """`ds` keeps its bytes in this file: not in external raw-data files (HDF5's external
        storage) nor mapped from other datasets (a virtual dataset), both of which HDF5 reads as
        if they were its own, by a path the archive names; verify's writer makes neither. Run by
        each typed accessor (`_dataset`, `_byte_array`, `_record`) on every dataset it hands
        out, at the open and at each later read alike: no read can skip it (one property-list
        read, ~12 µs)."""
        dcpl = ds.id.get_create_plist()
        if dcpl.get_layout() == h5d.VIRTUAL:
            files = [dcpl.get_virtual_filename(i) for i in range(dcpl.get_virtual_count())]
            raise self.corrupt(f"{named} is a virtual dataset, its data mapped from "
                               f"{str(files)[:100]}; verify archives hold their own data")
        if dcpl.get_external_count():
            name = dcpl.get_external(0)[0].decode("utf-8", "backslashreplace")
            raise self.corrupt(f"{named} keeps its data in the external file {name[:100]!r}; "
                               "verify archives hold their own data")

    def _count(self, group: h5py.Group, where: str) -> int:
        keys = self._names(group, where)
        if not all(_INDEX.fullmatch(k) for k in keys) or \
                sorted(int(k) for k in keys) != list(range(len(keys))):
            raise self.corrupt(f"{where} is not numbered 0..{len(keys) - 1}")
        return len(keys)

    def _dataset(self, where: str, what: str) -> h5py.Dataset:
        known = self._checked.get(where)
        if known is not None:
            return known
        ds = self._f.get(where)
        named = what if what == where else f"{what} ({where})"
        if not isinstance(ds, h5py.Dataset):
            raise self.corrupt(f"{named} is missing or not a dataset")
        self._own_data(ds, what)
        if ds.shape is None or ds.dtype.kind not in "biufc" or ds.dtype.hasobject:
            raise self.corrupt(f"{named} is not a numeric array")
        nbytes = int(np.prod(ds.shape, dtype=np.float64)) * ds.dtype.itemsize
        if nbytes > self.limit:
            raise self._over_limit(what, nbytes)
        self._checked[where] = ds
        return ds

    def _byte_array(self, where: str) -> h5py.Dataset:
        """An external data file's dataset: a 1-D byte array of any size (streamed, never read
        whole, so not held to the tensor size limit)."""
        ds = self._f.get(where)
        if not isinstance(ds, h5py.Dataset) or ds.dtype != np.uint8 or len(ds.shape) != 1:
            raise self.corrupt(f"{where} is not a byte array")
        self._own_data(ds, where)
        return ds

    def _json(self, text: str, kind: type, what: str) -> Any:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            raise self.corrupt(f"the {what} record is not JSON") from None
        if not isinstance(value, kind):
            raise self.corrupt(f"the {what} record is not a JSON {kind.__name__}")
        return value


def int_attr(attrs: Any, key: str) -> int:
    """An integer attribute (a bool is not one); ValueError when missing or not one."""
    value = attrs.get(key)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"attribute {key!r} is missing or not an integer")
    return int(value)


def _format_name(f: h5py.File) -> str | None:
    """The root's format attribute: fixed-length text (format 2), or the variable-length
    string format 1 wrote, followed into the global heap only when the version says 1."""
    if schema.ATTR_FORMAT not in f.attrs:
        return None
    attr = f.attrs.get_id(schema.ATTR_FORMAT)
    if attr.shape != ():
        return None
    if attr.dtype.kind != "S":
        version = f.attrs.get(schema.ATTR_VERSION)
        if not isinstance(version, (int, np.integer)) or version != schema.UNCHECKED_VERSION:
            return None
    value = f.attrs[schema.ATTR_FORMAT]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _starts_like_onnx(path: Path) -> bool:
    """Whether the file begins as a serialized ModelProto does: its ir_version (field 1, a
    varint 1..127), then another of its fields (producer, domain, graph, opset import, ...)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(3)
    except OSError:
        return False
    return len(head) == 3 and head[0] == 0x08 and 0 < head[1] < 0x80 and head[2] in (
        0x12, 0x1a, 0x22, 0x28, 0x32, 0x3a, 0x42, 0x72, 0x7a)


def open_archive(path: Path) -> h5py.File:
    """The HDF5 file at `path` opened read-only, once it is labelled a verify archive in a
    format version this verify reads; else one ArchiveError line (the file closed)."""
    if not path.exists():
        raise ArchiveError(f"{path}: no such file")
    if path.is_dir():
        raise ArchiveError(f"{path}: is a directory, expected a .vtc testcase archive")
    try:
        f = h5py.File(path, "r")
    except PermissionError:
        raise ArchiveError(f"{path}: cannot read: permission denied") from None
    except (OSError, ValueError, RuntimeError):
        # `verify run model.onnx`: a new user's first try (or a model saved as .vtc)
        named = path.suffix.lower() == ".onnx"  # else pack's own name would be the model's
        if named or _starts_like_onnx(path):
            out = path.with_suffix(".vtc") if named else path.with_name(path.stem + ".packed.vtc")
            raise ArchiveError(f"{path}: an ONNX model, not a testcase archive; pack it first "
                               f"(verify pack {shlex.quote(str(path))}"
                               + ("" if named else f" -o {shlex.quote(str(out))}")
                               + f" writes {shlex.quote(str(out))}) and give that") from None
        raise ArchiveError(f"{path}: not a verify testcase archive (not HDF5, or truncated/corrupt)") from None
    try:
        if _format_name(f) != schema.FORMAT_NAME:
            raise ArchiveError(f"{path}: an HDF5 file, but not a verify testcase archive")
        try:
            version = int_attr(f.attrs, schema.ATTR_VERSION)
        except ValueError:
            raise ArchiveError(f"{path}: corrupt archive: no format version") from None
        if version > schema.NEWEST_VERSION:
            written_by = f.attrs.get(schema.ATTR_VERIFY_VERSION, "?")
            written_by = (written_by.decode("utf-8", "replace") if isinstance(written_by, bytes)
                          else written_by if isinstance(written_by, str) else "?")
            raise ArchiveError(
                f"{path}: written in archive format version {version} by verify "
                f"{written_by[:40]}; this verify {__version__} reads "
                f"up to version {schema.NEWEST_VERSION}: upgrade verify")
        if version < schema.UNCHECKED_VERSION:
            raise ArchiveError(f"{path}: invalid archive format version {version}")
    except ArchiveError:
        f.close()
        raise
    except (OSError, ValueError, TypeError, RuntimeError, KeyError) as exc:
        f.close()
        raise ArchiveError(f"{path}: corrupt archive: {type(exc).__name__}: {exc}") from None
    except BaseException:
        f.close()
        raise
    return f
