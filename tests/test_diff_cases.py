"""`diff.diff_cases`: several cases of one capture pair, each side opened once — the same
reports as one `diff_captures` call per case, with the archive read and its model parsed once
(ci's per-layer gate diffs every case of a job this way)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from fixtures_dump import make_dump, pack
from helpers_cli import only_line, verify

from verify import archive_reader, diff, diff_sources
from verify.compare import ToleranceSet
from verify.errors import UsageError

DYNAMIC = Path(__file__).resolve().parent.parent / "goldens" / "models" / "dynamic.onnx"


@pytest.fixture(scope="module")
def three_cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cases")
    archive = pack(DYNAMIC, root / "dyn.vtc", "--layers", "-d", "x:[[1,2,3,4]]",
                   "-d", "x:[[1,2,3,4],[5,6,7,8]]", "-d", "x:[[0,0,0,1],[1,0,0,0],[2,2,2,2]]")
    return archive, make_dump(archive, root / "dump", "all")


def test_cases_match_one_call_per_case_and_open_each_side_once(
        three_cases: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    archive, dump = three_cases
    rules = ToleranceSet()
    singly = [diff.diff_captures(dump, archive, rules, case=c) for c in range(3)]
    reads, parses = [], []
    read, parse = archive_reader.ArchiveReader, diff_sources.parse_model
    # diff_sources imports the reader where an archive is opened (two dumps need no h5py)
    monkeypatch.setattr(archive_reader, "ArchiveReader", lambda p: reads.append(p) or read(p))
    monkeypatch.setattr(diff_sources, "parse_model",
                        lambda b, w, *e: parses.append(w) or parse(b, w, *e))
    together = diff.diff_cases(dump, archive, rules, [0, 1, 2])
    assert (len(reads), len(parses)) == (1, 1)
    reads.clear()
    parses.clear()
    assert all(r.passed for r in diff.diff_cases(archive, archive, rules))
    assert (len(reads), len(parses)) == (2, 1)  # floors come from the reference side only
    assert [r.case for r in together] == [0, 1, 2]
    for one, many in zip(singly, together, strict=True):
        assert one.to_dict() == many.to_dict()
    # each case compared its own batch size: the last tensor's shape grows with the case
    shapes = [r.compared[-1].diff.reference_shape for r in together]  # type: ignore[union-attr]
    assert [s[0] for s in shapes] == [1, 2, 3], shapes


def test_a_case_either_side_lacks_is_one_usage_error(three_cases: tuple[Path, Path]) -> None:
    archive, dump = three_cases
    with pytest.raises(UsageError, match=r"dump: no case 5 \(the dump holds case\(s\) 0, 1, 2\)"):
        diff.diff_cases(dump, archive, ToleranceSet(), [0, 5])
    with pytest.raises(UsageError,
                       match=r"dyn.vtc: --case 5 out of range \(the archive holds 3 case"):
        diff.diff_cases(archive, dump, ToleranceSet(), [1, 5])


def test_cli_compares_every_case_by_default(three_cases: tuple[Path, Path],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    archive, dump = three_cases
    code, out, err = verify(capsys, "diff", dump, archive)
    assert (code, err) == (0, "")
    assert [ln for ln in out.splitlines() if ln.startswith("reference:")] == [
        f"reference: {archive}  (case {c})" for c in range(3)]
    assert out.splitlines()[-1] == "=== PASS: 3 cases, every tensor within tolerance"
    code, out, _ = verify(capsys, "diff", dump, archive, "--json")
    doc = json.loads(out)
    assert (code, doc["passed"], [c["case"] for c in doc["cases"]]) == (0, True, [0, 1, 2])
    code, out, _ = verify(capsys, "diff", dump, archive, "--case", "1", "--json")
    assert (code, json.loads(out)["case"]) == (0, 1)  # one case: the one-report document


def test_a_case_that_diverges_is_named_with_its_first_divergent_tensor(
        three_cases: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    archive, _ = three_cases
    # a device whose values go wrong in case 2 only: one computed tensor of that case doubled
    other = make_dump(archive, tmp_path / "other", "disable")
    manifest = json.loads((other / "manifest.json").read_text())
    (case2,) = [c for c in manifest["cases"] if c["case"] == 2]
    wrong = next(t for t in case2["tensors"] if t["op"] != "<input>")
    with open(other / wrong["file"], "r+b") as fh:
        fh.seek(wrong["offset"])
        value = np.lib.format.read_array(fh)
        fh.seek(wrong["offset"])
        np.lib.format.write_array(fh, value * 2 + 1)
    code, out, err = verify(capsys, "diff", other, archive)
    assert (code, err) == (1, "")
    last = out.splitlines()[-1]
    assert last.startswith("=== FAIL: 1 of 3 cases over tolerance (case(s) 2); case 2 first "
                           "diverges at "), last
    doc = json.loads(verify(capsys, "diff", other, archive, "--json")[1])
    assert [c["passed"] for c in doc["cases"]] == [True, True, False]
    assert doc["cases"][2]["first_divergent"]["name"] == wrong["name"] and wrong["name"] in last


def test_a_dump_of_one_case_is_compared_on_that_case_and_says_what_it_left_out(
        three_cases: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    archive, _ = three_cases
    one = make_dump(archive, tmp_path / "one", "disable", "--case", "2")
    code, out, err = verify(capsys, "diff", one, archive, "--json")
    (doc,) = json.loads(out)["cases"]  # no --case: the cases document, whatever their count
    assert (code, err, doc["case"], doc["passed"]) == (0, "", 2, True)
    assert "case(s) 0, 1 only in the reference capture: not compared" in doc["notes"]
    code, out, err = verify(capsys, "diff", one, archive, "--case", "0")
    assert (code, out) == (2, "")
    assert only_line(err) == f"error: {one}: no case 0 (the dump holds case(s) 2)"


def test_captures_with_no_case_in_common_are_one_usage_error(
        three_cases: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    archive, _ = three_cases
    first = make_dump(archive, tmp_path / "first", "disable", "--case", "0")
    second = make_dump(archive, tmp_path / "second", "disable", "--case", "1")
    code, out, err = verify(capsys, "diff", first, second)
    assert (code, out) == (2, "")
    assert only_line(err) == (f"error: {first} holds case(s) 0 and {second} case(s) 1: none in "
                              "common to compare")


def test_an_archive_without_layers_is_compared_against_layers_computed_here(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Packed without --layers: diff computes every layer on this host from the archive's
    model and inputs — the same figures as against an archive packed with --layers."""
    cnn = DYNAMIC.parent / "cnn.onnx"
    plain = pack(cnn, tmp_path / "plain.vtc")
    layered = pack(cnn, tmp_path / "layered.vtc", "--layers")
    dump = make_dump(plain, tmp_path / "dump", "all")
    code, out, err = verify(capsys, "diff", dump, plain, "--case", "0", "--json")
    computed = json.loads(out)
    assert (code, err, computed["passed"]) == (0, "", True)
    assert computed["notes"] == [
        f"{plain} holds no per-layer references (packed without --layers): computed on this "
        "host (onnxruntime CPU, optimizations off) from its model and case 0's inputs; its "
        "outputs are the ground truth it stores, as `run` judges them"]
    stored = json.loads(verify(capsys, "diff", dump, layered, "--case", "0", "--json")[1])
    assert [r["diff"] for r in computed["rows"]] == [r["diff"] for r in stored["rows"]]
    assert computed["counts"] == stored["counts"] and computed["counts"]["compared"] > 10


