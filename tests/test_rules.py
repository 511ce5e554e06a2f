"""Tolerance rules own their verdict (verify/rules.py): `compare` and `ToleranceSet` ask the rule,
so a rule class they have never heard of judges, describes itself and takes a floor without a
branch anywhere else."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest

from verify.compare import compare
from verify.rules import AllcloseRule, ExactRule, GateRule, MagnitudeRule, SqnrGate, Verdict
from verify.scan import Scan, scan
from verify.tolerance_specs import ToleranceOverride, ToleranceSet


@dataclass(frozen=True)
class MeanRule:
    """A rule compare.py does not know: the mean |a-r| at most `limit`, the floor kept."""

    limit: float
    floor: float | None = None

    def describe(self) -> str:
        return f"mean<={self.limit:g}"

    def resolved(self, dtype: np.dtype) -> MeanRule:
        return self

    def with_floor(self, floor: float) -> MeanRule:
        return self if self.floor is not None else replace(self, floor=floor)

    def kernel_args(self) -> tuple[float, float, bool]:
        return math.inf, 0.0, False

    def scan(self, a: np.ndarray, r: np.ndarray, kd: np.dtype, eng: str, tiny: float,
             rows: np.ndarray | None = None) -> Scan:
        return scan(a, r, kd, eng, math.inf, 0.0, tiny, False, None, rows)

    def verdict(self, s: Scan, a: np.ndarray, r: np.ndarray) -> Verdict:
        mean = s.sum_abs / s.n_compared if s.n_compared else 0.0
        ok = mean <= self.limit
        return Verdict(ok, self.limit, mean / self.limit, "" if ok else f"mean {mean:.3g}", 0)


def test_a_rule_compare_never_heard_of_judges_and_describes_itself() -> None:
    r = np.linspace(-1, 1, 100, dtype=np.float32)
    a = r + np.float32(0.01)
    good, bad = compare("x", a, r, MeanRule(0.02)), compare("x", a, r, MeanRule(0.005))
    assert (good.passed, good.rule, good.tol_units) == (True, "mean<=0.02", pytest.approx(0.5))
    assert (bad.passed, bad.reason) == (False, "mean 0.01")


def test_the_set_asks_the_rule_to_take_the_producing_ops_floor() -> None:
    rules = ToleranceSet(MagnitudeRule(), (ToleranceOverride("m*", MeanRule(1.0), "m*:mean"),
                                           ToleranceOverride("g*", GateRule(
                                               (SqnrGate(40.0),), MagnitudeRule()), "g*:sqnr")))
    assert rules.rule_for("mine", np.float32, 0.0625) == MeanRule(1.0, 0.0625)
    assert rules.rule_for("other", np.float32, 0.0625) == MagnitudeRule(None, 0.0625)
    assert rules.rule_for("gated", np.float32, 0.0625).base == MagnitudeRule(None, 0.0625)
    # an explicit floor stays; rules without one are unchanged
    assert MagnitudeRule(None, 0.0).with_floor(0.0625) == MagnitudeRule(None, 0.0)
    assert AllcloseRule(1e-3).with_floor(0.0625) == AllcloseRule(1e-3)
    assert ExactRule().with_floor(0.0625) == ExactRule()
    assert GateRule((SqnrGate(40.0),)).with_floor(0.0625) == GateRule((SqnrGate(40.0),))
