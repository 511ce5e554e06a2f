"""Compare tensors: error metrics, tolerance rules, per-tensor verdicts.

Arrays in, frozen dataclasses out; this module knows nothing of archives, dumps, devices or the
CLI. `compare(name, actual, reference, rule)` returns a `TensorDiff`; a mismatch of values, shape,
dtype or NaN/Inf positions is a result (`passed=False` with a `reason`), never an exception.

Rules (each has `describe()`, the string reports show as "judged by"):
- `MagnitudeRule(k, floor)`, the default: pass iff `max|a-r| <= k * max(max|r|, floor)`. Without
  an explicit k, `k = 2^9 * eps(reference dtype)`: 2^-14 for float32 and float64 (float64 uses
  float32's eps: its references are compared against float32 runs), 2^-1 for float16, 2^2 for
  bfloat16. 2^9 eps is 3.1x the worst benign cross-platform noise measured in float32; for
  bfloat16 a k above 1 only catches gross blow-ups. `floor` is `SATURATION_FLOOR` (1/16) for
  outputs of saturating ops (see `saturating_floor`), else 0.
- `AllcloseRule(atol, rtol)`: pass iff `|a-r| <= atol + rtol*|r|` for every element.
- `ExactRule()`: every element equal. Integer and bool tensors are always judged exactly.
Everywhere: shapes and dtypes must match, and NaN/Inf must sit at the same places (NaN against
NaN, +Inf against +Inf is fine). Numeric metrics are taken over the elements finite on both sides.

- `GateRule(gates, base)`: metric gates that must all hold, and the value rule `base` too when
  one is given: `CosineGate` (`cos>=V`), `SqnrGate` (`sqnr>=DB`, decibels), `QuantileGate`
  (`pNN_abs<=V`: the NN-th percentile of |a-r|, so a few outliers may exceed V). Made for
  quantized and fp16 models, whose errors are judged in aggregate.
Each rule owns its verdict: `resolved(dtype)` fills its defaults, `scan` reads the arrays,
`verdict(scan, a, r)` returns a `Verdict`; a new key is one class, not a branch in `compare`.

Tolerance overrides (`parse_tolerance`, `ToleranceSet.from_specs`), one spec per tensor glob:
    PATTERN:KEY=VALUE[,KEY=VALUE...]   keys atol, rtol (allclose) or k, floor (magnitude)
    PATTERN:GATE[,GATE...]             cos>=V, sqnr>=DB, pNN_abs<=V (may follow KEY=VALUEs)
    PATTERN:exact
PATTERN is an `fnmatch` glob on the whole tensor name, case-sensitive, where `*` also matches
`/`; the last `:` splits it from the settings, so names may contain `:`. VALUE is a decimal
number (`1e-3`) or a power of two (`2^-12`). A missing atol or rtol is 0; a missing k is the
dtype's default and a missing floor comes from the producing op. The first matching spec wins.
Examples: `conv*:atol=1e-3`, `prob:atol=1e-4,rtol=1e-3`, `*:k=2^-12`, `block1/*:k=1e-3,floor=0`,
`logits:cos>=0.9999`, `*:sqnr>=40`, `*:p99_abs<=1e-3`, `out:atol=1e-3,cos>=0.999`.

Metrics (`TensorDiff`): max|a-r|; max relative error `max(|a-r| / max(|r|, tiny))` elementwise,
tiny = smallest normal of the reference dtype (1 for integers) — when that exceeds 1/eps (an
element of r near zero: 1e-7 over 1e-38 reads 1e+31) it is taken again against
`max(|r|, eps * max|r|)`; mean|a-r|; cosine similarity
from float64 sums, as `1 - (sum d^2 - (|a|-|r|)^2) / (2|a||r|)`, which keeps full precision near
1 (1.0 when both are all zero, 0.0 when only one is); SQNR `10*log10(sum r^2 / sum (a-r)^2)` dB
(+inf when equal); `tol_units`, the error in tolerance units (`max|a-r| / threshold`; for
allclose the largest elementwise `|a-r| / (atol + rtol*|r|)`); `n_outside`, the elements
outside the rule (for the magnitude rule, above its threshold; for exact rules, unequal) plus
NaN/Inf mismatches; NaN and Inf counts on each side. Metrics that cannot be computed (shapes
differ) are NaN. `to_dict()` renders non-finite floats as the strings "nan", "inf" and "-inf",
so the JSON stays strict. `note` flags a float reference that is all zero or one constant:
cosine and relative error mean nothing there, and a constant wrong output may pass.

Speed (the kernel lives in verify/scan.py): one streaming pass over both arrays in blocks, no
full-size temporaries (a tensor failing the magnitude rule gets a second pass over its failing
blocks, to count them). The fused numba kernel (parallel over blocks, float64 accumulators) runs at
memory bandwidth, about 10x the numpy blocked engine, with the same results (identical maxima,
counts and verdicts; sums to ~1e-13). Numba costs ~0.7 s once per process (import, loading its
cached code; 2 s more to compile on a cold cache), so `engine="auto"` stays on numpy until
`NUMBA_AFTER_BYTES` have been compared in the process, or from the start once a caller announced a
job of `NUMBA_UPFRONT_BYTES` or more (`expect_bytes`: where the kernel pays its load back), and for
tensor pairs under 64 KiB. `VERIFY_NO_NUMBA=1` keeps auto on numpy.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import numpy as np

from verify.errors import UsageError
from verify.scan import (NUMBA_AFTER_BYTES, NUMBA_UPFRONT_BYTES, Batch, Engine, Scan,
                         choose_engine,
                         cosine, count_unequal, dtype_kind, dtype_name, expect_bytes, float_eps,
                         numba_available, scan, sqnr_db, tiny_of)

__all__ = [
    "NUMBA_AFTER_BYTES", "NUMBA_UPFRONT_BYTES", "SATURATING_OPS", "SATURATION_FLOOR",
    "SHAPE_ONLY_OPS", "AllcloseRule", "CosineGate", "ExactRule", "GateRule", "MagnitudeRule",
    "QuantileGate", "Rule", "SqnrGate", "TensorDiff", "Verdict", "abs_error_quantile",
    "ToleranceOverride", "ToleranceSet", "TopKAgreement", "compare",
    "expect_bytes", "first_divergent", "json_safe", "numba_available", "parse_tolerance",
    "saturating_floor", "topk_agreement",
]

# --- tolerance rules --------------------------------------------------------------------------

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


def _check_value(key: str, value: float, positive: bool = False) -> None:
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
            _check_value("k", self.k, positive=True)
        if self.floor is not None:
            _check_value("floor", self.floor)

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

    def kernel_args(self) -> tuple[float, float, bool]:
        return math.inf, 0.0, False

    def scan(self, a: np.ndarray, r: np.ndarray, kd: np.dtype, eng: str, tiny: float,
             rows: np.ndarray | None = None) -> Scan:
        return scan(a, r, kd, eng, math.inf, 0.0, tiny, False,
                    lambda peak: self.threshold(peak, r.dtype), rows)

    def verdict(self, s: Scan, a: np.ndarray, r: np.ndarray) -> Verdict:
        threshold = self.threshold(s.ref_peak, r.dtype)
        ok = s.max_abs <= threshold
        why = "" if ok else "max|a-r| {} > {}".format(*_fmt_apart(s.max_abs, threshold))
        return Verdict(ok, threshold, _ratio(s.max_abs, threshold), why)


@dataclass(frozen=True)
class AllcloseRule:
    """Pass iff |a-r| <= atol + rtol*|r| for every element."""

    atol: float = 0.0
    rtol: float = 0.0

    def __post_init__(self) -> None:
        _check_value("atol", self.atol)
        _check_value("rtol", self.rtol)

    def describe(self) -> str:
        return f"allclose atol={_fmt_num(self.atol)} rtol={_fmt_num(self.rtol)}"

    def resolved(self, dtype: np.dtype) -> AllcloseRule:
        return self

    def kernel_args(self) -> tuple[float, float, bool]:
        return self.atol, self.rtol, True

    def scan(self, a: np.ndarray, r: np.ndarray, kd: np.dtype, eng: str, tiny: float,
             rows: np.ndarray | None = None) -> Scan:
        return scan(a, r, kd, eng, self.atol, self.rtol, tiny, True, None, rows)

    def verdict(self, s: Scan, a: np.ndarray, r: np.ndarray) -> Verdict:
        ok = s.n_outside == 0
        why = "" if ok else (f"{s.n_outside} of {_plural(int(a.size), 'element')} outside "
                             f"{self.describe()} (max|a-r| {s.max_abs:.2e}, {s.max_tr:.3g} "
                             "tolerance units)")
        return Verdict(ok, self.atol + self.rtol * s.ref_peak, s.max_tr, why)


@dataclass(frozen=True)
class ExactRule:
    """Pass iff every element is equal (integers and bools always use this)."""

    def describe(self) -> str:
        return "exact"

    def resolved(self, dtype: np.dtype) -> ExactRule:
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
            why = f"{s.n_outside} of {_plural(int(a.size), 'element')} differ"
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


@dataclass(frozen=True)
class ToleranceOverride:
    """One parsed `PATTERN:SETTINGS` spec."""

    pattern: str
    rule: Rule
    spec: str

    def matches(self, name: str) -> bool:
        return fnmatchcase(name, self.pattern)


_POW2 = re.compile(r"2\s*(?:\^|\*\*)\s*([+-]?\d+)")


def _parse_number(spec: str, text: str) -> float:
    m = _POW2.fullmatch(text)
    if m:
        return 2.0 ** int(m.group(1))
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UsageError(f"bad tolerance {spec!r}: {text!r} is not a number (write 1e-3 or 2^-12)")
    return value


_GATE = re.compile(r"(cos|sqnr|p(\d+(?:\.\d+)?)_abs)\s*(>=|<=)\s*(.+)")
_GATE_OP = {"cos": ">=", "sqnr": ">=", "p": "<="}


def _parse_gate(spec: str, item: str) -> Gate:
    m = _GATE.fullmatch(item)
    if m is None:
        raise UsageError(f"bad tolerance {spec!r}: unknown gate {item!r} "
                         "(use cos>=V, sqnr>=DB or pNN_abs<=V)")
    name, q, op, text = m.group(1), m.group(2), m.group(3), m.group(4).strip()
    want = _GATE_OP["p" if q is not None else name]
    if op != want:
        raise UsageError(f"bad tolerance {spec!r}: write {name}{want}{text}")
    value = _parse_number(spec, text.removesuffix("dB").strip())
    if name == "cos":
        if not -1.0 <= value <= 1.0:
            raise UsageError(f"bad tolerance {spec!r}: cos>= takes a value in [-1, 1]")
        return CosineGate(value)
    if name == "sqnr":
        return SqnrGate(value)
    quantile = float(q)  # type: ignore[arg-type]
    if not 0.0 <= quantile <= 100.0:
        raise UsageError(f"bad tolerance {spec!r}: the percentile in {name} must lie in [0, 100]")
    try:
        _check_value(name, value)
    except UsageError as exc:
        raise UsageError(f"bad tolerance {spec!r}: {exc}") from None
    return QuantileGate(quantile, value)


def parse_tolerance(spec: str) -> ToleranceOverride:
    """Parse one `PATTERN:KEY=VALUE[,...]`, `PATTERN:GATE[,...]` or `PATTERN:exact` spec;
    UsageError names the bad one."""
    pattern, sep, settings = spec.rpartition(":")
    pattern, settings = pattern.strip(), settings.strip()
    if not sep or not settings:
        raise UsageError(f"bad tolerance {spec!r}: expected PATTERN:KEY=VALUE[,KEY=VALUE...] "
                         "with keys atol, rtol, k, floor, gates cos>=, sqnr>=, pNN_abs<=, "
                         "or PATTERN:exact")
    if not pattern:
        raise UsageError(f"bad tolerance {spec!r}: empty tensor-name pattern before ':'")
    if settings == "exact":
        return ToleranceOverride(pattern, ExactRule(), spec)
    values: dict[str, float] = {}
    gates: list[Gate] = []
    for item in settings.split(","):
        item = item.strip()
        if ">=" in item or "<=" in item:
            gate = _parse_gate(spec, item)
            if any(type(g) is type(gate) for g in gates):
                raise UsageError(f"bad tolerance {spec!r}: {gate.key!r} given twice")
            gates.append(gate)
            continue
        key, eq, text = (s.strip() for s in item.partition("="))
        if not eq:
            raise UsageError(f"bad tolerance {spec!r}: expected KEY=VALUE, got {item!r}")
        if key not in ("atol", "rtol", "k", "floor"):
            raise UsageError(f"bad tolerance {spec!r}: unknown key {key!r} "
                             "(use atol, rtol, k, floor, cos>=, sqnr>=, pNN_abs<= or exact)")
        if key in values:
            raise UsageError(f"bad tolerance {spec!r}: {key!r} given twice")
        values[key] = _parse_number(spec, text)
    if values.keys() & {"atol", "rtol"} and values.keys() & {"k", "floor"}:
        raise UsageError(
            f"bad tolerance {spec!r}: atol/rtol and k/floor cannot be mixed in one rule")
    try:
        base: MagnitudeRule | AllcloseRule | None = (
            MagnitudeRule(values.get("k"), values.get("floor")) if values.keys() & {"k", "floor"}
            else AllcloseRule(values.get("atol", 0.0), values.get("rtol", 0.0)) if values
            else None)
    except UsageError as exc:
        raise UsageError(f"bad tolerance {spec!r}: {exc}") from None
    rule: Rule = GateRule(tuple(gates), base) if gates else base  # type: ignore[assignment]
    return ToleranceOverride(pattern, rule, spec)


@dataclass(frozen=True)
class ToleranceSet:
    """The rule for each tensor: the first override whose glob matches its name, else default."""

    default: Rule = MagnitudeRule()
    overrides: tuple[ToleranceOverride, ...] = ()

    @classmethod
    def from_specs(cls, specs: Iterable[str] = (), *, atol: float | None = None,
                   rtol: float | None = None) -> ToleranceSet:
        """Parse `specs`; a global atol and/or rtol replaces the magnitude default by allclose."""
        default: Rule = MagnitudeRule()
        if atol is not None or rtol is not None:
            default = AllcloseRule(atol or 0.0, rtol or 0.0)
        return cls(default, tuple(parse_tolerance(s) for s in specs))

    def rule_for(self, name: str, floor: float = 0.0) -> Rule:
        """The rule judging `name`; `floor` (`saturating_floor`) fills an unset magnitude floor."""
        rule = next((o.rule for o in self.overrides if o.matches(name)), self.default)
        if isinstance(rule, MagnitudeRule) and rule.floor is None:
            rule = dataclasses.replace(rule, floor=floor)
        if isinstance(rule, GateRule) and isinstance(rule.base, MagnitudeRule) \
                and rule.base.floor is None:
            rule = GateRule(rule.gates, dataclasses.replace(rule.base, floor=floor))
        return rule


# --- results ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TopKAgreement:
    """Agreement of classifier-shaped outputs, row by row (a 1-D tensor is one row).

    top1: fraction of rows with the same argmax; top5: fraction whose sets of the 5 largest
    entries (all of them when a row is shorter) are equal, order ignored.
    """

    rows: int
    top1: float
    top5: float


@dataclass(frozen=True)
class TensorDiff:
    """The verdict and metrics for one tensor pair (actual a, reference r)."""

    name: str
    passed: bool
    rule: str
    reason: str
    actual_shape: tuple[int, ...]
    reference_shape: tuple[int, ...]
    actual_dtype: str
    reference_dtype: str
    size: int
    max_abs: float
    max_rel: float
    mean_abs: float
    cosine: float
    sqnr_db: float
    ref_peak: float
    threshold: float
    tol_units: float
    n_outside: int
    frac_outside: float
    nan_actual: int
    nan_reference: int
    inf_actual: int
    inf_reference: int
    nonfinite_mismatch: int
    topk: TopKAgreement | None = None
    note: str = ""  # e.g. "reference is all zero": the check can tell little

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: tuples become lists, non-finite floats the strings nan/inf/-inf."""
        return json_safe(dataclasses.asdict(self))


