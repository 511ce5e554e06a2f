"""The model side of `verify profile`: an ONNX model's nodes indexed by the names onnxruntime's
trace gives them, and the cost (FLOPs, bytes; verify.flops) of one traced execution of a node,
with the model's attributes and the weights the kernel pre-packed out of the trace.

`load_model_index` reads an .onnx file or a .vtc archive's model; `variant_cost` aligns a
trace's shapes with the model node's inputs (or, without the model, infers which weight the
trace left out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verify import schema
from verify.flops import (UNKNOWN, NodeCost, TensorSpec, initializer_spec, node_attrs,
                          node_cost, ort_node_name)
from verify.trace import NodeStats, ShapeVariant


def load_model_index(path: Path) -> "ModelIndex":
    """Index the model of an .onnx file or of a .vtc archive (told apart by content).

    Either is read once: an archive through `read_archive` (its per-layer references, often
    most of the file, are not read), anything else, a pipe included, as ONNX bytes.
    """
    from verify.graph import load_model_bytes, parse_model
    from verify.testcase import read_archive

    path = Path(path)
    data = read_archive(path).model_bytes if _is_hdf5(path) else load_model_bytes(path)
    # only the graph's structure and shapes are read: weights in external data may stay there
    return ModelIndex.of(parse_model(data, str(path), external=True))


def _is_hdf5(path: Path) -> bool:
    """A regular file that starts with HDF5's signature (8 bytes are read). A pipe can be read
    only once and is never an archive; an unreadable path is left to the ONNX reader's error."""
    try:
        if not path.is_file():
            return False
        with path.open("rb") as f:
            return f.read(len(schema.SIGNATURE)) == schema.SIGNATURE
    except OSError:
        return False


@dataclass(frozen=True)
class _ModelNode:
    op_type: str
    inputs: tuple[str, ...]
    attrs: Mapping[str, Any]


@dataclass(frozen=True)
class ModelIndex:
    """What the analysis needs from a model: nodes by onnxruntime name, initializer specs."""

    nodes: Mapping[str, _ModelNode]
    initializers: Mapping[str, TensorSpec]

    @staticmethod
    def of(model: Any) -> "ModelIndex":
        """Index an onnx.ModelProto, subgraphs included (weights need not be loaded)."""
        import onnx

        nodes: dict[str, _ModelNode] = {}
        inits: dict[str, TensorSpec] = {}

        def walk(graph: Any) -> None:
            for init in graph.initializer:
                inits.setdefault(init.name, initializer_spec(init))
            for i, node in enumerate(graph.node):
                nodes.setdefault(ort_node_name(node, i), _ModelNode(
                    node.op_type, tuple(node.input), node_attrs(node)))
                for a in node.attribute:
                    if a.type == onnx.AttributeProto.GRAPH:
                        walk(a.g)
                    elif a.type == onnx.AttributeProto.GRAPHS:
                        for g in a.graphs:
                            walk(g)

        walk(model.graph)
        return ModelIndex(nodes, inits)


def variant_cost(stats: NodeStats, variant: ShapeVariant, model: ModelIndex | None
                 ) -> NodeCost:
    """Cost of one execution of a node with one of its shape variants.

    With the model, the node's attributes are used and inputs the trace leaves out
    (pre-packed weights) are taken from the model's initializers; without it, or for a node
    onnxruntime created, only the trace's shapes are (see _align_trace).
    """
    mnode = model.nodes.get(stats.name) if model is not None else None
    if mnode is not None and mnode.op_type == stats.op_type:
        inputs = _align_model(mnode, variant.inputs, model.initializers)
        return node_cost(stats.op_type, inputs, variant.outputs, mnode.attrs)
    return node_cost(stats.op_type, _align_trace(stats.op_type, variant), variant.outputs)


def _align_model(mnode: _ModelNode, trace: Sequence[TensorSpec],
                 inits: Mapping[str, TensorSpec]) -> list[TensorSpec | None]:
    present = [n for n in mnode.inputs if n]
    out: list[TensorSpec | None] = []
    j = 0
    for name in mnode.inputs:
        if not name:
            out.append(None)
            continue
        init = inits.get(name)
        if len(trace) >= len(present) or init is None:
            out.append(trace[j] if j < len(trace) else init or UNKNOWN)
            j += 1
        else:  # the trace lacks some inputs: pre-packed initializers; keep the model's spec
            if j < len(trace) and trace[j].shape == init.shape:
                j += 1
            out.append(init)
    return out


def _align_trace(op_type: str, variant: ShapeVariant) -> list[TensorSpec | None]:
    """Positional inputs from the trace alone, marking a weight the kernel pre-packed (and so
    left out of the trace) as UNKNOWN: MatMul's and Gemm's B, Conv's W."""
    ins, outs = list(variant.inputs), variant.outputs
    if op_type in ("MatMul", "FusedMatMul", "Gemm", "FusedGemm") and len(ins) == 1:
        return [ins[0], UNKNOWN]
    if op_type in ("Gemm", "FusedGemm") and len(ins) == 2:
        b_like, c_like = _gemm_roles(ins[0], ins[1], outs[0] if outs else UNKNOWN)
        if c_like and not b_like:
            return [ins[0], UNKNOWN, ins[1]]
        if b_like and not c_like:
            return ins
        return [ins[0], UNKNOWN, UNKNOWN]
    if (op_type in ("Conv", "FusedConv", "ConvTranspose") and len(ins) >= 2
            and ins[0].shape is not None and ins[1].shape is not None
            and len(ins[1].shape) != len(ins[0].shape)):
        return [ins[0], UNKNOWN, *ins[1:]]
    return ins


def _gemm_roles(a: TensorSpec, second: TensorSpec, y: TensorSpec) -> tuple[bool, bool]:
    """Whether Gemm's second traced input could be B, and whether it could be C."""
    if a.elements is None or second.shape is None or y.shape is None or len(y.shape) != 2:
        return True, True
    m, n = y.shape
    k = a.elements // m if m else 0
    s = second.shape
    b_like = len(s) == 2 and s in ((k, n), (n, k))
    padded = (1,) * (2 - len(s)) + s if len(s) <= 2 else None
    c_like = padded is not None and all(d in (1, full) for d, full in zip(padded, (m, n)))
    return b_like, c_like
