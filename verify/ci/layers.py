"""Per-layer errors for the accuracy and regression gates: a dump run diffed against the archive.

Needs an archive packed with `--layers` (per-layer references) and `verify.diff`; when either is
missing the job says so in its notes and the gates judge the final outputs only.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verify import execute
from verify.ci.jobs import Job
from verify.ci.results import TensorError
from verify.tolerance import tolerance_set

RequestFactory = Callable[..., execute.RunRequest]


def available() -> bool:
    """True when this verify can capture and diff per-layer dumps."""
    fields = {f.name for f in dataclasses.fields(execute.RunRequest)}
    return "bin_io_dump" in fields and importlib.util.find_spec("verify.diff") is not None


def capture(job: Job, run: Callable[[], tuple[TensorError, ...]]
            ) -> tuple[tuple[TensorError, ...], list[str]]:
    if not available():
        return (), ["per-layer gates skipped: this verify cannot capture layer dumps "
                    "(no verify.diff); outputs only"]
    return run(), []


def _rows(case: int, report: Any) -> list[TensorError]:
    """verify.diff rows as TensorErrors; tensors on one side only (fused away) are skipped."""
    return [TensorError.from_diff(case, row.index, row.diff, row.op)
            for row in report.rows if row.diff is not None]


def run_with_dump(job: Job, request: RequestFactory) -> tuple[TensorError, ...]:
    """One untimed run capturing every layer, diffed case by case against the archive."""
    from verify import diff  # type: ignore[attr-defined]

    with tempfile.TemporaryDirectory(prefix="verify-ci-dump-") as tmp:
        dump = Path(tmp) / "dump"
        outcome = execute.run(request(job, bin_io_dump=dump, iterations=1, warmup=0))
        rules = tolerance_set(outcome.testcase.tolerances, job.tolerance.atol, job.tolerance.rtol,
                              job.tolerance.specs)
        rows: list[TensorError] = []
        for case in outcome.case_indices:
            report = diff.diff_captures(dump, job.archive, rules, case=case)
            rows.extend(_rows(case, report))
        return tuple(rows)
