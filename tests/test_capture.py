"""capture.host_layers: reference values of every tensor, chunked, in topological order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from verify.capture import host_layers, plan_dump
from verify.errors import UsageError
from verify.graph import tensor_order, with_outputs

CNN = Path(__file__).resolve().parent.parent / "goldens" / "models" / "cnn.onnx"


@pytest.fixture(scope="module")
def feeds() -> dict[str, np.ndarray]:
    return {"data": np.random.default_rng(1).standard_normal((1, 3, 224, 224), np.float32)}


@pytest.fixture(scope="module")
def all_marked(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor from one run of the fully marked model (the unbounded way)."""
    model = onnx.load(CNN)
    marked, _ = with_outputs(model, [t.name for t in tensor_order(model)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(marked.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return {**feeds, **dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))}


@pytest.mark.parametrize("budget", [None, 1 << 20, 1])
def test_host_layers_yields_every_tensor_in_order_bit_identical(
        feeds: dict[str, np.ndarray], all_marked: dict[str, np.ndarray],
        budget: int | None) -> None:
    order = [t.name for t in tensor_order(onnx.load(CNN))]
    got = list(host_layers(CNN.read_bytes(), feeds, budget_bytes=budget))
    assert [n for n, _ in got] == order
    for name, value in got:
        assert value.dtype == all_marked[name].dtype
        assert np.array_equal(value, all_marked[name]), name


def test_host_layers_takes_a_subset_in_topological_order(feeds: dict[str, np.ndarray]) -> None:
    got = [n for n, _ in host_layers(CNN.read_bytes(), feeds, ["prob", "stem/relu:0", "data"])]
    assert got == ["data", "stem/relu:0", "prob"]


def test_host_layers_refuses_unknown_tensor_names(feeds: dict[str, np.ndarray]) -> None:
    with pytest.raises(UsageError, match="no tensor named 'nope' in the model"):
        list(host_layers(CNN.read_bytes(), feeds, ["nope"]))


def test_plan_dump_filter_and_bad_regex() -> None:
    plan = plan_dump(CNN.read_bytes(), None, r"^block3/se/")
    assert [t.name for t in plan.tensors][:3] == ["data", "block3/se/pool:0", "block3/se/fc1:0"]
    assert [t.index for t in plan.tensors] == list(range(len(plan.tensors)))
    assert plan.floors["block3/se/sigmoid:0"] == 1 / 16
    with pytest.raises(UsageError, match=r"--dump-filter '\(': not a regular expression"):
        plan_dump(CNN.read_bytes(), None, "(")


def test_pack_layers_streams_the_host_capture_into_the_archive(tmp_path: Path) -> None:
    from verify.archive_reader import iter_layers, read_archive
    from verify.cli import main

    out = tmp_path / "cnn.vtc"
    assert main(["pack", str(CNN), "-o", str(out), "--layers", "--seed", "3", "--json"]) == 0
    tc = read_archive(out)
    assert tc.has_layers
    stored = list(iter_layers(out))
    expected = list(host_layers(CNN.read_bytes(), tc.cases[0].inputs))
    assert [n for n, _ in stored] == [n for n, _ in expected] == [t.name for t in tc.tensor_order]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(stored, expected))
    assert np.array_equal(dict(stored)["prob"], tc.cases[0].outputs["prob"])
