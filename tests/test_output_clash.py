"""An output path that names one of the command's own inputs (the model, the archive, the
suite, a testcase, another output) or a folder no file can be made in is exit 2 before any
work, and the input is left as it was."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fixtures_ci import TESTCASES, local_suite
from helpers_cli import only_line, verify
from verify.files import same_file

REPO = Path(__file__).resolve().parent.parent
CNN = REPO / "goldens" / "models" / "cnn.onnx"
DESTROY = "writing there would destroy it, give another file name"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("VERIFY_DEVICES", str(tmp_path / "devices"))
    (tmp_path / "devices").mkdir()


def test_same_file_sees_links_and_spellings(tmp_path: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_text("x")
    os.link(a, tmp_path / "hard.txt")
    assert same_file(a, tmp_path / "hard.txt")
    assert same_file(a, tmp_path / "sub" / ".." / "a.txt")
    assert same_file(tmp_path / "new.md", tmp_path / "." / "new.md")  # neither exists yet
    assert not same_file(a, tmp_path / "b.txt")


def test_pack_never_writes_over_its_model_or_data(tmp_path: Path, home: None,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(CNN.read_bytes())
    code, out, err = verify(capsys, "pack", model, "-o", model)
    assert (code, out) == (2, "")
    assert only_line(err) == f"error: -o {model}: is the model; {DESTROY}"
    assert model.read_bytes() == CNN.read_bytes()

    data = tmp_path / "x.npy"
    np.save(data, np.zeros((1, 3, 32, 32), np.float32))
    before = data.read_bytes()
    code, _, err = verify(capsys, "pack", model, "-d", f"x:{data}", "-o", data)
    assert code == 2
    assert only_line(err) == f"error: -o {data}: is a -d file; {DESTROY}"
    assert data.read_bytes() == before

    # the ground truth's own files: --expected, and a torch:FILE.py:FACTORY or .pt2 program
    program, expected = tmp_path / "net.py", tmp_path / "out.json"
    program.write_text("def make(): ...\n")
    expected.write_text("{}")
    for args, out, what in (
            (["--reference", f"torch:{program}:make"], program, "the --reference program"),
            (["--reference", f"torch:{tmp_path / 'net.pt2'}"], tmp_path / "net.pt2",
             "the --reference program"),
            (["--expected", f"y:{expected}"], expected, "an --expected file")):
        code, _, err = verify(capsys, "pack", model, *args, "-o", out)
        assert (code, only_line(err)) == (2, f"error: -o {out}: is {what}; {DESTROY}")
    assert program.read_text() == "def make(): ...\n" and expected.read_text() == "{}"


def test_pack_never_writes_over_a_file_its_model_or_data_folder_holds(
        tmp_path: Path, home: None, capsys: pytest.CaptureFixture[str]) -> None:
    """The model's external weights file, and a file inside a -d folder (onnx_test_runner's
    input_0.pb), were overwritten: the next pack fed the HDF5 bytes to onnxruntime as weights
    and stored NaN ground truth, exit 0."""
    import onnx

    from verify.cli import main

    model = onnx.load(str(CNN))
    folder = tmp_path / "ext"
    folder.mkdir()
    onnx.save_model(model, str(folder / "m.onnx"), save_as_external_data=True,
                    location="m.data", size_threshold=0)
    weights = (folder / "m.data").read_bytes()
    code, _, err = verify(capsys, "pack", folder / "m.onnx", "-o", folder / "m.data")
    assert (code, only_line(err)) == (
        2, f"error: -o {folder / 'm.data'}: is the model's external data file; {DESTROY}")
    assert (folder / "m.data").read_bytes() == weights

    runner = tmp_path / "case"
    (runner / "test_data_set_0").mkdir(parents=True)
    assert main(["export", str(REPO / "goldens" / "testcases" / "cnn.vtc"), "-o",
                 str(runner / "model.onnx"), "--data", str(runner)]) == 0
    given = runner / "test_data_set_0" / "input_0.pb"
    before = given.read_bytes()
    code, _, err = verify(capsys, "pack", runner / "model.onnx", "-d", runner, "-o", given)
    assert (code, only_line(err)) == (
        2, f"error: -o {given}: is a file of the -d folder {runner}; {DESTROY}")
    assert given.read_bytes() == before
    code, _, err = verify(capsys, "pack", runner / "model.onnx", "-d", runner /
                          "test_data_set_0", "-o", given)  # the set's folder given itself
    assert code == 2 and "is a file of the -d folder" in err and given.read_bytes() == before
    # the folder's other files are not read: the default output beside the model is written,
    # and written again (a re-pack was refused)
    for _ in range(2):
        assert verify(capsys, "pack", runner / "model.onnx", "-d", runner)[0] == 0
    assert (runner / "model.vtc").is_file()


def test_run_never_writes_over_its_archive_or_another_output(
        tmp_path: Path, home: None, capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "cnn.vtc"
    assert verify(capsys, "pack", CNN, "-o", archive)[0] == 0
    before = archive.read_bytes()
    for option in ("--io-dump", "--profile"):
        code, out, err = verify(capsys, "run", archive, "--iter", "1", option, archive)
        assert (code, out) == (2, "")
        assert only_line(err) == f"error: {option} {archive}: is the archive; {DESTROY}"
    text = tmp_path / "same.txt"
    code, out, err = verify(capsys, "run", archive, "--iter", "1", "--io-dump", text,
                            "--profile", text)
    assert (code, out) == (2, "")
    assert only_line(err) == f"error: --profile {text}: is the --io-dump file; {DESTROY}"
    assert not text.exists()
    assert archive.read_bytes() == before
    # a folder no file can be made in: said before the run, as the write would say it
    code, out, err = verify(capsys, "run", archive, "--iter", "1", "--profile", "/proc/p.json")
    assert (code, out) == (2, "")
    assert only_line(err).startswith("error: /proc/p.json: cannot write: ")


def test_ci_reports_never_land_on_the_suite_a_testcase_or_each_other(
        device_env, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from verify.cli import main

    suite = local_suite(tmp_path)
    text = suite.read_text()
    cnn = TESTCASES / "cnn.vtc"
    cnn_bytes = cnn.read_bytes()
    report = tmp_path / "r.xml"
    cases = [(["--markdown", str(suite)], f"--markdown {suite}: is the suite file"),
             (["--report-json", str(cnn)],
              f"--report-json {cnn}: is testcase 'cnn' of the suite"),
             (["--junit", str(report), "--html", str(report)],
              f"--html {report}: is the --junit report")]
    for args, said in cases:
        assert main(["ci", str(suite), "--baselines", str(tmp_path / "bl"), *args]) == 2
        out, err = capsys.readouterr()
        assert (out, err) == ("", f"error: {said}; {DESTROY}\n")  # no job ran
    assert main(["ci", str(suite), "--markdown", "/proc/ci.md"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and only_line(err).startswith("error: /proc/ci.md: cannot write: ")
    assert suite.read_text() == text and cnn.read_bytes() == cnn_bytes
    assert not report.exists() and not (tmp_path / "bl").exists()


def test_a_link_device_or_fifo_is_never_replaced_by_an_output(
        tmp_path: Path, home: None, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "kept.txt"
    target.write_text("kept")
    link, fifo = tmp_path / "link.txt", tmp_path / "fifo"
    link.symlink_to(target)
    os.mkfifo(fifo)
    for path, kind in ((link, "a symbolic link"), (fifo, "not a regular file"),
                       (Path("/dev/null"), "not a regular file")):
        code, out, err = verify(capsys, "pack", CNN, "-o", path)
        assert (code, out) == (2, "")
        assert only_line(err) == (f"error: -o {path}: is {kind}, which the written file would "
                                  "replace; give a file name")
    assert link.is_symlink() and target.read_text() == "kept"
    assert fifo.exists() and not fifo.is_file()
    assert Path("/dev/null").is_char_device()


def test_run_files_never_land_inside_its_dump_folders(
        tmp_path: Path, home: None, capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "cnn.vtc"
    assert verify(capsys, "pack", CNN, "-o", archive)[0] == 0
    for folder_option, option in (("--bin-io-dump", "--io-dump"),
                                  ("--bin-out-dump", "--profile")):
        inside = tmp_path / "d" / "sub" / "x.txt"
        code, out, err = verify(capsys, "run", archive, "--iter", "1", folder_option,
                                tmp_path / "d", option, inside)
        assert (code, out) == (2, "")
        assert only_line(err) == (f"error: {option} {inside}: is inside the {folder_option} "
                                  "folder, which holds the dump's own files only; give a path "
                                  "outside it")
        assert not (tmp_path / "d").exists()


def test_export_and_localize_check_where_they_write_before_any_work(
        tmp_path: Path, home: None, capsys: pytest.CaptureFixture[str]) -> None:
    """export -o a link or a FIFO, even with --force (which replaces a differing file), and
    --data or localize's -o where no file can be made: refused, exit 2, nothing written. The
    link was replaced by the model; localize ran its whole search, then failed to write."""
    archive = tmp_path / "cnn.vtc"
    assert verify(capsys, "pack", CNN, "-o", archive)[0] == 0
    target = tmp_path / "kept.onnx"
    target.write_text("kept")
    link, fifo = tmp_path / "link.onnx", tmp_path / "fifo.onnx"
    link.symlink_to(target)
    os.mkfifo(fifo)
    for path, kind in ((link, "a symbolic link"), (fifo, "not a regular file")):
        code, out, err = verify(capsys, "export", archive, "-o", path, "--force")
        assert (code, out) == (2, "")
        assert only_line(err) == (f"error: -o {path}: is {kind}, which the written file would "
                                  "replace; give a file name")
    assert link.is_symlink() and target.read_text() == "kept" and not fifo.is_file()
    code, out, err = verify(capsys, "export", archive, "-o", tmp_path / "m.onnx", "--data",
                            "/proc/data")
    assert (code, out) == (2, "")
    assert only_line(err).startswith("error: /proc/data: cannot write: ")
    assert not (tmp_path / "m.onnx").exists()
    dump = tmp_path / "dump"  # a run's --bin-io-dump folder, which extra files would break
    assert verify(capsys, "run", archive, "--iter", "1", "--bin-io-dump", dump)[0] == 0
    code, out, err = verify(capsys, "export", archive, "-o", tmp_path / "m.onnx", "--data", dump)
    assert (code, out) == (2, "")
    assert only_line(err) == (f"error: --data {dump}: is a verify dump folder (it holds "
                              "manifest.json); writing there would break it, give another folder")
    assert not (dump / "test_data_set_0").exists()
    code, out, err = verify(capsys, "localize", archive, "-o", "/proc/repro")
    assert (code, out) == (2, "")
    assert only_line(err).startswith("error: /proc/repro: cannot write: ")
    assert only_line(err).endswith("(-o, in /proc)")
    through = tmp_path / "kept.onnx" / "sub"  # a folder path through a file
    code, out, err = verify(capsys, "localize", archive, "-o", through)
    assert (code, out) == (2, "")
    assert only_line(err) == f"error: -o {through}: {target} is a file, not a folder"
