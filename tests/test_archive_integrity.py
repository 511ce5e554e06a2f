"""The archive's checksums and its checks on read: damage is one line and exit 2, found before
any device is touched (the device here is ssh on a closed port: reaching it would be exit 3);
the cases are checked against the model as a run would; a dataset declaring more than the
limit is refused before it is read; format-1 archives are read with a warning."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers_cli import only_line, verify
from verify.archive_reader import read_archive
from verify.testcase import Case, write_archive

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "goldens" / "models"
NOWHERE = "ssh:nobody@127.0.0.1:1"  # connection refused at once: exit 3 if ever reached


@pytest.fixture(scope="module")
def cnn_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from verify.cli import main

    out = tmp_path_factory.mktemp("integrity") / "cnn.vtc"
    assert main(["pack", str(MODELS / "cnn.onnx"), "--layers", "-o", str(out)]) == 0
    return out


def copy(src: Path, dest: Path) -> Path:
    dest.write_bytes(src.read_bytes())
    return dest


def flip_in(path: Path, dataset: str, element: int = 0) -> None:
    """Flip one bit of one stored value, in the file's bytes (no HDF5 call writes it)."""
    with h5py.File(path, "r") as f:
        ds = f[dataset]
        offset = ds.id.get_offset() + element * ds.dtype.itemsize
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("dataset, named", [
    ("model", "the model does not match its sha256"),
    ("cases/0/inputs/0", "cases/0/inputs/0 ('data') does not match its checksum"),
    ("cases/0/outputs/0", "cases/0/outputs/0 ('prob') does not match its checksum"),
])
def test_one_flipped_bit_is_one_line_and_exit_2_before_the_device(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path, tmp_path: Path, dataset: str,
        named: str) -> None:
    bad = copy(cnn_vtc, tmp_path / "bad.vtc")
    flip_in(bad, dataset, 3)
    line = (f"error: {bad}: corrupt archive: {named} (re-pack it, or get an intact copy)")
    for args in (("inspect", bad), ("run", bad, "--device", NOWHERE),
                 ("bench", bad, "--device", NOWHERE)):
        code, _, err = verify(capsys, *args)
        assert (code, only_line(err)) == (2, line), args


def test_a_flipped_layer_reference_is_found_by_inspect_and_by_diff(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path, tmp_path: Path) -> None:
    bad = copy(cnn_vtc, tmp_path / "bad.vtc")
    flip_in(bad, "cases/0/layers/5", 0)
    with h5py.File(bad) as f:
        name = f["cases/0/layers/5"].attrs["name"].decode()
    line = (f"error: {bad}: corrupt archive: cases/0/layers/5 ({name!r}) does not match its "
            "checksum (re-pack it, or get an intact copy)")
    code, _, err = verify(capsys, "inspect", bad)
    assert (code, only_line(err)) == (2, line)
    code, _, err = verify(capsys, "diff", cnn_vtc, bad)
    assert (code, only_line(err)) == (2, line)


@pytest.mark.parametrize("edit", ["tolerances", "name", "extra_attr", "source", "drop_output"])
def test_metadata_edited_behind_the_archive_is_corrupt(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path, tmp_path: Path, edit: str) -> None:
    """A record, a tensor's name, an attribute added, a case's source, a dataset removed: all
    change what the archive checksum covers (the tolerances edit would flip a verdict)."""
    bad = copy(cnn_vtc, tmp_path / "bad.vtc")
    with h5py.File(bad, "r+") as f:
        if edit == "tolerances":
            del f["tolerances"]
            text = json.dumps({"atol": 1e9, "rtol": 0})
            f.create_dataset("tolerances", data=np.array(text.encode(), dtype=f"S{len(text)}"))
        elif edit == "name":
            f["cases/0/outputs/0"].attrs.create("name", np.array(b"other", dtype="S5"))
        elif edit == "extra_attr":
            f["cases/0"].attrs.create("note", np.array(b"x", dtype="S1"))
        elif edit == "source":
            f["cases/0"].attrs.create("source", np.array(b"y", dtype="S1"))
        else:
            del f["cases/0/layers/37"]
    code, _, err = verify(capsys, "run", bad, "--device", NOWHERE)
    assert code == 2
    assert only_line(err).startswith(f"error: {bad}: corrupt archive: ")


