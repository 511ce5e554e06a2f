"""`--tol` specs parsed into the rules that judge (compare.parse_tolerance), gates included, and
the verdicts those rules give on small arrays. Unit-level and fast: the holes mutation testing
of verify/compare.py found (docs/mutation.md); the gates on real models are in
tests/test_corpus_gates.py."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from verify.compare import (AllcloseRule, CosineGate, ExactRule, GateRule, MagnitudeRule,
                            QuantileGate, SqnrGate, compare, numba_available,
                            parse_tolerance)
from verify.errors import UsageError


@pytest.mark.parametrize("spec, rule", [
    ("x:exact", ExactRule()),
    ("x:floor=0.5", MagnitudeRule(None, 0.5)),           # floor alone is the magnitude rule
    ("x:k=2^-12", MagnitudeRule(2.0 ** -12, None)),
    ("x:rtol=1e-3", AllcloseRule(0.0, 1e-3)),
    ("x:cos>=0.99", GateRule((CosineGate(0.99),), None)),
    ("x: sqnr >= 40dB", GateRule((SqnrGate(40.0),), None)),
    ("x:p99_abs<=2^-10", GateRule((QuantileGate(99.0, 2.0 ** -10),), None)),
    ("x:atol=1e-3,cos>=0.9,p50.5_abs<=1e-4",
     GateRule((CosineGate(0.9), QuantileGate(50.5, 1e-4)), AllcloseRule(1e-3, 0.0))),
    ("x:sqnr>=30,k=1e-3", GateRule((SqnrGate(30.0),), MagnitudeRule(1e-3, None))),
    # the ends of each range are in it: cos in [-1, 1], the percentile in [0, 100]
    ("x:cos>=1", GateRule((CosineGate(1.0),), None)),
    ("x:cos>=-1", GateRule((CosineGate(-1.0),), None)),
    ("x:p100_abs<=0", GateRule((QuantileGate(100.0, 0.0),), None)),
    ("x:p0_abs<=1", GateRule((QuantileGate(0.0, 1.0),), None)),
    ("x:p0.5_abs<=1", GateRule((QuantileGate(0.5, 1.0),), None)),
])
def test_specs_parse_into_their_rules(spec: str, rule: object) -> None:
    parsed = parse_tolerance(spec)
    assert (parsed.pattern, parsed.rule, parsed.spec) == ("x", rule, spec)


@pytest.mark.parametrize("spec, message", [
    ("x:cos>=0.9,cos>=0.8", "'cos>=' given twice"),
    ("x:sqnr>=30,sqnr>=20", "'sqnr>=' given twice"),
    ("x:rtol=1e-3,floor=0", "atol/rtol and k/floor cannot be mixed in one rule"),
    ("x:atol=1,floor=0", "atol/rtol and k/floor cannot be mixed in one rule"),
    ("x:rtol=1,k=2^-12", "atol/rtol and k/floor cannot be mixed in one rule"),
    ("x:atol==1", "'=1' is not a number (write 1e-3 or 2^-12)"),
    ("x:cos<=0.9", "write cos>=0.9"),
    ("x:p99_abs>=1", "write p99_abs<=1"),
    ("x:p100.5_abs<=1", "the percentile in p100.5_abs must lie in [0, 100]"),
    ("x:p50_abs<=-1", "p50_abs must be finite and >= 0, got -1"),
    ("x:cos>=-1.5", "cos>= takes a value in [-1, 1]"),
    ("x:cos>=1.5", "cos>= takes a value in [-1, 1]"),
    ("x:floor=-1", "floor must be finite and >= 0, got -1"),
    ("x:k=0", "k must be finite and > 0, got 0"),
    ("x:cos>=high", "'high' is not a number (write 1e-3 or 2^-12)"),
    ("x:sqnr>=40 dBm", "'40 dBm' is not a number (write 1e-3 or 2^-12)"),
    ("x:snr>=3", "unknown gate 'snr>=3' (use cos>=V, sqnr>=DB or pNN_abs<=V)"),
])
def test_bad_specs_name_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_tolerance(spec)
    assert str(e.value) == f"bad tolerance {spec!r}: {message}"


def test_gates_judge_alone_and_beside_a_value_rule() -> None:
    rng = np.random.default_rng(3)
    r = rng.standard_normal(1000).astype(np.float32)
    a = r.copy()
    a[:10] += np.float32(0.5)  # ten outliers, the bulk exact
    rule = parse_tolerance("x:p50_abs<=1e-6").rule
    d = compare("x", a, r, rule)
    assert d.passed and d.n_outside == 0 and d.rule == "p50_abs<=1e-06"
    d = compare("x", a, r, parse_tolerance("x:p99.5_abs<=1e-6").rule)
    assert not d.passed and d.reason.startswith("p99.5|a-r| 0.5 > 1e-06") and d.n_outside == 10
    both = compare("x", a, r, parse_tolerance("x:atol=0.1,p50_abs<=1e-6").rule)
    assert not both.passed and both.reason.startswith("10 of 1000 elements outside allclose")
    assert both.rule == "allclose atol=0.1 rtol=0 + p50_abs<=1e-06"
    cos = compare("x", a, r, parse_tolerance("x:cos>=0.999999").rule)
    assert not cos.passed and cos.reason.startswith("cos 0.99")
    assert compare("x", a, r, parse_tolerance("x:cos>=0.99,sqnr>=10").rule).passed
    db = compare("x", a, r, parse_tolerance("x:sqnr>=40").rule)
    assert not db.passed and db.reason.endswith("dB < 40 dB") and db.tol_units > 1


def test_gates_hold_at_their_bound_and_rank_by_their_distance_from_it() -> None:
    """A gate holds when the figure equals its bound (`sqnr>=20` at exactly 20 dB, `p50_abs<=V`
    at exactly V), and `tol_units` (what diff --top and localize rank by) is the distance from
    the gate: 10 dB better than asked is 0.1, an equal tensor 0, a reference of zeros against
    a nonzero actual infinitely bad."""
    r = np.zeros(100, np.float32)
    r[0] = 10.0
    a = r.copy()
    a[1] = 1.0  # sum r^2 / sum (a-r)^2 = 100: 20 dB exactly
    at = compare("x", a, r, parse_tolerance("x:sqnr>=20").rule)
    assert at.sqnr_db == 20.0 and at.passed and at.tol_units == pytest.approx(1.0)
    better = compare("x", a, r, parse_tolerance("x:sqnr>=10").rule)
    assert better.passed and better.tol_units == pytest.approx(0.1, rel=1e-12)
    worse = compare("x", a, r, parse_tolerance("x:sqnr>=30").rule)
    assert not worse.passed and worse.tol_units == pytest.approx(10.0, rel=1e-12)
    equal = compare("x", r, r, parse_tolerance("x:sqnr>=30").rule)
    assert equal.passed and equal.sqnr_db == math.inf and equal.tol_units == 0.0
    zeros = np.zeros(4, np.float32)
    lost = compare("x", zeros + np.float32(1), zeros, parse_tolerance("x:sqnr>=30").rule)
    assert not lost.passed and lost.sqnr_db == -math.inf and lost.tol_units == math.inf
    # the median of |a-r| exactly at the bound: 2^-10 on every element (exact in float32)
    q = np.linspace(1.0, 2.0, 64).astype(np.float32)
    off = q + np.float32(2.0 ** -10)
    assert np.all(np.abs(off.astype(np.float64) - q) == 2.0 ** -10)
    held = compare("x", off, q, parse_tolerance("x:p50_abs<=2^-10").rule)
    assert held.passed and held.tol_units == 1.0
    assert not compare("x", off, q, parse_tolerance("x:p50_abs<=2^-11").rule).passed


def test_a_quantile_gate_on_a_tensor_with_no_finite_element_holds() -> None:
    """An output masked to NaN on both sides (same places) has no finite error to take a
    percentile of: nothing differs, so the gate holds (0, not an error or a NaN verdict)."""
    r = np.full((2, 3), np.nan, np.float32)
    d = compare("masked", r, r.copy(), parse_tolerance("masked:p99_abs<=1e-3").rule)
    assert d.passed and d.tol_units == 0.0 and d.reason == ""


def test_a_gate_beside_a_value_rule_reports_both() -> None:
    """`out:atol=...,cos>=...`: the value rule's threshold and units are the diff's (the gate
    has no threshold of its own), the worse of the two units ranks it, every failing part is
    named, and a magnitude rule beside a gate takes its k from the tensor's dtype."""
    r = np.linspace(1.0, 2.0, 100).astype(np.float32)
    a = r + np.float32(0.01)  # cos stays ~1; 0.01 is ten times atol=1e-3
    both = compare("x", a, r, parse_tolerance("x:atol=1e-3,cos>=0.9").rule)
    assert not both.passed and both.reason.startswith("100 of 100 elements outside allclose")
    assert both.threshold == pytest.approx(1e-3) and both.tol_units == pytest.approx(10, rel=1e-3)
    ok = compare("x", a, r, parse_tolerance("x:atol=0.1,cos>=0.9").rule)
    assert ok.passed and ok.threshold == pytest.approx(0.1) and ok.n_outside == 0
    # two gates failing: both named, in order
    two = compare("x", a, r, parse_tolerance("x:cos>=1,sqnr>=80").rule)
    assert not two.passed and math.isnan(two.threshold)
    cos_why, sqnr_why = two.reason.split("; ")
    assert cos_why.startswith("cos ") and cos_why.endswith(" < 1")
    assert sqnr_why.startswith("sqnr ") and sqnr_why.endswith(" dB < 80 dB")
    # a magnitude rule with a gate: float16's k (2^-1), not float32's (2^-14)
    h = np.linspace(1.0, 2.0, 100).astype(np.float16)
    off = h + np.float16(2.0 ** -6)  # 1/64 off at a peak of 2: inside 2^-1 * 2, outside 2^-14 * 2
    mag = compare("x", off, h, parse_tolerance("x:floor=0,cos>=0.9").rule)
    assert mag.passed and mag.threshold == 1.0 and mag.rule == "magnitude k=0.5 + cos>=0.9"