def json_safe(value: Any) -> Any:
    """Non-finite floats as the strings nan/inf/-inf, recursively (strict JSON)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# --- comparing --------------------------------------------------------------------------------

def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _fmt_apart(x: float, y: float) -> tuple[str, str]:
    """x and y with just enough digits to tell them apart (at least three)."""
    for digits in range(2, 17):
        fx, fy = f"{x:.{digits}e}", f"{y:.{digits}e}"
        if fx != fy:
            break
    return fx, fy


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def topk_agreement(actual: np.ndarray, reference: np.ndarray) -> TopKAgreement | None:
    """Top-1/top-5 agreement for classifier-shaped outputs (ndim 1 or 2, last axis >= 2,
    same shape, real numbers); None for anything else."""
    a, r = np.asarray(actual), np.asarray(reference)
    if (a.shape != r.shape or a.ndim not in (1, 2) or a.shape[-1] < 2
            or dtype_kind(a.dtype) not in ("float", "int")
            or dtype_kind(r.dtype) not in ("float", "int")):
        return None
    a2 = a.reshape(-1, a.shape[-1]).astype(np.float64)
    r2 = r.reshape(-1, r.shape[-1]).astype(np.float64)
    rows = a2.shape[0]
    if rows == 0:
        return TopKAgreement(0, 1.0, 1.0)
    top1 = float(np.mean(a2.argmax(axis=1) == r2.argmax(axis=1)))
    k = min(5, a2.shape[1])
    sa = np.sort(np.argpartition(-a2, k - 1, axis=1)[:, :k], axis=1)
    sr = np.sort(np.argpartition(-r2, k - 1, axis=1)[:, :k], axis=1)
    return TopKAgreement(rows, top1, float(np.mean((sa == sr).all(axis=1))))


def compare(name: str, actual: Any, reference: Any, rule: Rule | None = None, *,
            topk: bool = False, engine: Engine = "auto") -> TensorDiff:
    """Judge `actual` against `reference` with `rule` (default `MagnitudeRule()`, floor 0).

    Integer and bool tensors are judged exactly whatever the rule. `topk` adds top-1/top-5
    agreement for classifier-shaped outputs. `engine` picks the kernel (see the module doc).
    """
    p = _prepare(name, actual, reference, rule, engine)
    return p if isinstance(p, TensorDiff) else _finish(p, topk)


BatchItem = tuple[str, np.ndarray, np.ndarray, "Rule | None", bool, tuple[int, int]]


def compare_batch(items: Sequence[BatchItem], batch: Batch,
                  engine: Engine = "auto") -> list[TensorDiff]:
    """`compare` for many small pairs held in `batch` (name, actual, reference, rule, topk and
    the span `Batch.add` gave), in order: the kernel runs once per engine and rule setting
    over all of them, and each diff is identical to `compare`'s on that pair alone."""
    prepared = [_prepare(name, a, r, rule, engine) for name, a, r, rule, _, _ in items]
    groups: dict[tuple[str, float, float, float, bool], list[int]] = {}
    for i, p in enumerate(prepared):
        if (isinstance(p, _Prepared) and p.kd == np.float32 and p.a.dtype == np.float32
                and p.r.dtype == np.float32):
            groups.setdefault((p.eng, *p.judge.kernel_args()[:2], tiny_of(p.r.dtype),
                               p.judge.kernel_args()[2]), []).append(i)
    rows: dict[int, np.ndarray] = {}
    for (eng, atol, rtol, tiny, want_tr), idx in groups.items():
        got = batch.rows([items[i][5] for i in idx], eng, atol, rtol, tiny, want_tr)
        rows.update(zip(idx, got, strict=True))
    return [p if isinstance(p, TensorDiff) else _finish(p, items[i][4], rows.get(i))
            for i, p in enumerate(prepared)]


