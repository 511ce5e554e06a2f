"""`verify pack --layers`: every case's per-layer references, captured from one host set-up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers_cli import verify
from verify import capture, graph
from verify.archive_reader import iter_layers, read_archive
from verify.capture import host_layers

DYNAMIC = Path(__file__).resolve().parent.parent / "goldens" / "models" / "dynamic.onnx"


def test_cases_of_different_shapes_share_one_capture_set_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    parses = []
    parse = capture.parse_model

    def counting_parse(data: bytes, what: str, external=()):  # type: ignore[no-untyped-def]
        parses.append(what)
        return parse(data, what, external)

    monkeypatch.setattr(capture, "parse_model", counting_parse)
    monkeypatch.setattr(graph, "parse_model", counting_parse)  # pack's own parse
    out = tmp_path / "dyn.vtc"
    code, _, err = verify(capsys, "pack", DYNAMIC, "-o", out, "--layers",
                          "-d", "x:[[1,2,3,4]]", "-d", "x:[[1,2,3,4],[5,6,7,8]]",
                          "-d", "x:[[0,0,0,1],[1,0,0,0],[2,2,2,2]]")
    assert code == 0, err
    # one parse for pack and the capture set-up of three cases (the summary printed after
    # packing reads the written archive's model on its own: that one is named so)
    assert [w for w in parses if not w.endswith("the archive's model")] == [str(DYNAMIC)]
    monkeypatch.undo()
    tc = read_archive(out)
    assert len(tc.cases) == 3
    for i, case in enumerate(tc.cases):
        stored = list(iter_layers(out, i))
        expected = list(host_layers(tc.model_bytes, case.inputs))
        assert [n for n, _ in stored] == [n for n, _ in expected]
        assert stored[-1][1].shape[0] == i + 1  # each case at its own batch size
        for (name, a), (_, b) in zip(stored, expected, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b), (i, name)
