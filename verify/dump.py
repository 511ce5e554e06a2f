"""The dump directory format (`--bin-io-dump`): written, and read back as hostile input.

A dump is a directory:
    manifest.json        written last (a dump without it is incomplete): format, version, the
                         device, provider, options, versions, the model's sha256, which graph
                         was captured, and per case the tensors in topological order (index,
                         name, node, op, dtype, shape, file, summary stats)
    c<case>_t<index>.npy one file per tensor, named by index, never by tensor name
Tensor names (which may hold '/', '..', spaces or unicode) live only inside the manifest.
Files are read back without pickle, checked against the manifest (dtype, shape, length),
and memory-mapped or read into a reusable buffer (`Scratch`), one tensor at a time; the
manifest's fields are checked first (`dump_check`). The text io-dump is `iodump`.
"""

from __future__ import annotations

import datetime as _dt
import json
import mmap
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verify import __version__
from verify.dump_check import is_int, manifest_problem
from verify.errors import DumpError, UsageError
from verify.files import NPY_READ_ERRORS, npy_reason
from verify.runner.contract import (DUMP_FORMAT, DUMP_FORMAT_VERSION, FusedAway,
                                    ManifestCase, ManifestOptions, ManifestTensor,
                                    ManifestVersions)
from verify.runner.contract import Describe as D
from verify.runner.contract import Manifest as M

FORMAT = DUMP_FORMAT
FORMAT_VERSION = DUMP_FORMAT_VERSION
MC, MT, V = ManifestCase, ManifestTensor, ManifestVersions
MANIFEST = "manifest.json"
_FILE_RE = re.compile(r"c\d+_t\d+\.npy")


def is_tensor_file(name: str) -> bool:
    """Whether `name` is a dump tensor file's name (and so safe to write inside a dump)."""
    return _FILE_RE.fullmatch(name) is not None


# --- writing -----------------------------------------------------------------------------------

def manifest_header(*, device: Mapping[str, Any], spec: str, providers: Sequence[str],
                    options: Mapping[str, Any], model_sha256: str, graph: str,
                    outputs: Sequence[str]) -> dict[str, Any]:
    """The manifest's fields other than the tensors."""
    return {
        M.FORMAT: FORMAT, M.FORMAT_VERSION: FORMAT_VERSION, M.COMPLETE: True,
        M.VERIFY: __version__,
        M.CREATED_UTC: _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        M.DEVICE: dict(device), M.SPEC: spec, M.PROVIDERS: list(providers),
        M.OPTIONS: dict(options),
        M.VERSIONS: {V.ONNXRUNTIME: device.get(D.ONNXRUNTIME), V.NUMPY: device.get(D.NUMPY),
                     V.PYTHON: device.get(D.PYTHON), V.VERIFY: __version__},
        M.MODEL_SHA256: model_sha256, M.GRAPH: graph, M.OUTPUTS: list(outputs),
    }


def write_manifest(folder: Path, manifest: Mapping[str, Any]) -> Path:
    """Write a dump's manifest.json (strict JSON, atomically): last, completing the folder.
    `manifest` is `manifest_header(...)` plus "cases" and what the plan left out
    (layerdump.manifest composes it); `open_dump` reads it back."""
    from verify.compare import json_safe
    from verify.files import write_json_atomic

    path = Path(folder) / MANIFEST
    write_json_atomic(path, json_safe(dict(manifest)))
    return path


# --- reading -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class DumpEntry:
    """One tensor of one case in a dump."""

    index: int
    name: str
    node: str
    op: str
    dtype: str
    shape: tuple[int, ...]
    file: str | None
    stats: Mapping[str, Any]
    floor: float = 0.0
    origin: str = "model"


