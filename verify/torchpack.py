"""`verify pack --reference torch:PROGRAM`: PyTorch's outputs (and layers) as ground truth.

For every case the program's outputs become the archive's outputs; with `--layers` the value
of every FX node that maps onto an ONNX tensor (`torchref.TorchProgram.map_onto`) becomes that
tensor's reference, and the nodes that map onto none are listed in the provenance. onnxruntime
on this host is run on the same inputs and judged against PyTorch with the archive's own
tolerances: where it already differs ("the export changed the numbers") is recorded, so that
`diff`, `localize` and reports can tell it from a divergence that appears only on a device.
A case's PyTorch layer values are held in memory together (the interpreter runs the graph at
once): for models whose activations do not fit, pack without `--layers`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from verify import schema
from verify.capture import HostCapture
from verify.compare import compare
from verify.errors import InputError, UsageError
from verify.graph import INPUT_OP, output_names, tensor_order
from verify.origin import tensor_origins
from verify.tolerance import tolerance_set

PREFIX = "torch:"


def torch_spec(reference: str) -> str | None:
    """PROGRAM of a `torch:PROGRAM` reference; None for onnxruntime; UsageError otherwise."""
    if reference in ("", "onnxruntime", "ort"):
        return None
    if reference.startswith(PREFIX) and len(reference) > len(PREFIX):
        return reference[len(PREFIX):]
    raise UsageError(f"--reference {reference!r}: use onnxruntime (the default) or "
                     "torch:PROGRAM (a .pt2 saved by torch.export.save, or FILE.py:FACTORY)")


@dataclass(frozen=True)
class TorchTruth:
    outputs: tuple[dict[str, np.ndarray], ...]          # per case, by ONNX output name
    layers: tuple[dict[str, np.ndarray], ...] | None   # per case, by ONNX tensor name
    provenance: Mapping[str, object]


def torch_truth(spec: str, model: onnx.ModelProto, model_bytes: bytes,
                cases: Sequence[Mapping[str, np.ndarray]], tolerances: Mapping[str, object],
                layers: bool) -> TorchTruth:
    from verify.torchref import TorchProgram

    names = [i.name for i in model.graph.input]
    initializers = {i.name for i in model.graph.initializer}
    names = [n for n in names if n not in initializers]
    program = TorchProgram(spec, [cases[0][n] for n in names])
    outs = output_names(model)
    order = {t.name: t for t in tensor_order(model)}
    mapping = program.map_onto(model) if layers else None
    pairs = dict(mapping.pairs) if mapping else {}
    rules = tolerance_set(dict(tolerances))
    outputs: list[dict[str, np.ndarray]] = []
    per_layer: list[dict[str, np.ndarray]] = []
    failing: dict[str, float] = {}
    checked: set[str] = set()  # judged against PyTorch: only of those can a report say more
    shape_dropped: dict[str, str] = {}
    with HostCapture(model_bytes, model=model) as host:
        for i, feeds in enumerate(cases):
            inputs = [feeds[n] for n in names]
            got = program.outputs(inputs)
            if len(got) != len(outs):
                raise InputError(f"torch program {spec}: returns {len(got)} output(s), the ONNX "
                                 f"model has {len(outs)}: is it the program that was exported?")
            outputs.append(dict(zip(outs, got)))
            values = ({pairs[k]: v for k, v in program.values(inputs, set(pairs)).items()}
                      if pairs else {})
            wanted = [n for n in order if n in values or n in outs]
            layer: dict[str, np.ndarray] = {n: np.asarray(feeds[n]) for n in names}
            for name, ort_value in host.layers(feeds, wanted):
                ref = outputs[-1][name] if name in outs else values[name]
                if tuple(ref.shape) != tuple(ort_value.shape):
                    if name in outs:
                        raise InputError(f"torch program {spec}: output {name!r} has shape "
                                         f"{tuple(ref.shape)}, onnxruntime computes "
                                         f"{tuple(ort_value.shape)}: is it the program that "
                                         "was exported?")
                    shape_dropped[name] = (f"shape {tuple(ref.shape)} in PyTorch, "
                                           f"{tuple(ort_value.shape)} in ONNX")
                    continue
                verdict = compare(name, ort_value, ref, rules.rule_for(name, ref.dtype))
                checked.add(name)
                if not verdict.passed:
                    failing[name] = max(failing.get(name, 0.0), float(verdict.max_abs))
                if name in values:
                    layer[name] = values[name]
            if mapping is not None:
                per_layer.append(layer)
    unmapped = list(mapping.unmapped) if mapping else []
    origins = tensor_origins(model)
    first = next((n for n in order if n in failing), None)
    host_check = {
        "passed": not failing,
        "compared": "outputs and mapped layers" if layers else "outputs",
        "failing": [n for n in order if n in failing],
        "tensors": [n for n in order if n in checked],
        "first": None if first is None else {
            "tensor": first, "node": order[first].node, "op": order[first].op,
            "max_abs": failing[first],
            "module": origins[first].describe() if first in origins else ""},
    }
    dtypes = sorted({str(a.dtype) for o in outputs for a in o.values()})
    prov: dict[str, object] = {
        # the outputs' dtypes, as exported (it said float32 of a float64 model)
        "reference": f"PyTorch {program.version} on the CPU "
                     f"({', '.join(dtypes) or 'no outputs'} as exported), program {spec}",
        "torch": program.version, "torch_program": spec, "torch_dtype": dtypes,
        schema.PROV_HOST_CHECK: host_check,
    }
    if mapping is not None:
        prov[schema.PROV_TORCH_MAP] = {
            "how": mapping.how, "mapped": len(pairs) - len(shape_dropped),
            "onnx_tensors": sum(1 for t in order.values() if t.op != INPUT_OP),
            "unmapped": [u.to_dict() for u in unmapped] +
                        [{"fx": n, "module": "", "why": why} for n, why in shape_dropped.items()]}
    return TorchTruth(tuple(outputs), tuple(per_layer) if mapping else None, prov)


def layer_items(order: Sequence[str], values: Mapping[str, np.ndarray]
                ) -> Iterator[tuple[str, np.ndarray]]:
    """One case's PyTorch layer values in the ONNX tensor order, for `write_archive`."""
    for name in order:
        if name in values:
            yield name, values[name]
