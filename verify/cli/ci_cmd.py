"""`verify ci`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from verify.cli import CONTEXT, cli, emit_json, json_option
from verify.errors import (EXIT_DEVICE, EXIT_INTERNAL, EXIT_MISMATCH, EXIT_OK, EXIT_USAGE,
                           UsageError)

if TYPE_CHECKING:
    from verify.ci.results import JobResult

EXIT_FOR = {"passed": EXIT_OK, "failed": EXIT_MISMATCH, "input-error": EXIT_USAGE,
            "internal-error": EXIT_INTERNAL, "device-error": EXIT_DEVICE}
_MARK = {"passed": "PASS ", "failed": "FAIL ", "error": "ERROR"}


def _line(result: JobResult) -> str:
    """The job's line, then its notes (as the reports list them), indented."""
    gates = "  ".join(f"{g.gate}={g.status}" for g in result.gates)
    tail = result.summary() if result.status != "passed" else gates
    notes = [f"      note: {n}" for n in result.notes if not n.startswith("Traceback")]
    return "\n".join([f"{_MARK[result.status]} {result.job.id}  ({result.seconds:.1f} s)  "
                      f"{tail}", *notes])


def _show_fingerprint(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from verify.ci.machine import ENV, this_host

    fingerprint, facts = this_host()
    click.echo(fingerprint)
    click.echo("from " + ", ".join(f"{k}={v}" for k, v in facts.items())
               + f" (set {ENV}=LABEL to name this machine yourself)", err=True)
    ctx.exit(EXIT_OK)


@cli.command(context_settings=CONTEXT)
@click.argument("suite", type=click.Path(path_type=Path))
@click.option("--junit", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Write JUnit XML: one testcase per job, failures carry the numbers.")
@click.option("--markdown", "markdown_path", type=click.Path(path_type=Path), default=None,
              metavar="FILE", help="Write a Markdown summary (e.g. \"$GITHUB_STEP_SUMMARY\").")
@click.option("--report-json", "json_path", type=click.Path(path_type=Path), default=None,
              metavar="FILE", help="Write the JSON report with every figure.")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              metavar="FILE", help="Write the HTML report (offline; plots per failing job).")
@click.option("--update-goldens", is_flag=True,
              help="Record this run's errors and latencies as the baselines (on purpose; "
                   "commit the files it writes). Put in place together when every job has "
                   "run: an interrupted run changes none. Jobs failing a gate or erroring "
                   "keep their old baseline and are listed as not updated.")
@click.option("--shard", default=None, metavar="I/N",
              help="Run only shard I of N (stable: a job's shard depends on its id and N).")
@click.option("--only", multiple=True, metavar="PATTERN",
              help="Run only jobs whose id (testcase/device/options) matches this glob, or "
                   "with this testcase, device or option-set name. Repeatable.")
@click.option("--baselines", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Baselines folder (default: the suite's [suite] baselines).")
@click.option("--require-baselines", is_flag=True,
              help="Fail jobs that have no baseline instead of reporting them.")
@click.option("--list", "list_only", is_flag=True, help="List the selected jobs and exit.")
@click.option("--fingerprint", is_flag=True, is_eager=True, expose_value=False,
              callback=_show_fingerprint,
              help="Print this machine's fingerprint (the key of its latency baselines; "
                   "local and emulated devices run here) and exit. SUITE is not needed.")
@json_option
def ci(suite: Path, junit: Path | None, markdown_path: Path | None, json_path: Path | None,
       html_path: Path | None, update_goldens: bool, shard: str | None, only: tuple[str, ...],
       baselines: Path | None, require_baselines: bool, list_only: bool, as_json: bool) -> int:
    """Run the nightly gates of a SUITE file and write reports.

    Runs every testcase x device x option set of the suite (devices in parallel, one job at a
    time per device), judges the gates (accuracy, regression and latency against the
    baselines, determinism) and writes the reports asked for: an earlier file at a report
    path is removed before any job runs, so a run killed or failing leaves no report rather
    than a stale one. The suite format is in docs/suite.md.

    \b
      verify ci goldens/suites/sample.toml --junit ci.xml --markdown summary.md --html ci.html
      verify ci nightly.toml --shard 2/4 --junit shard2.xml
      verify ci nightly.toml --only 'cnn/*' --update-goldens   # then commit goldens/baselines

    Exit codes: 0 every gate held; 1 a gate failed; 2 a bad suite file (the line or key is
    named) or a bad testcase; 3 only device errors; 4 an internal error.
    """
    import verify.ci as ci_lib
    from verify.files import check_output_file

    request = ci_lib.CiRequest(suite=suite, only=only,
                               shard=ci_lib.parse_shard(shard) if shard else None,
                               update_goldens=update_goldens,
                               require_baselines=require_baselines, baselines=baselines)
    planned = ci_lib.plan(request)  # read once: the reports' checks and the run see one suite
    if list_only:
        _, jobs, total = planned
        if as_json:
            emit_json({"total": total, "jobs": [j.id for j in jobs]}, "ci-list")
        else:
            for job in jobs:
                click.echo(job.id)
            shard = f" in shard {shard}" if shard else ""
            click.echo(f"{len(jobs)} of {total} job(s){shard}", err=True)
        return EXIT_OK
    reports = (("--junit", junit), ("--markdown", markdown_path), ("--report-json", json_path),
               ("--html", html_path))
    taken: list[tuple[str, Path | str | None]] = [("the suite file", suite)]
    if any(path is not None for _, path in reports):
        # every testcase of the suite, selected by --only/--shard or not, and its baselines
        suite_doc = planned[0]
        taken += [(f"testcase {job.testcase!r} of the suite", job.archive)
                  for job in ci_lib.expand(suite_doc)]
        kept = (baselines or suite_doc.baselines).resolve()
    for option, path in reports:  # before any job runs: a bad path costs no device time
        if path is not None:
            check_output_file(path, option, taken)
            if kept in path.resolve().parents:
                raise UsageError(f"{option} {path}: is inside the baselines folder {kept}; "
                                 "writing there could replace a baseline, give another file "
                                 "name")
            taken.append((f"the {option} report", path))
    # an earlier run's reports go now: this run's replace them at its end, and a run killed
    # or failing before then leaves none rather than last night's standing for it
    ci_lib.remove_stale_reports(path for _, path in reports if path is not None)
    ci_lib.check_report_dependencies([option for option, path in reports
                                      if path and option in ci_lib.REPORT_LIBRARIES])
    show = None if as_json else (lambda r: click.echo(_line(r)))
    outcome = ci_lib.run_suite(request, on_result=show, planned=planned)
    for line in outcome.cleared:
        click.echo(f"note: {line}", err=True)
    written = ci_lib.write_reports(outcome, junit=junit, markdown_path=markdown_path,
                                   json_path=json_path, html_path=html_path)
    if as_json:
        from verify.ci.report import document

        emit_json({**document(outcome.results, outcome.info), "written": written}, "ci-report")
    else:
        from verify.ci.results import (missing_baselines, not_updated, overall,
                                       recorded_latencies)

        counts = overall(outcome.results)
        click.echo(f"=== {outcome.verdict.upper()}: {counts['passed']} passed, "
                   f"{counts['failed']} failed, {counts['error']} error(s) — "
                   f"{outcome.info.scope(len(outcome.results))}")
        kept = not_updated(outcome.results) if update_goldens else []
        if kept:
            click.echo(f"{len(kept)} job(s) kept their old baseline (not updated: a gate "
                       f"failed or the job errored): {', '.join(job for job, _ in kept)}; "
                       "the other jobs' baselines were put in place; record these once they "
                       f"pass with `{outcome.info.record_command([j for j, _ in kept])}`",
                       err=True)
        missing = missing_baselines(outcome.results)
        if missing and not update_goldens:
            click.echo(f"{len(missing)} job(s) have no baseline; record them with "
                       f"`{outcome.info.record_command()}` and commit them", err=True)
        recorded = recorded_latencies(outcome.results)
        if recorded:
            fps = sorted({r.machine for r in outcome.results if r.job.id in recorded})
            click.echo(f"{len(recorded)} job(s) had no latency baseline for machine "
                       f"{', '.join(fps)}: their latency was recorded, not judged (later runs on "
                       "this machine are judged against it)", err=True)
        for kind, path in written.items():
            click.echo(f"wrote {kind}: {path}", err=True)
    return EXIT_FOR[outcome.verdict]
