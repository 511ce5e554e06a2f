"""`verify profile --torch PROGRAM`: the FX tutorial's per-node profiler, in verify's tables.

The program runs through a timing `torch.fx.Interpreter` (`torchref.TorchProgram.timed`):
warmup runs, then timed iterations; each FX node's wall time becomes a node of a
`trace.TraceProfile`, so `profile.analyze` gives the same summary, top-N, filters, ordering,
aggregation (by op, or by PyTorch module) and JSON as an onnxruntime trace. The whole
interpreted run is timed around the same runs ("total host time"), so the summary shows how
much of it the per-node times account for.

Given a device profile of the exported model, `module_times` puts beside each PyTorch module
(or group of modules the exporter fused into one ONNX node) its time on this host and the
device's time for the ONNX nodes that came from it (`origin.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from verify import schema
from verify.errors import UsageError
from verify.origin import torch_origins
from verify.files import read_user_file
from verify.trace import NodeStats, ShapeVariant, TraceProfile

PROVIDER = "PyTorch CPU"


@dataclass(frozen=True)
class TorchProfile:
    profile: TraceProfile
    modules: Mapping[str, str]      # FX node name → module path
    version: str
    spec: str


def torch_profile(spec: str, inputs: Sequence[np.ndarray] | None, warmup: int,
                  iterations: int) -> TorchProfile:
    """Time every FX node of PROGRAM over `iterations` runs after `warmup` runs, on `inputs`
    (default: the program's own example inputs)."""
    from verify.torchref import TorchProgram

    if iterations < 1 or warmup < 0:
        raise UsageError("--iterations must be at least 1 and --warmup at least 0")
    program = TorchProgram(spec, inputs, option="--torch")
    feeds = list(inputs) if inputs is not None else program.example_inputs()
    costs = program.costs(feeds)
    per_node, totals = program.timed(feeds, warmup, iterations)
    nodes = []
    for index, node in enumerate(program.nodes):
        times = per_node.get(node.name) or []
        if not times:
            continue
        shape = costs.get(node.name)
        variant = ShapeVariant(inputs=shape.inputs if shape else (),
                               outputs=shape.outputs if shape else (), calls=len(times),
                               cost=shape.cost if shape else None)
        nodes.append(NodeStats(name=node.name, op_type=_short(node.op), provider=PROVIDER,
                               node_index=index, calls=len(times), total=math.fsum(times),
                               min=min(times), max=max(times), device_total=None,
                               variants=(variant,)))
    profile = TraceProfile(source=f"torch:{spec}", runs=iterations, skipped_runs=warmup,
                      run_times=tuple(totals), nodes=tuple(nodes), session_init=None,
                      model_load=None, device_events=False,
                      warmup_source="torch" if warmup else None)
    return TorchProfile(profile, {n.name: n.module for n in program.nodes}, program.version,
                        spec)


def _short(target: str) -> str:
    """'aten.convolution.default' → 'aten.convolution' (the overload says nothing here)."""
    parts = target.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 and parts[0] == "aten" else target


def model_and_inputs(path: Path) -> tuple[onnx.ModelProto, list[np.ndarray] | None]:
    """The exported model from an .onnx or a .vtc; a .vtc's first case gives the inputs too
    (in the order of the model's graph inputs)."""
    from verify.archive_reader import read_archive
    from verify.graph import parse_model

    data = read_user_file(path, UsageError, "an .onnx model or a .vtc archive")
    if not data.startswith(schema.SIGNATURE):
        return parse_model(data, str(path)), None
    del data
    tc = read_archive(path)
    model = parse_model(tc.model_bytes, str(path), tc.external)
    fixed = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in fixed]
    return model, [tc.cases[0].inputs[n] for n in names]


@dataclass(frozen=True)
class ModuleTime:
    """One PyTorch module (or modules fused into the same ONNX nodes): host and device time."""

    modules: tuple[str, ...]
    host: float | None       # seconds per run, PyTorch on this host (FX nodes of the modules)
    device: float | None     # seconds per run, the device's ONNX nodes from these modules
    fx_nodes: int
    onnx_nodes: int

    @property
    def label(self) -> str:
        return " + ".join(m or "(top-level module)" for m in self.modules)

    def to_dict(self) -> dict[str, Any]:
        return {"modules": list(self.modules), "host": self.host, "device": self.device,
                "fx_nodes": self.fx_nodes, "onnx_nodes": self.onnx_nodes}


