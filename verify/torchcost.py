"""FLOPs and bytes of one FX node of a PyTorch program, for `verify profile --torch`.

Each aten op is counted as the ONNX op it computes, by verify.flops's conventions (a
multiply-add is 2 FLOPs, a convolution's bias 1 per output, an element-wise op 1 per output
element, a batch norm 2, a softmax 5), so an FX node counts as its exported ONNX node does in a
device profile (a batch norm the exporter folds into a Conv's bias is 1 per element there, 2
here). Bytes are the node's tensor arguments read (its
weights included, as an ONNX node's initializers are) and its tensor results written. A view
(reshape, a tuple's item) moves nothing: 0 and 0. An op with none of these forms is counted
by PyTorch's own FLOP counter where it has a formula (torch.utils.flop_counter), else its
FLOPs are unknown (None), as for an ONNX op verify.flops does not know.

torch is passed in by the caller (verify.torchref); nothing here imports it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verify.flops import NodeCost, TensorSpec, node_cost, sum_bytes

# torch's dtype names where onnxruntime's (verify.flops.DTYPE_BITS) differ
_DTYPES = {"float32": "float", "float64": "double"}

# aten op (overload packet name) -> the ONNX op of the same arithmetic
_SAME_AS = {
    "conv1d": "Conv", "conv2d": "Conv", "conv3d": "Conv",
    "conv_transpose1d": "ConvTranspose", "conv_transpose2d": "ConvTranspose",
    "conv_transpose3d": "ConvTranspose",
    "mm": "MatMul", "bmm": "MatMul", "matmul": "MatMul",
    "_native_batch_norm_legit_no_training": "BatchNormalization",
    "batch_norm": "BatchNormalization",
    "native_layer_norm": "LayerNormalization", "layer_norm": "LayerNormalization",
    "group_norm": "GroupNormalization", "native_group_norm": "GroupNormalization",
    "_softmax": "Softmax", "softmax": "Softmax",
    "_log_softmax": "LogSoftmax", "log_softmax": "LogSoftmax",
    "mean": "ReduceMean", "sum": "ReduceSum", "amax": "ReduceMax", "amin": "ReduceMin",
    "prod": "ReduceProd", "argmax": "ArgMax", "argmin": "ArgMin",
    "adaptive_avg_pool1d": "ReduceMean", "adaptive_avg_pool2d": "ReduceMean",
    "adaptive_avg_pool3d": "ReduceMean", "_adaptive_avg_pool2d": "ReduceMean",
    "max_pool1d": "MaxPool", "max_pool2d": "MaxPool", "max_pool3d": "MaxPool",
    "max_pool2d_with_indices": "MaxPool", "max_pool3d_with_indices": "MaxPool",
    "avg_pool1d": "AveragePool", "avg_pool2d": "AveragePool", "avg_pool3d": "AveragePool",
}
# element-wise ops PyTorch does not tag as pointwise
_ELEMENTWISE = {"hardswish", "hardsigmoid", "gelu", "silu", "mish", "hardtanh", "relu6",
                "softplus", "elu", "leaky_relu", "clamp", "dropout", "prelu"}
_POOLS = {"MaxPool": 2, "AveragePool": 2}  # the ONNX ops whose count needs the kernel (arg 1)


def tensor_spec(t: Any) -> TensorSpec:
    """A torch tensor's dtype (onnxruntime's spelling) and shape."""
    name = str(t.dtype).replace("torch.", "")
    return TensorSpec(_DTYPES.get(name, name), tuple(int(d) for d in t.shape))


@dataclass(frozen=True)
class NodeShape:
    """One execution of an FX node: its tensor arguments and results, its FLOPs and bytes."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    cost: NodeCost


def node_shape(torch: Any, target: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
               value: Any, count: Callable[[], int | None]) -> NodeShape:
    """One execution of an FX node calling `target` on `args`/`kwargs` that returned `value`;
    `count()` runs the node again under PyTorch's FLOP counter (None when it has no formula)."""
    ins = [tensor_spec(t) for t in flatten((args, kwargs)) if isinstance(t, torch.Tensor)]
    outs = [tensor_spec(t) for t in flatten(value) if isinstance(t, torch.Tensor)]
    return NodeShape(tuple(ins), tuple(outs), _cost(torch, target, args, kwargs, ins, outs, count))


def _cost(torch: Any, target: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
          ins: list[TensorSpec], outs: list[TensorSpec], count: Callable[[], int | None]
          ) -> NodeCost:
    if target is operator.getitem or _is_view(target):
        return NodeCost(0, 0, 0)
    name = getattr(getattr(target, "overloadpacket", None), "__name__", "")
    op = _SAME_AS.get(name)
    if name == "convolution":  # (input, weight, bias, stride, padding, dilation, transposed, ...)
        op = "ConvTranspose" if len(args) > 6 and args[6] else "Conv"
    if op is not None:
        attrs: dict[str, Any] | None = {}
        if op in _POOLS:
            kernel = args[1] if len(args) > 1 else kwargs.get("kernel_size")
            rank = len(outs[0].shape or ()) - 2 if outs else 0
            kernel = [int(kernel)] * rank if isinstance(kernel, int) else list(kernel or ())
            attrs = {"kernel_shape": kernel * rank if len(kernel) == 1 else kernel}
        return node_cost(op, _positional(name, args, ins), outs, attrs)
    if name == "linear":  # x @ w.T (+ b): a MatMul, and 1 per output element for the bias
        flops = node_cost("MatMul", ins[:1], outs).flops
        if flops is not None and len(ins) > 2:
            flops += outs[0].elements or 0
        return NodeCost(flops, sum_bytes(ins), sum_bytes(outs))
    if name == "addmm":  # bias + a @ b: ONNX's Gemm(a, b, bias)
        return node_cost("Gemm", [*ins[1:3], ins[0]] if len(ins) == 3 else ins, outs)
    if name in _ELEMENTWISE or _tagged(torch, target, "pointwise"):
        return node_cost("Relu", ins, outs)  # 1 per output element
    return NodeCost(count(), sum_bytes(ins), sum_bytes(outs))


def _positional(name: str, args: Sequence[Any], ins: list[TensorSpec]) -> list[TensorSpec | None]:
    """The ONNX op's inputs: a convolution's absent bias stays absent (None), not shifted."""
    if name.startswith("conv") and len(args) > 2 and args[2] is None:
        return [*ins[:2], None, *ins[2:]]
    return list(ins)


def _is_view(target: Any) -> bool:
    """An op whose result aliases its input (view, reshape of a contiguous tensor, expand)."""
    returns = getattr(getattr(target, "_schema", None), "returns", None)
    return bool(returns) and returns[0].alias_info is not None and \
        not returns[0].alias_info.is_write


def _tagged(torch: Any, target: Any, tag: str) -> bool:
    wanted = getattr(torch.Tag, tag, None)
    return wanted is not None and wanted in getattr(target, "tags", ())


def flatten(value: Any) -> list[Any]:
    """The leaves of nested lists, tuples and dicts (an FX node's arguments or results)."""
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in flatten(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in flatten(v)]
    return [value]
