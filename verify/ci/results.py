"""What a CI run produces: per-tensor errors, latency samples, gate verdicts, job results."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verify.ci.jobs import Job
from verify.compare import TensorDiff, json_safe
from verify.timing import Timing

PASS, FAIL, NO_BASELINE, UPDATED = "pass", "fail", "no-baseline", "updated"
RECORDED = "recorded"    # no latency baseline for this machine: this run's was recorded
PASSED, FAILED, ERROR = "passed", "failed", "error"


def fmt3(x: float | str) -> str:
    """A figure for a report line: 3 significant digits, or the text as it is (nan, inf)."""
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def num(x: float) -> float | str:
    """A float for JSON: 6 significant digits; non-finite values as strings."""
    x = float(x)
    return float(f"{x:.6g}") if math.isfinite(x) else json_safe(x)


def unnum(x: Any) -> float:
    """The inverse of `num` ("nan", "inf" and "-inf" parse as floats)."""
    return float(x)


@dataclass(frozen=True)
class TensorError:
    """One output (or one layer) of one case against its reference."""

    case: int
    index: int          # output position, or the tensor's topological index for layers
    name: str
    op: str
    passed: bool
    rule: str
    max_abs: float
    threshold: float
    tol_units: float
    max_rel: float = math.nan
    cosine: float = math.nan
    sqnr_db: float = math.nan
    n_outside: int = 0
    reason: str = ""
    pytorch: str = ""   # a first divergent layer's PyTorch module (and source line), if known
    where: str = ""     # origin.HOST / origin.DEVICE when the archive has a PyTorch reference

    @property
    def key(self) -> str:
        return f"case{self.case}/{self.name}"

    @staticmethod
    def from_diff(case: int, index: int, diff: TensorDiff, op: str = "") -> TensorError:
        return TensorError(case=case, index=index, name=diff.name, op=op, passed=diff.passed,
                           rule=diff.rule, max_abs=diff.max_abs, threshold=diff.threshold,
                           tol_units=diff.tol_units, max_rel=diff.max_rel, cosine=diff.cosine,
                           sqnr_db=diff.sqnr_db, n_outside=diff.n_outside, reason=diff.reason)

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "index": self.index, "name": self.name, "op": self.op,
                "passed": self.passed, "rule": self.rule, "max_abs": num(self.max_abs),
                "threshold": num(self.threshold), "tol_units": num(self.tol_units),
                "max_rel": num(self.max_rel), "cosine": num(self.cosine),
                "sqnr_db": num(self.sqnr_db), "n_outside": self.n_outside, "reason": self.reason,
                **({"pytorch": self.pytorch} if self.pytorch else {}),
                **({"where": self.where} if self.where else {})}

    def numbers(self) -> str:
        """The figures a failure message carries, after the tensor's name."""
        units = ("beyond any" if math.isinf(self.tol_units)  # (a zero tolerance, a NaN)
                 else f"{self.tol_units:.3g}x")
        return (f"max_abs={self.max_abs:.3g} threshold={self.threshold:.3g} "
                f"({units} tolerance), {self.n_outside} element(s) outside [{self.rule}]")

    def describe(self) -> str:
        """Name, place and figures: `conv3:0 (Conv, #17, case 0): max_abs=…`."""
        where = f"{self.op}, #{self.index}, case {self.case}" if self.op else f"case {self.case}"
        return f"{self.name} ({where}): {self.numbers()}"


@dataclass(frozen=True)
class Latency:
    """Per-iteration inference times of a job (all cases), in milliseconds; with a control,
    the control probe's time right before each iteration (`control_ms[i]` beside
    `samples_ms[i]`)."""

    samples_ms: tuple[float, ...]
    control_ms: tuple[float, ...] = ()

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else math.nan

    @property
    def has_control(self) -> bool:
        return bool(self.samples_ms) and len(self.control_ms) == len(self.samples_ms) \
            and min(self.control_ms) > 0

    @property
    def control_median_ms(self) -> float:
        return statistics.median(self.control_ms) if self.control_ms else math.nan

    def normalized(self) -> tuple[float, ...]:
        """Each iteration over the control probe beside it (load slows both alike)."""
        return tuple(s / c for s, c in zip(self.samples_ms, self.control_ms))

    def to_dict(self) -> dict[str, Any]:
        """The statistics of `verify.timing`, under the key names baselines are written with."""
        s = self.samples_ms
        nan = math.nan
        t = Timing.of(s) if s else Timing(0, nan, 0.0, nan, nan, nan, nan, nan)
        doc = {"n": t.n, "median_ms": num(t.median), "mean_ms": num(t.avg), "sd_ms": num(t.sd),
               "min_ms": num(t.min), "max_ms": num(t.max), "samples_ms": [num(x) for x in s]}
        if self.control_ms:
            doc["control_median_ms"] = num(self.control_median_ms)
            doc["control_ms"] = [num(x) for x in self.control_ms]
        return doc


