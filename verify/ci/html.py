"""The HTML report: one self-contained file (no scripts, no CDN; plots are embedded PNGs).

A table of every job, then per failing job a plot of per-layer error against layer index
(log scale, the tolerance as a line, the first divergent tensor marked; the final outputs
when no layers were captured) and its latency samples against the baseline's.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from verify.ci.report import RunInfo, closing_sections, verdict
from verify.ci.results import (
    ERROR,
    FAIL,
    FAILED,
    PASSED,
    JobResult,
    TensorError,
    overall,
)
from verify.errors import MissingDependency

ZERO_FLOOR = 1e-12   # errors of exactly 0 are drawn here (a log axis has no 0)

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1f23}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px}
table{border-collapse:collapse;margin:12px 0} th,td{border:1px solid #d0d7de;padding:4px 8px;
text-align:left;vertical-align:top} th{background:#f6f8fa}
.passed{color:#1a7f37;font-weight:600} .failed{color:#cf222e;font-weight:600}
.error{color:#9a6700;font-weight:600} .muted{color:#57606a} code{font-size:13px}
.job{border:1px solid #d0d7de;border-radius:6px;padding:8px 16px;margin:16px 0}
img{max-width:100%;height:auto}
"""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise MissingDependency("--html needs matplotlib: pip install 'onnx-verify[report]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _error_axes(ax: Any, r: JobResult) -> None:
    rows = list(r.layers) or list(r.outputs)
    what = "layer" if r.layers else "output"
    if not rows:
        ax.text(0.5, 0.5, "no tensors compared", ha="center", va="center")
        return
    rows.sort(key=lambda t: (t.case, t.index))
    # x is the tensor's own index (a layer's topological index, as the text's "#237" says; an
    # output's position): each case is a line of its own over the same x (they were drawn one
    # after another, and x was the position among the compared tensors)
    cases = sorted({t.case for t in rows})

    def y(t: TensorError) -> float:
        return max(t.max_abs, ZERO_FLOOR) if math.isfinite(t.max_abs) else ZERO_FLOOR

    first_case = [t for t in rows if t.case == cases[0]]
    for k, case in enumerate(cases):
        sub = [t for t in rows if t.case == case]
        xs = [t.index for t in sub]
        tol = [max(t.threshold, ZERO_FLOOR) if math.isfinite(t.threshold) else math.nan
               for t in sub]
        ax.semilogy(xs, [y(t) for t in sub], "o-", color="#0969da", ms=4, lw=1.2,
                    alpha=1.0 if k == 0 else 0.5,
                    label=("max |x - r| (this run)" if len(cases) == 1 else
                           f"max |x - r| (case {case})") if k < 3 else None)
        # padded by half a step on each side, so a single tensor still shows its tolerance
        ax.step([xs[0] - 0.5, *xs, xs[-1] + 0.5], [tol[0], *tol, tol[-1]], where="mid",
                color="#cf222e", ls="--", lw=1.2, label="tolerance" if k == 0 else None)
        base = [r.baseline_errors.get(t.key) for t in sub]
        if any(b is not None for b in base):
            ax.semilogy(xs, [max(b, ZERO_FLOOR) if b is not None and math.isfinite(b)
                             else math.nan for b in base], "s:", color="#8c959f", ms=3,
                        label="baseline" if k == 0 else None)
    first, label, color = r.first_divergent, "first divergent", "#cf222e"
    if first is None:  # within tolerance but worse than the baseline: mark the first regression
        first, label, color = _first_regressed(r, rows), "first regression", "#bc4c00"
    if first is not None and first in rows:
        ax.plot([first.index], [y(first)], "X", color=color, ms=13, zorder=5,
                label=f"{label}: {first.name}")
        ax.annotate(first.name, (first.index, y(first)), textcoords="offset points",
                    xytext=(8, 8), color=color, fontsize=9)
    ax.set_xlabel(f"{what} index (topological order)" if r.layers else "output index")
    zeros = sum(1 for t in rows if t.max_abs == 0)
    ax.set_ylabel("max abs error (log)" + (f"; {zeros} exact (0) at 1e-12" if zeros else ""))
    ax.set_title(f"per-{what} error vs tolerance")
    if len(first_case) <= 12:
        ax.set_xticks([t.index for t in first_case], [t.name[:14] for t in first_case],
                      rotation=30, ha="right", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def _first_regressed(r: JobResult, rows: Sequence[TensorError]) -> TensorError | None:
    gate = next((g for g in r.gates if g.gate == "regression" and g.status == "fail"), None)
    if gate is None:
        return None
    worse = {(w["case"], w["tensor"]) for w in [*gate.details["worse_outputs"],
                                                 *gate.details["worse_layers"]]}
    return next((t for t in rows if (t.case, t.name) in worse), None)


def _latency_axes(ax: Any, r: JobResult, threshold: float) -> None:
    from verify.ci.gates import CONTROL_QUANTILE

    base, now = r.baseline_latency, r.latency
    # what the gate judged: with a control, each run's iterations over the fastest tenth of its
    # own probes (in ms at the baseline's probe speed), and their fastest tenth; else the
    # iterations as measured, and their median. The limit line is the baseline's statistic
    # times 1 + threshold. (A per-iteration ratio to the probe beside it is not what is judged:
    # on a busy machine it put a passing job's whole box above the line.)
    gate = next((g for g in r.gates if g.gate == "latency"), None)
    controlled = (gate is not None and gate.details.get("control") == "probe"
                  and base is not None and now is not None and base.has_control
                  and now.has_control)
    q = CONTROL_QUANTILE if controlled else 0.5
    scale = float(np.quantile(base.control_ms, q)) if controlled and base is not None else 1.0

    def judged(s: Any) -> tuple[float, ...]:
        if not controlled:
            return tuple(s.samples_ms)
        probe = max(float(np.quantile(s.control_ms, q)), 1e-12)
        return tuple(x / probe * scale for x in s.samples_ms)

    series = [(n, judged(s)) for n, s in (("baseline", base), ("this run", now))
              if s is not None and s.samples_ms]
    if not series:
        ax.text(0.5, 0.5, "no latency samples", ha="center", va="center")
        return
    stat_name = "fastest tenth (p10)" if controlled else "median"
    ax.boxplot([s for _, s in series], showfliers=True)
    ax.set_xticks(range(1, len(series) + 1), [n for n, _ in series])
    for k, (_, s) in enumerate(series, 1):
        ax.plot([k] * len(s), s, ".", color="#0969da", alpha=0.5)
        ax.plot([k], [float(np.quantile(s, q))], "_", color="#1b1f23", ms=40, mew=2.5,
                label=f"judged: {stat_name}" if k == 1 else None)
    every = [x for _, s in series for x in s]
    # scaled to the medians, not to the spread: on a busy machine a quarter of the samples can
    # be descheduled ones, and they would squash the boxes
    top = 3.0 * max(float(np.median(s)) for _, s in series)
    if base is not None and base.samples_ms:
        limit = float(np.quantile(series[0][1], q)) * (1 + threshold)
        top = max(top, 1.2 * limit)
        ax.axhline(limit, color="#cf222e", ls="--", lw=1.2,
                   label=f"baseline {stat_name.split(' (')[0]} +{threshold:.0%}")
    ax.legend(fontsize=8)
    clipped = sum(1 for x in every if x > top)
    ax.set_ylim(0, top)
    if clipped:  # descheduled iterations would squash the boxes: say they are off the chart
        ax.text(0.02, 0.02, f"{clipped} sample(s) above {top:.3g} ms not shown",
                transform=ax.transAxes, va="bottom", fontsize=8, color="#57606a")
    ax.set_ylabel("per-iteration latency over the run's control probe\n(ms at the baseline's "
                  "probe speed)" if controlled else "per-iteration latency (ms)")
    ax.set_title("latency vs baseline")
    ax.grid(True, axis="y", alpha=0.3)


def job_figure(r: JobResult) -> str:
    """The failing job's two plots as a base64 PNG."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    try:
        _error_axes(left, r)
        _latency_axes(right, r, r.job.settings.latency_threshold)
        fig.suptitle(r.job.id, fontsize=11)
        return _png(fig)
    finally:
        plt.close(fig)


def _e(text: Any) -> str:
    return html.escape(str(text))


def _row(r: JobResult) -> str:
    gates = "<br>".join(f"{_e(g.gate)}: <span class='{'failed' if g.status == FAIL else 'muted'}'>"
                        f"{_e(g.status)}</span>" for g in r.gates)
    med = f"{r.latency.median_ms:.4g}" if r.latency and r.latency.samples_ms else "–"
    base = (f"{r.baseline_latency.median_ms:.4g}" if r.baseline_latency
            and r.baseline_latency.samples_ms else "–")
    arch = r.device.get("arch", "")
    name = f"<code>{_e(r.job.id)}</code>"
    if r.status in (FAILED, ERROR):  # only those have a section below to link to
        name = f"<a href='#{_e(r.job.id)}'>{name}</a>"
    return (f"<tr><td>{name}</td>"
            f"<td>{_e(r.job.device.name)} <span class='muted'>{_e(arch)}</span></td>"
            f"<td class='{r.status}'>{r.status}</td><td>{gates or '–'}</td>"
            f"<td>{med}</td><td>{base}</td><td>{_e(r.summary())}</td></tr>")


def where_line(where: str) -> str:
    from verify.origin import Attribution

    return " ".join(Attribution(None, where).lines())


def _section(r: JobResult) -> str:
    parts = [f"<div class='job' id='{_e(r.job.id)}'><h2><code>{_e(r.job.id)}</code> "
             f"<span class='{r.status}'>{r.status}</span></h2><ul>"]
    if r.status == ERROR:
        parts.append(f"<li>{_e(r.error_kind)} error after {r.attempts} attempt(s): "
                     f"{_e(r.error)}</li></ul></div>")
        return "".join(parts)
    parts += [f"<li><b>{_e(g.gate)}</b>: {_e(g.message)}</li>" for g in r.failed_gates]
    first = r.first_divergent
    if first is not None:
        parts.append(f"<li>first divergent tensor: <code>{_e(first.name)}</code> "
                     f"({_e(first.op or 'output')}, #{first.index}, case {first.case}): "
                     f"{_e(first.numbers())}</li>")
        if first.pytorch:
            parts.append(f"<li>PyTorch module: <code>{_e(first.pytorch)}</code></li>")
        if first.where:
            parts.append(f"<li>{_e(where_line(first.where))}</li>")
    parts += [f"<li class='muted'>{_e(n)}</li>" for n in r.notes if not n.startswith("Traceback")]
    parts.append(f"</ul><img alt='per-layer error and latency of {_e(r.job.id)}' "
                 f"src='data:image/png;base64,{job_figure(r)}'></div>")
    return "".join(parts)


def _closing(title: str, lead: list[tuple[str, bool]],
             items: list[list[tuple[str, bool]]]) -> str:
    def text(segments: list[tuple[str, bool]]) -> str:
        return "".join(f"<code>{_e(t)}</code>" if code else _e(t) for t, code in segments)

    return (f"<h2>{_e(title)}</h2>" + (f"<p>{text(lead)}</p>" if lead else "")
            + "<ul>" + "".join(f"<li>{text(i)}</li>" for i in items) + "</ul>")


def html_report(results: Sequence[JobResult], info: RunInfo) -> str:
    counts = overall(results)
    v = verdict(results)
    cls = {"passed": "passed", "failed": "failed"}.get(v, "error")
    rows = "".join(_row(r) for r in results)
    sections = "".join(_section(r) for r in results if r.status in (FAILED, ERROR))
    passed = {r.job.id for r in results if r.status == PASSED}
    ends = [(title, lead, [i for i in items if title != "Notes" or i[0][0] in passed])
            for title, lead, items in closing_sections(results, info)]
    # a failed or errored job's notes are in its own section already
    closing = "".join(_closing(*end) for end in ends if end[2])
    held = "Every job held every gate" + (" it was judged by" if any(
        title != "Notes" for title, _, _ in ends) else "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>verify ci: {_e(info.suite_name)}</title>
<style>{_CSS}</style></head><body>
<h1>verify ci: {_e(info.suite_name)} — <span class="{cls}">{_e(v)}</span></h1>
<p class="muted">{counts[PASSED]} passed · {counts[FAILED]} failed · {counts[ERROR]} error(s) —
{_e(info.scope(len(results)))}, {info.seconds:.1f} s, {_e(info.created_utc)},
suite <code>{_e(info.suite_file)}</code></p>
<table><thead><tr><th>job</th><th>device</th><th>status</th><th>gates</th>
<th>median ms</th><th>baseline ms</th><th>summary</th></tr></thead><tbody>{rows}</tbody></table>
{sections or f'<p class="passed">{held}.</p>'}
{closing}
</body></html>
"""