def test_a_re_packed_edit_is_a_new_archive(capsys: pytest.CaptureFixture[str], cnn_vtc: Path,
                                           tmp_path: Path) -> None:
    """What the README says: an edit made through verify's writer carries fresh checksums; the
    archive is then simply another archive (its provenance names the model it holds)."""
    tc = read_archive(cnn_vtc)
    out = tmp_path / "edited.vtc"
    write_archive(out, dataclasses.replace(tc, tolerances={"atol": 1.0, "rtol": 0.0}))
    code, out_text, _ = verify(capsys, "inspect", out, "--json")
    assert code == 0
    doc = json.loads(out_text)
    assert doc["tolerances"] == {"atol": 1.0, "rtol": 0.0}
    assert doc["integrity"].startswith("verified: the model and 2 tensor(s)")


def _cases(tc, **change):  # type: ignore[no-untyped-def]
    return dataclasses.replace(tc, cases=tuple(change.get("cases", tc.cases)))


@pytest.mark.parametrize("kind, message", [
    ("name", "case 0: input 'image' is not an input of the model (it takes 'data')"),
    ("dtype", "case 0: input 'data' is float64, the model takes float32"),
    ("shape", "case 0: input 'data' has shape (1,224,224,3), the model takes (1,3,224,224)"),
    ("empty_case", "case 1: no value for the model's input 'data'"),
    ("no_output", "case 0: no ground truth for the model's output 'prob'"),
])
def test_cases_that_do_not_fit_the_model_are_exit_2_in_inspect_and_run(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path, tmp_path: Path, kind: str,
        message: str) -> None:
    tc = read_archive(cnn_vtc)
    case = tc.cases[0]
    x = case.inputs["data"]
    cases = {
        "name": (Case({"image": x}, case.outputs),),
        "dtype": (Case({"data": x.astype(np.float64)}, case.outputs),),
        "shape": (Case({"data": np.ascontiguousarray(x.transpose(0, 2, 3, 1))}, case.outputs),),
        "empty_case": (case, Case({}, {})),
        "no_output": (Case(case.inputs, {}),),
    }[kind]
    bad = tmp_path / "bad.vtc"
    write_archive(bad, dataclasses.replace(tc, cases=cases))  # checksums intact
    for args in (("inspect", bad), ("run", bad, "--device", NOWHERE)):
        code, _, err = verify(capsys, *args)
        assert (code, only_line(err)) == (2, f"error: {bad}: {message}"), args


