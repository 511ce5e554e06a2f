"""`verify diff`'s report: one row per tensor of the walk (`DiffRow`), the verdict of one case
(`DiffReport`), and the rows a table shows (`iter_rows`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from verify.compare import TensorDiff, json_safe, tol_rank
from verify.origin import Attribution


@dataclass(frozen=True)
class DiffRow:
    """One tensor of the walk: `diff` is None when one side lacks it (`missing` says which:
    'actual' or 'reference'; `why` says why, e.g. fused away). `fused` lists the reference
    tensors the actual device fused into this one (its error may come from any of them)."""

    index: int
    name: str
    node: str
    op: str
    diff: TensorDiff | None
    missing: str | None = None
    why: str = ""
    fused: tuple[str, ...] = ()

    @property
    def passed(self) -> bool | None:
        return None if self.diff is None else self.diff.passed

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "node": self.node, "op": self.op,
                "missing": self.missing, "why": self.why, "fused": list(self.fused),
                "diff": self.diff.to_dict() if self.diff is not None else None}


@dataclass(frozen=True)
class DiffReport:
    actual: str
    reference: str
    case: int
    rows: tuple[DiffRow, ...]
    first_divergent: DiffRow | None
    passed: bool
    only_in_actual: tuple[str, ...]
    only_in_reference: tuple[str, ...]
    notes: tuple[str, ...] = ()
    attribution: Attribution | None = None  # the first divergent tensor in PyTorch's terms
    # outputs within what their sources hand them (the table's PASS) but over tolerance as
    # `run` judges them, on their own floor: the error accumulated across layers
    outputs_over: tuple[TensorDiff, ...] = ()

    @property
    def compared(self) -> tuple[DiffRow, ...]:
        return tuple(r for r in self.rows if r.diff is not None)

    @property
    def failing(self) -> tuple[DiffRow, ...]:
        return tuple(r for r in self.rows if r.passed is False)

    def verdict(self) -> str:
        n, bad = len(self.compared), len(self.failing)
        if self.first_divergent is None and self.outputs_over:
            d = self.outputs_over[0]
            return (f"FAIL: {few([o.name for o in self.outputs_over], 3)} over tolerance as "
                    f"`run` judges the outputs (max_abs {d.max_abs:.3g} > {d.threshold:.3g}, "
                    f"{d.rule}), yet every layer within what its sources hand it: the error "
                    "accumulates across layers, no single node is over its own tolerance")
        if self.first_divergent is None:
            return f"PASS: {n} tensors within tolerance"
        fd = self.first_divergent
        where = f"{fd.name!r} (node {fd.node or '-'}, op {fd.op or '-'})"
        fused = (f", fused on the actual side with {few(fd.fused, 3)}" if fd.fused else "")
        return f"FAIL: {bad} of {n} tensors over tolerance; first divergent {where}{fused}"

    def to_dict(self) -> dict[str, Any]:
        return json_safe({  # every name in full, where the text shows a few (`few`)
            "actual": self.actual, "reference": self.reference, "case": self.case,
            "passed": self.passed, "verdict": self.verdict(),
            "first_divergent": self.first_divergent.to_dict() if self.first_divergent else None,
            "attribution": self.attribution.to_dict() if self.attribution else None,
            "counts": {"compared": len(self.compared), "failed": len(self.failing),
                       "only_in_actual": len(self.only_in_actual),
                       "only_in_reference": len(self.only_in_reference)},
            "only_in_actual": list(self.only_in_actual),
            "only_in_reference": list(self.only_in_reference),
            "outputs_over_tolerance": [d.to_dict() for d in self.outputs_over],
            "notes": list(self.notes), "rows": [r.to_dict() for r in self.rows]})


def few(names: Sequence[str], k: int) -> str:
    """The first `k` names and how many more: a fused chain can name 70 (the one-line
    verdict repeated all of them)."""
    return ", ".join(names[:k]) + (f" (+{len(names) - k} more)" if len(names) > k else "")


def iter_rows(report: DiffReport, *, top: int | None = None,
              only_failing: bool = False) -> Iterator[DiffRow]:
    """The rows a table shows: all compared rows in order, only the failing ones, or the
    `top` worst by tolerance units (then in order)."""
    rows = [r for r in report.rows if r.diff is not None and
            (not only_failing or not r.diff.passed)]
    if top is not None:
        worst = sorted(rows, key=lambda r: tol_rank(r.diff), reverse=True)[:top]
        keep = {id(r) for r in worst}
        rows = [r for r in rows if id(r) in keep]
    yield from rows
