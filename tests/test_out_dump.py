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


def test_a_failed_run_leaves_the_previous_files_whole_and_nothing_staged(
        two_cases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", out)[0] == 0
    before = _files(out)
    code, _, err = verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", out,
                          "--device", "ssh:nobody@127.0.0.1:1")  # refused after the folder
    assert code == 3, err                                       # was prepared
    assert _files(out) == before  # no staging folder left either
    fresh = tmp_path / "fresh"
    code, _, _ = verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", fresh,
                        "--device", "ssh:nobody@127.0.0.1:1")
    assert code == 3 and not fresh.exists()  # the folder the run made goes with it


def test_the_dump_and_the_outputs_need_folders_of_their_own(
        two_cases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = tmp_path / "both"
    code, _, err = verify(capsys, "run", two_cases, "--iter", "1", "--bin-out-dump", both,
                          "--bin-io-dump", both)
    assert (code, err.strip()) == (2, f"error: --bin-out-dump and --bin-io-dump are both "
                                      f"{both}: give each a folder of its own")
    assert not both.exists()
