"""The true byte size of every tensor a graph computes, for the case's concrete input shapes.

A dump is cut into segments whose live tensors fit a memory budget, so it must know how large
each tensor will be before it runs. Declared shapes cannot say (exported models leave most dims
symbolic), so the graph's inputs are pinned to the case's actual shapes and shape inference runs
with data propagation. Where that stops (onnx does not propagate a Slice of a Shape, as in
PP-OCRv4 rec's Reshape targets, nor Range's bounds, as in YOLOv8n's anchor grids), the small
integer values of shape arithmetic are evaluated here, node by node, and fed to the node's own
inference. onnxruntime's optimized graphs add ops onnx does not know (the NCHWc layout ops,
fused convolutions), whose shapes follow from their attributes and weights here. A tensor whose
size still cannot be derived is None: the runner then measures it (one profiled run) instead of
guessing it small.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Shape = tuple[int, ...]


def tensor_sizes(model: onnx.ModelProto, cases: Iterable[Mapping[str, Sequence[int]]]
                 ) -> dict[str, int | None]:
    """Bytes of every node output of `model`'s top-level graph: the largest over `cases` (each
    maps input names to the concrete shape fed), None where it cannot be derived."""
    sizes: dict[str, int | None] = {}
    for shapes in cases:
        for name, size in case_sizes(model, shapes).items():
            old = sizes.get(name, 0)
            sizes[name] = None if size is None or (name in sizes and old is None) else \
                max(old or 0, size)
    return sizes


def case_sizes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]
               ) -> dict[str, int | None]:
    """`tensor_sizes` for one case."""
    return {out: _nbytes(tp) for out, tp in _output_types(model, shapes).items()}


def case_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]
                ) -> dict[str, Shape | None]:
    """The shape of every node output of `model`'s top-level graph for one case's input
    shapes, None where it cannot be derived."""
    return {out: _shape(tp) for out, tp in _output_types(model, shapes).items()}


def _output_types(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]
                  ) -> dict[str, onnx.TypeProto | None]:
    types = _infer(model, shapes)
    inits = {i.name: i for i in model.graph.initializer if _held(i)}
    weights = {i.name: tuple(i.dims) for i in model.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for i in node.input:
            readers.setdefault(i, []).append(node)
    values: dict[str, np.ndarray] = {k: numpy_helper.to_array(v) for k, v in inits.items()}
    for node in model.graph.node:  # ops onnx cannot infer, in graph order
        if not all(o in types for o in node.output if o):
            data = {i: inits[i] if i in inits else numpy_helper.from_array(values[i], i)
                    for i in node.input if i in values}
            got = _node_types(node, types, data, weights, model.opset_import, readers)
            for out, tp in got.items():
                types.setdefault(out, tp)
        _propagate(node, types, values)
    return {out: types.get(out) for node in model.graph.node for out in node.output if out}


_SMALL = 64  # elements: initializers up to this size keep their values (shape arithmetic)


def _held(init: TensorProto) -> bool:
    """Whether `init`'s value is small and in the model itself: a graph loaded without its
    external data (every weight saved outside, `size_threshold=0`) has only the name and shape
    of even its shape constants, whose values are then unknown, not read."""
    return _count(init.dims) <= _SMALL and init.data_location != TensorProto.EXTERNAL


def _infer(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]
           ) -> dict[str, onnx.TypeProto]:
    """Whole-graph shape inference with the inputs pinned. Large initializers go in as typed
    graph inputs (their values decide no shape), so the copy costs no weights' worth of memory."""
    graph = model.graph
    pinned = onnx.ModelProto()
    pinned.ir_version = model.ir_version
    pinned.opset_import.extend(model.opset_import)
    pinned.functions.extend(model.functions)
    g = pinned.graph
    g.output.extend(graph.output)
    types: dict[str, onnx.TypeProto] = {}
    for node in graph.node:
        value = node.attribute[0].t if node.op_type == "Constant" and not node.domain and \
            len(node.attribute) == 1 and node.attribute[0].name == "value" else None
        if value is not None and _count(value.dims) > _SMALL:  # a weight held in a Constant
            types[node.output[0]] = _tensor(value.data_type, value.dims)
            g.input.add(name=node.output[0]).type.CopyFrom(types[node.output[0]])
        else:
            g.node.append(node)
    for init in graph.initializer:
        types[init.name] = _tensor(init.data_type, init.dims)
        if _held(init):
            g.initializer.append(init)
        else:
            g.input.add(name=init.name).type.CopyFrom(types[init.name])
    for inp in graph.input:
        if inp.name in types:
            continue
        vi = g.input.add()
        vi.CopyFrom(inp)
        if inp.name in shapes and vi.type.HasField("tensor_type"):
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for d in shapes[inp.name]:
                shape.dim.add().dim_value = int(d)
        types[inp.name] = vi.type
    try:
        inferred = onnx.shape_inference.infer_shapes(pinned, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - onnx raises assorted errors on graphs it cannot follow
        return types
    for vi in (*inferred.graph.value_info, *inferred.graph.output):
        if _nbytes(vi.type) is not None:
            types[vi.name] = vi.type
    return types


def _propagate(node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto],
               values: dict[str, np.ndarray]) -> None:
    """The values of `node`'s outputs where they are small shape arithmetic (Shape, Gather,
    Slice, Concat, Unsqueeze, ... of known values): exporters compute Reshape targets that way
    (PP-OCRv4 rec: Concat(Slice(Shape(x)), [-1])), and onnx's data propagation leaves many of
    them unknown, which left 140 of rec's sizes to a measuring run on the device."""
    if node.domain not in ("", "ai.onnx") or not node.output or not node.output[0]:
        return
    try:
        got = _evaluate(node, types, values)
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, ZeroDivisionError):
        return
    if got is not None and got.size <= _SMALL and got.dtype.kind in "iubf":
        values[node.output[0]] = got