@pytest.mark.filterwarnings("ignore:overflow encountered in dot")  # scan.py's float64 sums
def test_a_cosine_gate_at_its_bound_and_its_distance_from_it() -> None:
    """cos>=1 holds for equal tensors (the bound itself); tol_units is (1-cos)/(1-min): a
    tensor at cos 0.999 under cos>=0.99 is at 0.1; a cosine that cannot be computed (float64
    squares past 1e308) fails the gate and ranks infinitely bad."""
    r = np.linspace(-1.0, 1.0, 101)
    assert compare("x", r, r.copy(), parse_tolerance("x:cos>=1").rule).passed
    a = r + 0.045 * np.cos(np.arange(101))
    d = compare("x", a, r, parse_tolerance("x:cos>=0.99").rule)
    assert d.passed and d.tol_units == pytest.approx((1.0 - d.cosine) / 0.01, rel=1e-9)
    assert 0.01 < d.tol_units < 1.0
    for size in (4, 100_000):  # squares past float64's range: NaN, and no numpy warning
        huge = np.full(size, 1e200)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            n = compare("x", huge, huge * 1.5, parse_tolerance("x:cos>=0.9").rule)
        assert math.isnan(n.cosine) and not n.passed and n.tol_units == math.inf


@pytest.mark.parametrize("engine", ["numpy"] + (["numba"] if numba_available() else []))
def test_an_fp16_output_judged_by_gates_is_measured_in_float32_or_wider(engine: str) -> None:
    """Gates are made for fp16 and quantized models: an fp16 output's SQNR, cosine and
    max|a-r| are those of float64 arithmetic on its values (float16 sums of 4096 squares
    would be off in their third digit), and an allclose rule reports its threshold
    atol + rtol * max|r|."""
    rng = np.random.default_rng(5)
    r = rng.uniform(-40.0, 40.0, 4096).astype(np.float16)
    a = (r.astype(np.float32) + rng.normal(0.0, 0.05, 4096).astype(np.float32)).astype(np.float16)
    x, y = a.astype(np.float64), r.astype(np.float64)
    want_db = 10.0 * math.log10(float(np.sum(y * y)) / float(np.sum((x - y) ** 2)))
    d = compare("logits", a, r, parse_tolerance("logits:sqnr>=40,cos>=0.999").rule,
                engine=engine)  # type: ignore[arg-type]
    assert d.sqnr_db == pytest.approx(want_db, abs=1e-6)
    assert d.max_abs == float(np.max(np.abs(x - y)))
    assert d.passed == (want_db >= 40)
    allc = compare("logits", a, r, parse_tolerance("logits:atol=1e-3,rtol=0.5").rule,
                   engine=engine)  # type: ignore[arg-type]
    assert allc.threshold == pytest.approx(1e-3 + 0.5 * float(np.max(np.abs(y))))


