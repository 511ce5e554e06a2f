"""Ordinary OS conditions are one line and exit 2, with nothing left behind: a read-only
output folder (a tmpfs mounted read-only: root ignores permission bits), a full disk (a 1 MB
tmpfs), a folder given where a file belongs, and bad numbers on the command line."""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers_cli import only_line, verify

REPO = Path(__file__).resolve().parent.parent
CNN = REPO / "goldens" / "models" / "cnn.onnx"


@contextlib.contextmanager
def tmpfs(where: Path, size: str = "1m", read_only: bool = False) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(scope="module")
def cnn_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from verify.cli import main

    out = tmp_path_factory.mktemp("oscnd") / "cnn.vtc"
    assert main(["pack", str(CNN), "-o", str(out)]) == 0
    return out


@pytest.fixture
def local_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("VERIFY_DEVICES", str(tmp_path / "devices"))
    (tmp_path / "devices").mkdir()


def outputs(cnn: Path, folder: Path) -> list[tuple[list[str], Path]]:
    """(command, what the error names) for every command that writes what the user named."""
    return [
        (["pack", str(CNN), "-o", str(folder / "x.vtc")], folder / "x.vtc"),
        (["pack", str(CNN), "--layers", "-o", str(folder / "x.vtc")], folder / "x.vtc"),
        (["export", str(cnn), "-o", str(folder / "x.onnx")], folder / "x.onnx"),
        (["run", str(cnn), "--iter", "1", "--profile", str(folder / "p.json")],
         folder / "p.json"),
        (["run", str(cnn), "--iter", "1", "--bin-out-dump", str(folder / "out")],
         folder / "out"),
        (["run", str(cnn), "--iter", "1", "--bin-io-dump", str(folder / "dump")],
         folder / "dump"),
        (["run", str(cnn), "--iter", "1", "--io-dump", str(folder / "io.txt")],
         folder / "io.txt"),
    ]


def test_a_read_only_folder_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                                   cnn_vtc: Path, tmp_path: Path,
                                                   local_home: None) -> None:
    with tmpfs(tmp_path / "ro", read_only=True) as ro:
        for args, named in outputs(cnn_vtc, ro):
            code, _, err = verify(capsys, *args)
            line = only_line(err)
            assert code == 2, (args, err)
            assert line.startswith(f"error: {named}") and "Read-only file system" in line, line
            assert list(ro.iterdir()) == []
        # an existing folder for the dump: named itself, not the staging folder made inside it
        code, _, err = verify(capsys, "run", cnn_vtc, "--iter", "1", "--bin-io-dump", ro)
        assert (code, only_line(err)) == (2, f"error: {ro}: cannot write: Read-only file system")


def test_a_full_disk_is_one_line_exit_2_and_leaves_nothing(capsys: pytest.CaptureFixture[str],
                                                           cnn_vtc: Path, tmp_path: Path,
                                                           local_home: None) -> None:
    with tmpfs(tmp_path / "full", size="1m") as full:
        with open(full / "filler", "wb", buffering=0) as fh:  # every block taken
            with contextlib.suppress(OSError):
                while True:
                    fh.write(bytes(4096))
        for args, named in outputs(cnn_vtc, full):
            code, _, err = verify(capsys, *args)
            line = only_line(err)
            assert code == 2, (args, err)
            assert line.startswith(f"error: {full}") and "No space left on device" in line, line
            assert sorted(p.name for p in full.iterdir()) == ["filler"], args


def test_a_folder_where_the_archive_belongs(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    folder = tmp_path / "existing"
    folder.mkdir()
    code, _, err = verify(capsys, "pack", CNN, "-o", folder)
    assert (code, only_line(err)) == (2, f"error: {folder}: is a folder; give the archive's "
                                         "file name")
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_timeout_must_be_a_positive_number(capsys: pytest.CaptureFixture[str], cnn_vtc: Path,
                                           value: str) -> None:
    code, _, err = verify(capsys, "run", cnn_vtc, "--timeout", value)
    shown = {"0": "0", "-1": "-1", "nan": "nan", "inf": "inf"}[value]
    assert (code, only_line(err)) == (2, f"error: --timeout {shown}: expected a number of "
                                         "seconds > 0")


def test_a_disk_that_fills_midway_says_what_the_whole_archive_needs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, local_home: None) -> None:
    """`pack --layers` onto a disk that fills with the layers: the message quoted the next
    layer's size against what was left ("needs about 0.4 MB, 0.3 MB free"), not the archive's."""
    with tmpfs(tmp_path / "small", size="2m") as small:
        code, _, err = verify(capsys, "pack", CNN, "-d", REPO / "goldens" / "images" /
                              "sample.png", "--layers", "-o", small / "cnn.vtc")
        line = only_line(err)
        assert code == 2 and line.startswith(f"error: {small / 'cnn.vtc'}: cannot write: No "
                                             "space left on device (needs at least "), line
        need, free, written = (float(x) for x in re.findall(r"([0-9.]+) MB", line))
        assert written > 0.5 and need > free > written, line  # the input and model went in
        assert line.endswith(" MB written, then removed)")
        assert list(small.iterdir()) == []
