"""Verdicts at their edges: one output (or case) failing beside one passing, a zero tolerance,
an archive without cases, two archives storing different tolerances, a saturating op fused by
onnxruntime, integer inputs one past their dtype's range, the --case index one past the last.

Each test was written against a single-point mutant that survived the rest of the suite (a
flipped comparison, `all` for `any`, a dropped check, an off-by-one; docs/mutation.md): with
the mutant applied it fails. Ground truth is changed in the archive (rewritten by verify's own writer, as an
archive packed against another reference would hold it) so that the real local device computes the right values and the
verdict turns on the check alone.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import onnx
import pytest
from fixtures_dump import make_dump, pack
from helpers_cli import only_line, verify
from helpers_dump import get_tensor, put_tensor
from onnx import TensorProto, helper, numpy_helper

from verify import schema
from verify.archive_reader import iter_layers, read_archive
from verify.compare import SATURATION_FLOOR, AllcloseRule, MagnitudeRule
from verify.errors import InputError
from verify.inputs import build_cases, model_inputs
from verify.testcase import write_archive
from verify.tolerance import tolerance_record, tolerance_set

REPO = Path(__file__).resolve().parent.parent
TWO_IO = REPO / "goldens" / "models" / "two_io.onnx"  # inputs a, b; outputs sum_relu, prod


def _bump(value: np.ndarray, how: str) -> np.ndarray:
    """`ulp`: the first element one float32 ulp up; `wrong`: every element + 1."""
    value = np.array(value, copy=True)
    if how == "ulp":
        flat = value.reshape(-1)
        flat[0] = np.nextafter(flat[0], np.float32(np.inf))
        return value
    return value + np.float32(1)


def _rewrite(archive: Path, case: int, name: str, how: str, where: str = "outputs") -> None:
    """Store a different ground truth (or per-layer reference, `where="layers"`) for one
    tensor: the archive is rewritten by verify's own writer, checksums and all, as an archive
    packed against another reference would be."""
    tc = read_archive(archive)
    layers = None
    if tc.has_layers:
        layers = [[(n, _bump(v, how) if (where, c, n) == ("layers", case, name) else v)
                   for n, v in iter_layers(archive, c)] for c in range(len(tc.cases))]
    cases = list(tc.cases)
    if where == "outputs":
        outputs = {n: _bump(v, how) if n == name else v for n, v in cases[case].outputs.items()}
        cases[case] = dataclasses.replace(cases[case], outputs=outputs)
    write_archive(archive, dataclasses.replace(tc, cases=tuple(cases)),
                  layers=[iter(x) for x in layers] if layers is not None else None)


def _tamper(archive: Path, case: int, output: str, how: str) -> None:
    _rewrite(archive, case, output, how)


@pytest.fixture
def two_cases(tmp_path: Path) -> Path:
    """two_io packed with two cases (seeded random inputs)."""
    return pack(TWO_IO, tmp_path / "two.vtc", "-d", "a:rand", "-d", "b:rand", "-d", "a:rand",
                "-d", "b:rand")


def _run(capsys: pytest.CaptureFixture[str], archive: Path, *extra: object
         ) -> tuple[int, str, str]:
    return verify(capsys, "run", archive, "--iter", "1", "--warmup", "0", "--opt-level",
                  "disable", *extra)


# --- one output failing beside one passing; one case failing beside one passing ---------------
def test_one_wrong_output_beside_a_right_one_fails_the_run(
        capsys: pytest.CaptureFixture[str], two_cases: Path) -> None:
    _tamper(two_cases, 0, "prod", "wrong")
    code, out, _ = _run(capsys, two_cases, "--case", "0")
    assert code == 1, out
    assert [ln.split()[-1] for ln in out.splitlines() if ln.startswith("check #0")] == \
        ["PASS", "FAIL"]
    assert out.splitlines()[-1].startswith("=== FAIL")
    doc = json.loads(_run(capsys, two_cases, "--case", "0", "--json")[1])
    assert doc["passed"] is False


def test_a_failing_case_beside_a_passing_one_fails_the_run(
        capsys: pytest.CaptureFixture[str], two_cases: Path) -> None:
    for output in ("sum_relu", "prod"):  # case 0 wholly wrong, case 1 right
        _tamper(two_cases, 0, output, "wrong")
    code, out, _ = _run(capsys, two_cases)
    assert code == 1, out
    verdicts = {ln.split(":")[0]: ln.split()[-1] for ln in out.splitlines()
                if ln.startswith("check #")}
    assert sorted(verdicts.items()) == [("check #0", "FAIL"), ("check #1", "PASS")]
    assert out.splitlines()[-1].startswith("=== FAIL")
    assert _run(capsys, two_cases, "--case", "1")[0] == 0  # case 1 alone does pass


# --- a zero tolerance is bit-exact, not "no tolerance given" ----------------------------------
def test_atol_zero_is_bit_exact_on_the_command_line_and_in_the_archive(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    archive = pack(TWO_IO, tmp_path / "exact.vtc", "--atol", "0")
    assert _run(capsys, archive)[0] == 0  # the device is bit-exact at opt-level disable
    _tamper(archive, 0, "prod", "ulp")
    code, out, _ = _run(capsys, archive)
    assert code == 1 and "allclose atol=0 rtol=0" in out, out
    plain = pack(TWO_IO, tmp_path / "plain.vtc")
    _tamper(plain, 0, "prod", "ulp")
    assert _run(capsys, plain)[0] == 0  # one ulp is within the default rule...
    assert _run(capsys, plain, "--atol", "0")[0] == 1  # ...and not within atol 0
    assert _run(capsys, plain, "--rtol", "0")[0] == 1


def test_zero_tolerances_are_recorded_and_layered() -> None:
    assert tolerance_record(0.0, None) == {"atol": 0.0}
    assert tolerance_record(None, 0.0) == {"rtol": 0.0}
    assert tolerance_set({}, atol=0.0).default == AllcloseRule(0.0, 0.0)
    assert tolerance_set({"atol": 0.0}).default == AllcloseRule(0.0, 0.0)
    assert tolerance_set({"rtol": 0.0}).default == AllcloseRule(0.0, 0.0)
    assert tolerance_set({}).default == MagnitudeRule()


# --- an archive without cases -----------------------------------------------------------------
@pytest.mark.parametrize("damage", ["no cases group", "empty cases group"])
def test_an_archive_without_cases_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             damage: str) -> None:
    archive = pack(TWO_IO, tmp_path / "empty.vtc")
    with h5py.File(archive, "r+") as f:
        del f[schema.CASES]
        if damage == "empty cases group":
            f.create_group(schema.CASES)
    # (a checksummed archive: any change is caught; what matters is one line, exit 2)
    for args in (("run", archive, "--iter", "1"), ("inspect", archive),
                 ("diff", archive, archive)):
        code, _, err = verify(capsys, *args)
        assert code == 2 and only_line(err).startswith(f"error: {archive}: "), args
        if damage == "empty cases group":
            assert only_line(err) == f"error: {archive}: archive holds no cases"
    empty = tmp_path / "written-empty.vtc"  # what verify's own writer makes of no cases
    write_archive(empty, dataclasses.replace(read_archive(pack(TWO_IO, tmp_path / "ok.vtc")),
                                             cases=()))
    code, _, err = verify(capsys, "run", empty, "--iter", "1")
    assert (code, only_line(err)) == (2, f"error: {empty}: archive holds no cases")


# --- diff of two archives that store different tolerances -------------------------------------
def test_diff_of_two_archives_judges_by_the_reference_archives_record(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    reference = pack(TWO_IO, tmp_path / "ref.vtc", "--layers", "--tol", "*:exact")
    actual = pack(TWO_IO, tmp_path / "act.vtc", "--layers", "--atol", "1")
    _rewrite(actual, 0, "prod", "ulp", "layers")  # one ulp off in one layer of the actual side
    code, out, _ = verify(capsys, "diff", actual, reference, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["cases"][0]["first_divergent"]["name"] == "prod"
    assert f"tolerances: {reference}'s own (default (magnitude" in " ".join(
        doc["cases"][0]["notes"])
    assert doc["cases"][0]["first_divergent"]["diff"]["rule"] == "exact"
    code, out, _ = verify(capsys, "diff", reference, actual, "--json")  # swapped: atol=1 judges
    assert code == 0 and json.loads(out)["cases"][0]["rows"][-1]["diff"]["rule"] == \
        "allclose atol=1 rtol=0"


# --- a saturating op fused by onnxruntime keeps its floor in an optimized dump ----------------
def _conv_sigmoid() -> bytes:
    """x -> Conv (bias -20: the Sigmoid saturates, |sig| < 3e-9) -> Sigmoid 'sig' -> Mul -> y.
    onnxruntime fuses Conv+Sigmoid: FusedConv at opt-level extended, an NCHWc Conv and a
    ReorderOutput producing 'sig' at all."""
    inits = [numpy_helper.from_array(np.full((8, 3, 3, 3), 0.01, np.float32), "W"),
             numpy_helper.from_array(np.full((8,), -20, np.float32), "B"),
             numpy_helper.from_array(np.float32(2.0), "two")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["conv"], ["sig"], name="sigmoid"),
             helper.make_node("Mul", ["sig", "two"], ["y"], name="mul")]
    graph = helper.make_graph(
        nodes, "conv_sigmoid", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize("level, fused_op", [("extended", "FusedConv"),
                                             ("all", "ReorderOutput")])
def test_a_fused_saturating_op_keeps_its_floor_in_an_optimized_dump(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, level: str, fused_op: str) -> None:
    archive = pack(_conv_sigmoid(), tmp_path / "cs.vtc")
    dump = make_dump(archive, tmp_path / "dump", level)
    manifest = json.loads((dump / "manifest.json").read_text())
    assert manifest["graph"] == "optimized"
    sig = next(t for t in manifest["cases"][0]["tensors"] if t["name"] == "sig")
    assert (sig["op"], sig["floor"]) == (fused_op, SATURATION_FLOOR)
    # ulp noise of 1.0 on the saturated tensor: benign under the floor, a failure without it
    noisy = tmp_path / "noisy"
    shutil.copytree(dump, noisy)
    noisy_manifest = json.loads((noisy / "manifest.json").read_text())
    sig = next(t for t in noisy_manifest["cases"][0]["tensors"] if t["name"] == "sig")
    values = get_tensor(noisy, sig)
    assert np.abs(values).max() < 3e-8
    put_tensor(noisy, noisy_manifest, sig, values + np.float32(2.0 ** -22))
    code, out, _ = verify(capsys, "diff", noisy, dump, "--json")
    rows = {r["name"]: r for r in json.loads(out)["cases"][0]["rows"]}
    assert code == 0 and rows["sig"]["diff"]["rule"] == "magnitude k=2^-14 floor=2^-4", out


# --- integer inputs one past their dtype's range ----------------------------------------------
_INT_TYPES = [(TensorProto.INT8, np.int8), (TensorProto.UINT8, np.uint8),
              (TensorProto.INT16, np.int16), (TensorProto.UINT16, np.uint16),
              (TensorProto.INT32, np.int32), (TensorProto.UINT32, np.uint32),
              (TensorProto.INT64, np.int64), (TensorProto.UINT64, np.uint64)]


def _int_model(elem: int) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem, [1])],
                              [helper.make_tensor_value_info("y", elem, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("elem, dt", _INT_TYPES, ids=[d.__name__ for _, d in _INT_TYPES])
def test_integer_inputs_at_and_one_past_the_dtype_range(tmp_path: Path, elem: int,
                                                       dt: type) -> None:
    info = np.iinfo(dt)
    lo, hi = int(info.min), int(info.max)
    infos = model_inputs(_int_model(elem))

    def save(value: int) -> str:  # the widest numpy integer type that holds the value
        src = np.int64 if -2**63 <= value < 2**63 else np.uint64
        np.save(tmp_path / "x.npy", np.array([value], src))
        return "x.npy"

    for edge in (lo, hi):
        [case] = build_cases(infos, [save(edge)], base_dir=tmp_path)
        assert case["x"].dtype == dt and int(case["x"][0]) == edge
    for past in (lo - 1, hi + 1):
        if not -2**63 <= past < 2**64:
            continue  # no numpy integer holds it: nothing can be one past
        with pytest.raises(InputError, match=rf"do not fit \[{lo}, {hi}\]$"):
            build_cases(infos, [save(past)], base_dir=tmp_path)


# --- --case N with N the number of cases ------------------------------------------------------
def test_case_one_past_the_last_is_one_usage_error(capsys: pytest.CaptureFixture[str],
                                                  two_cases: Path) -> None:
    line = (f"error: {two_cases}: --case 2 out of range (the archive holds 2 case(s), 0..1)")
    code, _, err = _run(capsys, two_cases, "--case", "2")
    assert (code, only_line(err)) == (2, line)
    code, _, err = verify(capsys, "diff", two_cases, two_cases, "--case", "2")
    assert (code, only_line(err)) == (2, line)
    code, _, err = _run(capsys, two_cases, "--case", "-1")
    assert code == 2 and "--case -1 out of range" in only_line(err)
    assert _run(capsys, two_cases, "--case", "1")[0] == 0


# --- check_outputs on its own: every output judged, by its own floor, with top-k -------------
def test_check_outputs_judges_each_output_by_its_floor_and_refuses_a_missing_one() -> None:
    from verify.check import check_outputs
    from verify.compare import ToleranceSet
    from verify.errors import RunnerError

    ref = {"prob": np.full((1, 4), 1e-6, np.float32), "logits": np.arange(4, dtype=np.float32)}
    act = {"prob": ref["prob"] + np.float32(2.0 ** -20), "logits": ref["logits"].copy()}
    diffs = check_outputs(act, ref, ToleranceSet(), {"prob": SATURATION_FLOOR}, "phone")
    assert [(d.name, d.passed) for d in diffs] == [("prob", True), ("logits", True)]
    assert diffs[0].rule == "magnitude k=2^-14 floor=2^-4" and diffs[1].rule == "magnitude k=2^-14"
    assert diffs[1].topk is not None and diffs[1].topk.top1 == 1.0
    unfloored = check_outputs(act, ref, ToleranceSet(), {}, "phone")
    assert [d.passed for d in unfloored] == [False, True]
    with pytest.raises(RunnerError, match=r"^phone: the runner returned no value for output\(s\) "
                                          r"'logits'$"):
        check_outputs({"prob": act["prob"]}, ref, ToleranceSet(), {}, "phone")
    with pytest.raises(RunnerError, match=r"^device: the runner returned no value"):
        check_outputs({}, ref, ToleranceSet(), {})
    # a --tol glob names one output: that output alone is judged by it
    globbed = check_outputs(act, ref, ToleranceSet.from_specs(["prob:exact"]),
                            {"prob": SATURATION_FLOOR})
    assert [(d.rule, d.passed) for d in globbed] == [("exact", False), ("magnitude k=2^-14", True)]


# --- ranking for diff --top and localize: a failure with no figure first, a pass with none last
def test_tol_rank_orders_figureless_failures_first_and_figureless_passes_last() -> None:
    import dataclasses
    import math

    from verify.compare import compare, tol_rank

    r = np.ones(4, np.float32)
    failing, passing = compare("a", r + 1, r), compare("b", r, r)
    shape = compare("c", np.ones(3, np.float32), r)  # another shape: no figure, failing
    blank = dataclasses.replace(passing, tol_units=math.nan)  # passing, no figure
    assert math.isnan(shape.tol_units) and not shape.passed
    assert tol_rank(shape) == math.inf and tol_rank(blank) == -1.0
    assert tol_rank(failing) == failing.tol_units > 1 and tol_rank(passing) == 0.0
