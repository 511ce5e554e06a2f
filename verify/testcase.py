"""The `.vtc` testcase archive: write (atomically), read, validate. Layout in `schema.py`.

Reading treats the file as hostile: every group, attribute and dataset is checked for its type
and range before use, a dataset whose declared size is over the limit (`max_tensor_bytes`) is
refused before it is read, and every dataset read is checked against its digest (digest.py).
Anything wrong is one ArchiveError line naming the part, exit 2, before any device is touched.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from verify import __version__, schema
from verify.digest import TensorHasher, archive_digest, sha256_hex, slices, tensor_digest
from verify.errors import ArchiveError, ArchiveWarning, UsageError
from verify.files import atomic_path, ensure_space, output_errors
from verify.external import ExternalData, ExternalFile, read_dataset, safe_location, write_dataset
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


# --- writing ----------------------------------------------------------------------------------
def write_archive(path: Path, tc: Testcase,
                  layers: Sequence[Iterator[tuple[str, np.ndarray]]] | None = None) -> None:
    """Write the archive atomically: a temp file in the same folder, renamed when complete.

    `layers`, if given, holds one iterator per case yielding (tensor name, reference value);
    they are streamed into the file one tensor at a time. Every dataset gets its digest, the
    root the archive's checksum; the provenance's model_sha256 is that of the bytes written.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ArchiveError(f"{path}: folder {directory} does not exist")
    if path.is_dir():
        raise ArchiveError(f"{path}: is a folder; give the archive's file name")
    model_sha = sha256_hex(tc.model_bytes)
    provenance = {**tc.provenance, "model_sha256": model_sha}
    with output_errors(path), atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
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
        records = {
            schema.ATTR_PROVENANCE: json.dumps(provenance, sort_keys=True),
            schema.ATTR_TOLERANCES: json.dumps(tc.tolerances, sort_keys=True),
            schema.ATTR_TENSOR_ORDER: json.dumps([t.to_dict() for t in tc.tensor_order]),
        }
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
                entries += _write_named(group.create_group(kind), items, path)
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


def _write_named(group: h5py.Group, items: Any, path: Path) -> list[list[Any]]:
    entries = []
    for k, (name, value) in enumerate(items):
        value = np.asarray(value)
        ensure_space(path, value.nbytes)  # a failed HDF5 write can crash: never try one
        ds = group.create_dataset(str(k), data=value)
        digest = tensor_digest(str(name), value)
        _set_text(ds, schema.ATTR_NAME, str(name))
        _set_text(ds, schema.ATTR_SHA256, digest)
        entries.append([ds.name.lstrip("/"), str(name), digest])
    return entries


# --- reading ----------------------------------------------------------------------------------
_HEX64 = re.compile(r"[0-9a-f]{64}")
_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")


@dataclass(frozen=True)
class Entry:
    """One stored tensor: where it is, its name and (format 2) its digest."""

    key: str
    name: str
    digest: str