@dataclass(frozen=True)
class Dump:
    """An opened, complete dump directory."""

    path: Path
    manifest: Mapping[str, Any]

    @property
    def n_cases(self) -> int:
        return len(self.manifest[M.CASES])

    @property
    def stats_only(self) -> bool:
        return bool(self.manifest.get(M.OPTIONS, {}).get(ManifestOptions.STATS_ONLY))

    # the manifest's fields a reader uses, typed (open_dump checked their types)
    @property
    def outputs(self) -> frozenset[str]:
        """The model's own outputs."""
        return frozenset(self.manifest.get(M.OUTPUTS) or ())

    @property
    def fused_away(self) -> frozenset[str]:
        """Tensors of the model that the captured (optimized) graph no longer has."""
        return frozenset(str(f[FusedAway.NAME]) for f in self.manifest.get(M.FUSED_AWAY) or ()
                         if isinstance(f, dict) and FusedAway.NAME in f)

    @property
    def fused_into(self) -> dict[str, list[str]]:
        """Optimized-graph tensor → the model's tensors fused into it."""
        return {str(k): [str(x) for x in v]
                for k, v in (self.manifest.get(M.FUSED_INTO) or {}).items()}

    @property
    def subgraph_tensors(self) -> int:
        """Tensors inside If/Loop/Scan bodies the dump could not capture."""
        n = self.manifest.get(M.SUBGRAPH_TENSORS) or 0
        return n if is_int(n) else 0

    @property
    def not_captured(self) -> list[str]:
        """Tensors the runner could not write: a type with no .npy form (bfloat16, ...)."""
        names = self.manifest.get(M.NOT_CAPTURED) or []
        return [str(n) for n in names] if isinstance(names, list) else []

    @property
    def model_sha256(self) -> str:
        return str(self.manifest.get(M.MODEL_SHA256) or "")

    @property
    def dump_filter(self) -> str | None:
        """The --dump-filter the dump was taken with, where it left tensors out."""
        value = self.manifest.get(M.OPTIONS, {}).get(ManifestOptions.FILTER)
        left_out = self.manifest.get(M.FILTERED_OUT) or 0
        return value if isinstance(value, str) and is_int(left_out) and left_out > 0 else None

    @property
    def graph(self) -> str:
        """Which graph was captured: "model" or "optimized"."""
        return str(self.manifest.get(M.GRAPH) or M.GRAPH.default)

    @property
    def optimizer_build(self) -> dict[str, str]:
        """What decides the optimized graph a capture ran and the names onnxruntime gave the
        tensors it made there (reorder_token_<n>, numbered per build): onnxruntime's version,
        the providers, the opt level and the machine (its NCHWc block size follows the CPU).
        Empty where the manifest does not say them all."""
        device = self.manifest.get(M.DEVICE)
        device = device if isinstance(device, dict) else {}
        versions = self.manifest.get(M.VERSIONS)
        options = self.manifest.get(M.OPTIONS)
        found = {"onnxruntime version": (versions.get(V.ONNXRUNTIME)
                                         if isinstance(versions, dict) else None),
                 "execution providers": ",".join(map(str, self.manifest.get(M.PROVIDERS) or ())),
                 "opt level": (options.get(ManifestOptions.OPT_LEVEL)
                               if isinstance(options, dict) else None),
                 "architecture": device.get(D.ARCH), "machine": device.get(D.MACHINE_ID)}
        return {k: str(v) for k, v in found.items()} if all(found.values()) else {}

    @property
    def case_numbers(self) -> list[int]:
        """The archive's case numbers the dump holds (a run with --case 2 holds just 2)."""
        return [int(c.get(MC.CASE, i)) for i, c in enumerate(self.manifest[M.CASES])]

    def entries(self, case: int = 0) -> list[DumpEntry]:
        """The tensors of the archive's case `case`, in topological order."""
        numbers = self.case_numbers
        if case not in numbers:
            raise UsageError(f"{self.path}: no case {case} (the dump holds case(s) "
                             f"{', '.join(map(str, numbers))})")
        try:
            return [DumpEntry(int(t[MT.INDEX]), str(t[MT.NAME]), str(MT.NODE.of(t)),
                              str(MT.OP.of(t)), str(t[MT.DTYPE]),
                              tuple(int(d) for d in t[MT.SHAPE]), t.get(MT.FILE),
                              MT.STATS.of(t), float(MT.FLOOR.of(t)), str(MT.ORIGIN.of(t)))
                    for t in self.manifest[M.CASES][numbers.index(case)][MC.TENSORS]]
        except (KeyError, TypeError, ValueError) as exc:
            raise DumpError(f"{self.path}: corrupt {MANIFEST} (tensor entry: "
                            f"{type(exc).__name__}: {exc})") from None

    def load(self, entry: DumpEntry, scratch: Scratch | None = None) -> np.ndarray:
        """The tensor's values, after checking the file against the manifest: memory-mapped,
        or read into `scratch` (valid until its next use)."""
        if entry.file is None:
            raise DumpError(f"{self.path}: tensor {entry.name!r} has no values (a "
                            "--dump-stats-only dump); re-run with --bin-io-dump and no "
                            "--dump-stats-only")
        if "/" in entry.file or "\\" in entry.file or entry.file.startswith("."):
            raise DumpError(f"{self.path}: corrupt {MANIFEST}: bad file name {entry.file!r}")
        return load_npy(self.path / entry.file, entry, f"{self.path}: tensor {entry.name!r}",
                        scratch)


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