@dataclass(frozen=True)
class GateResult:
    gate: str
    status: str                      # pass, fail, no-baseline, updated
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "status": self.status, "message": self.message,
                "details": dict(self.details)}


@dataclass(frozen=True)
class JobResult:
    job: Job
    status: str                      # passed, failed, error
    gates: tuple[GateResult, ...] = ()
    outputs: tuple[TensorError, ...] = ()
    layers: tuple[TensorError, ...] = ()
    latency: Latency | None = None
    baseline_latency: Latency | None = None
    baseline_errors: Mapping[str, float] = field(default_factory=dict)  # key -> max_abs
    device: Mapping[str, Any] = field(default_factory=dict)
    machine: str = ""                # the device's machine fingerprint (latency baselines)
    error: str = ""
    error_kind: str = ""             # device, input or internal
    error_type: str = ""             # the exception's class, e.g. ConnectError
    unreachable: bool = False        # a ConnectError (or subclass): the device is out of the run
    timed_out: bool = False          # a DeviceTimeout on its last attempt (schedule: HUNG_AFTER)
    attempts: int = 0
    seconds: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def failed_gates(self) -> list[GateResult]:
        return [g for g in self.gates if g.status == FAIL]

    @property
    def first_divergent(self) -> TensorError | None:
        """The first tensor over tolerance: per layer when captured, else among the outputs."""
        for rows in (self.layers, self.outputs):
            bad = [t for t in rows if not t.passed]
            if bad:
                return min(bad, key=lambda t: (t.case, t.index))
        return None

    def summary(self) -> str:
        """One line: why the job failed or errored, or that it passed."""
        if self.status == ERROR:
            return f"{self.error_kind} error: {self.error}"
        failed = self.failed_gates
        missing = [g.gate for g in self.gates if g.status in (NO_BASELINE, RECORDED)]
        if failed:
            return "; ".join([f"{g.gate}: {g.message}" for g in failed] + (
                [f"not judged (no baseline): {', '.join(missing)}"] if missing else []))
        if self.status == FAILED:  # only --require-baselines fails a job without a failed gate
            return f"no baseline for {', '.join(missing)} (--require-baselines)"
        if missing:  # held, but not every gate was judged: say which were not
            return f"every judged gate held; not judged (no baseline): {', '.join(missing)}"
        return "all gates held"

    def to_dict(self) -> dict[str, Any]:
        j = self.job
        first = self.first_divergent
        return {
            "id": j.id, "testcase": j.testcase, "archive": str(j.archive),
            "device": {"name": j.device.name, "spec": j.device.spec, **dict(self.device)},
            "machine": self.machine,
            "options": j.options.to_dict(), "iterations": j.iterations, "warmup": j.warmup,
            "status": self.status, "summary": self.summary(),
            "error": {"kind": self.error_kind, "type": self.error_type, "message": self.error}
            if self.error else None,
            "attempts": self.attempts, "seconds": num(self.seconds),
            "gates": [g.to_dict() for g in self.gates],
            "first_divergent": first.to_dict() if first else None,
            "outputs": [t.to_dict() for t in self.outputs],
            "layers": [t.to_dict() for t in self.layers],
            "latency": self.latency.to_dict() if self.latency else None,
            "baseline_latency": self.baseline_latency.to_dict() if self.baseline_latency else None,
            "notes": list(self.notes),
        }


def overall(results: Sequence[JobResult]) -> dict[str, int]:
    counts = {PASSED: 0, FAILED: 0, ERROR: 0}
    for r in results:
        counts[r.status] += 1
    return counts


def missing_baselines(results: Sequence[JobResult]) -> list[str]:
    return [r.job.id for r in results if any(g.status == NO_BASELINE for g in r.gates)]


def recorded_latencies(results: Sequence[JobResult]) -> list[str]:
    """Jobs whose latency was recorded (no baseline for their machine), not judged."""
    return [r.job.id for r in results if any(g.status == RECORDED for g in r.gates)]


def not_updated(results: Sequence[JobResult]) -> list[tuple[str, str]]:
    """Under --update-goldens: the jobs whose baselines the run did not write (they keep
    their old ones, or still have none), each with why: a gate failed, or the job errored."""
    return [(r.job.id, r.summary() if r.status == ERROR else
             f"a gate failed ({', '.join(g.gate for g in r.failed_gates) or 'none judged'})")
            for r in results if r.status != PASSED]