def test_exact_judgement_of_class_ids_and_of_a_masked_float_output() -> None:
    """Integer outputs (class ids, token ids) and `:exact` specs: equal is 0 tolerance units
    and threshold 0, so diff --top and localize rank a matching one last and a differing one
    first; a float output judged exactly may hold NaN at the same places (a masked output)."""
    from verify.compare import tol_rank

    ids = np.array([3, 1, 4, 1, 5], np.int64)
    same = compare("ids", ids, ids.copy())
    assert same.passed and (same.threshold, same.tol_units) == (0.0, 0.0)
    moved = ids.copy()
    moved[2] = 9
    wrong = compare("ids", moved, ids)
    assert not wrong.passed and wrong.tol_units == math.inf and wrong.threshold == 0.0
    assert wrong.reason == "1 of 5 elements differ (max|a-r| 5)"
    near = compare("p", np.float32([1.0, 2.0]), np.float32([1.0, 2.001]))  # fails its rule
    assert sorted([wrong, same, near], key=tol_rank) == [same, near, wrong]
    masked = np.array([0.5, np.nan, -2.0, np.nan], np.float32)
    d = compare("m", masked, masked.copy(), parse_tolerance("m:exact").rule)
    assert d.passed and d.n_outside == 0 and d.tol_units == 0.0
    off = masked.copy()
    off[0] = np.nextafter(np.float32(0.5), np.float32(1.0))
    d = compare("m", off, masked, parse_tolerance("m:exact").rule)
    assert not d.passed and d.n_outside == 1 and d.reason.startswith("1 of 4 elements differ")


