"""Per-layer errors for the accuracy and regression gates: one untimed run that dumps every
layer (`run --bin-io-dump`), diffed case by case against the archive's per-layer references
(an archive packed with `--layers`) by `verify.diff`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from verify import diff, execute
from verify.ci.jobs import Job
from verify.ci.results import TensorError

RequestFactory = Callable[..., execute.RunRequest]


def run_with_dump(job: Job, request: RequestFactory
                  ) -> tuple[tuple[TensorError, ...], execute.RunOutcome]:
    """Every layer's error, in topological order per case (tensors the device's optimizer fused
    away, present on one side only, are left out), and the run itself: its final outputs come
    from the unmarked model, so it is a second run of the job (the determinism gate's)."""
    with tempfile.TemporaryDirectory(prefix="verify-ci-dump-") as tmp:
        dump = Path(tmp) / "dump"
        outcome = execute.run(request(job, bin_io_dump=dump, iterations=1, warmup=0))
        reports = diff.diff_cases(dump, job.archive, outcome.tolerances, outcome.case_indices)
        return tuple(TensorError.from_diff(report.case, row.index, row.diff, row.op)
                     for report in reports for row in report.rows
                     if row.diff is not None), outcome
