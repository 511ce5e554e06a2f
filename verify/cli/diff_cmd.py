"""`verify diff`: per-layer comparison of two captures, first divergent tensor named."""

from __future__ import annotations

import collections
import math
from pathlib import Path
from typing import TYPE_CHECKING

import click

from verify.cli import CONTEXT, cli, emit_json, json_option
from verify.cli.groups import tolerance_group
from verify.errors import EXIT_MISMATCH, EXIT_OK, UsageError

if TYPE_CHECKING:
    from verify.compare import ToleranceSet
    from verify.diff_report import DiffReport, DiffRow
    from verify.options import Tolerances


@cli.command(context_settings=CONTEXT)
@click.argument("actual", type=click.Path(path_type=Path))
@click.argument("reference", type=click.Path(path_type=Path))
@click.option("--case", "case_index", type=click.IntRange(min=0), default=None,
              help="Compare only this case (default: every case both captures hold).")
@click.option("--top", type=click.IntRange(min=0), default=None, metavar="N",
              help="Show only the N worst tensors (by error in tolerance units); 0: all, as "
                   "profile's --top 0.")
@click.option("--only-failing", is_flag=True, help="Show only tensors over tolerance.")
@click.option("--show-missing", is_flag=True,
              help="Also list each tensor present on one side only, with why.")
@tolerance_group
@json_option
def diff(actual: Path, reference: Path, case_index: int | None, top: int | None, only_failing: bool,
         show_missing: bool, tolerances: "Tolerances", as_json: bool) -> int:
    """Compare ACTUAL against REFERENCE layer by layer and name the first divergent tensor.

    Each is a dump folder (`verify run --bin-io-dump DIR`) or a .vtc archive: its per-layer
    references when packed with --layers, else every layer computed on this host from its
    model and inputs (onnxruntime CPU, optimizations off; the report says so).
    Tensors are matched by name and walked in REFERENCE's topological order. Per tensor:
    max abs and relative error, mean abs error, cosine similarity, SQNR (dB), NaN/Inf counts
    on each side, the fraction of elements outside tolerance, top-1/top-5 agreement for
    classifier outputs, and the rule that judged it (an archive side's own tolerances,
    with --atol/--rtol/--tol on top). Tensors on one side only (fused away by
    an optimizer, filtered out) are listed, not errors. Exit 1 when any tensor is over
    tolerance. Every case both captures hold is compared, one report each; --json then
    prints {"passed", "verdict", "cases": [one report per case]}. --case I compares one
    case, and --json prints that case's report itself.

    A quantized or fp16 model against its float original: each float tensor X is paired with
    the QDQ model's X_DequantizeLinear_Output, fp16 tensors are compared as float32, and with
    an SQNR gate (--tol '*:sqnr>=30') the first layer below it is named. Captures of unrelated
    models (different model files sharing few tensor names) are exit 2.

    Each pair is compared in one pass by a kernel compiled from C on the first comparison
    (the system's C compiler, $CC; cached in $XDG_CACHE_HOME/verify/kernels, by default
    ~/.cache/verify/kernels); without a compiler by numpy (or numba, for 2 GiB or more where
    installed), slower, with the same verdicts. A build that fails is said on stderr and not
    tried again. VERIFY_NO_NATIVE=1 keeps the compiled kernel out.

    \b
      verify diff phone/ cpu/                       every layer, first divergent node
      verify diff qdq-dump/ float-dump/ --tol '*:sqnr>=30'   quantized vs float, per layer
      verify diff phone/ model.vtc --top 10          10 worst against the archive's goldens
      verify diff phone/ cpu/ --only-failing --tol 'head/*:atol=1e-3' --json
    """
    from verify.diff import diff_cases
    from verify.tolerance import tolerance_set

    top = top or None  # 0: every row
    if top is not None and only_failing:
        raise UsageError("--top and --only-failing cannot be combined; pick one")
    t = tolerances
    tolerance_set({}, t.atol, t.rtol, t.specs)  # a bad option fails before any file is read

    def rules(stored: dict) -> ToleranceSet:  # an archive side's record, ours on top
        return tolerance_set(stored, t.atol, t.rtol, t.specs)

    from verify.cli.render import RunPrinter

    reports = diff_cases(actual, reference, rules,
                         None if case_index is None else [case_index],
                         status=None if as_json else RunPrinter().status)
    passed = all(r.passed for r in reports)
    from verify.scan_native import build_problem

    from verify.tolerance_specs import unmatched_specs

    for spec in unmatched_specs(t.specs, (row.name for r in reports for row in r.rows
                                          if row.diff is not None)):
        click.echo(f"note: --tol {spec!r} matches no tensor compared; the glob must match a "
                   "whole tensor name (diff --json lists them)", err=True)
    if problem := build_problem():  # a broken toolchain is said, not just slow
        click.echo(f"note: compared without the compiled kernel: {problem}; "
                   "VERIFY_NO_NATIVE=1 skips it", err=True)
    if as_json:  # the shape follows the option, never the data: --case, one report
        if case_index is not None:
            emit_json(reports[0].to_dict(), "diff-case")
        else:
            emit_json({"passed": passed, "verdict": cases_verdict(reports),
                       "cases": [r.to_dict() for r in reports]}, "diff")
    else:
        text = [render_report(r, top=top, only_failing=only_failing, show_missing=show_missing)
                for r in reports]
        if len(reports) > 1:
            text.append("=== " + cases_verdict(reports))
        click.echo("\n\n".join(text))
    return EXIT_OK if passed else EXIT_MISMATCH


