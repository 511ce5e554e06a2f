"""Reading a `.vtc` archive as hostile input: its layout (cases, tensors, records, external
data files) checked when opened, its tensors read one at a time. Layout in `schema.py`; the typed,
checked access to the file's parts below it in `archive_file.py`; the writer in `testcase.py`.

Every group, attribute and dataset is checked for its type and range before use, a soft or
external link anywhere (or a dataset whose bytes are in another file) is refused without being
followed, a dataset whose declared size is over the limit (`max_tensor_bytes`) is refused before
it is read, and every dataset read is checked against its digest (digest.py). Anything wrong is
one ArchiveError line naming the part, exit 2, before any device is touched.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import h5py
import numpy as np

from verify import schema
from verify.archive_file import ArchiveFile, int_attr
from verify.digest import TensorHasher, archive_digest, sha256_hex, slices
from verify.errors import ArchiveError, ArchiveWarning
from verify.external import ExternalData, ExternalFile, read_dataset, safe_location
from verify.files import ensure_space, output_errors
from verify.graph import TensorInfo
from verify.testcase import Case, Testcase

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Entry:
    """One stored tensor: where it is, its name and (format 2) its digest."""

    key: str
    name: str
    digest: str


class ArchiveReader(ArchiveFile):
    """An archive opened for reading: structure, attributes and the archive checksum checked
    when opened (no tensor read); tensors read one at a time, each checked against its digest.
    Use as a context manager."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        try:
            self._load_layout()
        except BaseException:
            self._f.close()
            raise

    # structure and metadata, checked on open
    def _load_layout(self) -> None:
        f = self._f
        try:
            self.version = int_attr(f.attrs, schema.ATTR_VERSION)
            self.checked = self.version >= 2
            names = self._names(f, "")  # before any part is opened: a link is never followed
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
            extra = set(names) - expected
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
                held = set(self._names(group, schema.case_path(i)))
                extra = held - set(schema.TENSOR_KINDS)
                if extra or schema.INPUTS not in held or schema.OUTPUTS not in held:
                    raise self.corrupt(f"case {i} does not hold inputs and outputs only")
                kinds: dict[str, list[Entry]] = {}
                for kind in schema.TENSOR_KINDS:
                    if kind in held:
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
        taken: set[PurePosixPath] = set()  # the files' paths, as the file system sees them
        folders: set[PurePosixPath] = set()  # and the folders they lie in
        for k in range(self._count(group, schema.EXTERNAL)):
            where = f"{schema.EXTERNAL}/{k}"
            ds = self._byte_array(where)
            self._only_attrs(ds, schema.ATTR_NAME, schema.ATTR_SHA256)
            location = self._attr(ds, schema.ATTR_NAME, str)
            digest = self._attr(ds, schema.ATTR_SHA256, str)
            path = PurePosixPath(location)  # 'a/./b' and 'a//b' are 'a/b'; '.' has no parts
            if not safe_location(location) or not path.parts or path in taken or \
                    path in folders or any(p in taken for p in path.parents):
                # one file twice, or a file where another needs a folder: the second extracted
                # would overwrite the first, or fail, after the first was checked
                raise self.corrupt(f"{where} has a bad or repeated location {location!r}")
            taken.add(path)
            folders.update(path.parents)
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
                digest = read_dataset(self._byte_array(f"{schema.EXTERNAL}/{k}"), dest)
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
                digest = read_dataset(self._byte_array(f"{schema.EXTERNAL}/{k}"),
                                      Path(os.devnull))
            except (OSError, ValueError, TypeError, RuntimeError) as exc:
                raise self.corrupt(f"{schema.EXTERNAL}/{k} ({ext.location!r}) cannot be read: "
                                   f"{exc}") from None
            if digest != ext.sha256:
                raise self.corrupt(f"external data {ext.location!r} does not match its "
                                   "checksum (re-pack it, or get an intact copy)")

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