def module_times(host: TorchProfile, model: onnx.ModelProto, device: TraceProfile,
                 clock: str = "device") -> tuple[tuple[ModuleTime, ...], float]:
    """Per module group: PyTorch's time here beside the device's time for the ONNX nodes
    that came from it; and the device's time per run in nodes no module claims (layout
    reorders onnxruntime adds, or a model without exporter metadata).

    A device node is one of the model's nodes by name, or one onnxruntime made by fusing or
    by its NCHWc layout pass (`relu_1_nchwc`, named after a tensor of the chain it fused):
    the node of that name, or the first one up its chain with the device node's op type (the
    Conv a Relu was fused into), gets its time. The ops fused into it (an activation, a
    residual Add) have no time of their own on the device, and a name cannot say which they
    were, so they are not guessed. Modules that share an ONNX node form one group: the
    device cannot time them apart."""
    origins = torch_origins(model)
    producer = {out: node for node in model.graph.node for out in node.output if out}
    by_name = {node.name: node for node in model.graph.node}
    direct = {n.name: by_name[n.name] for n in device.nodes if n.name in by_name}
    # a fusion keeps its first node's name with the fusion's after it
    # ("node_MatMul_93/MatMulAddFusion": a Linear's MatMul and bias Add as one kernel)
    direct.update({n.name: by_name[base] for n in device.nodes if n.name not in by_name
                   and (base := _FUSION_SUFFIX.sub("", n.name)) in by_name})
    tensor_of = {n.name: _ORT_SUFFIX.sub("", n.name) for n in device.nodes
                 if n.name not in by_name and _ORT_SUFFIX.sub("", n.name) in producer}
    claimed: dict[str, set[str]] = {}
    for n in device.nodes:
        if n.name in direct:
            nodes = [direct[n.name]]
        elif n.name in tensor_of:
            nodes = [_named_op(producer, producer[tensor_of[n.name]], n.op_type)]
        else:
            continue
        modules = {m for node in nodes if node.name in origins
                   for m in origins[node.name].modules}
        if modules:
            claimed[n.name] = modules
    groups = _merge([set(o.modules) for o in origins.values()])
    group_of = {m: i for i, g in enumerate(groups) for m in g}
    host_runs, device_runs = max(host.profile.runs, 1), max(device.runs, 1)
    host_t: dict[int, float] = {}
    fx: dict[int, int] = {}
    loose: dict[str, float] = {}
    for node in host.profile.nodes:
        module = host.modules.get(node.name, "")
        if module in group_of:
            i = group_of[module]
            host_t[i] = host_t.get(i, 0.0) + node.total / host_runs
            fx[i] = fx.get(i, 0) + 1
        else:
            loose[module] = loose.get(module, 0.0) + node.total / host_runs
    dev_t: dict[int, float] = {}
    onnx_n: dict[int, int] = {}
    unclaimed = 0.0
    for node in device.nodes:
        seconds = (node.device_total if clock == "device" and node.device_total is not None
                   else node.total) / device_runs
        if node.name not in claimed:
            unclaimed += seconds
            continue
        i = group_of[next(iter(claimed[node.name]))]
        dev_t[i] = dev_t.get(i, 0.0) + seconds
        onnx_n[i] = onnx_n.get(i, 0) + 1
    rows = [ModuleTime(tuple(sorted(groups[i])), host_t.get(i), dev_t.get(i), fx.get(i, 0),
                       onnx_n.get(i, 0)) for i in range(len(groups))]
    rows += [ModuleTime((m,), t, None, 0, 0) for m, t in loose.items()]
    rows.sort(key=lambda r: -(r.device if r.device is not None else r.host or 0.0))
    return tuple(rows), unclaimed


# onnxruntime names a node it made by fusing (or by the NCHWc layout transformer) after its
# output tensor, with this suffix.
_ORT_SUFFIX = re.compile(r"_nchwc$")
# ... and a node fused from others after the first of them, with the fusion's name
_FUSION_SUFFIX = re.compile(r"/[A-Za-z0-9]+Fusion/?$")


def _named_op(producer: Mapping[str, onnx.NodeProto], node: onnx.NodeProto, op: str
              ) -> onnx.NodeProto:
    """`node`, or the first node up its chain of first inputs whose op type is `op`."""
    start = node
    for _ in range(4):  # a fused chain is short (Conv, BatchNorm, Add, Relu)
        if node.op_type == op:
            return node
        if not node.input or node.input[0] not in producer:
            break
        node = producer[node.input[0]]
    return start


def _merge(sets: Sequence[set[str]]) -> list[set[str]]:
    """Overlapping sets merged into disjoint groups."""
    groups: list[set[str]] = []
    for members in sets:
        members = set(members)
        for g in [g for g in groups if g & members]:
            members |= g
            groups.remove(g)
        groups.append(members)
    return groups