def test_an_all_zero_output_matching_its_all_zero_reference_is_zero_units() -> None:
    """A ReLU output that is all zero on both sides: the magnitude threshold is 0 (no floor),
    nothing differs, so it passes at 0 tolerance units, ranked with the passing tensors, not
    as infinitely bad; one nonzero element fails it at infinity."""
    z = np.zeros((2, 8), np.float32)
    d = compare("relu", z, z.copy())
    assert d.passed and d.threshold == 0.0 and d.tol_units == 0.0
    assert d.note == "reference is all zero"
    g = compare("relu", z, z.copy(), parse_tolerance("relu:p100_abs<=0").rule)
    assert g.passed and g.tol_units == 0.0
    hot = z.copy()
    hot[1, 3] = 1e-30
    f = compare("relu", hot, z)
    assert not f.passed and f.tol_units == math.inf


def test_the_relative_error_of_an_fp16_output_near_zero_is_floored_by_fp16s_eps() -> None:
    """max_rel, shown beside every verdict: an fp16 element 0 in the reference and 0.1 in the
    output reads 0.1 / (fp16's smallest normal) = 1638 raw; past 1/eps of fp16 it is taken
    again against eps(fp16) * max|r| (102.4), as a float32 one is against eps(float32)."""
    r = np.array([1.0, 0.0], np.float16)
    a = np.array([1.0, 0.1], np.float16)
    d = compare("h", a, r)
    assert d.max_rel == pytest.approx(float(np.float16(0.1)) / 2.0 ** -10)
    r32, a32 = r.astype(np.float32), np.array([1.0, 1e-4], np.float32)
    assert compare("f", a32, r32).max_rel == pytest.approx(1e-4 / 2.0 ** -23, rel=1e-6)


# --- integer tensors: exact unless a glob names them (ToleranceSet.rule_for) ------------------

def test_integer_tensors_stay_exact_unless_a_glob_names_them() -> None:
    """An index, a shape or a class id off by one is wrong: the default, a global --atol and
    a catch-all glob leave integer tensors exact; a glob naming them (a QDQ model's int8
    tensors) judges them by its rule. Bool tensors stay exact even when named."""
    from verify.compare import ToleranceSet

    i8, f32 = np.dtype(np.int8), np.dtype(np.float32)
    assert ToleranceSet().rule_for("q", i8) == ExactRule()
    assert ToleranceSet.from_specs([], atol=1.0).rule_for("q", i8) == ExactRule()
    for catch_all in ("*:atol=1", "**:atol=1"):
        rules = ToleranceSet.from_specs([catch_all])
        assert rules.rule_for("q", i8) == ExactRule()
        assert rules.rule_for("q", f32) == AllcloseRule(1.0, 0.0)
    rules = ToleranceSet.from_specs(["q*:atol=1", "m*:atol=1", "g*:sqnr>=30", "*:sqnr>=40"])
    assert rules.rule_for("q_out", i8) == AllcloseRule(1.0, 0.0)
    assert rules.rule_for("q_out", np.uint8) == AllcloseRule(1.0, 0.0)
    assert rules.rule_for("g", np.int64) == GateRule((SqnrGate(30.0),), None)
    assert rules.rule_for("shape", np.int64) == ExactRule()
    assert rules.rule_for("mask", np.bool_) == ExactRule()
    assert rules.rule_for("m_names", np.dtype("<U3")) == ExactRule()