@dataclass(frozen=True)
class _Prepared:
    """A pair past the checks that need no pass over the data, its engine chosen."""

    a: np.ndarray
    r: np.ndarray
    judge: Rule
    base: dict[str, Any]
    reasons: list[str]
    kr: str
    kd: np.dtype
    eng: str


def _prepare(name: str, actual: Any, reference: Any, rule: Rule | None,
             engine: Engine) -> TensorDiff | _Prepared:
    a, r = np.asarray(actual), np.asarray(reference)
    rule = rule if rule is not None else MagnitudeRule()
    shape_a, shape_r = tuple(int(s) for s in a.shape), tuple(int(s) for s in r.shape)
    ka, kr = dtype_kind(a.dtype), dtype_kind(r.dtype)
    judge: Rule = (ExactRule() if kr in ("int", "bool", "other") else rule).resolved(r.dtype)
    nan = math.nan
    base: dict[str, Any] = {
        "name": name, "rule": judge.describe(), "actual_shape": shape_a,
        "reference_shape": shape_r, "actual_dtype": dtype_name(a.dtype),
        "reference_dtype": dtype_name(r.dtype)}
    if shape_a != shape_r:
        return TensorDiff(**base, passed=False,
                          reason=f"shape {_fmt_shape(shape_a)} vs {_fmt_shape(shape_r)}",
                          size=0, max_abs=nan, max_rel=nan, mean_abs=nan, cosine=nan,
                          sqnr_db=nan, ref_peak=nan, threshold=nan, tol_units=nan, n_outside=0,
                          frac_outside=nan, nan_actual=0, nan_reference=0, inf_actual=0,
                          inf_reference=0, nonfinite_mismatch=0)
    reasons = []
    if a.dtype != r.dtype:
        reasons.append(f"dtype {base['actual_dtype']} vs {base['reference_dtype']}")
    size = int(a.size)

    if "other" in (ka, kr):  # strings, objects, complex: equality only
        try:
            n_out = int(np.count_nonzero(a != r))
        except (TypeError, ValueError):
            n_out = size
        if n_out:
            reasons.append(f"{n_out} of {_plural(size, 'element')} differ")
        return TensorDiff(**base, passed=not reasons, reason="; ".join(reasons), size=size,
                          max_abs=nan, max_rel=nan, mean_abs=nan, cosine=nan, sqnr_db=nan,
                          ref_peak=nan, threshold=0.0, tol_units=0.0 if not n_out else math.inf,
                          n_outside=n_out, frac_outside=n_out / size if size else 0.0,
                          nan_actual=0, nan_reference=0, inf_actual=0, inf_reference=0,
                          nonfinite_mismatch=0)

    small_float = all(dtype_kind(d) == "float" and d.itemsize <= 4 for d in (a.dtype, r.dtype))
    kd = np.dtype(np.float32 if small_float else np.float64)
    eng = choose_engine(engine, a.nbytes + r.nbytes)
    return _Prepared(a, r, judge, base, reasons, kr, kd, eng)


