"""The dump directory format (`--bin-io-dump`): written, and read back as hostile input.

A dump is a directory:
    manifest.json        written last (a dump without it is incomplete): format, version, the
                         device, provider, options, versions, the model's sha256, which graph
                         was captured, and per case the tensors in topological order (index,
                         name, node, op, dtype, shape, file, offset, summary stats)
    c<case>.npys         the case's tensors, one .npy image each at its manifest offset (a
                         multiple of 64): `fh.seek(offset); numpy.load(fh)` reads one
Format 1 (still read) had one file per tensor instead, c<case>_t<index>.npy, and no offsets.
Tensor names (which may hold '/', '..', spaces or unicode) live only inside the manifest.
Files are read back without pickle, checked against the manifest (dtype, shape, length),
and memory-mapped or read into a reusable buffer (`Scratch`), one tensor at a time
(`dump_read`); the manifest's fields are checked first (`dump_check`). The text io-dump is
`iodump`.
"""

from __future__ import annotations

import bisect
import datetime as _dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verify import __version__
from verify.dump_check import FILE_RE, is_int, manifest_problem
from verify.dump_read import OpenFiles, Scratch, load_npy, packed_image, read_npy
from verify.errors import DumpError, UsageError
from verify.runner.contract import (DUMP_FORMAT, DUMP_FORMAT_VERSION, FusedAway,
                                    ManifestCase, ManifestOptions, ManifestTensor,
                                    ManifestVersions)
from verify.runner.contract import Describe as D
from verify.runner.contract import Manifest as M

FORMAT = DUMP_FORMAT
FORMAT_VERSION = DUMP_FORMAT_VERSION
MC, MT, V = ManifestCase, ManifestTensor, ManifestVersions
MANIFEST = "manifest.json"


def is_tensor_file(name: str) -> bool:
    """Whether `name` is a dump tensor file's name (and so safe to write inside a dump)."""
    return FILE_RE.fullmatch(name) is not None


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
    offset: int | None = None  # where its .npy image starts in `file` (None: all of it)
    sources: tuple[str, ...] = ()  # the tensors its values are selected from (value_sources)


