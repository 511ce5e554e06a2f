"""Tolerances as stored in an archive, and how command-line options layer over them.

An archive records what `pack` was given (`{"atol": .., "rtol": .., "specs": [..]}`, all
optional); `run`, `diff` and `ci` build a `tolerance_specs.ToleranceSet` from that record with their own
options in front: a `--tol` glob given on the command line wins over the archive's, and a global
`--atol/--rtol` replaces the archive's global rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from verify.tolerance_specs import ToleranceSet
from verify.errors import ArchiveError


def tolerance_record(atol: float | None, rtol: float | None,
                     specs: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON-able record `pack` stores; validates every spec now (UsageError on a bad one)."""
    ToleranceSet.from_specs(specs, atol=atol, rtol=rtol)  # raises on a bad value or spec
    record: dict[str, Any] = {}
    if atol is not None:
        record["atol"] = atol
    if rtol is not None:
        record["rtol"] = rtol
    if specs:
        record["specs"] = list(specs)
    return record


def layered_record(record: Mapping[str, Any], atol: float | None = None,
                   rtol: float | None = None, specs: Sequence[str] = ()) -> dict[str, Any]:
    """The record a check uses: command-line options first, then the archive's record (what a
    repro archive stores as its own). `--atol`/`--rtol` on the command line replace the whole
    stored record, its per-tensor globs included: a stored `--tol '*:atol=1'` silently won
    over `--atol 1e-9` (a stricter check asked for, the packed loose one applied). ArchiveError
    when the stored record does not parse."""
    try:
        stored_specs = [str(s) for s in record.get("specs", [])]
        stored_atol, stored_rtol = record.get("atol"), record.get("rtol")
        ToleranceSet.from_specs(stored_specs, atol=stored_atol, rtol=stored_rtol)
    except Exception as exc:  # a record that does not parse is a corrupt archive
        raise ArchiveError(f"the archive's tolerances do not parse: {exc}") from None
    if atol is None and rtol is None:
        atol, rtol = stored_atol, stored_rtol
    else:
        stored_specs = []
    return tolerance_record(atol, rtol, [*specs, *stored_specs])


def tolerance_set(record: Mapping[str, Any], atol: float | None = None, rtol: float | None = None,
                  specs: Sequence[str] = ()) -> ToleranceSet:
    """The rules for a check: command-line options first, then the archive's record."""
    layered = layered_record(record, atol, rtol, specs)
    rules = ToleranceSet.from_specs(layered.get("specs", []), atol=layered.get("atol"),
                                    rtol=layered.get("rtol"))
    if atol is None and rtol is None:
        return rules
    return replace(rules, set_aside=tuple(str(s) for s in record.get("specs", [])))


def describe_record(record: Mapping[str, Any]) -> str:
    """One line for `inspect`: which rule an archive asks for."""
    parts = []
    if record.get("atol") is not None or record.get("rtol") is not None:
        parts.append(f"allclose atol={record.get('atol', 0)} rtol={record.get('rtol', 0)}")
    else:
        parts.append("default (magnitude: max|x-r| <= 2^-14 * max(max|r|, F), scaled by dtype)")
    parts.extend(f"--tol {s}" for s in record.get("specs", []))
    return "; ".join(parts)
