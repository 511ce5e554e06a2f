"""localize's host references: one host capture set-up (model parsed, scratch copy written)
for every round of a search, removed when the search ends."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from verify import capture
from verify.graph import tensor_order
from verify.localize.search import References

CNN = Path(__file__).resolve().parents[2] / "goldens" / "models" / "cnn.onnx"


def test_rounds_share_one_host_capture_and_its_scratch_goes_at_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model_bytes = CNN.read_bytes()
    names = [t.name for t in tensor_order(onnx.load(CNN))]
    feeds = {names[0]: np.random.default_rng(0).random((1, 3, 224, 224), np.float32)}
    parses = []
    parse = capture.parse_model
    monkeypatch.setattr(capture, "parse_model", lambda b, w: parses.append(w) or parse(b, w))
    with References(model_bytes, feeds) as refs:
        first = refs.get([names[5]])
        second = refs.get([names[10], names[-1]])  # another round: only what is new
        scratch = Path(refs._host._scratch.name)  # type: ignore[union-attr]
        assert scratch.is_dir()
    assert len(parses) == 1 and not scratch.exists()
    monkeypatch.undo()
    whole = dict(capture.host_layers(model_bytes, feeds, [names[5], names[10], names[-1]]))
    for got in (first, second):
        for name, value in got.items():
            assert np.array_equal(value, whole[name]), name