def test_a_rule_naming_integer_tensors_judges_their_values_as_numbers() -> None:
    """int8 values one quantization step apart pass `atol=1`, two steps do not; pNN_abs is
    in steps too, k, sqnr and cos are taken on the raw values; a uint8 0 against 255 is 255
    apart (never a wrapped 1)."""
    from verify.compare import ToleranceSet

    rng = np.random.default_rng(0)
    r = rng.integers(-100, 101, 1000).astype(np.int8)
    r[0] = 100  # the peak
    a = r.copy()
    a[1:40] += 1
    rules = ToleranceSet.from_specs(["q:atol=1", "p:p99_abs<=1", "k:k=2^-6", "s:sqnr>=30",
                                     "c:cos>=0.9999"])

    def judged(name: str, x: np.ndarray) -> object:
        return compare(name, x, r, rules.rule_for(name, r.dtype))

    one = judged("q", a)
    assert one.passed and one.rule == "allclose atol=1 rtol=0" and one.max_abs == 1.0
    two = a.copy()
    two[500] += 2
    d = judged("q", two)
    assert not d.passed and d.reason == ("1 of 1000 elements outside allclose atol=1 rtol=0 "
                                         "(max|a-r| 2.00e+00, 2 tolerance units)")
    assert ExactRule().describe() == compare("q", a, r).rule and not compare("q", a, r).passed
    assert judged("p", two).passed  # 1 element of 1000 two steps off: under the 99th
    assert judged("k", a).passed and judged("k", a).threshold == 100 * 2.0 ** -6
    assert not judged("k", two).passed
    sqnr = 10 * math.log10(float(np.sum(r.astype(float) ** 2)) / 39)
    s = judged("s", a)
    assert s.passed and s.sqnr_db == pytest.approx(sqnr, rel=1e-12)
    assert judged("c", a).passed and not judged("c", -a).passed
    u = np.array([0, 7], np.uint8)
    d = compare("q", np.array([255, 7], np.uint8), u, rules.rule_for("q", u.dtype))
    assert not d.passed and d.max_abs == 255.0


def test_a_magnitude_rule_without_k_is_refused_on_an_integer_tensor() -> None:
    """Its default k is a float dtype's precision, which an integer tensor has not: one line
    naming the spec and the tensor, exit 2 (a UsageError); on a float tensor it stands."""
    from verify.compare import ToleranceSet

    for spec in ("q*:floor=0", "q*:floor=1,sqnr>=30"):
        rules = ToleranceSet.from_specs([spec])
        with pytest.raises(UsageError) as err:
            rules.rule_for("q_out", np.int8)
        assert str(err.value) == (
            f"--tol {spec!r} matches integer tensor 'q_out' (int8): the magnitude rule's "
            "default k is a float dtype's precision; give k= (of the peak) or atol= (in "
            "integer steps)")
        assert rules.rule_for("q_out", np.float32).describe().startswith("magnitude")
    assert ToleranceSet.from_specs(["q*:floor=0"]).rule_for("q", np.bool_) == ExactRule()


def test_run_s_check_and_the_layer_judge_take_a_glob_naming_integer_tensors() -> None:
    """Every place that judges a tensor asks `rule_for` with its dtype: run's output check
    (and localize's, pack's), and the layer judge of diff, ci and localize, whole and plain."""
    from verify.check import check_outputs
    from verify.compare import ToleranceSet
    from verify.layer_judge import LayerJudge

    r = np.arange(-8, 8, dtype=np.int8)
    a = r + np.int8(1)
    for specs, ok in (([], False), (["*:atol=1"], False), (["ids:atol=1"], True)):
        rules = ToleranceSet.from_specs(specs)
        [d] = check_outputs({"ids": a}, {"ids": r}, rules, {})
        judge = LayerJudge(rules, {}, {}, {})
        assert [d.passed, judge("ids", a, r).passed, judge.plain("ids", a, r).passed] == [ok] * 3
