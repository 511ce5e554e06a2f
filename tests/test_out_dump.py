"""`run --bin-out-dump DIR`: the final outputs' folder lives as a dump folder does. A folder
holding anything else is refused before the run; a run's files replace the previous run's as
a whole (outputs.json last), so files of an earlier run with more cases or another model are
never left beside the new ones; a run that fails leaves the previous files as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures_dump import CNN, pack
from helpers_cli import verify


@pytest.fixture(scope="module")
def two_cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack(CNN, tmp_path_factory.mktemp("outdump") / "cnn2.vtc", "-d", "data:rand",
                "-d", "data:rand")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_rerun_replaces_the_previous_files_as_a_whole(
        two_cases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code, _, err = verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", out)
    assert code == 0, err
    assert sorted(_files(out)) == ["case0-out0.npy", "case1-out0.npy", "outputs.json"]
    code, _, err = verify(capsys, "run", two_cases, "--iter", "1", "--case", "1",
                          "--bin-out-dump", out)
    assert code == 0, err
    assert sorted(_files(out)) == ["case1-out0.npy", "outputs.json"]  # no case0 of before
    index = json.loads((out / "outputs.json").read_text())
    assert [e["file"] for e in index["outputs"]] == ["case1-out0.npy"]


def test_a_folder_holding_anything_else_is_refused_before_the_run(
        two_cases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, stdout, err = verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", out)
    assert (code, err.strip()) == (2, f"error: {out}: folder is not empty and not a "
                                      "--bin-out-dump folder (holds notes.txt); give an empty "
                                      "or new folder")
    assert stdout == "" and _files(out) == {"notes.txt": b"mine"}
    code, _, err = verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", two_cases)
    assert (code, err.strip()) == (2, f"error: {two_cases}: exists and is not a folder; give "
                                      "a folder for the outputs")


def test_a_failed_run_leaves_the_previous_files_whole_and_nothing_staged(
        two_cases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", out)[0] == 0
    before = _files(out)
    code, _, err = verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", out,
                          "--device", "ssh:nobody@127.0.0.1:1")  # refused after the folder
    assert code == 3, err                                       # was prepared
    assert _files(out) == before  # no staging folder left either
    fresh = tmp_path / "new" / "a" / "out"
    code, _, _ = verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", fresh,
                        "--device", "ssh:nobody@127.0.0.1:1")
    assert code == 3 and not (tmp_path / "new").exists()  # the folders the run made go too


def test_outputs_are_swapped_in_last_so_a_later_failure_keeps_the_previous_ones(
        two_cases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from verify import execute

    out, layers = tmp_path / "out", tmp_path / "layers"
    assert verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", out)[0] == 0
    before = _files(out)

    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(execute, "write_layer_dumps", full)  # the step before the outputs'
    code, _, err = verify(capsys, "run", two_cases, "--iter", "1", "--case", "1",
                          "--bin-out-dump", out, "--bin-io-dump", layers)
    assert code == 2 and "No space left on device" in err
    assert _files(out) == before and not layers.exists()
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    code, stdout, err = verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", out,
                               "--io-dump", blocker / "io.txt")  # refused before the run
    assert (code, stdout, err.strip()) == (
        2, "", f"error: --io-dump {blocker / 'io.txt'}: {blocker} is a file, not a folder")
    assert _files(out) == before


@pytest.mark.parametrize("out, layers", [("both", "both"), ("o", "o/layers"),
                                         ("d/out", "d")])
def test_the_dump_and_the_outputs_need_folders_of_their_own(
        out: str, layers: str, two_cases: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump",
                          tmp_path / out, "--bin-io-dump", tmp_path / layers)
    assert (code, err.strip()) == (
        2, f"error: --bin-out-dump {tmp_path / out} and --bin-io-dump {tmp_path / layers}: the "
           "same folder, or one inside the other; give each a folder of its own")
    assert list(tmp_path.iterdir()) == []
