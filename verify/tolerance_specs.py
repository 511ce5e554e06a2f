"""Tolerance specs (`--tol`, suite files, archive records) parsed into rules, and the set that
picks each tensor's rule.

One spec per tensor glob (`parse_tolerance`, `ToleranceSet.from_specs`):
    PATTERN:KEY=VALUE[,KEY=VALUE...]   keys atol, rtol (allclose) or k, floor (magnitude)
    PATTERN:GATE[,GATE...]             cos>=V, sqnr>=DB, pNN_abs<=V (may follow KEY=VALUEs)
    PATTERN:exact
PATTERN is an `fnmatch` glob on the whole tensor name, case-sensitive, where `*` also matches
`/`; the last `:` splits it from the settings, so names may contain `:`. VALUE is a decimal
number (`1e-3`) or a power of two (`2^-12`). A missing atol or rtol is 0; a missing k is the
dtype's default and a missing floor comes from the producing op. The first matching spec wins.
Examples: `conv*:atol=1e-3`, `prob:atol=1e-4,rtol=1e-3`, `*:k=2^-12`, `block1/*:k=1e-3,floor=0`,
`logits:cos>=0.9999`, `*:sqnr>=40`, `*:p99_abs<=1e-3`, `out:atol=1e-3,cos>=0.999`.

Integer tensors are judged exactly unless a spec whose glob names them matches: a catch-all
glob (`*`) or the global --atol/--rtol leaves them exact, since an index, a shape or a class
id off by one is wrong; `*_QuantizeLinear_Output:atol=1` lets a QDQ model's int8 values differ
by one step. Such a rule judges the values as numbers (atol and pNN_abs in steps; rtol, k,
cos and sqnr on the raw integers, zero point included); a magnitude rule without k is refused
there (its default is a float dtype's precision). Bool tensors are always judged exactly.
`ToleranceSet.rule_for` is the one place that decides this.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

import numpy as np
from numpy.typing import DTypeLike

from verify.dtypes import dtype_kind
from verify.errors import UsageError
from verify.rules import (
    AllcloseRule,
    CosineGate,
    ExactRule,
    Gate,
    GateRule,
    MagnitudeRule,
    QuantileGate,
    Rule,
    SqnrGate,
    check_value,
)

@dataclass(frozen=True)
class ToleranceOverride:
    """One parsed `PATTERN:SETTINGS` spec."""

    pattern: str
    rule: Rule
    spec: str

    def matches(self, name: str) -> bool:
        return fnmatchcase(name, self.pattern)

    @property
    def catch_all(self) -> bool:
        """A glob of `*`s alone: written for every tensor, it names no integer tensor."""
        return set(self.pattern) == {"*"}


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
        check_value(name, value)
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
            if any(g.key == gate.key for g in gates):
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
    # the archive's stored --tol specs that a command-line --atol/--rtol set aside
    set_aside: tuple[str, ...] = ()

    @classmethod
    def from_specs(cls, specs: Iterable[str] = (), *, atol: float | None = None,
                   rtol: float | None = None) -> ToleranceSet:
        """Parse `specs`; a global atol and/or rtol replaces the magnitude default by allclose."""
        default: Rule = MagnitudeRule()
        if atol is not None or rtol is not None:
            default = AllcloseRule(atol or 0.0, rtol or 0.0)
        return cls(default, tuple(parse_tolerance(s) for s in specs))

    def notes(self, given: str = "--atol/--rtol", keep: str = "add --tol to keep one"
              ) -> tuple[str, ...]:
        """What a report says of the rules: the stored globs the command line set aside
        (`given`, `keep`: how the caller's user sets them: a suite says it otherwise)."""
        if not self.set_aside:
            return ()
        return (f"{given} replace the archive's stored tolerances ("
                + ", ".join(f"--tol {s!r}" for s in self.set_aside) + f"); {keep}",)

    def override_for(self, name: str) -> ToleranceOverride | None:
        """The first override whose glob matches `name`, or None (the default judges it)."""
        return next((o for o in self.overrides if o.matches(name)), None)

    def rule_for(self, name: str, dtype: DTypeLike, floor: float = 0.0) -> Rule:
        """The rule judging `name`, a tensor of `dtype`; `floor` (`saturating_floor`) fills an
        unset magnitude floor. Integer tensors: exact, unless a glob naming them (not a
        catch-all) matched: then its rule, on their values as numbers (UsageError naming the
        tensor and the spec where the rule cannot judge integers). Bool and other non-float
        tensors: exact."""
        dtype = np.dtype(dtype)
        kind = dtype_kind(dtype)
        o = self.override_for(name)
        if kind == "float":
            return (o.rule if o is not None else self.default).with_floor(floor)
        if kind != "int" or o is None or o.catch_all:
            return ExactRule()
        why = o.rule.why_not_integers()
        if why:
            raise UsageError(f"--tol {o.spec!r} matches integer tensor {name!r} ({dtype}): "
                             f"{why}")
        return o.rule.with_floor(floor)


def unmatched_specs(specs: Iterable[str], names: Iterable[str]) -> list[str]:
    """The --tol specs whose glob matches none of `names`: a typo ('prob:' for 'probs')
    otherwise leaves the default rule judging without a word."""
    names = list(dict.fromkeys(names))
    return [spec for spec in specs if not any(parse_tolerance(spec).matches(n) for n in names)]


def exact_anyway_notes(tolerances: ToleranceSet, judged: Iterable[tuple[str, str]]
                       ) -> list[str]:
    """A note for each --tol that matched failing integer or bool tensors (`judged`: (name,
    reference dtype) pairs) whose rule `rule_for` set aside, judging them exactly: integer
    tensors under a catch-all glob (naming them loosens them), bool tensors under a glob
    naming them (always exact; a catch-all glob is no aim at them: not noted)."""
    ints: dict[str, list[str]] = {}
    bools: dict[str, list[str]] = {}
    for name, dtype in judged:
        o = tolerances.override_for(name)
        kind = "int" if dtype.startswith(("int", "uint")) else dtype  # ml_dtypes' int4 too
        if o is None or isinstance(o.rule, ExactRule) or kind not in ("int", "bool"):
            continue
        if kind == "bool" and not o.catch_all:
            bools.setdefault(o.spec, []).append(name)
        elif kind == "int" and isinstance(tolerances.rule_for(name, np.int64), ExactRule):
            ints.setdefault(o.spec, []).append(name)
    return ([f"--tol {spec!r} left {_some(names, 'integer')} exact: a catch-all glob does not "
             f"loosen integer tensors; name them in a --tol before it, e.g. --tol "
             f"'{names[0]}:atol=1' (in integer steps)" for spec, names in ints.items()]
            + [f"--tol {spec!r} matched {_some(names, 'bool')}: they are judged exactly, as "
               "bool tensors always are" for spec, names in bools.items()])


def _some(names: list[str], kind: str) -> str:
    return (f"{len(names)} {kind} tensor(s) ({names[0]}" + (", …)" if len(names) > 1 else ")"))
