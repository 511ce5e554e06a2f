"""A dump manifest's fields checked before anything reads them: a manifest is a file anyone
can edit, so every field a reader uses is checked by type and range here (`open_dump` calls
`manifest_problem` after the format, version and completeness checks, and turns a problem into
one `DumpError` line)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from verify.runner.contract import PACK_ALIGN as ALIGN
from verify.runner.contract import FusedAway, ManifestCase, ManifestTensor
from verify.runner.contract import Manifest as M

MC, MT = ManifestCase, ManifestTensor
FILE_RE = re.compile(r"c\d+(_t\d+\.npy|\.npys)")  # format 2's pack, or format 1's own file


def is_int(v: Any, low: int = 0) -> bool:
    """A JSON integer (not a bool) from `low` up to 2^62."""
    return isinstance(v, int) and not isinstance(v, bool) and low <= v < 1 << 62


def _is_strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def file_problem(name: str, offset: Any) -> str | None:
    """What is wrong with a tensor's file name and offset, or None: a pack (c<case>.npys)
    with an offset that is a multiple of 64, or a tensor's own .npy (c<case>_t<index>.npy)
    with none."""
    if FILE_RE.fullmatch(name) is None:
        return f"file {name[:60]!r} is not c<case>.npys (nor c<case>_t<index>.npy)"
    if name.endswith(".npys"):
        if not is_int(offset) or offset % ALIGN:
            return f"offset {offset!r} into {name} is not a multiple of {ALIGN}"
    elif offset is not None:
        return f"{name} is a tensor's own file, yet an offset ({offset!r}) is given"
    return None


def _overlap(tensors: list[Any]) -> str | None:
    """Two tensors (of any cases) whose images in one pack overlap (each image is a header of
    at least 64 bytes, then its data), or that name one tensor file of their own, or None.
    (A header longer than 64 bytes is checked as the image is read: `Dump.load`.)"""
    spans: dict[str, list[tuple[int, int, str]]] = {}
    own: dict[str, Any] = {}  # a format-1 file -> the entry naming it
    for t in tensors:
        if isinstance(t.get(MT.FILE), str) and t.get(MT.OFFSET) is None:
            first = own.setdefault(t[MT.FILE], t)
            if first is not t:
                return (f"tensors {first[MT.NAME][:60]!r} and {t[MT.NAME][:60]!r} share "
                        f"{t[MT.FILE]}")
        if isinstance(t.get(MT.FILE), str) and is_int(t.get(MT.OFFSET)):
            try:
                size = math.prod(t[MT.SHAPE]) * np.dtype(t[MT.DTYPE]).itemsize
            except (TypeError, ValueError):  # a dtype numpy does not know (or "(-1,)i4"):
                # the reader refuses it
                size = 0
            spans.setdefault(t[MT.FILE], []).append((t[MT.OFFSET], size, t[MT.NAME]))
    for file, found in spans.items():
        found.sort()
        for (at, size, name), (nxt, _, other) in zip(found, found[1:]):
            if nxt < at + ALIGN + size:
                return f"tensors {name[:60]!r} and {other[:60]!r} overlap in {file}"
    return None


def manifest_problem(m: Mapping[str, Any]) -> str | None:
    """What is wrong with a manifest's fields (every one a reader uses, by type and range),
    or None. A manifest is a file anyone can edit: nothing is trusted before this."""
    optional: dict[str, Any] = {M.OPTIONS: dict, M.OUTPUTS: _is_strs, M.PROVIDERS: _is_strs,
                                M.DEVICE: dict, M.VERSIONS: dict,
                                M.OPTIMIZED_ONLY: _is_strs, M.FUSED_AWAY: list,
                                M.FUSED_INTO: dict, M.MODEL_SHA256: str, M.GRAPH: str,
                                M.FILTERED_OUT: is_int}
    for key, kind in optional.items():
        if key in m and m[key] is not None and not (
                kind(m[key]) if callable(kind) and not isinstance(kind, type)
                else isinstance(m[key], kind)):
            return f"field {key!r} has the wrong type"
    if not all(isinstance(f, dict) and isinstance(f.get(FusedAway.NAME, ""), str)
               for f in m.get(M.FUSED_AWAY) or []):
        return "fused_away entries are not records with a name"
    if not all(isinstance(k, str) and _is_strs(v) for k, v in (m.get(M.FUSED_INTO) or {}).items()):
        return "fused_into does not map names to name lists"
    seen = set()
    for i, case in enumerate(m[M.CASES]):
        number = case.get(MC.CASE, i)
        if not is_int(number) or number in seen:
            return f"case number {number!r} is not a new integer >= 0"
        seen.add(number)
        names: set[str] = set()
        for t in case[MC.TENSORS]:
            if not isinstance(t, dict):
                return "a tensor entry is not a record"
            ok = (is_int(t.get(MT.INDEX)) and isinstance(t.get(MT.NAME), str)
                  and isinstance(t.get(MT.DTYPE), str)
                  and isinstance(t.get(MT.SHAPE), list) and len(t[MT.SHAPE]) <= 64
                  and all(is_int(d) for d in t[MT.SHAPE])
                  and (t.get(MT.FILE) is None or isinstance(t.get(MT.FILE), str))
                  and (t.get(MT.OFFSET) is None or is_int(t.get(MT.OFFSET)))
                  and all(isinstance(t.get(k, ""), str) for k in (MT.NODE, MT.OP, MT.ORIGIN))
                  and isinstance(t.get(MT.STATS, {}), dict) and _is_strs(t.get(MT.SOURCES, []))
                  and isinstance(t.get(MT.FLOOR, 0.0), (int, float))
                  and not isinstance(t.get(MT.FLOOR, 0.0), bool))
            if not ok:
                return f"tensor entry {str(t.get(MT.NAME))[:60]!r} is malformed"
            if t[MT.NAME] in names:  # a reader keeps one: the other could hide a divergence
                return f"tensor {t[MT.NAME][:60]!r} is listed twice in case {number}"
            names.add(t[MT.NAME])
            if t.get(MT.FILE) is not None:
                problem = file_problem(t[MT.FILE], t.get(MT.OFFSET))
                if problem:
                    return f"tensor {t[MT.NAME][:60]!r}: {problem}"
    return _overlap([t for case in m[M.CASES] for t in case[MC.TENSORS]])
