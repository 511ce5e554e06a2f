"""`verify run`'s set-up and session (verify/execute.py: `prepare`, `run`), decision by decision:
the line naming the archive's model when its external data does not fit the archive, and the
live status line and transfer progress that a terminal user sees while the device works.

Each test was written against a single-point mutant of execute.py that survived the rest of
execute's test selection (docs/mutation.md; scripts/mutation.py): with the mutant applied it
fails. The model is tiny and real (y = x + w, z = x * v, w and v kept as external data files),
packed by `verify pack` and run on the real local device."""

from __future__ import annotations

import io
from pathlib import Path

import h5py
import numpy as np
import pytest
from onnx import TensorProto, helper

from helpers_archive import external_tensor as _external
from helpers_archive import reseal
from helpers_cli import only_line, verify
from verify import schema

W = np.arange(1, 5, dtype=np.float32)
V = np.arange(10, 14, dtype=np.float32)


@pytest.fixture
def packed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The tiny model, its weights in `w.bin` and `sub/v.bin`, packed keeping them external."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "w.bin").write_bytes(W.tobytes())
    (src / "sub" / "v.bin").write_bytes(V.tobytes())
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"]), helper.make_node("Mul", ["x", "v"], ["z"])],
        "g", [info("x", TensorProto.FLOAT, [4])],
        [info("y", TensorProto.FLOAT, [4]), info("z", TensorProto.FLOAT, [4])],
        [_external("w", W, "w.bin"), _external("v", V, "sub/v.bin")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (src / "m.onnx").write_bytes(model.SerializeToString())
    vtc = tmp_path / "m.vtc"
    code, _, err = verify(capsys, "pack", src / "m.onnx", "--keep-external-data", "-d", "x:rand",
                          "-o", vtc)
    assert code == 0, err
    return vtc


def test_a_model_naming_a_file_the_archive_lacks_is_one_line_naming_the_archives_model(
        packed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An archive whose second external file was renamed (and the archive re-sealed, as a tool
    that edits archives would): run refuses it before the device, exit 2, in one line that
    names the archive and its model, and the file the model wants (the `where` of prepare's
    parse, and the archive's own file list passed to it: prepare 13, 14, 16, 17)."""
    # intact, it passes: the output check's own parse (no dump) gets the archive's files too
    # (output_floors 5, 7, 8)
    code, out, err = verify(capsys, "run", packed, "--iter", "1")
    assert code == 0, err
    assert out.rstrip().endswith("=== PASS: all outputs within tolerance in 1 case(s)")
    with h5py.File(packed, "r+") as f:
        f[f"{schema.EXTERNAL}/1"].attrs[schema.ATTR_NAME] = np.bytes_(b"sub/other.bin")
    reseal(packed)
    code, out, err = verify(capsys, "run", packed, "--iter", "1")
    assert (code, only_line(err)) == (
        2, f"error: {packed}: the archive's model: initializer 'v' is stored in external file "
           "'sub/v.bin', which the archive does not hold")
    assert "PASS" not in out and "FAIL" not in out


def test_a_terminal_sees_the_connecting_status_line(
        packed: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal `verify run` says what it waits for ('… connecting to local', '… running on
    local') on stderr while the device works (run passes its status callback to the session: run 8); in a
    CI log (not a terminal) it says nothing."""
    from verify.cli import render

    code, _, err = verify(capsys, "run", packed, "--iter", "1")
    assert (code, err) == (0, "")
    monkeypatch.setattr(render, "interactive", lambda: True)
    code, out, err = verify(capsys, "run", packed, "--iter", "1")
    assert code == 0, err
    assert err.splitlines() == ["… connecting to local", "… running on local"]
    assert out.rstrip().endswith("=== PASS: all outputs within tolerance in 1 case(s)")


def test_every_transfer_reaches_the_progress_factory(packed: Path) -> None:
    """The progress factory (the CLI's bars for transfers of 8 MB and more) is asked for each
    file the run sends: the runner, the model, the input and both external data files, each
    with its size (run passes it to the session: run 9)."""
    from verify import execute
    from verify.archive_reader import read_archive
    from verify.options import ArchiveSelection
    from verify.session import runner_file

    asked: list[tuple[str, int]] = []

    def factory(label: str, total: int) -> None:
        asked.append((label, total))
        return None

    outcome = execute.run(execute.RunRequest(ArchiveSelection(packed)), progress=factory)
    assert outcome.passed is True
    tc = read_archive(packed)
    npy = io.BytesIO()
    np.save(npy, tc.cases[0].inputs["x"])  # pushed as .npy
    assert sorted(asked) == sorted([("runner", runner_file().stat().st_size),
                                    ("model", len(tc.model_bytes)), ("input x", len(npy.getvalue())),
                                    ("w.bin", W.nbytes), ("sub/v.bin", V.nbytes)])