@dataclass(frozen=True)
class Dump:
    """An opened, complete dump directory."""

    path: Path
    manifest: Mapping[str, Any]
    files: OpenFiles = field(default_factory=OpenFiles, compare=False, repr=False)
    # pack -> where its images start, over every case (built on the first read from a pack)
    starts: dict[str, list[int]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_cases(self) -> int:
        return len(self.manifest[M.CASES])

    @property
    def options(self) -> Mapping[str, Any]:
        """The run options the dump was taken with (empty where the manifest has none)."""
        options = self.manifest.get(M.OPTIONS)
        return options if isinstance(options, dict) else {}

    @property
    def stats_only(self) -> bool:
        return self.options.get(ManifestOptions.STATS_ONLY) is True

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
        value = self.options.get(ManifestOptions.FILTER)
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
        found = {"onnxruntime version": (versions.get(V.ONNXRUNTIME)
                                         if isinstance(versions, dict) else None),
                 "execution providers": ",".join(map(str, self.manifest.get(M.PROVIDERS) or ())),
                 "opt level": self.options.get(ManifestOptions.OPT_LEVEL),
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
            entries = [DumpEntry(int(t[MT.INDEX]), str(t[MT.NAME]), str(MT.NODE.of(t)),
                                 str(MT.OP.of(t)), str(t[MT.DTYPE]),
                                 tuple(int(d) for d in t[MT.SHAPE]), t.get(MT.FILE),
                                 MT.STATS.of(t), float(MT.FLOOR.of(t)), str(MT.ORIGIN.of(t)),
                                 MT.OFFSET.of(t), tuple(MT.SOURCES.of(t)))
                       for t in self.manifest[M.CASES][numbers.index(case)][MC.TENSORS]]
        except (KeyError, TypeError, ValueError) as exc:
            raise DumpError(f"{self.path}: corrupt {MANIFEST} (tensor entry: "
                            f"{type(exc).__name__}: {exc})") from None
        for e in entries:  # a floor is a magnitude: the rule would refuse it, naming nothing
            if not (math.isfinite(e.floor) and e.floor >= 0):
                raise DumpError(f"{self.path}: corrupt {MANIFEST} (tensor {e.name!r}: floor "
                                f"{e.floor!r}, not a finite number >= 0)")
        return entries

    def load(self, entry: DumpEntry, scratch: Scratch | None = None) -> np.ndarray:
        """The tensor's values, after checking the file against the manifest: memory-mapped,
        or read into `scratch` (valid until its next use)."""
        if entry.file is None:
            raise DumpError(f"{self.path}: tensor {entry.name!r} has no values (a "
                            "--dump-stats-only dump); re-run with --bin-io-dump and no "
                            "--dump-stats-only")
        # the file's name and offset were checked with the manifest (dump_check.file_problem)
        what = f"{self.path}: tensor {entry.name!r}"
        if entry.offset is None:
            return load_npy(self.path / entry.file, entry, what, scratch)
        path = self.path / entry.file
        # the image ends where the pack's next one starts (a header can be longer than the 64
        # bytes manifest_problem counts): bytes beyond it are another tensor's, refused
        end = self._next_start(entry.file, entry.offset)
        if scratch is None:  # mapped: header and data from one map when np.save wrote it
            fast = packed_image(self.files, path, entry.offset, entry, what, end)
            if fast is not None:
                return fast
        fh, size = self.files.get(path, what)
        return read_npy(fh, size, entry.offset, entry.file, entry, what, scratch,
                        mapper=lambda at, n: self.files.mapped(path, at, n, what), end=end)

    def _next_start(self, file: str, offset: int) -> int | None:
        """Where the next image in the pack `file` starts after `offset`, or None."""
        if not self.starts:
            for case in self.manifest[M.CASES]:
                for t in case[MC.TENSORS]:
                    if t.get(MT.FILE) is not None and t.get(MT.OFFSET) is not None:
                        self.starts.setdefault(t[MT.FILE], []).append(t[MT.OFFSET])
            for starts in self.starts.values():
                starts.sort()
        starts = self.starts.get(file, ())
        i = bisect.bisect_right(starts, offset)
        return starts[i] if i < len(starts) else None

    def close(self) -> None:
        """Close the files the reads opened (a dump is read pack by pack, kept open)."""
        self.files.close()


def not_captured_text(names: Sequence[str]) -> str:
    """What a note says of tensors a dump could not capture."""
    shown = ", ".join(repr(n) for n in names[:5]) + (" …" if len(names) > 5 else "")
    return (f"{len(names)} tensor(s) not captured, their type having no .npy form (bfloat16, "
            f"float8, string) or being no tensor (a sequence): {shown}")


STAGING = ".verify-staging-"  # + random: a dump folder being written (dump_dir)


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
        if any(FILE_RE.fullmatch(p.name) for p in path.iterdir()):
            raise DumpError(f"{path}: incomplete dump (tensor files but no {MANIFEST}: the "
                            "dump was interrupted); re-run it")
        staged = sorted(p.name for p in path.iterdir() if p.name.startswith(STAGING))
        if staged:
            raise DumpError(f"{path}: incomplete dump (a run writing it was interrupted, or is "
                            f"still writing: {staged[0]}/ holds what it wrote); re-run it")
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


def dump_summary(dump: Dump) -> dict[str, Any]:
    """What `verify inspect DIR` shows of a dump, once every tensor it holds has been read
    back and checked against the manifest (dtype, shape, length; a DumpError line if not):
    the manifest's own fields under their names, the cases counted."""
    m = dump.manifest
    counted, read = [], 0
    try:
        for number in dump.case_numbers:
            entries = dump.entries(number)
            nbytes = 0
            for e in entries:
                if e.file is not None:
                    nbytes += int(dump.load(e).nbytes)
                    read += 1
            counted.append({"number": number, "tensor_count": len(entries),
                            "tensor_bytes": nbytes})
    finally:  # a damaged tensor's DumpError too lets go of the files and maps
        dump.close()
    kept = (M.FORMAT_VERSION, M.CREATED_UTC, M.VERIFY, M.SPEC, M.DEVICE, M.PROVIDERS,
            M.OPTIONS, M.GRAPH, M.MODEL_SHA256, M.SEGMENTS, M.SUBGRAPH_TENSORS, M.NOT_CAPTURED)
    return {"folder": str(dump.path), **{k: k.of(m) for k in kept},
            "fused_away_count": len(dump.fused_away), "case_counts": counted,
            "verified": read}
