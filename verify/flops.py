"""FLOPs and bytes of one ONNX node, from its tensors' shapes and dtypes.

These are the numbers behind `verify profile`'s computation, FLOP/s, memory and bandwidth
columns. They are counts of the arithmetic an op defines, not of what a kernel executes (a
Winograd conv does fewer multiplies, a padded conv computes taps that hit zeros), so achieved
FLOP/s is comparable across nodes and devices but is not a hardware counter.

Conventions. A multiply-add counts as 2 FLOPs. `out` is the number of elements of output 0,
`in` of input 0. Scalings by alpha/beta and per-channel constants (a sqrt per channel, the
divide of a mean) are ignored: they are small beside the per-element work.

  Conv                2 * N*Cout*prod(out spatial) * (Cin/group) * prod(kernel), + out if bias.
                      That is 2 * out * prod(W.shape[1:]); strides, pads and dilations act
                      through the output size only (a padded tap is counted as computed).
                      + out per residual input onnxruntime fused in (a 4th input).
  ConvTranspose       2 * in * (Cout/group) * prod(kernel) = 2 * in * prod(W.shape[1:]),
                      + out if bias.
  Gemm                2*M*N*K (+ M*N if C is given), K taken from A's size, so transA/transB
                      need not be known.
  MatMul              2 * out * K, K = A.shape[-1]; batch and broadcast are in `out`.
  FusedConv/FusedGemm as Conv/Gemm, + out for the fused activation. A fused node keeps the
                      count of the op it reports (onnxruntime's NCHWc 'Conv' hides its fused
                      activation, so that one element-wise op per output is not counted).
  FusedMatMul         as MatMul, K from transA (the node's attributes; for a node onnxruntime
                      made, from the shapes where A and the output tell it).
  QLinearConv, ConvInteger, QLinearMatMul, MatMulInteger   as Conv/MatMul on their data
                      inputs (an int8 multiply-add is 2 FLOPs too); scales and zero points,
                      and the requantization, are not counted.
  QuantizeLinear/DequantizeLinear   1 per element, as Cast.
  MaxPool/AveragePool/LpPool   out * prod(kernel_shape) (needs attributes).
  GlobalAveragePool/GlobalMaxPool   in.
  element-wise        1 per output element per element operation, whatever the function:
                      Add, Relu, Sigmoid, Erf, Clip, Where, Cast ... all count 1, so FLOP/s of
                      a transcendental op understates its cost. Variadic Sum/Max/Min count
                      (inputs - 1) per element, Mean counts inputs.
  BatchNormalization  2 per element (inference form y = x*a + b, a and b folded per channel).
  LayerNormalization  7 per element (mean 1, variance 2, normalize 2, scale 1, bias 1);
                      6 without the bias input. InstanceNormalization and GroupNormalization 7.
  RMSNormalization, SimplifiedLayerNormalization   4 per element.
  Softmax, LogSoftmax 5 per element (max, subtract, exp, sum, divide or log-subtract).
  Resize/Upsample     per output element: nearest 0 (a gather), linear 2 * 2^r, cubic
                      2 * 4^r, where r is the number of axes whose size changes; antialias
                      and unknown modes are unknown.
  reductions          in (ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp,
                      ArgMax, ArgMin).
  Range               1 per output element.
  data movement       0 (Reshape, Transpose, Concat, Slice, Gather, Pad, Expand, Identity,
                      ConstantOfShape ...).
  anything else       unknown (None). Never guessed.

Bytes: bytes_read is the sum of the sizes of the node's inputs, initializers included;
bytes_written the sum of its outputs' sizes. These are tensor sizes, not memory traffic
(caches, in-place ops and re-reads are ignored). An input or output whose shape or dtype is
not known makes the sum unknown; an absent optional input counts nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Bits per element, keyed by onnxruntime's dtype spelling (as in a profile's input_type_shape).
DTYPE_BITS: Mapping[str, int] = {
    "float": 32, "double": 64, "float16": 16, "bfloat16": 16,
    "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32, "uint32": 32,
    "int64": 64, "uint64": 64, "bool": 8, "complex64": 64, "complex128": 128,
    "float8e4m3fn": 8, "float8e4m3fnuz": 8, "float8e5m2": 8, "float8e5m2fnuz": 8,
    "float8e8m0": 8, "int4": 4, "uint4": 4, "float4e2m1": 4, "int2": 2, "uint2": 2,
}

# onnx.TensorProto.DataType value -> onnxruntime's spelling.
ONNX_DTYPES: Mapping[int, str] = {
    1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "string", 9: "bool", 10: "float16", 11: "double", 12: "uint32", 13: "uint64",
    14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8e4m3fn",
    18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz", 21: "uint4", 22: "int4",
    23: "float4e2m1", 24: "float8e8m0", 25: "uint2", 26: "int2",
}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's dtype (onnxruntime's spelling) and static shape; None where not known."""

    dtype: str | None
    shape: tuple[int, ...] | None

    @property
    def elements(self) -> int | None:
        return None if self.shape is None else math.prod(self.shape)

    @property
    def nbytes(self) -> int | None:
        bits = DTYPE_BITS.get(self.dtype or "")
        n = self.elements
        return None if bits is None or n is None else (n * bits + 7) // 8

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": None if self.shape is None else list(self.shape)}