def cases_verdict(reports: tuple[DiffReport, ...]) -> str:
    """One line over several cases: which failed, and where the first of them diverged."""
    bad = [r for r in reports if not r.passed]
    if not bad:
        return f"PASS: {len(reports)} cases, every tensor within tolerance"
    fd = bad[0].first_divergent
    head = (f"FAIL: {len(bad)} of {len(reports)} cases over tolerance (case(s) "
            f"{', '.join(str(r.case) for r in bad)}); case {bad[0].case} ")
    if fd is None:  # outputs over as `run` judges them, every layer within its own
        from verify.diff_report import few

        return head + (f"has {few([d.name for d in bad[0].outputs_over], 3)} over tolerance as "
                       "`run` judges the outputs, no layer over its own")
    return head + f"first diverges at {fd.name!r}" + (
        f" ({bad[0].attribution.origin.describe()})"
        if bad[0].attribution and bad[0].attribution.origin else "")


def _g(x: float, spec: str = ".3g", suffix: str = "") -> str:
    """x in `spec` then `suffix`; no value (NaN: a shape mismatch, nothing finite) is "-",
    as wide, so the columns stay aligned."""
    if isinstance(x, float) and math.isnan(x):
        width = len(spec) - len(spec.lstrip("0123456789"))
        return "-".rjust(int(spec[:width] or 0) + len(suffix))
    return format(x, spec) + suffix


def render_report(report: DiffReport, *, top: int | None = None, only_failing: bool = False,
                  show_missing: bool = False) -> str:
    """The text report: a table of tensors, what one side lacks, the first divergent tensor,
    and a one-line verdict."""
    from verify.diff_report import iter_rows

    lines = [f"actual:    {report.actual}", f"reference: {report.reference}  (case {report.case})"]
    lines += [f"note: {n}" for n in report.notes]
    header = (f"{'#':>4}  {'tensor':<32} {'op':<18} {'max_abs':>9} {'max_rel':>9} "
              f"{'mean_abs':>9} {'cosine':>12} {'sqnr_db':>8} {'outside':>8} "
              f"{'nan/inf a|r':>11} {'tol_units':>9}  verdict  judged by")
    rows = list(iter_rows(report, top=top, only_failing=only_failing))
    none = ("no tensor over tolerance" if not report.outputs_over else
            "no layer over its own tolerance; the outputs as `run` judges them: see below")
    lines += ["", header] if rows or not only_failing else ["", none]
    for row in rows:
        d = row.diff
        nonfinite = f"{d.nan_actual + d.inf_actual}|{d.nan_reference + d.inf_reference}"
        cos = "-" if math.isnan(d.cosine) else f"{d.cosine:.9f}"
        verdict = "PASS" if d.passed else "FAIL"
        lines.append(
            f"{row.index:>4}  {_clip(row.name, 32):<32} {_clip(row.op, 18):<18} "
            f"{_g(d.max_abs, '9.2e')} {_g(d.max_rel, '9.2e')} {_g(d.mean_abs, '9.2e')} "
            f"{cos:>12} {_g(d.sqnr_db, '8.1f')} {_g(100 * d.frac_outside, '7.3f', '%')} "
            f"{nonfinite:>11} {_g(d.tol_units, '9.3g')}  {verdict:<7}  {d.rule}")
        if not d.passed:
            lines.append(f"{'':>6}{d.reason}")
        if d.note:
            lines.append(f"{'':>6}note: {d.note}")
        if d.topk is not None:
            lines.append(f"{'':>6}top-1 agreement {d.topk.top1:.3f}, top-5 {d.topk.top5:.3f} "
                         f"over {d.topk.rows} row(s)")
    missing_ref = [r for r in report.rows if r.missing == "actual"]
    missing_act = [r for r in report.rows if r.missing == "reference"]
    for title, missing in (("\nonly in reference", missing_ref), ("only in actual", missing_act)):
        if missing:
            lines.append(f"{title}: {len(missing)} tensor(s){_reasons(missing)}")
            if show_missing:
                lines += [f"  {r.name} ({r.op}): {r.why}" for r in missing]
    fd = report.first_divergent
    if fd is not None:
        lines.append(f"\nfirst divergent tensor: {fd.name!r}  node {fd.node or '-'}  op "
                     f"{fd.op or '-'}  ({fd.diff.reason})")
        if report.attribution is not None:
            lines += [f"  {line}" for line in report.attribution.lines()]
        if fd.fused:
            from verify.diff_report import few

            lines.append("  on the actual side this tensor's producer also computes the "
                         f"fused-away {few(fd.fused, 8)}: the fault may be in any of them"
                         + (" (--json lists them all)" if len(fd.fused) > 8 else ""))
    lines.append("=== " + report.verdict())
    return "\n".join(lines)


def _reasons(rows: list[DiffRow]) -> str:
    """": " and how many tensors each reason left out, the most frequent first; nothing where
    every reason would only repeat the summary line's own words."""
    from verify.diff import PLAIN_REASONS

    counts = collections.Counter(r.why for r in rows)
    if set(counts) <= PLAIN_REASONS:
        return ""
    return ": " + "; ".join(f"{n} {why}" for why, n in counts.most_common())


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]