def _evaluate(node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto],
              values: Mapping[str, np.ndarray]) -> np.ndarray | None:
    op = node.op_type
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if op == "Constant":
        if "value" in attrs:
            return numpy_helper.to_array(attrs["value"]) if _count(
                attrs["value"].dims) <= _SMALL else None
        if "value_ints" in attrs:
            return np.array(attrs["value_ints"], np.int64)
        return np.array(attrs["value_int"], np.int64) if "value_int" in attrs else None
    if op in ("Shape", "Size"):
        shape = _shape(types.get(node.input[0]))
        if shape is None:
            return None
        if op == "Size":
            return np.array(_count(shape), np.int64)
        start, end = int(attrs.get("start", 0)), attrs.get("end")
        return np.array(shape[start:None if end is None else int(end)], np.int64)
    ins = [values.get(i) if i else None for i in node.input]
    if not ins or any(x is None for x, i in zip(ins, node.input) if i):
        return None
    x = ins[0]
    if op in ("Identity", "Cast"):
        to = attrs.get("to")
        return x if to is None else x.astype(helper.tensor_dtype_to_np_dtype(int(to)))
    if op == "Gather":
        return np.take(x, ins[1], axis=int(attrs.get("axis", 0)))
    if op == "Concat":
        return np.concatenate([np.atleast_1d(v) for v in ins], axis=int(attrs.get("axis", 0)))
    if op in ("Unsqueeze", "Squeeze"):
        axes = attrs.get("axes", ins[1] if len(ins) > 1 else None)
        if op == "Squeeze":
            return np.squeeze(x) if axes is None else np.squeeze(x, tuple(int(a) for a in axes))
        out = x
        for a in sorted(int(a) % (x.ndim + len(axes)) for a in axes):
            out = np.expand_dims(out, a)
        return out
    if op == "Slice":
        if len(ins) > 1:
            starts, ends = ins[1], ins[2]
            axes = ins[3] if len(ins) > 3 and ins[3] is not None else range(len(starts))
            steps = ins[4] if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
        else:
            starts, ends = attrs["starts"], attrs["ends"]
            axes, steps = attrs.get("axes", range(len(starts))), [1] * len(starts)
        index = [slice(None)] * x.ndim
        for a, b, e, st in zip(axes, starts, ends, steps):
            index[int(a)] = slice(int(b), int(e), int(st))
        return x[tuple(index)]
    if op in _ARITHMETIC and len(ins) == 2:
        if op == "Div" and x.dtype.kind in "iu":
            return np.trunc(x / ins[1]).astype(x.dtype)
        return _ARITHMETIC[op](x, ins[1])
    if op == "Range":
        return np.arange(x, ins[1], ins[2]).astype(x.dtype)
    if op == "Reshape":
        return x.reshape([d if d else x.shape[i] for i, d in enumerate(ins[1].tolist())])
    return None