def _finish(p: _Prepared, topk: bool, rows: np.ndarray | None = None) -> TensorDiff:
    a, r, judge, reasons, kr = p.a, p.r, p.judge, p.reasons, p.kr
    size = int(a.size)
    s = judge.scan(a, r, p.kd, p.eng, tiny_of(r.dtype), rows)
    v = judge.verdict(s, a, r)
    threshold, tol_units = v.threshold, v.tol_units
    if kr == "float" and s.max_rel * float_eps_or_f32(r.dtype) > 1.0:
        # driven by references near zero (|a-r| of 1e-7 over an r of 1e-38 reads 1e+31):
        # measure relative error against max(|r|, eps * max|r|) instead
        s = dataclasses.replace(s, max_rel=_max_rel_floored(a, r, s.ref_peak))
    if s.nonfinite_mismatch:
        reasons.append(f"NaN/Inf positions differ at {_plural(s.nonfinite_mismatch, 'element')} "
                       f"(NaN {s.nan_a} vs {s.nan_r}, Inf {s.inf_a} vs {s.inf_r})")
    if not v.ok:
        reasons.append(v.reason)
    n_outside = (s.n_outside if v.n_outside is None else v.n_outside) + s.nonfinite_mismatch
    return TensorDiff(
        **p.base, passed=not reasons, reason="; ".join(reasons), size=size,
        max_abs=s.max_abs, max_rel=s.max_rel,
        mean_abs=s.sum_abs / s.n_compared if s.n_compared else 0.0,
        cosine=cosine(s.sum_aa, s.sum_rr, s.sum_dd), sqnr_db=sqnr_db(s.sum_rr, s.sum_dd),
        ref_peak=s.ref_peak, threshold=threshold, tol_units=tol_units, n_outside=n_outside,
        frac_outside=n_outside / size if size else 0.0, nan_actual=s.nan_a,
        nan_reference=s.nan_r, inf_actual=s.inf_a, inf_reference=s.inf_r,
        nonfinite_mismatch=s.nonfinite_mismatch,
        topk=topk_agreement(a, r) if topk else None,
        note=_constant_note(r, s) if kr == "float" else "")