def test_host_values_asked_out_of_order_are_still_right(three_cases: tuple[Path, Path]) -> None:
    from verify.archive_reader import read_archive
    from verify.capture import HostCapture

    archive, _ = three_cases
    tc = read_archive(archive)
    feeds = tc.cases[2].inputs
    with HostCapture(tc.model_bytes) as host:
        expected = dict(host.layers(feeds))
        load = diff_sources.streamed(host, feeds)
        names = list(expected)
        for name in [names[-1], names[0], *names[1:]]:  # the last first: the rest recomputed
            assert np.array_equal(load(name), expected[name]), name


def test_host_values_cost_one_capture_pass_whichever_side_computes_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A dump may order its tensors unlike the model; the side computed on the host is still
    read in its own order, one pass, as the actual side as well as the reference."""
    from verify.capture import HostCapture

    plain = pack(DYNAMIC.parent / "cnn.onnx", tmp_path / "plain.vtc")
    dump = make_dump(plain, tmp_path / "dump", "all")
    # how far an optimized graph's order departs from the model's varies; take the extreme:
    # the dump's tensors in reverse order (the manifest's indices say the order)
    manifest = json.loads((dump / "manifest.json").read_text())
    tensors = manifest["cases"][0]["tensors"]
    for t in tensors:
        t["index"] = len(tensors) - 1 - t["index"]
    (dump / "manifest.json").write_text(json.dumps(manifest))
    passes: list[object] = []
    layers = HostCapture.layers

    def counted(self, feeds, names=None, **kwargs):  # type: ignore[no-untyped-def]
        passes.append(names)
        return layers(self, feeds, names, **kwargs)

    monkeypatch.setattr(HostCapture, "layers", counted)
    for sides in ((dump, plain), (plain, dump)):
        passes.clear()
        code, out, err = verify(capsys, "diff", *sides, "--json")
        assert (code, err, passes) == (0, "", [None]), sides  # one pass over every tensor
        assert json.loads(out)["cases"][0]["counts"]["compared"] > 10


def test_host_values_asked_once_out_of_order_cost_one_more_pass(
        three_cases: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from verify.archive_reader import read_archive
    from verify.capture import HostCapture

    archive, _ = three_cases
    tc = read_archive(archive)
    feeds = tc.cases[1].inputs
    with HostCapture(tc.model_bytes) as host:
        expected = dict(host.layers(feeds))
        names = list(expected)
        assert len(names) >= 3
        passes: list[object] = []
        layers = HostCapture.layers
        monkeypatch.setattr(HostCapture, "layers",
                            lambda self, f, n=None, **kw: passes.append(n) or layers(self, f, n,
                                                                                   **kw))
        load = diff_sources.streamed(host, feeds)
        for name in [names[0], names[2], names[1], *names[3:]]:
            assert np.array_equal(load(name), expected[name]), name
        assert passes == [None, [names[1]]]  # the stream, and the one name it had passed


def test_an_archives_own_tolerances_judge_under_the_command_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As `run` does: the tolerances an archive was packed with judge the diff, and the
    command line's go on top; two dumps have none of their own."""
    cnn = DYNAMIC.parent / "cnn.onnx"
    strict = pack(cnn, tmp_path / "strict.vtc", "--layers", "--tol", "*:exact")
    plain = pack(cnn, tmp_path / "plain.vtc")  # the same model and inputs (--seed 7)
    dump = make_dump(plain, tmp_path / "dump", "all")  # optimized: last-bit differences
    code, out, _ = verify(capsys, "diff", dump, strict, "--case", "0", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["first_divergent"] is not None
    assert {r["diff"]["rule"] for r in doc["rows"] if r["diff"]} == {"exact"}
    assert f"tolerances: {strict}'s own (default (magnitude: max|x-r| <= 2^-14 * max(max|r|, " \
           "F), scaled by dtype); --tol *:exact), under any given on the command line" \
           in doc["notes"]
    code, out, _ = verify(capsys, "diff", dump, strict, "--case", "0", "--json",
                          "--tol", "*:k=2^-14")
    doc = json.loads(out)
    rules = {r["diff"]["rule"] for r in doc["rows"] if r["diff"]}
    # (a tensor selecting values from another, a Relu, with that one's magnitude for a floor)
    assert code == 0 and {"magnitude k=2^-14", "magnitude k=2^-14 floor=2^-4"} <= rules
    assert all(r.startswith("magnitude k=2^-14") for r in rules)
    other = make_dump(plain, tmp_path / "other", "disable")
    code, out, _ = verify(capsys, "diff", dump, other, "--case", "0", "--json")
    assert not any(n.startswith("tolerances:") for n in json.loads(out)["notes"])


def test_captures_fed_different_inputs_are_refused_not_blamed_on_a_layer(
        three_cases: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A dump run with --input (other data than the archive's case): every layer differs for
    that alone, so the diff is refused (exit 2) naming the input, rather than a FAIL (exit 1)
    naming the graph input as the first divergent tensor, which points at the device."""
    archive, _ = three_cases
    np.save(tmp_path / "x.npy", np.array([[9, 9, 9, 9]], np.float32))
    other = make_dump(archive, tmp_path / "other", "disable", "--case", "0", "--input",
                      f"x:{tmp_path / 'x.npy'}")
    code, out, err = verify(capsys, "diff", other, archive, "--case", "0")
    assert code == 2 and out == ""
    assert only_line(err) == (
        f"error: {other} and {archive} were fed different inputs in case 0: 'x' differs "
        "(max|a-r| 8); compare captures of the same inputs (one run with --input, another "
        "archive or case?)")
    same = make_dump(archive, tmp_path / "same", "disable", "--case", "0")
    assert verify(capsys, "diff", same, archive, "--case", "0")[0] == 0
    # a dump filtered to one layer keeps the graph inputs: the check still sees them (every
    # layer of such a dump was blamed)
    last = [t["name"] for t in json.loads((same / "manifest.json").read_text())["cases"][0][
        "tensors"]][-1]
    filtered = make_dump(archive, tmp_path / "filtered", "disable", "--case", "0", "--input",
                         f"x:{tmp_path / 'x.npy'}", "--dump-filter", f"^{re.escape(last)}$")
    code, _, err = verify(capsys, "diff", filtered, archive, "--case", "0")
    assert code == 2 and "were fed different inputs in case 0: 'x' differs" in err, err
    # an input of another shape names the shapes (it said "max|a-r| nan")
    np.save(tmp_path / "x2.npy", np.ones((2, 4), np.float32))
    wider = make_dump(archive, tmp_path / "wider", "disable", "--case", "0", "--input",
                      f"x:{tmp_path / 'x2.npy'}")
    code, _, err = verify(capsys, "diff", wider, archive, "--case", "0")
    assert code == 2 and "'x' differs (shape (2,4) vs (1,4));" in only_line(err), err
