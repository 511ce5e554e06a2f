"""The model side of `verify profile`: an ONNX model's nodes indexed by the names onnxruntime's
trace gives them, and the cost (FLOPs, bytes; verify.flops) of one traced execution of a node,
with the model's attributes and the weights the kernel pre-packed out of the trace.

`load_model_index` reads an .onnx file or a .vtc archive's model; `variant_cost` aligns a
trace's shapes with the model node's inputs (or, without the model, infers which weight the
trace left out); `model_costs` costs every node of a model from shape inference alone. The
ONNX protos are read here, so verify.flops stays plain arithmetic on shapes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verify import schema
from verify.flops import ONNX_DTYPES, UNKNOWN, NodeCost, TensorSpec, node_cost
from verify.trace import NodeStats, ShapeVariant


def load_model_index(path: Path) -> "ModelIndex":
    """Index the model of an .onnx file or of a .vtc archive (told apart by content).

    Either is read once: an archive through `read_archive` (its per-layer references, often
    most of the file, are not read), anything else, a pipe included, as ONNX bytes.
    """
    from verify.archive_reader import read_archive
    from verify.graph import load_model_bytes, parse_model

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


NCHWC_SUFFIX = "_nchwc"
# (model op, the op onnxruntime's layout pass runs for it) with the same attributes' meaning
_RENAMED_OPS = frozenset({("Resize", "Upsample")})


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
                entry = _ModelNode(node.op_type, tuple(node.input), node_attrs(node))
                nodes.setdefault(ort_node_name(node, i), entry)
                if node.output and node.output[0]:
                    # onnxruntime's NCHWc layout pass replaces the node by one named after its
                    # output ('/model.9/m/MaxPool_output_0_nchwc'), same op and attributes
                    nodes.setdefault(node.output[0] + NCHWC_SUFFIX, entry)
                if node.op_type == "Constant" and node.output:  # weights as Paddle exports them
                    value = next((a.t for a in node.attribute if a.name == "value"
                                  and a.type == onnx.AttributeProto.TENSOR), None)
                    if value is not None:
                        inits.setdefault(node.output[0], initializer_spec(value))
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
    if variant.cost is not None:
        return variant.cost
    mnode = model.nodes.get(stats.name) if model is not None else None
    if mnode is not None and (mnode.op_type == stats.op_type
                              or (mnode.op_type, stats.op_type) in _RENAMED_OPS):
        inputs = _align_model(mnode, variant.inputs, model.initializers)
        return node_cost(stats.op_type, inputs, variant.outputs, mnode.attrs)
    # a MatMul onnxruntime fused a Transpose into ("p2o.MatMul.24/MatmulTransposeFusion/"):
    # the model's MatMul of that name gives the weight the kernel pre-packed; the attributes
    # are the fused node's own (none in the model), read from the shapes
    base = model.nodes.get(stats.name.split("/", 1)[0]) if model is not None else None
    if base is not None and base.op_type == "MatMul" and stats.op_type == "FusedMatMul":
        inputs = _align_model(base, variant.inputs, model.initializers)
        return node_cost(stats.op_type, inputs, variant.outputs, None)
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


# --- node costs from an ONNX model ----------------------------------------------------------
def tensor_spec(type_proto: Any) -> TensorSpec:
    """TensorSpec of an onnx TypeProto (value_info.type); symbolic or missing dims -> shape None."""
    if not type_proto.HasField("tensor_type"):
        return UNKNOWN
    tt = type_proto.tensor_type
    dtype = ONNX_DTYPES.get(tt.elem_type)
    if not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
        return TensorSpec(dtype, None)
    return TensorSpec(dtype, tuple(int(d.dim_value) for d in tt.shape.dim))


def initializer_spec(init: Any) -> TensorSpec:
    return TensorSpec(ONNX_DTYPES.get(init.data_type), tuple(int(d) for d in init.dims))


def node_attrs(node: Any) -> dict[str, Any]:
    """A NodeProto's attributes as plain Python values (strings decoded, subgraphs left out)."""
    import onnx

    attrs: dict[str, Any] = {}
    for a in node.attribute:
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            continue
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, list):
            v = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
        attrs[a.name] = v
    return attrs


def ort_node_name(node: Any, index: int) -> str:
    """The name onnxruntime gives a node in its profile: its own, or '<OpType>_<index in file>'."""
    return node.name or f"{node.op_type}_{index}"


def model_costs(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None
                ) -> dict[str, NodeCost]:
    """Cost of every node of the model's main graph, by onnxruntime node name, from
    onnx.shape_inference. `input_shapes` fixes graph inputs' dims (needed for symbolic ones);
    a node whose shapes stay symbolic gets None counts.
    """
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    graph_inputs = {i.name: i for i in m.graph.input}
    for name, dims in (input_shapes or {}).items():
        if name not in graph_inputs:
            from verify.errors import InputError
            raise InputError(f"model has no input named {name!r}; inputs: "
                             f"{', '.join(graph_inputs) or '(none)'}")
        shape = graph_inputs[name].type.tensor_type.shape
        shape.ClearField("dim")
        for d in dims:
            shape.dim.add().dim_value = int(d)
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception as exc:  # onnx raises several unrelated types; any failure means the same
        from verify.errors import ModelError
        raise ModelError(f"shape inference failed: {str(exc).splitlines()[0]}") from None
    specs: dict[str, TensorSpec] = {}
    for vi in (*m.graph.input, *m.graph.value_info, *m.graph.output):
        specs[vi.name] = tensor_spec(vi.type)
    for init in m.graph.initializer:
        specs[init.name] = initializer_spec(init)
    costs: dict[str, NodeCost] = {}
    for i, node in enumerate(m.graph.node):
        ins = [specs.get(n, UNKNOWN) if n else None for n in node.input]
        outs = [specs.get(n, UNKNOWN) if n else None for n in node.output]
        costs[ort_node_name(node, i)] = node_cost(node.op_type, ins, outs, node_attrs(node))
    return costs
