"""Per-layer errors for the accuracy and regression gates: one untimed run that dumps every
layer (`run --bin-io-dump`), diffed case by case against the archive's per-layer references
(an archive packed with `--layers`) by `verify.diff`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from verify import diff, execute
from verify.ci.jobs import Job
from verify.ci.results import TensorError
from verify.options import DumpOptions, TimedRuns
from verify.sessions import Sessions

RequestFactory = Callable[..., execute.RunRequest]


def run_with_dump(job: Job, request: RequestFactory, sessions: Sessions | None = None
                  ) -> tuple[tuple[TensorError, ...], execute.RunOutcome]:
    """Every layer's error, in topological order per case (tensors the device's optimizer fused
    away, present on one side only, are left out), and the run itself: its final outputs come
    from the unmarked model, so it is a second run of the job (the determinism gate's)."""
    with tempfile.TemporaryDirectory(prefix="verify-ci-dump-") as tmp:
        dump = Path(tmp) / "dump"
        outcome = execute.run(request(job, dump=DumpOptions(bin_io_dump=dump),
                                      timed=TimedRuns(iterations=1, warmup=0)),
                              sessions=sessions)
        reports = diff.diff_cases(dump, job.archive, outcome.tolerances, outcome.case_indices)
        return tuple(_attributed(TensorError.from_diff(report.case, row.index, row.diff, row.op),
                                 report if row is report.first_divergent else None)
                     for report in reports for row in report.rows
                     if row.diff is not None), outcome


def _attributed(error: TensorError, report: diff.DiffReport | None) -> TensorError:
    """A report's first divergent layer carries its PyTorch module and whether the packing
    host already differed from PyTorch there (archives packed with --reference torch)."""
    found = report.attribution if report is not None else None
    if found is None:
        return error
    return replace(error, pytorch=found.origin.describe() if found.origin else "",
                   where=found.where or "")
