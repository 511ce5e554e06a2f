"""Fault localization: a model with one perturbed node, dumped at opt-level disable and all,
diffed against the clean model's per-layer goldens at default tolerances, must name exactly
that node's output as the first divergent tensor.

At opt-level all ONNX Runtime fuses most Conv outputs away (Conv+BatchNormalization+Relu
become one node whose output keeps the Relu's name): there the tensor diff names is the first
one the device still computes, and its `fused` list must hold the perturbed node's output
(the report says the fault is among them); where the perturbed output survives the
optimizer it must be named exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from fixtures_dump import CNN, pack, perturb, sigmoid_variant
from fixtures_dump import dump_factory  # noqa: F401 (fixture)
from verify.compare import ToleranceSet
from verify.diff import diff_captures

pytestmark = pytest.mark.slow

SIGMOIDS = ["stem/relu", "block2/relu1"]  # made Sigmoid in the variant (block3/se has one)
CASES = [
    ("conv", "stem/conv", "stem/conv:0"),
    ("conv", "block2/conv1", "block2/conv1:0"),
    ("conv", "block3/conv2", "block3/conv2:0"),
    ("hardsigmoid", "stem/relu", "stem/relu:0"),
    ("hardsigmoid", "block2/relu1", "block2/relu1:0"),
    ("hardsigmoid", "block3/se/sigmoid", "block3/se/sigmoid:0"),
    ("fp16", "stem/bn", "stem/bn:0"),
    ("fp16", "block2/add", "block2/add:0"),
    ("fp16", "head/fc", "logits"),
]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The clean models' per-layer goldens (the same seeded inputs as the dumps)."""
    root = tmp_path_factory.mktemp("refs")
    clean = onnx.load(CNN)
    return {"cnn": pack(CNN, root / "cnn.vtc", "--layers"),
            "sigmoid": pack(sigmoid_variant(clean, SIGMOIDS).SerializeToString(),
                            root / "sig.vtc", "--layers")}


@pytest.mark.parametrize("level", ["disable", "all"])
@pytest.mark.parametrize("kind, node, output", CASES, ids=[f"{k}-{n}" for k, n, _ in CASES])
def test_diff_names_the_perturbed_node_first(kind: str, node: str, output: str, level: str,
                                             references: dict[str, Path],
                                             dump_factory: Callable[..., Path]) -> None:
    base, ref = onnx.load(CNN), references["cnn"]
    if kind == "hardsigmoid":
        base, ref = sigmoid_variant(base, SIGMOIDS), references["sigmoid"]
    dump = dump_factory(perturb(base, kind, node).SerializeToString(), level)
    report = diff_captures(dump, ref, ToleranceSet())
    fd = report.first_divergent
    assert fd is not None and not report.passed
    if level == "disable" or output in {r.name for r in report.compared}:
        assert fd.name == output, report.verdict()
        assert fd.node == node
    else:
        assert output in fd.fused, report.verdict()
    # nothing before it is over tolerance
    assert all(r.passed for r in report.compared if r.index < fd.index)


@pytest.mark.parametrize("level", ["disable", "all"])
def test_clean_dumps_pass_against_the_goldens(level: str, references: dict[str, Path],
                                              dump_factory: Callable[..., Path]) -> None:
    report = diff_captures(dump_factory(CNN, level), references["cnn"], ToleranceSet())
    assert report.passed, report.verdict()
    sig = sigmoid_variant(onnx.load(CNN), SIGMOIDS).SerializeToString()
    report = diff_captures(dump_factory(sig, level), references["sigmoid"], ToleranceSet())
    assert report.passed, report.verdict()
