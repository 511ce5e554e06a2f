"""The run's verdict, the JSON document with every figure, and the Markdown summary."""

from __future__ import annotations

import datetime as _dt
import json
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from verify import __version__
from verify.ci.results import (
    ERROR,
    FAIL,
    FAILED,
    NO_BASELINE,
    PASS,
    PASSED,
    RECORDED,
    UPDATED,
    JobResult,
    fmt3,
    missing_baselines,
    not_updated,
    overall,
    recorded_latencies,
)
from verify.ci.gates import first_worse
from verify.ci.suite import GATES

FORMAT = "verify-ci-report"
VERSION = 1


@dataclass(frozen=True)
class RunInfo:
    """What was asked of this run, for the reports' headers."""

    suite_name: str
    suite_file: str
    total_jobs: int
    shard: tuple[int, int] | None = None
    only: Sequence[str] = ()
    update_goldens: bool = False
    seconds: float = 0.0
    created_utc: str = field(default_factory=lambda: _dt.datetime.now(
        _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    baselines: str = ""  # the --baselines folder given, if any

    def record_command(self, only: Sequence[str] = ()) -> str:
        """The command that records the missing baselines (of the jobs `only`, when given)
        where this run looked for them."""
        where = f" --baselines {shlex.quote(self.baselines)}" if self.baselines else ""
        jobs = "".join(f" --only {shlex.quote(j)}" for j in only)
        return f"verify ci {shlex.quote(self.suite_file)}{where} --update-goldens{jobs}"

    def scope(self, ran: int) -> str:
        parts = [f"{ran} of {self.total_jobs} job(s)"]
        if self.shard:
            parts.append(f"shard {self.shard[0]}/{self.shard[1]}")
        if self.only:
            parts.append("--only " + " ".join(self.only))
        if self.update_goldens:
            parts.append("--update-goldens")
        return ", ".join(parts)


def verdict(results: Sequence[JobResult]) -> str:
    """failed when a gate failed; else input-error, internal-error or device-error when a job
    errored (in that order); else passed. The CLI maps these to exit codes 1, 2, 4, 3 and 0.
    """
    if any(r.status == FAILED for r in results):
        return "failed"
    errors = [r for r in results if r.status == ERROR]
    if any(r.error_kind == "input" for r in errors):
        return "input-error"
    if any(r.error_kind == "internal" for r in errors):
        return "internal-error"
    if errors:
        return "device-error"
    return "passed"


def document(results: Sequence[JobResult], info: RunInfo) -> dict[str, Any]:
    return {
        "format": FORMAT, "version": VERSION, "verify": __version__,
        "suite": info.suite_name, "suite_file": info.suite_file, "created_utc": info.created_utc,
        "scope": info.scope(len(results)),
        "shard": f"{info.shard[0]}/{info.shard[1]}" if info.shard else None,
        "only": list(info.only), "update_goldens": info.update_goldens,
        "seconds": round(info.seconds, 3), "verdict": verdict(results),
        "counts": overall(results), "missing_baselines": missing_baselines(results),
        "recorded_latency_baselines": recorded_latencies(results),
        "baselines_not_updated": [{"job": job, "why": why} for job, why in not_updated(results)]
        if info.update_goldens else [],
        "machines": machines(results),
        "jobs": [r.to_dict() for r in results],
    }


def machines(results: Sequence[JobResult]) -> dict[str, str]:
    """Device name -> the fingerprint of the machine it ran on (latency baselines' key)."""
    return {r.job.device.name: r.machine for r in results if r.machine}


def to_json(results: Sequence[JobResult], info: RunInfo) -> str:
    return json.dumps(document(results, info), indent=2) + "\n"


# --- Markdown ---------------------------------------------------------------------------------

_MARK = {PASS: "✅", FAIL: "❌", NO_BASELINE: "⚪ no baseline", UPDATED: "📝 updated",
         RECORDED: "📝 recorded"}
_STATUS = {PASSED: "✅ passed", FAILED: "❌ failed", ERROR: "⚠️ error"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _gate_cell(result: JobResult, gate: str) -> str:
    g = next((g for g in result.gates if g.gate == gate), None)
    if g is None:
        return "–"
    mark = _MARK.get(g.status, g.status)
    if gate == "latency" and g.status in (PASS, FAIL):
        return f"{mark} {fmt3(g.details['median_ms'])} ms ({fmt3(g.details['ratio'])}x)"
    if gate == "regression" and g.status == FAIL:
        w = first_worse(g.details)  # the tensor the text and JUnit name
        if w is None:
            return mark
        at = f" at `{w['tensor']}`"
        if isinstance(w["ratio"], (int, float)) and math.isfinite(w["ratio"]):
            return f"{mark} {fmt3(w['ratio'])}x{at}"
        # no ratio (a baseline error of 0, or a NaN or infinite error): the error against the
        # baseline's, and how far over the limit where that is a number
        over = (f" ({fmt3(w['max_abs'] / w['limit'])}x the limit)"
                if isinstance(w["max_abs"], (int, float)) and
                isinstance(w["limit"], (int, float)) and w["limit"] > 0 else "")
        return f"{mark} {fmt3(w['max_abs'])} vs {fmt3(w['baseline_max_abs'])}{over}{at}"
    return mark


def _device_label(r: JobResult) -> str:
    arch = r.device.get("arch")
    return f"{r.job.device.name} ({arch})" if arch else r.job.device.name


def _machines_line(results: Sequence[JobResult]) -> list[str]:
    found = machines(results)
    if not found:
        return []
    return ["Machines (latency baselines are kept per machine): " + ", ".join(
        f"{dev} `{fp}`" for dev, fp in found.items()), ""]


Segments = list[tuple[str, bool]]  # text, and whether it is code (a job id, a command)


def closing_sections(results: Sequence[JobResult],
                     info: RunInfo) -> list[tuple[str, Segments, list[Segments]]]:
    """What every report ends with, whatever its jobs' status: the jobs without a baseline
    (and the command that records them), under --update-goldens the jobs whose baselines were
    not updated (and why), the latencies recorded rather than judged, and every job's notes.
    As (title, lead, items) for the Markdown and the HTML alike."""
    out: list[tuple[str, Segments, list[Segments]]] = []
    missing = missing_baselines(results)
    if missing:
        out.append(("Missing baselines", [
            (f"{len(missing)} job(s) have no baseline; regression and latency were not judged "
             "for them. Record baselines on purpose with ", False),
            (info.record_command(), True), (" and commit them:", False)],
            [[(m, True)] for m in missing]))
    kept = not_updated(results) if info.update_goldens else []
    if kept:
        out.append(("Baselines not updated", [
            (f"{len(kept)} job(s) kept their old baselines (or still have none); the other "
             "jobs' new baselines were put in place together. Record these once they pass "
             "with ", False), (info.record_command([job for job, _ in kept]), True),
            (":", False)], [[(job, True), (f": {why}", False)] for job, why in kept]))
    recorded = recorded_latencies(results)
    if recorded:
        out.append(("Latency recorded, not judged", [
            (f"{len(recorded)} job(s) had no latency baseline for the machine they ran on; this "
             "run's samples were recorded as its baseline and later runs there are judged "
             "against them (commit them to keep them):", False)],
            [[(r.job.id, True), (" on machine ", False), (r.machine, True)]
             for r in results if r.job.id in recorded]))
    notes = [[(r.job.id, True), (f": {n}", False)] for r in results for n in r.notes
             if not n.startswith("Traceback")]
    if notes:
        out.append(("Notes", [], notes))
    return out


def markdown(results: Sequence[JobResult], info: RunInfo) -> str:
    counts = overall(results)
    v = verdict(results)
    head = {"passed": "✅ all gates held", "failed": "❌ a gate failed",
            "device-error": "⚠️ device errors", "input-error": "⚠️ errors",
            "internal-error": "⚠️ internal errors"}[v]
    used = [g for g in GATES if any(x.gate == g for r in results for x in r.gates)]
    lines = [f"## verify ci: {info.suite_name} — {head}", "",
             f"{counts[PASSED]} passed · {counts[FAILED]} failed · {counts[ERROR]} error(s) "
             f"— {info.scope(len(results))}, {info.seconds:.1f} s", "",
             *_machines_line(results),
             "| job | device | status | " + " | ".join(used) + " |",
             "|---|---|---|" + "---|" * len(used)]
    for r in results:
        cells = [f"`{r.job.id}`", _device_label(r), _STATUS[r.status],
                 *[_gate_cell(r, g) for g in used]]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    failed = [r for r in results if r.status == FAILED]
    if failed:
        lines += ["", "### Failures", ""]
        for r in failed:
            lines.append(f"- **`{r.job.id}`**")
            for g in r.failed_gates:
                lines.append(f"  - {g.gate}: {_cell(g.message)}")
            first = r.first_divergent
            if first is not None:
                lines.append(f"  - first divergent tensor: `{first.name}` ({first.op or 'output'},"
                             f" #{first.index}, case {first.case}): {_cell(first.numbers())}")
    errored = [r for r in results if r.status == ERROR]
    if errored:
        lines += ["", "### Errors", ""]
        lines += [f"- **`{r.job.id}`** ({r.error_kind}, {r.attempts} attempt(s)): {_cell(r.error)}"
                  for r in errored]
    for title, lead, items in closing_sections(results, info):
        lines += ["", f"### {title}", ""]
        if lead:
            lines += ["".join(f"`{t}`" if code else t for t, code in lead), ""]
        lines += ["- " + "".join(f"`{t}`" if code else _cell(t) for t, code in item)
                  for item in items]
    return "\n".join(lines) + "\n"