class ArchiveReader:
    """An archive opened for reading: structure, attributes and the archive checksum checked
    when opened (no tensor read); tensors read one at a time, each checked against its digest.
    Use as a context manager."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.limit = max_tensor_bytes()
        self._f = _open(self.path)
        try:
            self._load_layout()
        except BaseException:
            self._f.close()
            raise

    def __enter__(self) -> "ArchiveReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def close(self) -> None:
        self._f.close()

    def corrupt(self, what: str) -> ArchiveError:
        return ArchiveError(f"{self.path}: corrupt archive: {what}")

    # structure and metadata, checked on open
    def _load_layout(self) -> None:
        f = self._f
        try:
            self.version = _int_attr(f.attrs, schema.ATTR_VERSION)
            self.checked = self.version >= 2
            meta = {k: self._attr(f, k, str if k != schema.ATTR_VERSION else int)
                    for k in schema.META_ATTRS}
            expected = {schema.MODEL, schema.CASES}
            if self.version >= schema.EXTERNAL_VERSION:
                expected.add(schema.EXTERNAL)
            if self.checked:
                expected.update(schema.META_RECORDS)
                meta.update({k: self._record(k) for k in schema.META_RECORDS})
            else:
                meta.update({k: self._attr(f, k, str) for k in schema.META_RECORDS})
            extra = set(f.keys()) - expected
            if extra:
                raise self.corrupt(f"unexpected entries {sorted(extra)}")
            if self.checked:
                self._only_attrs(f, *schema.META_ATTRS, schema.ATTR_CHECKSUM)
                for key in schema.META_RECORDS:
                    self._only_attrs(f[key])
            model = self._dataset(schema.MODEL, "the model")
            if model.dtype != np.uint8 or len(model.shape) != 1:
                raise self.corrupt("the model is not a byte array")
            self.model_sha = self._attr(model, schema.ATTR_SHA256, str)
            if self.checked:
                self._only_attrs(model, schema.ATTR_SHA256)
                if isinstance(f.get(schema.CASES), h5py.Group):  # absent: 'no cases' below
                    self._only_attrs(f[schema.CASES])
            if self.model_sha and not _HEX64.fullmatch(self.model_sha):
                raise self.corrupt("the model's sha256 attribute is malformed")
            if self.checked and not self.model_sha:
                raise self.corrupt("the model has no sha256")
            entries: list[list[Any]] = [[schema.MODEL, "", self.model_sha]]
            self.cases: list[dict[str, list[Entry]]] = []
            self.sources: list[str] = []
            cases = f.get(schema.CASES)
            if not isinstance(cases, h5py.Group):
                raise self.corrupt("no cases")
            n = self._count(cases, schema.CASES)
            for i in range(n):
                group = cases[str(i)]
                if not isinstance(group, h5py.Group):
                    raise self.corrupt(f"{schema.case_path(i)} is not a group")
                source = self._attr(group, schema.ATTR_SOURCE, str, default="")
                if self.checked:
                    self._only_attrs(group, schema.ATTR_SOURCE)
                entries.append([schema.case_path(i), schema.ATTR_SOURCE, source])
                extra = set(group.keys()) - set(schema.TENSOR_KINDS)
                if extra or schema.INPUTS not in group or schema.OUTPUTS not in group:
                    raise self.corrupt(f"case {i} does not hold inputs and outputs only")
                kinds: dict[str, list[Entry]] = {}
                for kind in schema.TENSOR_KINDS:
                    if kind in group:
                        entries.append([f"{schema.case_path(i)}/{kind}", "", ""])
                        kinds[kind] = self._entries(group, kind, entries)
                self.cases.append(kinds)
                self.sources.append(source)
            if n == 0:
                raise ArchiveError(f"{self.path}: archive holds no cases")
            self.external = self._external(entries)
            if self.checked:
                stored = self._attr(f, schema.ATTR_CHECKSUM, str, default="")
                if not _HEX64.fullmatch(stored):
                    raise self.corrupt("the archive checksum is missing or malformed")
                if archive_digest(meta, entries) != stored:
                    raise self.corrupt("its metadata or layout does not match the archive "
                                       "checksum (re-pack it, or get an intact copy)")
            elif schema.ATTR_CHECKSUM in f.attrs:
                raise self.corrupt(f"format version {self.version} but carries checksums")
            self.provenance = self._json(meta[schema.ATTR_PROVENANCE], dict, "provenance")
            self.tolerances = self._json(meta[schema.ATTR_TOLERANCES], dict, "tolerances")
            order = self._json(meta[schema.ATTR_TENSOR_ORDER], list, "tensor order")
            self.tensor_order = tuple(self._tensor_info(d) for d in order)
        except ArchiveError:
            raise
        except (KeyError, OSError, ValueError, TypeError, RuntimeError, OverflowError) as exc:
            raise self.corrupt(f"{type(exc).__name__}: {exc}") from None
        if not self.checked:
            warnings.warn(ArchiveWarning(
                f"{self.path}: archive format {self.version} has no checksums, so damage to it "
                "cannot be detected; re-pack it with this verify"), stacklevel=2)

    def _external(self, entries: list[list[Any]]) -> tuple[ExternalFile, ...]:
        """The external data files' datasets (format 3): checked for type, location and
        digest form; their size is not limited (they are streamed, never read whole)."""
        group = self._f.get(schema.EXTERNAL)
        if group is None:
            return ()
        if not isinstance(group, h5py.Group):
            raise self.corrupt(f"{schema.EXTERNAL} is not a group")
        self._only_attrs(group)
        out: list[ExternalFile] = []
        for k in range(self._count(group, schema.EXTERNAL)):
            where = f"{schema.EXTERNAL}/{k}"
            ds = group[str(k)]
            if not isinstance(ds, h5py.Dataset) or ds.dtype != np.uint8 or len(ds.shape) != 1:
                raise self.corrupt(f"{where} is not a byte array")
            self._only_attrs(ds, schema.ATTR_NAME, schema.ATTR_SHA256)
            location = self._attr(ds, schema.ATTR_NAME, str)
            digest = self._attr(ds, schema.ATTR_SHA256, str)
            if not safe_location(location) or location in {f.location for f in out}:
                raise self.corrupt(f"{where} has a bad or repeated location {location!r}")
            if not _HEX64.fullmatch(digest):
                raise self.corrupt(f"{where} ({location!r}) has a malformed digest")
            entries.append([where, location, digest])
            out.append(ExternalFile(location, int(ds.shape[0]), digest))
        return tuple(out)

    def extract_external(self, folder: Path) -> ExternalData:
        """Write every external data file under its location in `folder` (streamed, each
        checked against its digest)."""
        files = []
        for k, ext in enumerate(self.external):
            dest = folder / ext.location
            dest.parent.mkdir(parents=True, exist_ok=True)
            ensure_space(dest, ext.size)
            try:
                digest = read_dataset(self._f[f"{schema.EXTERNAL}/{k}"], dest)
            except (OSError, ValueError, TypeError, RuntimeError) as exc:
                raise self.corrupt(f"{schema.EXTERNAL}/{k} ({ext.location!r}) cannot be read: "
                                   f"{exc}") from None
            if digest != ext.sha256:
                dest.unlink()
                raise self.corrupt(f"external data {ext.location!r} does not match its "
                                   "checksum (re-pack it, or get an intact copy)")
            files.append(ExternalFile(ext.location, ext.size, ext.sha256, dest))
        return ExternalData(folder, tuple(files))

    def check_external(self) -> None:
        """Every external data file checked against its digest (streamed, nothing kept)."""
        for k, ext in enumerate(self.external):
            try:
                digest = read_dataset(self._f[f"{schema.EXTERNAL}/{k}"], Path(os.devnull))
            except (OSError, ValueError, TypeError, RuntimeError) as exc:
                raise self.corrupt(f"{schema.EXTERNAL}/{k} ({ext.location!r}) cannot be read: "
                                   f"{exc}") from None
            if digest != ext.sha256:
                raise self.corrupt(f"external data {ext.location!r} does not match its "
                                   "checksum (re-pack it, or get an intact copy)")

    def _only_attrs(self, obj: Any, *allowed: str) -> None:
        extra = set(obj.attrs.keys()) - set(allowed)
        if extra:
            raise self.corrupt(f"{obj.name} carries unexpected attribute(s) {sorted(extra)}")

    def _attr(self, obj: Any, key: str, kind: type, default: Any = None) -> Any:
        if kind is int:
            return _int_attr(obj.attrs, key)
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
                raise self.corrupt(f"attribute {key!r} is not UTF-8 text") from None
        if not isinstance(value, kind):
            raise self.corrupt(f"attribute {key!r} of {obj.name} is missing or not "
                               f"{kind.__name__}")
        return value

    def _record(self, key: str) -> str:
        """A format-2 JSON record: a scalar fixed-length string dataset."""
        ds = self._f.get(key)
        if not isinstance(ds, h5py.Dataset) or ds.dtype.kind != "S" or ds.shape != ():
            raise self.corrupt(f"the {key} record is missing or not text")
        if ds.dtype.itemsize > self.limit:
            raise self.corrupt(f"the {key} record declares {ds.dtype.itemsize} bytes")
        try:
            return bytes(ds[()]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.corrupt(f"the {key} record is not UTF-8 text") from None

    def _count(self, group: h5py.Group, where: str) -> int:
        keys = list(group.keys())
        if not all(_INDEX.fullmatch(k) for k in keys) or \
                sorted(int(k) for k in keys) != list(range(len(keys))):
            raise self.corrupt(f"{where} is not numbered 0..{len(keys) - 1}")
        return len(keys)

    def _dataset(self, where: str, what: str) -> h5py.Dataset:
        ds = self._f.get(where)
        if not isinstance(ds, h5py.Dataset):
            raise self.corrupt(f"{what} ({where}) is missing or not a dataset")
        if ds.shape is None or ds.dtype.kind not in "biufc" or ds.dtype.hasobject:
            raise self.corrupt(f"{what} ({where}) is not a numeric array")
        nbytes = int(np.prod(ds.shape, dtype=np.float64)) * ds.dtype.itemsize
        if nbytes > self.limit:
            raise ArchiveError(
                f"{self.path}: {what} declares {nbytes / 2**20:.4g} MB, over the "
                f"{self.limit / 2**20:.4g} MB limit (raise it with verify --max-tensor-mb N "
                f"or ${schema.MAX_TENSOR_MB_ENV})")
        return ds

    def _entries(self, group: h5py.Group, kind: str, entries: list[list[Any]]) -> list[Entry]:
        sub = group[kind]
        where = f"{group.name.lstrip('/')}/{kind}"
        if not isinstance(sub, h5py.Group):
            raise self.corrupt(f"{where} is not a group")
        out, seen = [], set()
        if self.checked:
            self._only_attrs(sub)
        for k in range(self._count(sub, where)):
            ds = self._dataset(f"{where}/{k}", f"{where}/{k}")
            if self.checked:
                self._only_attrs(ds, schema.ATTR_NAME, schema.ATTR_SHA256)
            name = self._attr(ds, schema.ATTR_NAME, str)
            if name in seen:
                raise self.corrupt(f"{where} holds {name!r} twice")
            seen.add(name)
            digest = self._attr(ds, schema.ATTR_SHA256, str) if self.checked else ""
            if self.checked and not _HEX64.fullmatch(digest):
                raise self.corrupt(f"{where}/{k} ({name!r}) has a malformed digest")
            entries.append([f"{where}/{k}", name, digest])
            out.append(Entry(f"{where}/{k}", name, digest))
        return out

    def _json(self, text: str, kind: type, what: str) -> Any:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            raise self.corrupt(f"the {what} record is not JSON") from None
        if not isinstance(value, kind):
            raise self.corrupt(f"the {what} record is not a JSON {kind.__name__}")
        return value

    def _tensor_info(self, d: Any) -> TensorInfo:
        ok = (isinstance(d, dict) and type(d.get("index")) is int
              and all(isinstance(d.get(k), str) for k in ("name", "node", "op"))
              and isinstance(d.get("is_output", False), bool))
        if not ok:
            raise self.corrupt(f"tensor order entry {str(d)[:60]!r} is malformed")
        return TensorInfo.from_dict(d)

    # data, read when asked for
    def model_bytes(self) -> bytes:
        data = self._read_plain(schema.MODEL).tobytes()
        if self.model_sha and sha256_hex(data) != self.model_sha:
            raise self.corrupt("the model does not match its sha256 (re-pack it, or get an "
                               "intact copy)")
        return data

    def dataset(self, entry: Entry) -> h5py.Dataset:
        """The dataset of `entry` (for its shape, dtype and size; read it with `read`)."""
        return self._dataset(entry.key, entry.key)

    def read(self, entry: Entry, out: np.ndarray | None = None) -> np.ndarray:
        """One tensor, checked against its digest; into `out` (same shape and dtype) if given."""
        ds = self._dataset(entry.key, entry.key)
        try:
            if out is None or ds.size == 0:
                value = np.asarray(ds[()])
            else:
                ds.read_direct(out)
                value = out
        except (OSError, ValueError, TypeError, RuntimeError) as exc:
            raise self.corrupt(f"{entry.key} ({entry.name!r}) cannot be read: {exc}") from None
        if self.checked:
            h = TensorHasher(entry.name, value.dtype, value.shape)
            for part in slices(value.shape, value.dtype.itemsize):
                h.update(value[part])
            if h.hexdigest() != entry.digest:
                raise self.corrupt(f"{entry.key} ({entry.name!r}) does not match its checksum "
                                   "(re-pack it, or get an intact copy)")
        return value

    def _read_plain(self, where: str) -> np.ndarray:
        ds = self._dataset(where, where)
        try:
            return np.asarray(ds[()])
        except (OSError, ValueError, TypeError, RuntimeError) as exc:
            raise self.corrupt(f"{where} cannot be read: {exc}") from None

    def read_named(self, case: int, kind: str) -> dict[str, np.ndarray]:
        return {e.name: self.read(e) for e in self.cases[case].get(kind, [])}

    def testcase(self) -> Testcase:
        """Everything but the per-layer references (see `iter_layers`), every part checked."""
        model_bytes = self.model_bytes()
        cases = tuple(Case(inputs=self.read_named(i, schema.INPUTS),
                           outputs=self.read_named(i, schema.OUTPUTS), source=self.sources[i])
                      for i in range(len(self.cases)))
        return Testcase(model_bytes=model_bytes, cases=cases, tensor_order=self.tensor_order,
                        tolerances=self.tolerances, provenance=self.provenance,
                        has_layers=any(schema.LAYERS in c for c in self.cases),
                        format_version=self.version, path=self.path, checked=self.checked,
                        external=self.external)


def _int_attr(attrs: Any, key: str) -> int:
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


def _open(path: Path) -> h5py.File:
    if not path.exists():
        raise ArchiveError(f"{path}: no such file")
    if path.is_dir():
        raise ArchiveError(f"{path}: is a directory, expected a .vtc testcase archive")
    try:
        f = h5py.File(path, "r")
    except PermissionError:
        raise ArchiveError(f"{path}: cannot read: permission denied") from None
    except (OSError, ValueError, RuntimeError):
        raise ArchiveError(f"{path}: not a verify testcase archive (not HDF5, or truncated/corrupt)") from None
    try:
        if _format_name(f) != schema.FORMAT_NAME:
            raise ArchiveError(f"{path}: an HDF5 file, but not a verify testcase archive")
        try:
            version = _int_attr(f.attrs, schema.ATTR_VERSION)
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


def read_archive(path: Path) -> Testcase:
    """Read everything but the per-layer references (see `iter_layers`), every part checked
    against its checksum."""
    with ArchiveReader(path) as reader:
        return reader.testcase()


def iter_layers(path: Path, case: int = 0,
                names: Collection[str] | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Stream the per-layer reference values of one case, one tensor at a time, each checked;
    with `names`, only those are read from disk (the others are skipped by their name)."""
    with ArchiveReader(path) as reader:
        if not 0 <= case < len(reader.cases) or schema.LAYERS not in reader.cases[case]:
            raise ArchiveError(f"{path}: case {case} has no per-layer references (pack with --layers)")
        for entry in reader.cases[case][schema.LAYERS]:
            if names is None or entry.name in names:
                yield entry.name, reader.read(entry)


@contextmanager
def external_data(tc: Testcase) -> Iterator[ExternalData | None]:
    """The archive's external data files extracted into a scratch folder for the duration
    (None when the model holds its weights); the folder goes when the block ends."""
    if not tc.external:
        yield None
        return
    if tc.path is None:
        raise ArchiveError("a model with external data must be read from its archive")
    with tempfile.TemporaryDirectory(prefix="verify-external-") as tmp, \
            ArchiveReader(tc.path) as reader:
        yield reader.extract_external(Path(tmp))


def export_external(tc: Testcase, folder: Path) -> list[Path]:
    """Write the archive's external data files under their locations in `folder`, beside the
    exported model: each extracted (streamed, checked) into a scratch folder there, then
    renamed into place, so a failure leaves no half file."""
    if not tc.external or tc.path is None:
        return []
    written = []
    with output_errors(folder), tempfile.TemporaryDirectory(prefix=".verify-export-",
                                                            dir=folder) as tmp, \
            ArchiveReader(tc.path) as reader:
        data = reader.extract_external(Path(tmp))
        for f in data.files:
            assert f.path is not None
            dest = folder / f.location
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f.path, dest)
            written.append(dest)
    return written