_ARITHMETIC = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Equal": np.equal,
               "Less": np.less, "Greater": np.greater, "Max": np.maximum, "Min": np.minimum}


def _count(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _nbytes(tp: onnx.TypeProto | None) -> int | None:
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return None
    tt = tp.tensor_type
    if tt.elem_type in (TensorProto.UNDEFINED, TensorProto.STRING) or not tt.HasField("shape"):
        return None
    n = helper.tensor_dtype_to_np_dtype(tt.elem_type).itemsize
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        n *= d.dim_value
    return n


def _shape(tp: onnx.TypeProto | None) -> Shape | None:
    if _nbytes(tp) is None:
        return None
    assert tp is not None
    return tuple(d.dim_value for d in tp.tensor_type.shape.dim)


def _tensor(elem: int, shape: Sequence[int]) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(elem, [int(d) for d in shape])


def _node_types(node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto],
                inits: Mapping[str, TensorProto], weights: Mapping[str, tuple[int, ...]],
                opsets: Sequence[onnx.OperatorSetIdProto],
                readers: Mapping[str, list[onnx.NodeProto]]) -> dict[str, onnx.TypeProto]:
    """Output types of one node whose outputs onnx's whole-graph pass left unknown."""
    ins = [types.get(i) if i else None for i in node.input]
    if not ins or ins[0] is None or _shape(ins[0]) is None:
        return {}
    x = _shape(ins[0])
    assert x is not None
    elem = ins[0].tensor_type.elem_type  # type: ignore[union-attr]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    out: Shape | None = None
    if node.domain == "com.microsoft.nchwc":
        out = _nchwc(node, x, attrs, weights, readers)
    elif node.domain == "com.microsoft" and node.op_type in _ELEMENTWISE:
        out = x
    elif node.op_type in _NORMALIZATION:  # fused by onnxruntime below the op's own opset
        out = x
    elif node.domain == "com.microsoft" and node.op_type == "FusedMatMul":
        b = _shape(ins[1]) if len(ins) > 1 and ins[1] is not None else weights.get(node.input[1])
        out = _fused_matmul(x, b, attrs) if b is not None else None
    elif node.domain == "com.microsoft" and node.op_type in ("FusedConv", "NhwcFusedConv"):
        w = weights.get(node.input[1])
        out = _conv(x, w, attrs) if w is not None else None
    elif node.domain in ("", "ai.onnx") and all(
            t is not None for t, i in zip(ins, node.input) if i):
        try:
            schema = onnx.defs.get_schema(node.op_type, _opset(opsets), node.domain)
            data = {i: inits[i] for i in node.input if i in inits}
            got = onnx.shape_inference.infer_node_outputs(
                schema, node, {i: t for i, t in zip(node.input, ins) if i and t is not None},
                data, opset_imports=list(opsets))
        except Exception:  # noqa: BLE001 - unknown op or an inference it cannot do
            return {}
        return {k: v for k, v in got.items() if _nbytes(v) is not None}
    if out is None or not node.output or not node.output[0]:
        return {}
    return {node.output[0]: _tensor(elem, out)}


# onnxruntime's fused element-wise ops: the output has input 0's shape
_ELEMENTWISE = frozenset({"QuickGelu", "Gelu", "FastGelu", "BiasGelu", "BiasSoftmax",
                          "BiasDropout", "Dropout", "SkipLayerNormalization"})


# normalizations onnxruntime fuses into graphs of any opset (onnx knows LayerNormalization only
# from opset 17): output 0 has input 0's shape
_NORMALIZATION = frozenset({"LayerNormalization", "SimplifiedLayerNormalization"})


def _opset(opsets: Sequence[onnx.OperatorSetIdProto]) -> int:
    return next((o.version for o in opsets if o.domain in ("", "ai.onnx")), 1)


