"""`verify ci`: nightly gates over a suite of testcases x devices x option sets.

suite (TOML) -> jobs (matrix, --only, --shard) -> schedule (devices in parallel, retries)
-> gates (accuracy, regression, latency, determinism; baselines in goldens/) -> reports
(JUnit XML, Markdown, JSON, HTML). docs/suite.md documents the suite file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verify.ci.jobs import Job, expand, parse_shard, select
from verify.ci.report import RunInfo, markdown, to_json, verdict
from verify.ci.results import JobResult
from verify.ci.schedule import CiRun, run_jobs
from verify.ci.staging import StagedBaselines, clear_leftovers
from verify.ci.suite import Suite, SuiteError, load_suite
from verify.errors import MissingDependency, UsageError
from verify.files import output_errors, write_text_atomic

__all__ = ["CiOutcome", "CiRequest", "Job", "JobResult", "Suite", "SuiteError",
           "check_report_dependencies", "load_suite", "parse_shard", "plan",
           "remove_stale_reports", "run_suite", "verdict", "write_reports"]

# report option -> the library it needs (both in the `report` extra)
REPORT_LIBRARIES = {"--junit": "junitparser", "--html": "matplotlib"}


@dataclass(frozen=True)
class CiRequest:
    suite: Path
    only: Sequence[str] = ()
    shard: tuple[int, int] | None = None
    update_goldens: bool = False
    require_baselines: bool = False
    baselines: Path | None = None       # overrides the suite's [suite] baselines


@dataclass(frozen=True)
class CiOutcome:
    results: tuple[JobResult, ...]
    info: RunInfo
    cleared: tuple[str, ...] = ()   # what was done with the staging folders of killed runs

    @property
    def verdict(self) -> str:
        return verdict(self.results)


def check_report_dependencies(options: Sequence[str]) -> None:
    """Raise MissingDependency (exit 2) for the first report option in `options` whose library
    is not installed: checked before any job runs, so a missing extra costs no device time and
    hides no gate's result."""
    import importlib

    for option in options:
        library = REPORT_LIBRARIES[option]
        try:
            importlib.import_module(library)
        except ImportError:
            raise MissingDependency(f"{option} needs {library}: pip install "
                                    "'onnx-verify[report]'") from None


def plan(request: CiRequest) -> tuple[Suite, list[Job], int]:
    """The suite, the jobs this run will do, and how many the whole suite has."""
    suite = load_suite(request.suite)
    jobs = expand(suite)
    return suite, select(jobs, request.only, request.shard), len(jobs)


def run_suite(request: CiRequest,
              on_result: Callable[[JobResult], None] | None = None,
              planned: tuple[Suite, list[Job], int] | None = None) -> CiOutcome:
    """Run the suite's selected jobs; `planned`: `plan(request)` already made (the suite file
    is then not read again, so what was checked is what runs).

    The baselines the jobs write are staged and put in place together once every job has
    run; an interrupt or an exception before that leaves the baselines as they were."""
    started = time.monotonic()
    suite, jobs, total = planned or plan(request)
    check_devices(request.suite, jobs)
    root = request.baselines or suite.baselines
    cleared = clear_leftovers(root, suite.name)
    with StagedBaselines(root, suite.name) as staged:
        ci = CiRun(suite_name=suite.name, baselines=root, update_goldens=request.update_goldens,
                   require_baselines=request.require_baselines, staged=staged)
        results = run_jobs(jobs, ci, on_result)
        staged.commit()
    info = RunInfo(suite_name=suite.name, suite_file=str(request.suite), total_jobs=total,
                   shard=request.shard, only=tuple(request.only),
                   update_goldens=request.update_goldens, seconds=time.monotonic() - started,
                   baselines=str(request.baselines) if request.baselines else "")
    return CiOutcome(tuple(results), info, tuple(cleared))


def check_devices(suite_file: Path, jobs: Sequence[Job]) -> None:
    """SuiteError, before any job runs, for a device of these jobs whose spec names no
    profile or is malformed: one typo used to cost the other jobs' device time first, then
    failed as a job error."""
    seen: set[str] = set()
    for job in jobs:
        if job.device.name in seen:
            continue
        seen.add(job.device.name)
        try:
            job.target.profile()
        except UsageError as exc:
            raise SuiteError(f"{suite_file}: [[device]] {job.device.name!r}: {exc}") from None


def remove_stale_reports(paths: Iterable[Path]) -> None:
    """Remove the files at the report paths before any job runs; `write_reports` writes them
    anew at the end. A run that is killed or fails on the way then leaves no report at all,
    which a CI step reading it notices, rather than an earlier run's (a green JUnit file from
    last night, read as tonight's). A path that cannot be removed is one OutputError line."""
    for path in paths:
        with output_errors(path):
            Path(path).unlink(missing_ok=True)


def write_reports(outcome: CiOutcome, *, junit: Path | None = None,
                  markdown_path: Path | None = None,
                  json_path: Path | None = None, html_path: Path | None = None) -> dict[str, str]:
    """Write the requested reports atomically; returns {kind: path}."""
    written: dict[str, str] = {}
    results, info = outcome.results, outcome.info
    if junit is not None:
        from verify.ci.junit import write_junit

        write_junit(junit, results, info)
        written["junit"] = str(junit)
    if markdown_path is not None:
        write_text_atomic(markdown_path, markdown(results, info))
        written["markdown"] = str(markdown_path)
    if json_path is not None:
        write_text_atomic(json_path, to_json(results, info))
        written["json"] = str(json_path)
    if html_path is not None:
        from verify.ci.html import html_report

        write_text_atomic(html_path, html_report(results, info))
        written["html"] = str(html_path)
    return written