def test_a_dataset_over_the_size_limit_is_refused_before_it_is_read(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A small file can declare a huge compressed dataset: the limit is checked on the
    declared size; the user raises it with --max-tensor-mb or $VERIFY_MAX_TENSOR_MB."""
    from verify.cli import main

    packed = tmp_path / "cnn.vtc"
    assert main(["pack", str(MODELS / "cnn.onnx"), "-o", str(packed)]) == 0
    code, _, err = verify(capsys, "--max-tensor-mb", "0.25", "inspect", packed)
    assert code == 2
    assert only_line(err) == (f"error: {packed}: cases/0/inputs/0 declares 0.5742 MB, over the 0.25 MB "
                              "limit (raise it with verify --max-tensor-mb N or "
                              "$VERIFY_MAX_TENSOR_MB)")
    assert verify(capsys, "--max-tensor-mb", "2", "inspect", packed)[0] == 0
    assert "VERIFY_MAX_TENSOR_MB" not in os.environ  # the option lasts one command only
    code, _, err = verify(capsys, "--max-tensor-mb", "0", "inspect", packed)
    assert code == 2 and "expected a number of MB > 0" in err


def test_pack_writes_nothing_a_reader_would_refuse(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """pack stored what the reader then refused in the same archive (a 2049 MB input, a model
    over --max-tensor-mb, a per-layer reference): refused at pack, naming the part, the
    limit and how to raise it, and no archive is left."""
    import onnx
    from onnx import TensorProto, helper

    from verify.cli import main

    out = tmp_path / "cnn.vtc"
    code, _, err = verify(capsys, "--max-tensor-mb", "0.25", "pack", MODELS / "cnn.onnx", "-d",
                          REPO / "goldens" / "images" / "sample.png", "-o", out)
    assert (code, only_line(err)) == (2, (
        f"error: {out}: case 0 input 'data' is 0.5742 MB, over the 0.25 MB an archive holds "
        "per tensor (readers refuse it); raise the limit with verify --max-tensor-mb N or "
        "$VERIFY_MAX_TENSOR_MB, for packing and reading alike"))
    assert not out.exists() and list(tmp_path.iterdir()) == []
    # a layer (streamed while the archive is written): 40,000 floats between a (1,4) input
    # and a (1,1) output
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "reps"], ["wide"]),
         helper.make_node("ReduceSum", ["wide"], ["y"], keepdims=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor("reps", TensorProto.INT64, [2], [1, 10000])])
    model = tmp_path / "wide.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model)
    out = tmp_path / "new" / "wide.vtc"  # a folder pack makes, and removes when it fails
    code, _, err = verify(capsys, "--max-tensor-mb", "0.1", "pack", model, "--layers", "-o", out)
    assert (code, only_line(err).split(" MB an archive")[0]) == (
        2, f"error: {out}: case 0 layer 'wide' is 0.1526 MB, over the 0.1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wide.onnx"]
    assert main(["--max-tensor-mb", "0.2", "pack", str(model), "--layers", "-o", str(out)]) == 0
    assert out.is_file()


def _write_v1(path: Path, src: Path) -> None:
    """An archive as format 1 wrote it: JSON records as variable-length root attributes, no
    checksums (the writer as it was, kept here to make one)."""
    tc = read_archive(src)
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "verify-testcase"
        f.attrs["format_version"] = 1
        f.attrs["verify_version"] = "0.1.0"
        f.attrs["created_utc"] = ""
        f.attrs["provenance"] = json.dumps(dict(tc.provenance), sort_keys=True)
        f.attrs["tolerances"] = json.dumps(dict(tc.tolerances))
        f.attrs["tensor_order"] = json.dumps([t.to_dict() for t in tc.tensor_order])
        model = f.create_dataset("model", data=np.frombuffer(tc.model_bytes, np.uint8))
        model.attrs["sha256"] = tc.provenance["model_sha256"]
        for i, case in enumerate(tc.cases):
            g = f.create_group(f"cases/{i}")
            g.attrs["source"] = case.source
            for kind, values in (("inputs", case.inputs), ("outputs", case.outputs)):
                for k, (name, value) in enumerate(values.items()):
                    f.create_dataset(f"cases/{i}/{kind}/{k}", data=value).attrs["name"] = name


def test_a_format_1_archive_is_read_with_one_warning(cnn_vtc: Path, tmp_path: Path) -> None:
    """In a process of its own: the warning as a user sees it on stderr (pytest would record
    it instead of printing it)."""
    import os
    import subprocess
    import sys

    old = tmp_path / "old.vtc"
    _write_v1(old, cnn_vtc)

    def inspect() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", "from verify.cli import main; main()",
                               "inspect", str(old), "--json"],
                              capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)

    proc = inspect()
    assert proc.returncode == 0, proc.stderr
    assert only_line(proc.stderr) == (
        f"warning: {old}: archive format 1 has no checksums, so damage to it cannot be "
        "detected; re-pack it with this verify")
    assert json.loads(proc.stdout)["integrity"] == ("not verified: archive format 1 has no "
                                                    "checksums (re-pack it)")
    flip_in(old, "model", 100)  # its model's sha256 was recorded: still checked
    proc = inspect()
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1] == (
        f"error: {old}: corrupt archive: the model does not match its sha256 (re-pack it, or "
        "get an intact copy)")


def test_a_version_1_label_on_a_checksummed_archive_is_corrupt(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path, tmp_path: Path) -> None:
    """Turning the version down cannot switch the checks off."""
    bad = copy(cnn_vtc, tmp_path / "bad.vtc")
    with h5py.File(bad, "r+") as f:
        f.attrs["format_version"] = 1
    code, _, err = verify(capsys, "inspect", bad)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(f"error: {bad}: corrupt archive: ")


def test_a_flipped_layer_reference_stops_every_verdict_on_the_local_device(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path, tmp_path: Path) -> None:
    """run, bench and localize do not read the per-layer references (localize only some): a
    background check reads them all while the device works and is joined before the verdict,
    so a flipped bit there is exit 2 and one line, never PASS/FAIL; intact, the same commands
    give their verdict (exit 0)."""
    bad = copy(cnn_vtc, tmp_path / "bad.vtc")
    flip_in(bad, "cases/0/layers/5", 0)
    with h5py.File(bad) as f:
        name = f["cases/0/layers/5"].attrs["name"].decode()
    line = (f"error: {bad}: corrupt archive: cases/0/layers/5 ({name!r}) does not match its "
            "checksum (re-pack it, or get an intact copy)")
    commands = [("run", "--iter", "1", "--warmup", "0"),
                ("run", "--iter", "1", "--warmup", "0", "--bin-io-dump", "DUMP"),
                ("bench", "--iter", "1", "--warmup", "0", "--opt-levels", "disable,all"),
                ("localize",), ("localize", "--no-dump")]
    for command, *rest in commands:
        code, out, _ = verify(capsys, command, cnn_vtc,
                              *(tmp_path / "good" if a == "DUMP" else a for a in rest))
        assert code == 0, (command, out)
        code, out, err = verify(capsys, command, bad,
                                *(tmp_path / "dump" if a == "DUMP" else a for a in rest))
        assert (code, only_line(err)) == (2, line), command
        assert "PASS" not in out and "FAIL" not in out and "CLEAN" not in out, command
    assert (tmp_path / "good" / "manifest.json").is_file()
    assert not (tmp_path / "dump").exists()  # the corrupt run's dump went, with its folder


def test_a_flipped_layer_reference_is_a_bad_testcase_in_ci(
        capsys: pytest.CaptureFixture[str], cnn_vtc: Path, tmp_path: Path) -> None:
    """A ci job on an archive whose per-layer references are damaged is a bad testcase (exit
    2, the dataset named), not a PASS or a gate failure."""
    from fixtures_ci import local_suite, run_ci

    (tmp_path / "bad").mkdir()
    bad = copy(cnn_vtc, tmp_path / "bad" / "cnn.vtc")
    flip_in(bad, "cases/0/layers/5", 0)
    suite = local_suite(tmp_path, testcases={"cnn": bad})
    # a job judged at its outputs only: nothing but the background check reads the references
    text = suite.read_text(encoding="utf-8")
    assert text.count("layers = true") == 1
    suite.write_text(text.replace("layers = true", "layers = false"), encoding="utf-8")
    ran = run_ci([suite, "--only", "cnn/local/opt-off"], capsys, tmp_path)
    assert ran.code == 2, ran.err
    assert "cases/0/layers/5" in json.dumps(ran.report) and "checksum" in json.dumps(ran.report)


@pytest.mark.parametrize("shape", [(), (0, 3), (1, 3, 7, 5), (2, 1, 40), (5,), (3, 4, 1)])
def test_the_background_check_reads_in_bounded_blocks_covering_the_tensor_in_order(
        shape: tuple[int, ...]) -> None:
    """Whatever the shape (a batch of 1 included), blocks of at most the limit (or one
    element), concatenated in order, give the tensor's bytes: its digest is the stored one."""
    from verify.archive_verify import blocks
    from verify.digest import TensorHasher, tensor_digest

    value = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    limit = 24  # bytes: 6 float32
    h = TensorHasher("t", value.dtype, value.shape)
    parts = list(blocks(value.shape, value.dtype.itemsize, limit))
    for part in parts:
        assert value[part].nbytes <= limit or value[part].size <= 1 or value.size == 0
        h.update(value[part])
    assert h.hexdigest() == tensor_digest("t", value)
    assert len(parts) >= value.nbytes // limit
