"""The `.vtc` testcase archive: write (atomically), read, validate. Layout in `schema.py`."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from verify import __version__, schema
from verify.errors import ArchiveError, UsageError
from verify.files import atomic_path
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

    def case_indices(self, index: int | None = None) -> tuple[int, ...]:
        """Every case, or just `index` (a --case option); UsageError when out of range."""
        if index is None:
            return tuple(range(len(self.cases)))
        if not 0 <= index < len(self.cases):
            raise UsageError(f"{self.path}: --case {index} out of range (the archive holds "
                             f"{len(self.cases)} case(s), 0..{len(self.cases) - 1})")
        return (index,)


def write_archive(path: Path, tc: Testcase,
                  layers: Sequence[Iterator[tuple[str, np.ndarray]]] | None = None) -> None:
    """Write the archive atomically: a temp file in the same folder, renamed when complete.

    `layers`, if given, holds one iterator per case yielding (tensor name, reference value);
    they are streamed into the file one tensor at a time.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ArchiveError(f"{path}: folder {directory} does not exist")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.attrs[schema.ATTR_FORMAT] = schema.FORMAT_NAME
        f.attrs[schema.ATTR_VERSION] = schema.FORMAT_VERSION
        f.attrs[schema.ATTR_VERIFY_VERSION] = __version__
        f.attrs[schema.ATTR_CREATED] = str(tc.provenance.get("created_utc", ""))
        f.attrs[schema.ATTR_PROVENANCE] = json.dumps(tc.provenance, sort_keys=True)
        f.attrs[schema.ATTR_TOLERANCES] = json.dumps(tc.tolerances, sort_keys=True)
        f.attrs[schema.ATTR_TENSOR_ORDER] = json.dumps([t.to_dict() for t in tc.tensor_order])
        model = f.create_dataset(schema.MODEL, data=np.frombuffer(tc.model_bytes, np.uint8))
        model.attrs[schema.ATTR_SHA256] = str(tc.provenance.get("model_sha256", ""))
        for i, case in enumerate(tc.cases):
            group = f.create_group(schema.case_path(i))
            group.attrs[schema.ATTR_SOURCE] = case.source
            _write_named(group.create_group(schema.INPUTS), case.inputs.items())
            _write_named(group.create_group(schema.OUTPUTS), case.outputs.items())
            if layers is not None:
                _write_named(group.create_group(schema.LAYERS), layers[i])


def _write_named(group: h5py.Group, items: Iterator[tuple[str, np.ndarray]] | Any) -> None:
    for k, (name, value) in enumerate(items):
        ds = group.create_dataset(str(k), data=np.asarray(value))
        ds.attrs[schema.ATTR_NAME] = name


def _read_named(group: h5py.Group) -> dict[str, np.ndarray]:
    keys = sorted(group.keys(), key=int)
    return {str(group[k].attrs[schema.ATTR_NAME]): group[k][()] for k in keys}


def _open(path: Path) -> h5py.File:
    if not path.exists():
        raise ArchiveError(f"{path}: no such file")
    if path.is_dir():
        raise ArchiveError(f"{path}: is a directory, expected a .vtc testcase archive")
    try:
        f = h5py.File(path, "r")
    except OSError:
        raise ArchiveError(f"{path}: not a verify testcase archive (not HDF5, or truncated/corrupt)") from None
    try:
        fmt = f.attrs.get(schema.ATTR_FORMAT)
        if fmt != schema.FORMAT_NAME:
            raise ArchiveError(f"{path}: an HDF5 file, but not a verify testcase archive")
        version = int(f.attrs.get(schema.ATTR_VERSION, -1))
        if version > schema.FORMAT_VERSION:
            raise ArchiveError(
                f"{path}: written in archive format version {version} by verify "
                f"{f.attrs.get(schema.ATTR_VERIFY_VERSION, '?')}; this verify {__version__} reads "
                f"up to version {schema.FORMAT_VERSION}: upgrade verify")
        if version < 1:
            raise ArchiveError(f"{path}: invalid archive format version {version}")
    except BaseException:
        f.close()
        raise
    return f


def read_archive(path: Path) -> Testcase:
    """Read everything but the per-layer references (see `iter_layers`)."""
    path = Path(path)
    f = _open(path)
    try:
        with f:
            provenance = json.loads(f.attrs[schema.ATTR_PROVENANCE])
            tolerances = json.loads(f.attrs[schema.ATTR_TOLERANCES])
            order = tuple(TensorInfo.from_dict(d) for d in json.loads(f.attrs[schema.ATTR_TENSOR_ORDER]))
            model_bytes = f[schema.MODEL][()].tobytes()
            cases = []
            n_cases = len(f[schema.CASES]) if schema.CASES in f else 0
            has_layers = False
            for i in range(n_cases):
                g = f[schema.case_path(i)]
                cases.append(Case(inputs=_read_named(g[schema.INPUTS]),
                                  outputs=_read_named(g[schema.OUTPUTS]),
                                  source=str(g.attrs.get(schema.ATTR_SOURCE, ""))))
                has_layers = has_layers or schema.LAYERS in g
            version = int(f.attrs[schema.ATTR_VERSION])
    except ArchiveError:
        raise
    except (KeyError, OSError, ValueError, json.JSONDecodeError) as exc:
        raise ArchiveError(f"{path}: corrupt testcase archive ({type(exc).__name__}: {exc})") from None
    if not cases:
        raise ArchiveError(f"{path}: archive holds no cases")
    return Testcase(model_bytes=model_bytes, cases=tuple(cases), tensor_order=order,
                    tolerances=tolerances, provenance=provenance, has_layers=has_layers,
                    format_version=version, path=path)


def iter_layers(path: Path, case: int = 0,
                names: Collection[str] | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Stream the per-layer reference values of one case, one tensor at a time; with `names`,
    only those are read from disk (the others are skipped by their name attribute)."""
    path = Path(path)
    with _open(path) as f:
        group_path = f"{schema.case_path(case)}/{schema.LAYERS}"
        if group_path not in f:
            raise ArchiveError(f"{path}: case {case} has no per-layer references (pack with --layers)")
        group = f[group_path]
        for k in sorted(group.keys(), key=int):
            name = str(group[k].attrs[schema.ATTR_NAME])
            if names is None or name in names:
                yield name, group[k][()]
