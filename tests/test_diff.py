"""`verify diff` through the CLI: clean diffs across opt levels, every bad input (exit code and
message), and the report's table, --top, --only-failing, --json."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fixtures_dump import CNN, REPO
from fixtures_dump import cnn_dumps, cnn_layers_vtc, dump_factory  # noqa: F401 (fixtures)
from helpers_cli import only_line, verify
from helpers_dump import get_tensor, put_tensor, to_format_1
from verify.compare import TensorDiff, ToleranceSet
from verify.diff import diff_captures
from verify.errors import DumpError


@pytest.fixture
def dump_copy(cnn_dumps: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the opt-disable dump, to damage."""
    return Path(shutil.copytree(cnn_dumps["disable"], tmp_path / "copy"))


def test_opt_disable_and_all_diff_cleanly_with_fused_tensors_listed(
        cnn_dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = verify(capsys, "diff", cnn_dumps["all"], cnn_dumps["disable"],
                             "--show-missing")
    assert code == 0, err
    assert out.splitlines()[-1] == "=== PASS: 18 tensors within tolerance"
    assert "only in reference: 20 tensor(s): 20 fused away by the actual side's optimizer" in out
    assert "  stem/conv:0 (Conv): fused away by the actual side's optimizer" in out
    assert ("only in actual: 11 tensor(s): 11 made by the actual side's optimizer (its "
            "optimized graph only)") in out.splitlines()
    assert "magnitude k=2^-14 floor=2^-4" in out  # the rule judging Softmax's prob


def test_dump_against_archive_layers_json(cnn_dumps: dict[str, Path], cnn_layers_vtc: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # the archive was packed with seed 7 random inputs, as the dumps: same inputs
    code, out, _ = verify(capsys, "diff", cnn_dumps["disable"], cnn_layers_vtc, "--json")
    whole = json.loads(out)
    assert whole["passed"] is True and [c["case"] for c in whole["cases"]] == [0]
    doc = whole["cases"][0]
    assert code == 0 and doc["passed"] is True and doc["first_divergent"] is None
    assert doc["counts"] == {"compared": 38, "failed": 0, "only_in_actual": 0,
                             "only_in_reference": 0}
    row = doc["rows"][-1]
    assert row["name"] == "prob" and row["diff"]["topk"]["top1"] == 1.0
    assert set(row["diff"]) >= {"max_abs", "max_rel", "mean_abs", "cosine", "sqnr_db",
                                "frac_outside", "nan_actual", "inf_reference", "rule"}


def test_tight_tolerance_fails_names_the_first_divergent_and_exits_1(
        cnn_dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = verify(capsys, "diff", cnn_dumps["all"], cnn_dumps["disable"],
                           "--atol", "1e-9", "--only-failing")
    assert code == 1
    assert "first divergent tensor: 'stem/relu:0'  node stem/relu  op Relu" in out
    assert out.splitlines()[-1].startswith(
        "=== FAIL: 17 of 18 tensors over tolerance; first divergent 'stem/relu:0' "
        "(node stem/relu, op Relu), fused on the actual side with stem/conv:0, stem/bn:0")
    code, out, _ = verify(capsys, "diff", cnn_dumps["all"], cnn_dumps["disable"],
                           "--tol", "*:atol=1e-9", "--top", "3")
    table = [ln for ln in out.splitlines() if ln.endswith(("PASS     magnitude k=2^-14",)) or
             "FAIL" in ln and "allclose" in ln]
    assert code == 1 and len(table) == 3
    # --top 0 is every row, as profile's -t 0 (it was refused)
    code, every, _ = verify(capsys, "diff", cnn_dumps["all"], cnn_dumps["disable"],
                            "--tol", "*:atol=1e-9", "--top", "0")
    plain = verify(capsys, "diff", cnn_dumps["all"], cnn_dumps["disable"],
                   "--tol", "*:atol=1e-9")[1]
    assert code == 1 and every == plain and every.count("FAIL") > 3


def test_shape_and_dtype_mismatches_are_rows_not_errors(dump_copy: Path) -> None:
    m = json.loads((dump_copy / "manifest.json").read_text())
    t = m["cases"][0]["tensors"][3]
    t["shape"], t["dtype"] = [2, 2], "float64"
    put_tensor(dump_copy, m, t, np.zeros((2, 2), np.float64))
    # the damaged copy against an intact dump: one failing row, everything else compared
    intact = dump_copy.parent / "intact"
    shutil.copytree(dump_copy, intact)
    m["cases"][0]["tensors"][3].update(shape=[1, 8, 112, 112], dtype="float32")
    put_tensor(intact, m, t, np.zeros((1, 8, 112, 112), np.float32))
    report = diff_captures(dump_copy, intact, ToleranceSet())
    assert not report.passed
    assert report.first_divergent is not None and report.first_divergent.name == t["name"]
    assert report.first_divergent.diff.reason == "shape (2,2) vs (1,8,112,112)"
    assert len(report.compared) == 38
    # the mismatch row has no figures: "-" as wide as each column, so the table stays aligned
    from verify.cli.diff_cmd import render_report

    lines = render_report(report).splitlines()
    header = next(ln for ln in lines if ln.lstrip().startswith("#  tensor"))
    rows = [ln for ln in lines if ln[:4].strip().isdigit()]
    assert len(rows) == 38
    bad = next(ln for ln in rows if t["name"] in ln)
    assert " FAIL " in bad and bad.count(" - ") >= 5
    for row in rows:
        assert row.index(" PASS " if " PASS " in row else " FAIL ") == header.index(" verdict"), row


def test_only_failing_with_nothing_failing_says_so_instead_of_an_empty_table(
        cnn_dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = verify(capsys, "diff", cnn_dumps["disable"], cnn_dumps["disable"],
                          "--only-failing")
    assert code == 0
    assert "no tensor over tolerance" in out.splitlines()
    assert "verdict  judged by" not in out


def _damage(kind: str, d: Path) -> str:
    """Damage the dump copy `d`; returns the expected error line."""
    m = json.loads((d / "manifest.json").read_text())
    t = m["cases"][0]["tensors"][5]
    f, at = d / t["file"], t["offset"]
    if kind == "missing file":
        f.unlink()  # the case's pack: the first tensor read names it
        return f"error: {d}: tensor 'data': file {f.name} is missing (an incomplete or damaged dump; re-run it)"
    if kind == "truncated":  # the pack cut inside this tensor's data
        end = at + 128 + 8 * 56 * 56 * 4  # its header is 128 bytes
        with open(f, "r+b") as fh:
            fh.truncate(end - 1000)
        return (f"error: {d}: tensor 'block1/conv1:0': {f.name} is truncated ({end - 1000} "
                f"bytes, expected at least {end})")
    if kind == "other shape":
        put_tensor(d, m, t, np.zeros((3, 4), np.float32))
        return (f"error: {d}: tensor 'block1/conv1:0': {f.name} holds float32 (3,4) but the "
                "manifest says float32 (1,8,56,56)")
    if kind == "pickled":
        t["dtype"], t["shape"] = "object", [1]
        put_tensor(d, m, t, np.array([{"evil": 1}], dtype=object), pickle=True)
        return (f"error: {d}: tensor 'block1/conv1:0': {f.name} holds Python objects (a pickled "
                ".npy); refusing to load it")
    if kind == "offset past the end":  # an edited offset
        t["offset"] = size = -(-f.stat().st_size // 64) * 64
        (d / "manifest.json").write_text(json.dumps(m))
        return (f"error: {d}: tensor 'block1/conv1:0': {f.name} is not a valid .npy image at "
                f"byte {size} (EOF: reading magic string, expected 8 bytes got 0)")
    if kind == "overlapping":  # an edited offset: two tensors' images would share bytes
        t["offset"] = m["cases"][0]["tensors"][4]["offset"] + 64
        (d / "manifest.json").write_text(json.dumps(m))
        return (f"error: {d}: corrupt manifest.json (tensors 'stem/pool:0' and "
                "'block1/conv1:0' overlap in c0.npys)")
    if kind == "unaligned":
        t["offset"] = at + 3
        (d / "manifest.json").write_text(json.dumps(m))
        return (f"error: {d}: corrupt manifest.json (tensor 'block1/conv1:0': offset {at + 3} "
                "into c0.npys is not a multiple of 64)")
    if kind == "fifo":  # a named pipe in the pack's place: refused, never waited on
        f.unlink()
        os.mkfifo(f)
        return f"error: {d}: tensor 'data': c0.npys is not a regular file"
    if kind == "mangled header":  # numpy's header tokenizer raises its own error on this
        with open(f, "r+b") as fh:
            fh.seek(at + 10)
            fh.write(b"xxxxxxxxxx")
        return (f"error: {d}: tensor 'block1/conv1:0': {f.name} is not a valid .npy image at "
                f"byte {at} (('EOF in multi-line statement', (2, 0)))")
    if kind == "huge header":  # numpy's three-line refusal, which advises allow_pickle=True
        with open(f, "r+b") as fh:
            fh.seek(at + 8)
            fh.write((65535).to_bytes(2, "little"))
        return (f"error: {d}: tensor 'block1/conv1:0': {f.name} is not a valid .npy image at "
                f"byte {at} (Header info length (65535) is large and may not be safe to load "
                "securely.)")
    if kind == "manifest not json":
        (d / "manifest.json").write_text("{not json")
        return (f"error: {d}: manifest.json is not valid JSON (Expecting property name "
                "enclosed in double quotes: line 1 column 2 (char 1))")
    if kind == "incomplete":
        (d / "manifest.json").unlink()
        return (f"error: {d}: incomplete dump (tensor files but no manifest.json: the dump "
                "was interrupted); re-run it")
    if kind == "killed while staged":  # what a SIGKILL leaves: the staging folder alone
        shutil.rmtree(d)
        (d / ".verify-staging-k1x2").mkdir(parents=True)
        (d / ".verify-staging-k1x2" / "c0.npys").write_bytes(b"\x93NUMPY")
        return (f"error: {d}: incomplete dump (a run writing it was interrupted, or is still "
                "writing: .verify-staging-k1x2/ holds what it wrote); re-run it")
    if kind == "empty":
        shutil.rmtree(d)
        d.mkdir()
        return f"error: {d}: empty folder, not a verify dump"
    if kind == "no tensors":
        m["cases"][0]["tensors"] = []
        (d / "manifest.json").write_text(json.dumps(m))
        return f"error: {d}: empty dump (no tensors; was --dump-filter too narrow?)"
    if kind == "listed twice":  # a second entry of one name, pointing at other values
        m["cases"][0]["tensors"].append(dict(t, file=m["cases"][0]["tensors"][6]["file"]))
        (d / "manifest.json").write_text(json.dumps(m))
        return (f"error: {d}: corrupt manifest.json (tensor 'block1/conv1:0' is listed twice "
                "in case 0)")
    if kind == "newer":
        m["format_version"] = 99
        (d / "manifest.json").write_text(json.dumps(m))
        return (f"error: {d}: dump format version 99 is newer than this verify 0.1.0 reads "
                "(up to 2): upgrade verify")
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["missing file", "truncated", "other shape", "pickled",
                                  "offset past the end", "overlapping", "unaligned", "fifo",
                                  "mangled header", "huge header", "manifest not json",
                                  "incomplete", "killed while staged", "empty", "no tensors",
                                  "listed twice",
                                  "newer"])
def test_bad_dumps_are_refused_with_one_line(kind: str, dump_copy: Path,
                                              cnn_dumps: dict[str, Path],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    expected = _damage(kind, dump_copy)
    code, out, err = verify(capsys, "diff", dump_copy, cnn_dumps["disable"])
    assert (code, out) == (2, "")
    assert err.strip() == expected


def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """A .npy 1.0 header as np.save writes it, for any descr and shape (even ones numpy
    cannot make an array of)."""
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, shape)
    text += " " * (-(10 + len(text) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode("latin1")


@pytest.mark.parametrize("kind", ["alias dtype", "subarray dtype", "negative subarray",
                                  "impossible shape", "null options", "int providers"])
def test_odd_dtypes_and_shapes_in_a_dump_get_one_line_not_a_traceback(
        kind: str, dump_copy: Path, cnn_dumps: dict[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    """What the one-map read of a pack could take wrongly or crash on (a review's findings):
    a dtype alias ("f4" for float32, which the file's header is not called), subarray dtypes,
    a shape whose element count numpy cannot index; and a manifest with null options."""
    m = json.loads((dump_copy / "manifest.json").read_text())
    tensors = m["cases"][0]["tensors"]
    t = tensors[-1]
    if kind == "alias dtype":
        for e in tensors:
            e["dtype"] = "f4"
    elif kind in ("subarray dtype", "impossible shape"):
        descr, shape = (("|V8", (1, 5)) if kind == "subarray dtype" else ("<f4", (0, 2**62)))
        t["dtype"], t["shape"] = ("(2,)f4" if kind == "subarray dtype" else "float32"), list(shape)
        with open(dump_copy / t["file"], "ab") as fh:
            end = fh.tell()
            t["offset"] = end + (-end % 64)
            fh.write(b"\0" * (-end % 64) + _npy_header(descr, shape) + b"\0" * 40)
    elif kind == "negative subarray":
        t["dtype"] = "(-1,)i4"
    elif kind == "int providers":  # the fuzz's manifest mutant: a traceback in diff
        m["providers"] = 5
    else:
        m["options"] = None
    (dump_copy / "manifest.json").write_text(json.dumps(m))
    code, out, err = verify(capsys, "diff", dump_copy, cnn_dumps["disable"])
    if kind == "null options":  # nothing a reader needs is missing
        assert code == 0, err
        return
    assert (code, out) == (2, "") and only_line(err).startswith(f"error: {dump_copy}")
    if kind == "int providers":
        assert err.strip().endswith("corrupt manifest.json (field 'providers' has the wrong type)")
    if kind == "alias dtype":
        assert err.strip().endswith(
            "c0.npys holds float32 (1,3,224,224) but the manifest says f4 (1,3,224,224)")


def test_a_format_1_dump_one_file_per_tensor_is_still_read(
        dump_copy: Path, cnn_dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    to_format_1(dump_copy)
    assert not list(dump_copy.glob("*.npys")) and len(list(dump_copy.glob("c0_t*.npy"))) == 38
    code, out, err = verify(capsys, "diff", dump_copy, cnn_dumps["disable"])
    assert code == 0, err
    assert out.splitlines()[-1] == "=== PASS: 38 tensors within tolerance"
    # its one-file checks hold: a byte after the data is refused
    m = json.loads((dump_copy / "manifest.json").read_text())
    f = dump_copy / m["cases"][0]["tensors"][5]["file"]
    f.write_bytes(f.read_bytes() + b"x")
    code, _, err = verify(capsys, "diff", dump_copy, cnn_dumps["disable"])
    assert code == 2 and err.strip().endswith(f"{f.name} has 1 bytes of trailing data")


def test_pickle_payload_is_never_executed(dump_copy: Path, cnn_dumps: dict[str, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    marker = dump_copy.parent / "pwned"

    class Evil:
        def __reduce__(self):  # noqa: ANN204
            return (Path.touch, (marker,))

    m = json.loads((dump_copy / "manifest.json").read_text())
    t = m["cases"][0]["tensors"][2]
    put_tensor(dump_copy, m, t, np.array([Evil()], dtype=object), pickle=True)
    code, _, err = verify(capsys, "diff", cnn_dumps["disable"], dump_copy)
    assert code == 2 and "a pickled .npy" in err
    assert not marker.exists()


def test_different_models_are_refused(tmp_path: Path, cnn_dumps: dict[str, Path],
                                      dump_factory: Callable[..., Path],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    other = dump_factory(REPO / "goldens" / "models" / "two_io.onnx", "disable")
    code, _, err = verify(capsys, "diff", other, cnn_dumps["disable"])
    assert code == 2
    assert err.strip() == (f"error: {other} and {cnn_dumps['disable']} share no computed "
                           "tensor: captures of different models?")


@pytest.mark.parametrize("args, message", [
    (["--tol", "conv*"], "error: bad tolerance 'conv*': expected PATTERN:KEY=VALUE[,KEY=VALUE...] "
                         "with keys atol, rtol, k, floor, gates cos>=, sqnr>=, pNN_abs<=, "
                         "or PATTERN:exact"),
    (["--tol", "conv*:atol=abc"], "error: bad tolerance 'conv*:atol=abc': 'abc' is not a number "
                                  "(write 1e-3 or 2^-12)"),
    (["--atol", "-1"], "error: atol must be finite and >= 0, got -1"),
    (["--top", "2", "--only-failing"], "error: --top and --only-failing cannot be combined; "
                                       "pick one"),
    (["--case", "3"], "error: {a}: no case 3 (the dump holds case(s) 0)"),
])
def test_usage_errors(args: list[str], message: str, cnn_dumps: dict[str, Path],
                      capsys: pytest.CaptureFixture[str]) -> None:
    a = cnn_dumps["disable"]
    code, _, err = verify(capsys, "diff", a, a, *args)
    assert code == 2
    assert err.strip() == message.format(a=a)


def test_missing_paths_and_stats_only_dumps(cnn_dumps: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from fixtures_dump import pack

    plain = pack(CNN, tmp_path / "plain.vtc")
    code, _, err = verify(capsys, "diff", tmp_path / "nope", plain)
    assert (code, err.strip()) == (2, f"error: {tmp_path / 'nope'}: no such file or folder")
    code, _, err = verify(capsys, "diff", cnn_dumps["disable"], stats := _stats_dump(tmp_path))
    assert code == 2 and err.strip() == (
        f"error: {stats}: a --dump-stats-only dump holds no tensor values to compare; diff "
        "its --io-dump text, or re-run without --dump-stats-only")


def _stats_dump(tmp_path: Path) -> Path:
    from fixtures_dump import make_dump, pack

    archive = pack(CNN, tmp_path / "s.vtc")
    return make_dump(archive, tmp_path / "stats", "disable", "--dump-stats-only")


def test_top_shows_a_tensor_failing_only_on_nan_positions(
        dump_copy: Path, cnn_dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    m = json.loads((dump_copy / "manifest.json").read_text())
    t = m["cases"][0]["tensors"][5]
    value = get_tensor(dump_copy, t)
    value.flat[5] = np.nan  # its numbers all agree: a NaN where the reference has one is all
    put_tensor(dump_copy, m, t, value)
    code, out, _ = verify(capsys, "diff", dump_copy, cnn_dumps["disable"], "--top", "3")
    assert code == 1
    shown = [line for line in out.splitlines() if t["name"] in line]
    assert shown and "FAIL" in shown[0], out


def test_a_text_io_dump_or_outputs_folder_is_named_for_what_it_is(
        cnn_vtc: Path, cnn_dumps: dict[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = verify(capsys, "run", cnn_vtc, "--iter", "1", "--io-dump", tmp_path / "t.txt",
                          "--bin-out-dump", tmp_path / "outs")
    assert code == 0, err
    code, out, err = verify(capsys, "diff", tmp_path / "t.txt", cnn_dumps["disable"])
    assert (code, out, err.strip()) == (
        2, "", f"error: {tmp_path / 't.txt'}: a text io-dump (--io-dump); verify diff compares "
               "--bin-io-dump folders and archives (compare text dumps with diff)")
    code, out, err = verify(capsys, "diff", cnn_dumps["disable"], tmp_path / "outs")
    assert (code, out, err.strip()) == (
        2, "", f"error: {tmp_path / 'outs'}: a --bin-out-dump folder (final outputs only), not "
               "a verify dump; capture every layer with --bin-io-dump")


def test_a_tol_glob_that_matches_no_compared_tensor_is_said(
        cnn_dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = verify(capsys, "diff", cnn_dumps["all"], cnn_dumps["disable"],
                            "--tol", "stem/relu:atol=1", "--tol", "stem/relu:0:atol=1")
    assert code == 0 and out.splitlines()[-1].startswith("=== PASS")
    assert only_line(err) == ("note: --tol 'stem/relu:atol=1' matches no tensor compared; the "
                              "glob must match a whole tensor name (diff --json lists them)")


def test_a_case_without_tensors_is_named_as_such_not_as_a_filter_or_model_mismatch() -> None:
    from verify.diff import _walk
    from verify.diff_sources import Side, Tensor

    full = Side(label="good", tensors=[Tensor("y", "n", "Relu", 0.0, True)],
                load=lambda name: np.zeros(2, np.float32), model_sha256="abc")
    empty = Side(label="damaged", tensors=[], load=lambda name: None, model_sha256="abc")
    with pytest.raises(DumpError) as caught:
        _walk(empty, full, ToleranceSet(), 3, "auto")
    assert str(caught.value) == "damaged: case 3 holds no tensor to compare"


@pytest.mark.parametrize("edit, said", [
    (lambda m: m["cases"][0].pop("tensors"), "(case entry 0 has no tensor list)"),
    (lambda m: m.update(cases=[]), "(no cases)"),
    # a floor the rule refuses: "floor must be finite and >= 0, got -5", naming nothing
    (lambda m: m["cases"][0]["tensors"][3].update(floor=-5),
     "(tensor '{name}': floor -5.0, not a finite number >= 0)"),
    (lambda m: m["cases"][0]["tensors"][3].update(floor=float("inf")),
     "(tensor '{name}': floor inf, not a finite number >= 0)")])
def test_a_manifest_without_cases_or_tensor_lists_says_which(
        dump_copy: Path, cnn_dumps: dict[str, Path], capsys: pytest.CaptureFixture[str],
        edit: Callable[[dict], object], said: str) -> None:
    m = json.loads((dump_copy / "manifest.json").read_text())
    name = m["cases"][0]["tensors"][3]["name"] if m["cases"] else ""
    edit(m)
    (dump_copy / "manifest.json").write_text(json.dumps(m))
    code, _, err = verify(capsys, "diff", dump_copy, cnn_dumps["disable"])
    assert (code, only_line(err)) == (
        2, f"error: {dump_copy}: corrupt manifest.json {said.format(name=name)}")


def test_a_long_fused_chain_is_shown_in_part_and_listed_whole_in_json() -> None:
    """A fused chain across NCHWc reorders named 71 nodes, all of them in the one-line
    verdict; the text now shows a few and how many more, the JSON every name."""
    from verify.diff_report import DiffReport, DiffRow

    fused = tuple(f"conv{i}:0" for i in range(71))
    bad = TensorDiff("y", False, "magnitude", "max|a-r| 1 > 0.1", (2,), (2,), "float32",
                     "float32", 2, 1.0, 1.0, 0.5, 0.9, 10.0, 1.0, 0.1, 10.0, 1, 0.5, 0, 0, 0, 0,
                     0)
    row = DiffRow(3, "y", "n", "Relu", bad, fused=fused)
    report = DiffReport(actual="a", reference="r", case=0, rows=(row,), first_divergent=row,
                        passed=False, only_in_actual=(), only_in_reference=())
    assert report.verdict().endswith(
        "fused on the actual side with conv0:0, conv1:0, conv2:0 (+68 more)")
    assert report.to_dict()["first_divergent"]["fused"] == list(fused)


def test_a_tol_that_could_not_loosen_integer_or_bool_tensors_says_so() -> None:
    """A glob naming a QDQ model's int8 tensors loosens them: nothing to say. A catch-all glob
    leaves integer tensors exact (an index off by one is wrong): the note says how to name
    them; a glob naming bool tensors cannot loosen them (always exact): said too."""
    from verify.tolerance_specs import exact_anyway_notes

    rules = ToleranceSet.from_specs(["*_Q:atol=20", "m*:atol=1", "ids:exact", "*:sqnr>=15"])
    judged = [("a_Q", "int8"), ("b_Q", "uint8"), ("f_Q", "float32"), ("shape", "int64"),
              ("ids", "int64"), ("mask", "bool"), ("flag", "bool"), ("idx", "int32")]
    assert exact_anyway_notes(rules, judged) == [
        "--tol '*:sqnr>=15' left 2 integer tensor(s) (shape, …) exact: a catch-all glob does "
        "not loosen integer tensors; name them in a --tol before it, e.g. --tol "
        "'shape:atol=1' (in integer steps)",
        "--tol 'm*:atol=1' matched 1 bool tensor(s) (mask): they are judged exactly, as bool "
        "tensors always are"]
    assert exact_anyway_notes(rules, [("f_Q", "float32"), ("a_Q", "int8")]) == []
    assert exact_anyway_notes(ToleranceSet.from_specs(["*:exact"]), [("shape", "int64")]) == []