UNKNOWN = TensorSpec(None, None)
"""An input that exists but whose shape is not known (e.g. a weight pre-packed out of a trace)."""


@dataclass(frozen=True)
class NodeCost:
    """FLOPs and bytes of one execution of a node; None where not known."""

    flops: int | None
    bytes_read: int | None
    bytes_written: int | None

    @property
    def bytes(self) -> int | None:
        if self.bytes_read is None or self.bytes_written is None:
            return None
        return self.bytes_read + self.bytes_written


Inputs = Sequence[TensorSpec | None]
Attrs = Mapping[str, Any] | None
_FlopFn = Callable[[Inputs, Inputs, Attrs], int | None]


def node_cost(op_type: str, inputs: Inputs, outputs: Inputs, attrs: Attrs = None) -> NodeCost:
    """FLOPs and bytes of one execution of an `op_type` node.

    `inputs`/`outputs` are positional, as in the op's schema: None is an absent optional
    input, UNKNOWN one that exists with an unknown shape. `attrs` are the node's attributes
    ({} when it has none); None means they are not known (a node the model does not have,
    e.g. one fused by onnxruntime), and ops whose count needs them report None.
    """
    fn = _FLOPS.get(op_type)
    try:
        flops = fn(inputs, outputs, attrs) if fn is not None else None
    except (IndexError, TypeError, ValueError, ZeroDivisionError):
        flops = None  # shapes that do not fit the op: unknown rather than a crash
    return NodeCost(flops, sum_bytes(inputs), sum_bytes(outputs))


