"""Rendering for the CLI: text in load_and_run's shape, rich tables, JSON documents.

Part of the CLI layer: only cli.py calls it. Library modules never print.
"""

from __future__ import annotations

import errno
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from verify.timing import timing_summary

if TYPE_CHECKING:
    from verify.devices import Profile
    from verify.execute import RunOutcome


def console(stderr: bool = False, width: int = 140):
    """A rich console for tables: the terminal's width, or where the stream it writes to is
    not a terminal (CI logs, pipes) $COLUMNS or else `width` columns for tables, and lines of
    text never broken (a grep or a log parser reads them whole)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich's own exits 1 ("a check failed" here): the CLI's main says it (exit 141)
            raise BrokenPipeError(errno.EPIPE, "the reader went away")

    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    columns = os.environ.get("COLUMNS", "")
    return _Console(stderr=stderr, highlight=False, soft_wrap=not tty,
                    width=None if tty else int(columns) if columns.isdigit() and int(columns)
                    else width)


def interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def fmt_shape(shape: Sequence[Any]) -> str:
    return "(" + ",".join(str(d) for d in shape) + ")"


def session_flags(opt_level: str, providers: Sequence[str] = (), threads: int = 0) -> str:
    """The `run` options that remake a session: a replay command without a --provider or
    --threads the search ran with runs another session (another provider: not the fault)."""
    return " ".join([f"--opt-level {opt_level}", *(f"--provider {p}" for p in providers),
                     *([f"--threads {threads}"] if threads else [])])


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            break
        n /= 1024
    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"


# --- run ------------------------------------------------------------------------------------------
def progress_factory():
    """A factory of per-transfer progress callbacks: bars on a terminal, nothing in CI logs."""
    if not interactive():
        return None
    threshold = 8 << 20

    def make(label: str, total: int):
        if total < threshold:
            return None
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TransferSpeedColumn,
        )

        bar = Progress(TextColumn(f"push {label}"), BarColumn(), DownloadColumn(),
                       TransferSpeedColumn(), transient=True, console=console(stderr=True))
        task = bar.add_task(label, total=total)
        bar.start()
        done = [0]

        def advance(n: int) -> None:
            done[0] += n
            bar.update(task, advance=n)
            if done[0] >= total:
                bar.stop()
        return advance
    return make


class RunPrinter:
    """Prints `verify run` the way load_and_run does, plus the check."""

    def status(self, message: str) -> None:
        if interactive():
            click.echo(click.style(f"… {message}", dim=True), err=True)

    def print_outcome(self, o: "RunOutcome") -> None:
        r = o.run
        dev = r.device
        echo = click.echo
        # a native runner has no Python (its describe says null): nothing to show for it
        python = f"python {dev['python']}, " if dev.get("python") else ""
        echo(f"device {r.spec}: {dev.get('arch', '?')} {dev.get('os', '')}, {python}"
             f"onnxruntime {dev.get('onnxruntime', '?')}; "
             f"providers {','.join(r.providers)}; opt-level {r.options.session.opt_level}"
             + (f"; threads {r.options.session.threads}" if r.options.session.threads else ""))
        t = r.transfers
        echo(f"transfers: {t.get('files_put', 0)} file(s) pushed ({fmt_bytes(t.get('bytes_put', 0))}), "
             f"{t.get('files_cached', 0)} already cached")
        echo(f"load model: {r.load_ms:.3f}ms")
        echo(f"=== prepare: {r.prepare_ms:.3f}ms; going to warmup")
        if len(o.case_indices) > 1:
            echo(f"=== going to run {len(o.case_indices)} testcases")
        for pos, ci in enumerate(o.case_indices):
            case = r.cases[pos]
            for k, w in enumerate(case.warmup_ms):
                echo(f"warmup {k}: {w:.3f}ms")
            n = len(case.iter_ms)
            echo(f"=== going to run input for {n} times")
            for k, ms in enumerate(case.iter_ms):
                echo(f"iter {k}/{n}: {ms:.3f}ms")
            s = timing_summary(case.iter_ms)
            echo(f"=== finished test #{ci}: time={s['total_ms']:.3f}ms avg_time={s['avg_ms']:.3f}ms "
                 f"sd={s['sd_ms']:.3f}ms minmax={s['min_ms']:.3f},{s['max_ms']:.3f}")
        for check in o.checks:
            self._print_check(check)
        for note in o.notes:
            echo(f"note: {note}")
        for what, where in o.written.items():
            echo(f"wrote {what.replace('_', '-')}: {where}")
        if r.workdir:
            echo(f"kept work directory on {r.spec}: {r.workdir} (remove it with "
                 f"`verify devices clean {r.spec}`)")
        verdict = o.passed
        if verdict is None:
            echo("=== no check (no ground truth)")
        elif verdict:
            echo(click.style(f"=== PASS: all outputs within tolerance in {len(o.checks)} case(s)",
                             fg="green"))
        else:
            bad = sum(1 for c in o.checks for d in (c.diffs or ()) if not d.passed)
            echo(click.style(f"=== FAIL: {bad} output(s) over tolerance", fg="red", bold=True))

    def _print_check(self, check: Any) -> None:
        if check.diffs is None:
            return
        for d in check.diffs:
            mark = click.style("PASS", fg="green") if d.passed else click.style("FAIL", fg="red", bold=True)
            click.echo(f"check #{check.index}: {d.name}: {describe_diff(d)}  [{d.rule}]  {mark}")
            if not d.passed and d.reason:
                click.echo(f"    {d.reason}")
            if getattr(d, "note", ""):
                from verify.compare import NOTHING_FINITE

                tail = "" if d.note == NOTHING_FINITE else ": this check can tell little"
                click.echo(f"    note: {d.note}{tail}")


def describe_diff(d: Any) -> str:
    parts = [f"max_abs={_g(d.max_abs)}", f"max_rel={_g(d.max_rel)}"]
    if getattr(d, "cosine", None) is not None:
        parts.append(f"cos={_cos(d.cosine)}")
    if "sqnr" in getattr(d, "rule", "") and getattr(d, "sqnr_db", None) is not None:
        parts.append(f"sqnr={d.sqnr_db:.1f} dB")
    if d.nan_actual or d.nan_reference:
        parts.append(f"NaN {d.nan_actual}/{d.nan_reference}")
    if d.inf_actual or d.inf_reference:
        parts.append(f"Inf {d.inf_actual}/{d.inf_reference}")
    return " ".join(parts)


def _g(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):  # NaN: not computable
        return "-"
    return f"{x:.3g}"


def _cos(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.9f}" if x > 0.999 else f"{x:.4f}"


def run_document(o: "RunOutcome") -> dict[str, Any]:
    r = o.run
    return {
        "archive": str(o.testcase.path), "device": {"spec": r.spec, **dict(r.device)},
        "options": {"iterations": r.options.timed.iterations, "warmup": r.options.timed.warmup,
                    "opt_level": r.options.session.opt_level,
                    "threads": r.options.session.threads,
                    "providers": list(r.providers)},
        "load_ms": r.load_ms, "prepare_ms": r.prepare_ms,
        "transfers": dict(r.transfers),
        "cases": [{"index": ci, "warmup_ms": list(r.cases[pos].warmup_ms),
                   "iter_ms": list(r.cases[pos].iter_ms),
                   "timing": timing_summary(r.cases[pos].iter_ms),
                   "check": None if o.checks[pos].diffs is None
                   else [d.to_dict() for d in o.checks[pos].diffs]}
                  for pos, ci in enumerate(o.case_indices)],
        "passed": o.passed, "notes": list(o.notes), "written": dict(o.written),
        "kept_workdir": r.workdir,
    }


# --- devices ------------------------------------------------------------------------------------
def profile_row(p: "Profile") -> dict[str, Any]:
    return {"name": p.name, "spec": p.target, "transport": p.transport,
            "description": p.description, "providers": list(p.providers),
            "runner": "native" if p.runner else "python", "file": str(p.source or "")}


def print_profiles(rows: Sequence[Mapping[str, Any]]) -> None:
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False)
    for col in ("name", "transport", "address / spec", "runner", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["transport"], r["spec"], r["runner"], r["description"])
    console().print(table)