def float_eps_or_f32(dtype: np.dtype) -> float:
    eps = float_eps(np.dtype(dtype))
    return max(eps if eps is not None else _EPS_FLOAT32, _EPS_FLOAT32)


def _max_rel_floored(a: np.ndarray, r: np.ndarray, ref_peak: float) -> float:
    """max |a-r| / max(|r|, eps * max|r|) over the elements finite on both sides."""
    floor = max(float_eps_or_f32(r.dtype) * ref_peak, tiny_of(r.dtype))
    worst = 0.0
    fa, fr = a.reshape(-1), r.reshape(-1)
    for lo in range(0, fa.size, 1 << 20):
        x = fa[lo:lo + (1 << 20)].astype(np.float64)
        y = fr[lo:lo + (1 << 20)].astype(np.float64)
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.any():
            d = np.abs(x[ok] - y[ok]) / np.maximum(np.abs(y[ok]), floor)
            worst = max(worst, float(d.max()))
    return worst


def _constant_note(r: np.ndarray, s: Scan) -> str:
    """A reference that is all zero or one constant tells little: cosine and relative errors
    mean nothing there, and any output that is constant too may pass. Say so."""
    if r.size < 2 or s.nan_r or s.inf_r:
        return ""
    if s.ref_peak == 0.0:
        return "reference is all zero"
    flat = r.reshape(-1)
    first = flat[0]
    # a strided sample first, so a varying tensor costs nothing more than a few reads
    if not np.all(flat[:: max(1, flat.size // 64)] == first):
        return ""
    if np.all(flat == first):
        return f"reference is constant ({float(first):.6g} everywhere)"
    return ""


def tol_rank(d: TensorDiff) -> float:
    """How bad a tensor is, for ranking: its error in tolerance units; a failing tensor with no
    figure (another shape or dtype, NaN where the reference has none) ranks worst of all, a
    passing one with no figure lowest."""
    if math.isnan(d.tol_units):
        return math.inf if not d.passed else -1.0
    return d.tol_units


def first_divergent(diffs: Iterable[TensorDiff]) -> TensorDiff | None:
    """The first failing diff in the given order (the caller orders them topologically)."""
    return next((d for d in diffs if not d.passed), None)
