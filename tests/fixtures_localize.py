"""Fixtures for `verify localize`: archives of the sample CNN, of a ResNet-style model with
residual branches, a concat of branches and a multi-output node, and of a long chain; and
fault-injecting device profiles (tests/faulty_runner.py) written into $VERIFY_DEVICES.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
FAULTY_RUNNER = Path(__file__).resolve().parent / "faulty_runner.py"
CHAIN_LENGTH = 128

__all__ = ["cnn_vtc", "residual_vtc", "chain_vtc", "if_vtc", "faulty_profile",
           "residual_model", "chain_model", "if_model"]


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float = 0.3,
          positive: bool = False) -> TensorProto:
    value = rng.uniform(0.5, 1.5, shape) if positive else rng.normal(0, scale, shape)
    return numpy_helper.from_array(value.astype(np.float32), name)


def residual_model(seed: int = 0) -> onnx.ModelProto:
    """A small ResNet-style net: stem, a residual block (Conv-BN-Relu-Conv-BN + skip Add), a
    Split into two branches (a multi-output node) joined by Concat and added to the skip, a
    head MatMul with an initializer weight and a bias made by a Constant node, Softmax."""
    rng = np.random.default_rng(seed)
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def conv(name: str, x: str, cin: int, cout: int, k: int) -> str:
        inits.append(_init(rng, f"{name}/W", (cout, cin, k, k), 0.6 / np.sqrt(cin * k * k)))
        inits.append(_init(rng, f"{name}/B", (cout,), 0.1))
        nodes.append(helper.make_node("Conv", [x, f"{name}/W", f"{name}/B"], [f"{name}:0"],
                                      name=name, pads=[k // 2] * 4, kernel_shape=[k, k]))
        return f"{name}:0"

    def bn(name: str, x: str, c: int) -> str:
        inits.extend([_init(rng, f"{name}/scale", (c,), positive=True),
                      _init(rng, f"{name}/bias", (c,), 0.1),
                      _init(rng, f"{name}/mean", (c,), 0.1),
                      _init(rng, f"{name}/var", (c,), positive=True)])
        nodes.append(helper.make_node(
            "BatchNormalization", [x, *(f"{name}/{p}" for p in ("scale", "bias", "mean", "var"))],
            [f"{name}:0"], name=name, epsilon=1e-5))
        return f"{name}:0"

    def op(kind: str, name: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> list[str]:
        outs = [f"{name}:{i}" for i in range(n_out)]
        nodes.append(helper.make_node(kind, inputs, outs, name=name, **attrs))
        return outs

    a = op("Relu", "stem/relu", [bn("stem/bn", conv("stem/conv", "x", 3, 8, 3), 8)])[0]
    r = op("Relu", "res1/relu1", [bn("res1/bn1", conv("res1/conv1", a, 8, 8, 3), 8)])[0]
    r = bn("res1/bn2", conv("res1/conv2", r, 8, 8, 3), 8)
    b = op("Relu", "res1/relu", op("Add", "res1/add", [a, r]))[0]
    inits.append(numpy_helper.from_array(np.array([4, 4], np.int64), "split/sizes"))
    s0, s1 = op("Split", "split", [b, "split/sizes"], n_out=2, axis=1)
    br0 = op("Relu", "br0/relu", [conv("br0/conv", s0, 4, 4, 3)])[0]
    br1 = op("Relu", "br1/relu", [conv("br1/conv", s1, 4, 4, 1)])[0]
    c = op("Concat", "concat", [br0, br1], axis=1)[0]
    d = op("Relu", "res2/relu", op("Add", "res2/add", [c, b]))[0]
    p = op("Flatten", "head/flatten", op("GlobalAveragePool", "head/pool", [d]))[0]
    inits.append(_init(rng, "head/W", (8, 10), 0.5))
    m = op("MatMul", "head/matmul", [p, "head/W"])[0]
    nodes.append(helper.make_node(
        "Constant", [], ["head/bias_value"], name="head/bias_const",
        value=numpy_helper.from_array(rng.normal(0, 0.1, (10,)).astype(np.float32))))
    logits = op("Add", "head/add", [m, "head/bias_value"])[0]
    nodes.append(helper.make_node("Softmax", [logits], ["prob"], name="head/softmax", axis=1))
    graph = helper.make_graph(
        nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def chain_model(length: int = CHAIN_LENGTH, seed: int = 1) -> onnx.ModelProto:
    """`length` nodes in a line (MatMul, Add, MatMul, Add, ...) on a 1x16 vector: every cut
    is a single tensor, so bisection halves the range each round."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for i in range(length):
        name = f"n{i:03d}"
        if i % 2 == 0:
            w = np.eye(16, dtype=np.float32) + rng.normal(0, 0.05, (16, 16)).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"{name}/W"))
            nodes.append(helper.make_node("MatMul", [x, f"{name}/W"], [f"{name}:0"], name=name))
        else:
            inits.append(numpy_helper.from_array(
                rng.normal(0, 0.05, (16,)).astype(np.float32), f"{name}/B"))
            nodes.append(helper.make_node("Add", [x, f"{name}/B"], [f"{name}:0"], name=name))
        x = f"{name}:0"
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 16])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def if_model() -> onnx.ModelProto:
    """Control flow: y = 2x, c = sum(y) > 0, z = If(c, y + w, y - w), out = Relu(z). The If
    bodies read y and w from the outer scope; c is a 0-d bool tensor."""
    f = TensorProto.FLOAT

    def body(op: str, out: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["y", "w"], [out], name=f"if/{op}")],
                                 op, [], [helper.make_tensor_value_info(out, f, [1, 4])])

    nodes = [helper.make_node("Mul", ["x", "two"], ["y"], name="mul"),
             helper.make_node("ReduceSum", ["y"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["z"], name="if", then_branch=body("Add", "t"),
                              else_branch=body("Sub", "e")),
             helper.make_node("Relu", ["z"], ["out"], name="relu")]
    inits = [numpy_helper.from_array(np.array(2, np.float32), "two"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.ones((1, 4), np.float32), "w")]
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", f, [1, 4])],
                              [helper.make_tensor_value_info("out", f, [1, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _pack(model: onnx.ModelProto, folder: Path, stem: str, *extra: str) -> Path:
    from verify.cli import main

    onnx_path = folder / f"{stem}.onnx"
    onnx.save(model, onnx_path)
    out = folder / f"{stem}.vtc"
    assert main(["pack", str(onnx_path), "-o", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="session")
def cnn_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """goldens/models/cnn.onnx packed with the sample image."""
    folder = tmp_path_factory.mktemp("loc-cnn")
    model = onnx.load(REPO / "goldens" / "models" / "cnn.onnx")
    return _pack(model, folder, "cnn", "-d", str(REPO / "goldens" / "images" / "sample.png"),
                 "--scale", "0.00392")


@pytest.fixture(scope="session")
def residual_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _pack(residual_model(), tmp_path_factory.mktemp("loc-res"), "residual")


@pytest.fixture(scope="session")
def chain_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _pack(chain_model(), tmp_path_factory.mktemp("loc-chain"), "chain")


@pytest.fixture(scope="session")
def if_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _pack(if_model(), tmp_path_factory.mktemp("loc-if"), "if", "-d", "x:[[1,2,3,-4]]")


@pytest.fixture
def faulty_profile(device_env: Any) -> Iterator[Any]:
    """make(name, fault, node(s), value=None, ssh=None, fused=False) writes a profile whose runner is
    tests/faulty_runner.py (locally, or on an ssh fixture server) and returns its spec."""

    def make(name: str, fault: str, node: str | list[str], value: float | None = None,
             ssh: Any = None, fused: bool = False) -> str:
        runner = [sys.executable, str(FAULTY_RUNNER), "--fault", fault, *(["--fused"] * fused)]
        for n in [node] if isinstance(node, str) else node:
            runner += ["--node", n]
        if value is not None:
            runner += ["--value", repr(value)]
        if ssh is not None:
            return device_env.ssh_profile(name, ssh, device_env.cache / f"ssh-{name}",
                                          runner=runner)
        device_env.write_profile(name, {"transport": "local", "runner": runner})
        return name

    yield make
