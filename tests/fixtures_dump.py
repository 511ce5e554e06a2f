"""Fixtures for per-layer dumps and `verify diff`: archives packed with --layers, dumps made by
`verify run --device local --bin-io-dump`, and models with one deliberately perturbed node.

Models are small (the golden cnn.onnx and variants of it built here), so a dump takes about a
second; each archive or dump is made once per session and shared.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from verify.cli import main

REPO = Path(__file__).resolve().parent.parent
CNN = REPO / "goldens" / "models" / "cnn.onnx"

__all__ = ["dump_factory", "cnn_layers_vtc", "cnn_dumps", "perturb", "sigmoid_variant",
           "make_dump"]


def make_dump(archive: Path, out: Path, opt_level: str, *extra: str) -> Path:
    code = main(["run", str(archive), "--device", "local", "--iter", "1", "--warmup", "0",
                 "--opt-level", opt_level, "--bin-io-dump", str(out), "--json", *extra])
    assert code == 0, f"dump of {archive} at {opt_level} exited {code}"
    return out


def pack(model: Path | bytes, out: Path, *extra: str) -> Path:
    if isinstance(model, bytes):
        src = out.with_suffix(".onnx")
        src.write_bytes(model)
        model = src
    code = main(["pack", str(model), "-o", str(out), "--seed", "7", "--json", *extra])
    assert code == 0, f"pack {model} exited {code}"
    return out


@pytest.fixture(scope="session")
def dump_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """make(model bytes or path, opt_level, *run options) -> a dump folder (cached by args)."""
    root = tmp_path_factory.mktemp("dumps")
    cache: dict[tuple[object, ...], Path] = {}

    def make(model: Path | bytes, opt_level: str, *extra: str) -> Path:
        key = (model if isinstance(model, Path) else hash(model), opt_level, extra)
        if key not in cache:
            n = len(cache)
            archive = pack(model, root / f"m{n}.vtc")
            cache[key] = make_dump(archive, root / f"d{n}-{opt_level}", opt_level, *extra)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def cnn_layers_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack(CNN, tmp_path_factory.mktemp("layers") / "cnn.vtc", "--layers")


@pytest.fixture(scope="session")
def cnn_dumps(dump_factory: Callable[..., Path]) -> dict[str, Path]:
    return {level: dump_factory(CNN, level) for level in ("disable", "all")}


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def perturb(model: onnx.ModelProto, kind: str, node_name: str) -> onnx.ModelProto:
    """A copy of `model` with one node perturbed; the perturbed node's output keeps its name.

    conv: its weights x1.001; hardsigmoid: a Sigmoid becomes HardSigmoid; fp16: its output
    rounded through float16 (Cast pair; the last Cast takes over the output's name).
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    node = _node(m, node_name)
    if kind == "conv":
        inits = {i.name: i for i in m.graph.initializer}
        w = numpy_helper.to_array(inits[node.input[1]])
        scaled = numpy_helper.from_array((w * np.float32(1.001)).astype(w.dtype),
                                         node.input[1] + "_x1001")
        m.graph.initializer.append(scaled)
        node.input[1] = scaled.name
    elif kind == "hardsigmoid":
        assert node.op_type == "Sigmoid"
        node.op_type = "HardSigmoid"
    elif kind == "fp16":
        out = node.output[0]
        node.output[0] = out + "_pre16"
        pos = list(m.graph.node).index(node)
        casts = [helper.make_node("Cast", [out + "_pre16"], [out + "_f16"], to=TensorProto.FLOAT16,
                                  name=node_name + "_to_f16"),
                 helper.make_node("Cast", [out + "_f16"], [out], to=TensorProto.FLOAT,
                                  name=node_name + "_to_f32")]
        for k, c in enumerate(casts):
            m.graph.node.insert(pos + 1 + k, c)
    else:
        raise ValueError(kind)
    return m


def sigmoid_variant(model: onnx.ModelProto, relus: list[str]) -> onnx.ModelProto:
    """`model` with the named Relu nodes turned into Sigmoid (so a Sigmoid sits at each depth)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for name in relus:
        node = _node(m, name)
        assert node.op_type == "Relu"
        node.op_type = "Sigmoid"
    return m
