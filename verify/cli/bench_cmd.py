"""`verify bench`: one archive, several settings, one table of latency and error."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from verify.cli import CONTEXT, cli, emit_json, json_option, render
from verify.cli.groups import archive_selection, device_target, timed_runs
from verify.errors import EXIT_MISMATCH, EXIT_OK

if TYPE_CHECKING:
    from verify.bench import BenchReport
    from verify.options import ArchiveSelection, DeviceTarget, TimedRuns

@cli.command(context_settings=CONTEXT)
@archive_selection("Use only this case of the archive (default: all, pooled).")
@device_target("each setting's job")
@click.option("--opt-levels", default=None, metavar="LIST",
              help="Graph optimization levels to try, e.g. disable,all "
                   "(default: disable,basic,extended,all when no other setting is given; "
                   "layout on request: its onnxruntime level needs onnxruntime >= 1.21).")
@click.option("--threads", default=None, metavar="LIST", help="Intra-op thread counts, e.g. 1,2.")
@click.option("--providers", default=None, metavar="LIST",
              help="Execution providers, e.g. cpu,cuda; 'cuda+cpu' is one setting with a "
                   "fallback.")
@click.option("--layouts", default=None, metavar="LIST",
              help="auto (onnxruntime's NCHWc/NHWC layout transforms) and/or nchw (none).")
@click.option("--setting", "explicit", multiple=True, metavar="KEY=V[,KEY=V]",
              help="One setting, repeatable: opt=, threads=, provider=, layout=, spin=0|1, "
                   "prepack=0|1, or a dotted onnxruntime session config key.")
@timed_runs("case and round")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Rounds over all settings, interleaved (A B A B …), pooled per setting.")
@json_option
def bench(selection: "ArchiveSelection", device: "DeviceTarget", opt_levels: str | None,
          threads: str | None, providers: str | None, layouts: str | None,
          explicit: tuple[str, ...], timed: "TimedRuns", repeat: int, as_json: bool) -> int:
    """Run ARCHIVE on one device under several settings and compare them: latency (avg, sd,
    min, max), speed-up over the first setting, and each setting's error against the
    ground truth with pass/fail. Notes say when the spread is too large for a difference to
    mean anything. Exit 1 if any setting's outputs are over tolerance.

    \b
      verify bench cnn.vtc --device local
      verify bench cnn.vtc --device arm64 --opt-levels disable,all --threads 1,2
      verify bench cnn.vtc --setting opt=all --setting opt=all,layout=nchw --repeat 3
    """
    from verify.bench import BenchRequest, settings_from
    from verify.bench import bench as run_bench

    settings = settings_from(opt_levels, threads, providers, layouts, explicit)
    request = BenchRequest(selection, tuple(settings), device, timed, repeat)
    live = None if as_json else render.RunPrinter()
    report = run_bench(request, status=live.status if live else None)
    if as_json:
        emit_json(report.to_dict(), "bench")
    else:
        print_report(report)
    return EXIT_OK if report.passed else EXIT_MISMATCH


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 'es' if what.endswith('s') else 's'}"


def print_report(report: "BenchReport") -> None:
    from rich.table import Table

    dev = report.device
    echo = click.echo
    echo(f"device {dev.get('spec')}: {dev.get('arch', '?')}, onnxruntime "
         f"{dev.get('onnxruntime', '?')}; {len(report.cases)} case(s), warmup {report.warmup}, "
         f"{report.iterations} iteration(s) x {report.repeat} round(s) per setting")
    jobs = len(report.results) * report.repeat
    echo(f"device session: {_count(report.connections, 'connection')}, "
         f"{_count(report.runner_starts, 'runner process')} started for {_count(jobs, 'job')}"
         # with one job, one start says nothing of whether the runner serves
         + ("" if jobs < 2 or report.runner_starts < jobs
            else " (the runner does not serve: one each)"))
    table = Table(show_edge=False, pad_edge=False)
    for col, right in (("setting", False), ("avg ms", True), ("±95%", True), ("sd", True),
                       ("min", True), ("median", True),
                       ("max", True), ("speed-up", True), ("max error", True),
                       ("rule", False), ("check", False)):
        table.add_column(col, justify="right" if right else "left")
    for r in report.results:
        t, worst = r.timing, r.worst
        check = "[green]PASS[/]" if r.passed else "[bold red]FAIL[/]"
        table.add_row(r.setting.label, f"{t.avg:.3f}", f"{t.ci_high - t.avg:.3f}",
                      f"{t.sd:.3f}", f"{t.min:.3f}", f"{t.median:.3f}",
                      f"{t.max:.3f}", f"{r.speedup:.2f}x",
                      "-" if worst is None else f"{worst.max_abs:.3g}",
                      "" if worst is None else f"{worst.name}: {worst.rule}", check)
    render.console(width=160).print(table)
    if len(report.results) > 1:  # the table's column does not say against what
        echo(f"speed-up: {report.results[0].setting.label}'s mean (the first setting) over "
             "each setting's")
    for r in report.results:
        for d in r.diffs:
            if not d.passed and d.reason:
                echo(f"{r.setting.label}: {d.name}: {d.reason}")
    for note in report.notes:
        echo(f"note: {note}")
    if report.passed:
        echo(click.style(f"=== PASS: every setting within tolerance ({len(report.results)} "
                         "settings)", fg="green"))
    else:
        bad = sum(1 for r in report.results if not r.passed)
        echo(click.style(f"=== FAIL: {bad} of {len(report.results)} setting(s) over tolerance",
                         fg="red", bold=True))
