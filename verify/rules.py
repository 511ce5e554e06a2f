"""Tolerance rules: how one tensor's values are judged. Each rule owns its verdict: `resolved(dtype)`
fills its defaults, `with_floor(F)` an unset saturation floor, `scan` reads the arrays through
the kernel (verify/scan.py), `verdict(scan, a, r)` returns a `Verdict`, `describe()` the string
reports show as "judged by", `why_not_integers()` why it cannot judge an integer tensor's values
('' when it can: `ToleranceSet.rule_for` gives integer tensors a rule only when a glob names
them); a new key is one class, not a branch in `compare`.

- `MagnitudeRule(k, floor)`, the default: pass iff `max|a-r| <= k * max(max|r|, floor)`. Without
  an explicit k, `k = 2^9 * eps(reference dtype)`: 2^-14 for float32 and float64 (float64 uses
  float32's eps: its references are compared against float32 runs), 2^-1 for float16, 2^2 for
  bfloat16. 2^9 eps is 3.1x the worst benign cross-platform noise measured in float32; for
  bfloat16 a k above 1 only catches gross blow-ups. `floor` is `SATURATION_FLOOR` (1/16) for
  outputs of saturating ops (see `saturating_floor`), else 0.
- `AllcloseRule(atol, rtol)`: pass iff `|a-r| <= atol + rtol*|r|` for every element.
- `ExactRule()`: every element equal (bool tensors always; integer ones unless a glob names them).
- `GateRule(gates, base)`: metric gates that must all hold, and the value rule `base` too when
  one is given: `CosineGate` (`cos>=V`), `SqnrGate` (`sqnr>=DB`, decibels), `QuantileGate`
  (`pNN_abs<=V`: the NN-th percentile of |a-r|, so a few outliers may exceed V). Made for
  quantized and fp16 models, whose errors are judged in aggregate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from verify.dtypes import dtype_kind, float_eps
from verify.errors import UsageError
from verify.scan import Scan, cosine, count_unequal, scan, sqnr_db

SATURATION_FLOOR = 1.0 / 16
# Ops whose outputs saturate: values near the bound are computed with absolute noise of a few
# ulp of 1.0 even when the whole tensor is tiny (a saturated Sigmoid: all < 3e-5, off by 1-2 ulp
# at 1.0). LogSoftmax is not here: its peak |r| is large whenever anything saturates.
SATURATING_OPS = frozenset({"Sigmoid", "HardSigmoid", "Tanh", "Softmax", "Erf"})
# Ops that move, select or repeat values without computing new ones.
SHAPE_ONLY_OPS = frozenset({
    "Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice",
    "Split", "Gather", "GatherElements", "GatherND", "Expand", "Tile", "DepthToSpace",
    "SpaceToDepth",
})
# How much of its input's error a saturating op can pass on at most (its largest slope; the
# softmax's rows' at most 1/2 in the max norm; HardSigmoid's usual alphas 0.2 and 1/6): the
# share of its sources' measured error it may carry (layer_judge.LayerJudge); ops that select
# values pass it all on (1).
SOURCE_FACTORS = {"Sigmoid": 0.25, "HardSigmoid": 0.25, "Softmax": 0.5, "Tanh": 1.0,
                  "Erf": 1.13}
_K_ULPS = 2.0 ** 9  # the magnitude rule's margin in units of the dtype's eps
_EPS_FLOAT32 = 2.0 ** -23


def saturating_floor(op_type: str, upstream: Sequence[str] = ()) -> float:
    """The magnitude floor F for a tensor made by `op_type`.

    `upstream` lists the op types above it along its data input, nearest first; the floor
    applies when the tensor is a saturating op's output seen through shape-only ops only.
    """
    for op in (op_type, *upstream):
        if op in SATURATING_OPS:
            return SATURATION_FLOOR
        if op not in SHAPE_ONLY_OPS:
            return 0.0
    return 0.0


def _fmt_num(x: float) -> str:
    """Small powers of two as 2^n (how these constants are written), anything else as %g."""
    if 0 < x <= 2.0 ** -4:
        m, e = math.frexp(x)
        if m == 0.5:
            return f"2^{e - 1}"
    return f"{x:g}"


def check_value(key: str, value: float, positive: bool = False) -> None:
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise UsageError(f"{key} must be finite and {'> 0' if positive else '>= 0'}, got {value:g}")


@dataclass(frozen=True)
class Verdict:
    """A rule's judgement of one tensor's values: pass or not, its threshold (the figure the
    error is held against, NaN where none), the error in tolerance units, and why it failed."""

    ok: bool
    threshold: float
    tol_units: float
    reason: str = ""
    n_outside: int | None = None  # None: the scan's count


def _ratio(x: float, limit: float) -> float:
    return x / limit if limit > 0 else (0.0 if x == 0 else math.inf)


@dataclass(frozen=True)
class MagnitudeRule:
    """Pass iff max|a-r| <= k * max(max|r|, floor); k None means 2^9 * eps of the dtype,
    floor None means "from the producing op" (filled in by `ToleranceSet.rule_for`, else 0)."""

    k: float | None = None
    floor: float | None = None

    def __post_init__(self) -> None:
        if self.k is not None:
            check_value("k", self.k, positive=True)
        if self.floor is not None:
            check_value("floor", self.floor)

    def k_for(self, dtype: np.dtype) -> float:
        if self.k is not None:
            return self.k
        eps = float_eps(np.dtype(dtype))
        return _K_ULPS * max(eps if eps is not None else _EPS_FLOAT32, _EPS_FLOAT32)

    def threshold(self, ref_peak: float, dtype: np.dtype) -> float:
        return self.k_for(dtype) * max(ref_peak, self.floor or 0.0)

    def describe(self) -> str:
        k = "2^9*eps" if self.k is None else _fmt_num(self.k)
        return f"magnitude k={k}" + (f" floor={_fmt_num(self.floor)}" if self.floor else "")

    def resolved(self, dtype: np.dtype) -> MagnitudeRule:
        return MagnitudeRule(self.k_for(dtype), self.floor or 0.0)

    def why_not_integers(self) -> str:
        return "" if self.k is not None else (
            "the magnitude rule's default k is a float dtype's precision; give k= (of the "
            "peak) or atol= (in integer steps)")

    def with_floor(self, floor: float) -> MagnitudeRule:
        """This rule with `floor` where none was set (the producing op's, `saturating_floor`)."""
        return self if self.floor is not None else dataclasses.replace(self, floor=floor)

    def kernel_args(self) -> tuple[float, float, bool]:
        return math.inf, 0.0, False

    def scan(self, a: np.ndarray, r: np.ndarray, kd: np.dtype, eng: str, tiny: float,
             rows: np.ndarray | None = None) -> Scan:
        return scan(a, r, kd, eng, math.inf, 0.0, tiny, False,
                    lambda peak: self.threshold(peak, r.dtype), rows)

    def verdict(self, s: Scan, a: np.ndarray, r: np.ndarray) -> Verdict:
        threshold = self.threshold(s.ref_peak, r.dtype)
        ok = s.max_abs <= threshold
        why = "" if ok else "max|a-r| {} > {}".format(*fmt_apart(s.max_abs, threshold))
        return Verdict(ok, threshold, _ratio(s.max_abs, threshold), why)


@dataclass(frozen=True)
class AllcloseRule:
    """Pass iff |a-r| <= atol + rtol*|r| for every element."""

    atol: float = 0.0
    rtol: float = 0.0

    def __post_init__(self) -> None:
        check_value("atol", self.atol)
        check_value("rtol", self.rtol)

    def describe(self) -> str:
        return f"allclose atol={_fmt_num(self.atol)} rtol={_fmt_num(self.rtol)}"

    def resolved(self, dtype: np.dtype) -> AllcloseRule:
        return self

    def why_not_integers(self) -> str:
        return ""

    def with_floor(self, floor: float) -> AllcloseRule:
        return self

    def kernel_args(self) -> tuple[float, float, bool]:
        return self.atol, self.rtol, True

    def scan(self, a: np.ndarray, r: np.ndarray, kd: np.dtype, eng: str, tiny: float,
             rows: np.ndarray | None = None) -> Scan:
        return scan(a, r, kd, eng, self.atol, self.rtol, tiny, True, None, rows)

    def verdict(self, s: Scan, a: np.ndarray, r: np.ndarray) -> Verdict:
        ok = s.n_outside == 0
        why = "" if ok else (f"{s.n_outside} of {plural(int(a.size), 'element')} outside "
                             f"{self.describe()} (max|a-r| {s.max_abs:.2e}, {s.max_tr:.3g} "
                             "tolerance units)")
        return Verdict(ok, self.atol + self.rtol * s.ref_peak, s.max_tr, why)


@dataclass(frozen=True)
class ExactRule:
    """Pass iff every element is equal (bools always; integers unless a glob names them)."""

    def describe(self) -> str:
        return "exact"

    def resolved(self, dtype: np.dtype) -> ExactRule:
        return self

    def why_not_integers(self) -> str:
        return ""

    def with_floor(self, floor: float) -> ExactRule:
        return self

    def kernel_args(self) -> tuple[float, float, bool]:
        return 0.0, 0.0, False

    def scan(self, a: np.ndarray, r: np.ndarray, kd: np.dtype, eng: str, tiny: float,
             rows: np.ndarray | None = None) -> Scan:
        s = scan(a, r, kd, eng, 0.0, 0.0, tiny, False, None, rows)
        if dtype_kind(r.dtype) != "float":  # exact integer count, not via float64
            s = dataclasses.replace(s, n_outside=count_unequal(a, r))
        return s

    def verdict(self, s: Scan, a: np.ndarray, r: np.ndarray) -> Verdict:
        ok = s.n_outside == 0
        why = ""
        if not ok:
            why = f"{s.n_outside} of {plural(int(a.size), 'element')} differ"
            if s.max_abs > 0:  # (integers beyond 2^53 can differ by less than float64 shows)
                why += f" (max|a-r| {s.max_abs:.3g})"
        return Verdict(ok, 0.0, 0.0 if ok else math.inf, why)


# --- metric gates: `cos>=`, `sqnr>=`, `pNN_abs<=` ---------------------------------------------

@dataclass(frozen=True)
class CosineGate:
    """cos(a, r) >= minimum (cosine similarity of the flattened tensors)."""

    minimum: float
    key = "cos>="

    def check(self, s: Scan, a: np.ndarray, r: np.ndarray) -> tuple[bool, float, str]:
        cos = cosine(s.sum_aa, s.sum_rr, s.sum_dd)
        units = _ratio(1.0 - cos, 1.0 - self.minimum) if not math.isnan(cos) else math.inf
        ok = cos >= self.minimum
        return ok, units, "" if ok else f"cos {cos:.6g} < {self.minimum:g}"

    def describe(self) -> str:
        return f"cos>={self.minimum:g}"


@dataclass(frozen=True)
class SqnrGate:
    """SQNR >= minimum dB: 10*log10(sum r^2 / sum (a-r)^2)."""

    minimum: float
    key = "sqnr>="

    def check(self, s: Scan, a: np.ndarray, r: np.ndarray) -> tuple[bool, float, str]:
        db = sqnr_db(s.sum_rr, s.sum_dd)
        units = 10.0 ** ((self.minimum - db) / 10.0) if math.isfinite(db) else (
            0.0 if db > 0 else math.inf)
        ok = db >= self.minimum
        return ok, units, "" if ok else f"sqnr {db:.3g} dB < {self.minimum:g} dB"

    def describe(self) -> str:
        return f"sqnr>={self.minimum:g}dB"


@dataclass(frozen=True)
class QuantileGate:
    """The q-th percentile of |a-r| over the finite elements <= maximum (`p99_abs<=1e-3`):
    a few outliers may exceed it, the bulk may not."""

    q: float
    maximum: float
    key = "pNN_abs<="

    def check(self, s: Scan, a: np.ndarray, r: np.ndarray) -> tuple[bool, float, str]:
        value = abs_error_quantile(a, r, self.q)
        ok = value <= self.maximum
        why = "" if ok else f"p{self.q:g}|a-r| {value:.3g} > {self.maximum:g}"
        return ok, _ratio(value, self.maximum), why

    def describe(self) -> str:
        return f"p{self.q:g}_abs<={self.maximum:g}"


Gate = CosineGate | SqnrGate | QuantileGate


def abs_error_quantile(a: np.ndarray, r: np.ndarray, q: float) -> float:
    """The q-th percentile (0..100) of |a-r| over the elements finite on both sides."""
    d = np.abs(np.asarray(a, np.float64) - np.asarray(r, np.float64)).ravel()
    d = d[np.isfinite(d)]
    return float(np.percentile(d, q)) if d.size else 0.0


@dataclass(frozen=True)
class GateRule:
    """Every gate must hold, and the value rule `base` too when one is given
    (`*:sqnr>=40` alone; `logits:atol=1e-3,cos>=0.9999` both)."""

    gates: tuple[Gate, ...]
    base: MagnitudeRule | AllcloseRule | ExactRule | None = None

    def describe(self) -> str:
        parts = [self.base.describe()] if self.base is not None else []
        return " + ".join([*parts, *(g.describe() for g in self.gates)])

    def resolved(self, dtype: np.dtype) -> GateRule:
        base = self.base.resolved(dtype) if self.base is not None else None
        return GateRule(self.gates, base)

    def why_not_integers(self) -> str:
        return self.base.why_not_integers() if self.base is not None else ""

    def with_floor(self, floor: float) -> GateRule:
        return self if self.base is None else GateRule(self.gates, self.base.with_floor(floor))

    def kernel_args(self) -> tuple[float, float, bool]:
        return (self.base or ExactRule()).kernel_args()

    def scan(self, a: np.ndarray, r: np.ndarray, kd: np.dtype, eng: str, tiny: float,
             rows: np.ndarray | None = None) -> Scan:
        return (self.base or ExactRule()).scan(a, r, kd, eng, tiny, rows)

    def verdict(self, s: Scan, a: np.ndarray, r: np.ndarray) -> Verdict:
        base = self.base.verdict(s, a, r) if self.base is not None else None
        checks = [g.check(s, a, r) for g in self.gates]
        reasons = ([base.reason] if base is not None and not base.ok else []) + \
            [why for ok, _, why in checks if not ok]
        units = max([u for _, u, _ in checks] + ([base.tol_units] if base else []))
        threshold = base.threshold if base is not None else math.nan
        # with gates alone, elements are not in or out of tolerance one by one: the ones that
        # differ count as outside only when a gate failed
        n_out = None if base is not None else (0 if not reasons else s.n_outside)
        return Verdict(not reasons, threshold, units, "; ".join(reasons), n_out)


Rule = MagnitudeRule | AllcloseRule | ExactRule | GateRule


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def fmt_apart(x: float, y: float) -> tuple[str, str]:
    """x and y with just enough digits to tell them apart (at least three)."""
    for digits in range(2, 17):
        fx, fy = f"{x:.{digits}e}", f"{y:.{digits}e}"
        if fx != fy:
            break
    return fx, fy


def float_eps_or_f32(dtype: np.dtype) -> float:
    eps = float_eps(np.dtype(dtype))
    return max(eps if eps is not None else _EPS_FLOAT32, _EPS_FLOAT32)