def sum_bytes(tensors: Inputs) -> int | None:
    """The bytes of `tensors` (an absent one, None, counts none); None if a size is unknown."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        n = t.nbytes
        if n is None:
            return None
        total += n
    return total


def _at(tensors: Inputs, i: int) -> TensorSpec | None:
    return tensors[i] if i < len(tensors) else None


def _shape(tensors: Inputs, i: int) -> tuple[int, ...] | None:
    t = _at(tensors, i)
    return None if t is None else t.shape


def _n(tensors: Inputs, i: int) -> int | None:
    t = _at(tensors, i)
    return None if t is None else t.elements


def _present(tensors: Inputs, i: int) -> bool:
    return _at(tensors, i) is not None


# --- per-op counts ----------------------------------------------------------------------------
def _conv(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
    x, w, out = _shape(ins, 0), _shape(ins, 1), _n(outs, 0)
    if x is None or out is None:
        return None
    if w is not None and len(w) == len(x):
        per_out = math.prod(w[1:])
    elif attrs is not None and attrs.get("kernel_shape"):
        group = int(attrs.get("group", 1))
        if x[1] % group:
            return None
        per_out = x[1] // group * math.prod(attrs["kernel_shape"])
    else:
        return None
    # inputs past B are residuals onnxruntime fused in (NCHWc Conv's Sum, FusedConv's Z)
    summed = sum(_present(ins, i) for i in range(3, len(ins)))
    return 2 * out * per_out + out * (_present(ins, 2) + summed)


def _conv_transpose(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
    x, w, y = _shape(ins, 0), _shape(ins, 1), _shape(outs, 0)
    if x is None or y is None:
        return None
    if w is not None and len(w) == len(x):
        per_in = math.prod(w[1:])
    elif attrs is not None and attrs.get("kernel_shape"):
        group = int(attrs.get("group", 1))
        if y[1] % group:
            return None
        per_in = y[1] // group * math.prod(attrs["kernel_shape"])
    else:
        return None
    out = math.prod(y)
    return 2 * math.prod(x) * per_in + (out if _present(ins, 2) else 0)


def _gemm(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
    a, y = _n(ins, 0), _shape(outs, 0)
    if a is None or y is None or len(y) != 2 or y[0] == 0:
        return None
    m, n = y
    if a % m:
        return None
    k = a // m
    return 2 * m * n * k + (m * n if _present(ins, 2) else 0)


def _matmul(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
    a, out = _shape(ins, 0), _n(outs, 0)
    if a is None or out is None or not a:
        return None
    return 2 * out * a[-1]


def _fused_matmul(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
    a, out, y = _shape(ins, 0), _n(outs, 0), _shape(outs, 0)
    if a is None or out is None or (attrs is not None and attrs.get("transBatchA")):
        return None
    if attrs is None:  # a node onnxruntime made (its attributes are in no model): transA is
        # the one that fits the shapes, A (.., M, K) or transposed (.., K, M), when they tell
        if y is None or len(a) < 2 or len(y) < 2 or a[-1] == a[-2]:
            return None
        if y[-2] == a[-2]:
            return 2 * out * a[-1]
        return 2 * out * a[-2] if y[-2] == a[-1] else None
    if int(attrs.get("transA", 0)):
        return 2 * out * a[-2] if len(a) >= 2 else None
    return 2 * out * a[-1]


def _fused(base: _FlopFn) -> _FlopFn:
    """base's count plus 1 per output element for the activation onnxruntime fused in."""
    def count(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
        flops, out = base(ins, outs, attrs), _n(outs, 0)
        return None if flops is None or out is None else flops + out
    return count


def _picked(base: _FlopFn, positions: tuple[int, ...]) -> _FlopFn:
    """base's count on the inputs at `positions` (a quantized op's data inputs, its scales
    and zero points left out): QLinearConv's x, w, B are its inputs 0, 3, 8."""
    def count(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
        return base([_at(ins, i) for i in positions], outs, attrs)
    return count


def _pool(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
    out = _n(outs, 0)
    if attrs is None or out is None or not attrs.get("kernel_shape"):
        return None
    return out * math.prod(attrs["kernel_shape"])


def _per_input_element(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
    return _n(ins, 0)


def _per_output_element(factor: int) -> _FlopFn:
    def count(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
        out = _n(outs, 0)
        return None if out is None else factor * out
    return count


def _variadic(extra: int) -> _FlopFn:
    def count(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
        out = _n(outs, 0)
        k = sum(1 for t in ins if t is not None)
        return None if out is None else max(k - 1 + extra, 0) * out
    return count


def _layer_norm(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
    out = _n(outs, 0)
    return None if out is None else (6 + _present(ins, 2)) * out


def _resize(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
    x, y = _shape(ins, 0), _shape(outs, 0)
    if attrs is None or x is None or y is None or len(x) != len(y) or attrs.get("antialias"):
        return None
    mode = attrs.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    resized = sum(1 for a, b in zip(x, y) if a != b)
    taps = {"nearest": 0, "linear": 2 ** resized, "bilinear": 2 ** resized,
            "cubic": 4 ** resized}.get(mode)
    return None if taps is None else 2 * taps * math.prod(y)


def _zero(ins: Inputs, outs: Inputs, attrs: Attrs) -> int | None:
    return 0


ELEMENTWISE = (
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Neg", "Abs", "Reciprocal", "Sqrt", "Exp", "Log",
    "Floor", "Ceil", "Round", "Sign", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu",
    "ThresholdedRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus", "Softsign",
    "Erf", "Gelu", "Mish", "Swish", "Clip", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh",
    "Cosh", "Asinh", "Acosh", "Atanh", "Equal", "Greater", "GreaterOrEqual", "Less",
    "LessOrEqual", "And", "Or", "Xor", "Not", "Where", "BitShift", "BitwiseAnd", "BitwiseOr",
    "BitwiseXor", "BitwiseNot", "IsNaN", "IsInf", "Cast", "CastLike",
    "FastGelu", "BiasGelu", "QuickGelu",
)
REDUCTIONS = (
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin",
)
DATA_MOVEMENT = (
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Concat", "Split",
    "Slice", "Gather", "GatherElements", "GatherND", "Pad", "Expand", "Tile", "DepthToSpace",
    "SpaceToDepth", "Shape", "Size", "Dropout", "ReorderInput", "ReorderOutput",
    "MemcpyToHost", "MemcpyFromHost", "ConstantOfShape",
)

_FLOPS: dict[str, _FlopFn] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "FusedConv": _fused(_conv),
    "FusedGemm": _fused(_gemm),
    "FusedMatMul": _fused_matmul,
    "QLinearConv": _picked(_conv, (0, 3, 8)),
    "QLinearMatMul": _picked(_matmul, (0, 3)),
    "ConvInteger": _picked(_conv, (0, 1)),
    "MatMulInteger": _picked(_matmul, (0, 1)),
    "QuantizeLinear": _per_output_element(1),
    "DequantizeLinear": _per_output_element(1),
    "MaxPool": _pool,
    "AveragePool": _pool,
    "LpPool": _pool,
    "GlobalAveragePool": _per_input_element,
    "GlobalMaxPool": _per_input_element,
    "BatchNormalization": _per_output_element(2),
    "InstanceNormalization": _per_output_element(7),
    "GroupNormalization": _per_output_element(7),
    "LayerNormalization": _layer_norm,
    "RMSNormalization": _per_output_element(4),
    "SimplifiedLayerNormalization": _per_output_element(4),
    "Softmax": _per_output_element(5),
    "LogSoftmax": _per_output_element(5),
    "Resize": _resize,
    "Upsample": _resize,
    "Sum": _variadic(0),
    "Max": _variadic(0),
    "Min": _variadic(0),
    "Mean": _variadic(1),
    **{op: _per_output_element(1) for op in ELEMENTWISE},
    "Range": _per_output_element(1),  # start + i * delta
    **{op: _per_input_element for op in REDUCTIONS},
    **{op: _zero for op in DATA_MOVEMENT},
}

"""Op types whose FLOPs node_cost can count (given the shapes, and attributes where noted)."""