def load_npy(path: Path, entry: DumpEntry, what: str,
             scratch: Scratch | None = None) -> np.ndarray:
    """Read an .npy without pickle; refuse object arrays, truncation and manifest mismatches.
    The header is parsed by numpy's own reader (never pickle), then the data is mapped in
    place (`map_readonly`: zero copy, pages mapped up front), or with `scratch` read into it
    (the array is then valid until the scratch's next use)."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise DumpError(f"{what}: file {path.name} is missing (an incomplete or damaged "
                        "dump; re-run it)") from None
    except OSError as exc:
        raise DumpError(f"{what}: {path.name} is not a valid .npy file ({exc})") from None
    with fh:
        try:
            known = _expected_header(fh, entry)
            if known is not None:
                shape, fortran, dtype = known
            else:
                fh.seek(0)
                version = np.lib.format.read_magic(fh)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            offset = fh.tell()
            size = os.fstat(fh.fileno()).st_size
        except NPY_READ_ERRORS as exc:
            raise DumpError(f"{what}: {path.name} is not a valid .npy file "
                            f"({npy_reason(exc)})") from None
        if dtype.hasobject:
            raise DumpError(f"{what}: {path.name} holds Python objects (a pickled .npy); "
                            "refusing to load it")
        if tuple(shape) != tuple(entry.shape) or str(dtype) != entry.dtype:
            raise DumpError(f"{what}: {path.name} holds {dtype} {shape_text(shape)} but the "
                            f"manifest says {entry.dtype} {shape_text(entry.shape)}")
        expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if size != expected:
            raise DumpError(f"{what}: {path.name} is truncated ({size} bytes, expected "
                            f"{expected})" if size < expected else
                            f"{what}: {path.name} has {size - expected} bytes of trailing data")
        if expected == offset:
            return np.zeros(shape, dtype)
        order = "F" if fortran else "C"
        if scratch is None:
            data = map_readonly(fh, offset, expected - offset)
            return np.frombuffer(data, dtype=dtype).reshape(shape, order=order)
        buf = scratch.take(expected - offset)
        got = fh.readinto(memoryview(buf))
    if got != buf.size:
        raise DumpError(f"{what}: {path.name} is truncated (read {got} of {buf.size} bytes)")
    return buf.view(dtype).reshape(shape, order=order)


def _expected_header(fh: Any, entry: DumpEntry) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """(shape, fortran order, dtype) when the file's .npy 1.0 header is, byte for byte, the one
    `np.save` writes for the manifest's dtype and shape, with the file positioned at the data;
    else None (the caller parses it with numpy's reader). numpy's reader evaluates the header
    with `ast.literal_eval`: 38 ms for det-640's 673 files, against 12 ms here (~2% of a
    whole diff's CPU time; issue 14)."""
    head = fh.read(10)
    if len(head) < 10 or head[:8] != b"\x93NUMPY\x01\x00":
        return None
    try:
        dtype = np.dtype(entry.dtype)
    except TypeError:
        return None
    shape = tuple(int(d) for d in entry.shape)
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (
        np.lib.format.dtype_to_descr(dtype), shape)
    length = int.from_bytes(head[8:10], "little")
    got = fh.read(length)
    if got.rstrip(b" \n") != text.encode("latin1") or not got.endswith(b"\n"):
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


def not_captured_text(names: Sequence[str]) -> str:
    """What a note says of tensors a dump could not capture."""
    shown = ", ".join(repr(n) for n in names[:5]) + (" …" if len(names) > 5 else "")
    return (f"{len(names)} tensor(s) not captured, their type having no .npy form (bfloat16, "
            f"float8, string): {shown}")


def shape_text(shape: Iterable[int]) -> str:
    dims = list(shape)
    return "(" + ",".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def open_dump(path: Path) -> Dump:
    """Open a dump directory; every way it can be unusable is one DumpError line."""
    path = Path(path)
    if not path.exists():
        raise DumpError(f"{path}: no such dump folder")
    if not path.is_dir():
        raise DumpError(f"{path}: not a folder (a dump is a folder written by "
                        "`verify run --bin-io-dump`)")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        if any(_FILE_RE.fullmatch(p.name) for p in path.iterdir()):
            raise DumpError(f"{path}: incomplete dump (tensor files but no {MANIFEST}: the "
                            "dump was interrupted); re-run it")
        if (path / "outputs.json").is_file():
            raise DumpError(f"{path}: a --bin-out-dump folder (final outputs only), not a "
                            "verify dump; capture every layer with --bin-io-dump")
        raise DumpError(f"{path}: empty folder, not a verify dump" if not any(path.iterdir())
                        else f"{path}: not a verify dump (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DumpError(f"{path}: {MANIFEST} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get(M.FORMAT) != FORMAT:
        raise DumpError(f"{path}: {MANIFEST} is not a verify dump manifest")
    version = manifest.get(M.FORMAT_VERSION)
    if not isinstance(version, int) or version < 1:
        raise DumpError(f"{path}: invalid dump format version {version!r}")
    if version > FORMAT_VERSION:
        raise DumpError(f"{path}: dump format version {version} is newer than this verify "
                        f"{__version__} reads (up to {FORMAT_VERSION}): upgrade verify")
    if manifest.get(M.COMPLETE) is not True:
        raise DumpError(f"{path}: incomplete dump (the manifest is not marked complete); "
                        "re-run it")
    cases = manifest.get(M.CASES)
    if not isinstance(cases, list) or not cases:
        raise DumpError(f"{path}: corrupt {MANIFEST} (no cases)")
    bad = next((i for i, c in enumerate(cases)
                if not (isinstance(c, dict) and isinstance(c.get(MC.TENSORS), list))), None)
    if bad is not None:
        raise DumpError(f"{path}: corrupt {MANIFEST} (case entry {bad} has no tensor list)")
    problem = manifest_problem(manifest)
    if problem:
        raise DumpError(f"{path}: corrupt {MANIFEST} ({problem})")
    if not any(c[MC.TENSORS] for c in cases):
        raise DumpError(f"{path}: empty dump (no tensors; was --dump-filter too narrow?)")
    return Dump(path, manifest)