def _nchwc(node: onnx.NodeProto, x: Shape, attrs: Mapping[str, object],
           weights: Mapping[str, tuple[int, ...]], readers: Mapping[str, list[onnx.NodeProto]]
           ) -> Shape | None:
    """onnxruntime's NCHWc ops (contrib_ops/cpu/nchwc_ops.cc): blocked channels, padded."""
    op = node.op_type
    if op == "ReorderInput":
        # channels padded to the device's block size: read back from an NCHWc Conv reading it,
        # directly or through channel-preserving NCHWc ops (a pool before it, as in PP-OCRv4
        # rec): its weights hold input channels / group; with none, unknown (measured)
        c = _padded_channels(node.output[0], node.domain, weights, readers)
        if c is None:
            return None
        # the output is NCHWc whichever layout the input has (channels_last: NHWC in)
        return (x[0], c, *x[1:-1]) if attrs.get("channels_last") else (x[0], c, *x[2:])
    if op == "ReorderOutput":
        c = int(attrs.get("channels", 0))  # type: ignore[call-overload]
        if not c:
            return None
        return (x[0], *x[2:], c) if attrs.get("channels_last") else (x[0], c, *x[2:])
    if op == "Conv":
        w = weights.get(node.input[1])
        return _conv(x, w, attrs) if w is not None else None
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        return (x[0], x[1], *[1] * (len(x) - 2))
    if op in ("MaxPool", "AveragePool"):
        return _pool(x, attrs)
    if op == "Upsample":
        scales = list(attrs.get("scales", []))  # type: ignore[call-overload]
        return tuple(d * s for d, s in zip(x, scales)) if len(scales) == len(x) else None
    return None


_KEEP_CHANNELS = frozenset({"AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool",
                            "Upsample"})


def _padded_channels(name: str, domain: str, weights: Mapping[str, tuple[int, ...]],
                     readers: Mapping[str, list[onnx.NodeProto]], depth: int = 4) -> int | None:
    """Channels of the NCHWc tensor `name`, from the first NCHWc Conv that reads it, directly
    or through up to `depth` channel-preserving NCHWc ops."""
    for reader in readers.get(name, []):
        if reader.domain != domain or not reader.input or reader.input[0] != name:
            continue
        w = weights.get(reader.input[1]) if len(reader.input) > 1 else None
        if reader.op_type == "Conv" and w is not None:
            return w[1] * (next((a.i for a in reader.attribute if a.name == "group"), 1) or 1)
        if reader.op_type in _KEEP_CHANNELS and depth > 0 and reader.output:
            got = _padded_channels(reader.output[0], domain, weights, readers, depth - 1)
            if got is not None:
                return got
    return None


def _fused_matmul(a: Shape, b: Shape, attrs: Mapping[str, object]) -> Shape | None:
    """onnxruntime's FusedMatMul (MatMul with transposes folded in) by a 2-D B, as its
    optimizer makes of MatMul by a weight; anything else: unknown (measured)."""
    if len(a) < 2 or len(b) != 2 or attrs.get("transBatchA") or attrs.get("transBatchB"):
        return None
    rows = a[-1] if attrs.get("transA") else a[-2]
    cols = b[0] if attrs.get("transB") else b[1]
    return (*a[:-2], rows, cols)


def _conv(x: Shape, w: Shape, attrs: Mapping[str, object]) -> Shape | None:
    spatial = _window(x, tuple(w[2:]), attrs)
    return None if spatial is None else (x[0], w[0], *spatial)


def _pool(x: Shape, attrs: Mapping[str, object]) -> Shape | None:
    kernel = tuple(attrs.get("kernel_shape", ()))  # type: ignore[call-overload]
    spatial = _window(x, kernel, attrs)
    return None if spatial is None else (x[0], x[1], *spatial)


def _window(x: Shape, kernel: Shape, attrs: Mapping[str, object]) -> list[int] | None:
    """Spatial output dims of a convolution or pooling window (onnx's formula)."""
    n = len(x) - 2
    if len(kernel) != n:
        return None
    strides = list(attrs.get("strides", [1] * n))  # type: ignore[call-overload]
    dil = list(attrs.get("dilations", [1] * n))  # type: ignore[call-overload]
    pads = list(attrs.get("pads", [0] * 2 * n))  # type: ignore[call-overload]
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    ceil = bool(attrs.get("ceil_mode", 0))
    dims = []
    for i in range(n):
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            dims.append(-(-x[2 + i] // strides[i]))
            continue
        span = dil[i] * (kernel[i] - 1) + 1
        if auto == "VALID":
            pads[i] = pads[i + n] = 0
        total = x[2 + i] + pads[i] + pads[i + n] - span
        dims.append((-(-total // strides[i]) if ceil else total // strides[i]) + 1)
    return dims
