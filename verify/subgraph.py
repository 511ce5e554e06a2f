"""Cutting an ONNX graph into pieces that run on their own, and batching pieces into one model.

A piece is a run `[lo, hi)` of the graph's nodes in topological order. Its inputs are the
tensors it reads that it does not make (graph inputs or tensors from earlier nodes), fed with
reference values; its outputs are the tensors it makes that are used after it or are graph
outputs. A one-node piece is an isolated node. Several pieces go side by side into ONE model so
one device round trip runs them all: node names stay unchanged (a device fault keyed by node
name still hits), and only an input that another piece of the same model produces is renamed.

Constant nodes are folded into initializers first, so a weight made by a Constant node travels
with every piece that uses it instead of widening the cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from verify.errors import ModelError
from verify.graph import node_bodies, node_label, topological_nodes

_REF_SUFFIX = "::ref"


@dataclass(frozen=True)
class Segment:
    """Nodes `[lo, hi)` of a `NodeGraph`, plus tensors inside it to return as well."""

    lo: int
    hi: int
    extra_outputs: tuple[str, ...] = ()

    def __len__(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Piece:
    """Where a segment's tensors sit in a batched model: feed name -> original tensor name."""

    segment: Segment
    inputs: Mapping[str, str]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Batch:
    model: onnx.ModelProto
    pieces: tuple[Piece, ...]

    def feeds(self, reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's inputs, taken from the reference values of the original tensors."""
        out: dict[str, np.ndarray] = {}
        for piece in self.pieces:
            for feed, original in piece.inputs.items():
                out[feed] = reference[original]
        return out


@dataclass(frozen=True)
class NodeGraph:
    """A model's computing nodes in topological order, with who makes and reads each tensor."""

    model: onnx.ModelProto
    nodes: tuple[onnx.NodeProto, ...]
    labels: tuple[str, ...]
    initializers: Mapping[str, onnx.TensorProto]
    graph_inputs: tuple[str, ...]
    graph_outputs: tuple[str, ...]
    producer: Mapping[str, int]          # tensor -> index of the node making it
    last_use: Mapping[str, int]          # tensor -> index of the last node reading it
    _live: tuple[int, ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return len(self.nodes)

    def reads(self, i: int) -> list[str]:
        """Node i's computed inputs (initializers and empty optional inputs left out)."""
        return _unique(n for n in _all_inputs(self.nodes[i]) if n and n not in self.initializers)

    def makes(self, i: int) -> list[str]:
        return [n for n in self.nodes[i].output if n]

    def computed(self) -> list[str]:
        """Every tensor a node makes, in topological order."""
        return [t for i in range(len(self.nodes)) for t in self.makes(i)]

    def segment_inputs(self, seg: Segment) -> list[str]:
        made = {t for i in range(seg.lo, seg.hi) for t in self.makes(i)}
        return _unique(t for i in range(seg.lo, seg.hi) for t in self.reads(i) if t not in made)

    def segment_outputs(self, seg: Segment) -> list[str]:
        """Tensors made in the segment and read after it, or graph outputs, plus extras.

        A segment whose outputs are all unused (a dead end) returns everything it makes.
        """
        outs = set(self.graph_outputs)
        made = [t for i in range(seg.lo, seg.hi) for t in self.makes(i)]
        chosen = [t for t in made if t in outs or self.last_use.get(t, -1) >= seg.hi]
        if not chosen:
            chosen = made
        return _unique([*chosen, *(t for t in seg.extra_outputs if t in made)])

    def cut_width(self, position: int) -> int:
        """How many computed tensors cross a cut before node `position` (1: a dominator cut)."""
        return self._live[position]

    def index_of(self, label: str) -> int | None:
        return next((i for i, lab in enumerate(self.labels) if lab == label), None)


def node_graph(model: onnx.ModelProto) -> NodeGraph:
    """Fold Constant nodes into initializers and index the rest in topological order."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    ordered = topological_nodes(graph)
    nodes: list[onnx.NodeProto] = []
    labels: list[str] = []
    for i, node in enumerate(ordered):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            initializers[node.output[0]] = _constant_tensor(node)
            continue
        nodes.append(node)
        labels.append(node_label(node, i))
    graph_inputs = tuple(i.name for i in graph.input if i.name not in initializers)
    producer: dict[str, int] = {}
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in _all_inputs(node):
            if name:
                last_use[name] = i
        for name in node.output:
            if name:
                producer[name] = i
    outputs = tuple(o.name for o in graph.output)
    n = len(nodes)
    for name in outputs:
        last_use[name] = n
    delta = [0] * (n + 2)
    for name, end in last_use.items():
        if name in initializers:
            continue
        start = producer.get(name, -1) + 1       # live from the cut after its producer
        if start <= end:
            delta[start] += 1
            delta[end + 1] -= 1
    live, running = [], 0
    for p in range(n + 1):
        running += delta[p]
        live.append(running)
    return NodeGraph(model=model, nodes=tuple(nodes), labels=tuple(labels),
                     initializers=initializers, graph_inputs=graph_inputs,
                     graph_outputs=outputs, producer=producer, last_use=last_use,
                     _live=tuple(live))


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto:
    attr = node.attribute[0] if node.attribute else None
    if attr is None:
        raise ModelError(f"Constant node {node.name!r} has no value")
    value = helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
    elif isinstance(value, onnx.SparseTensorProto):
        raise ModelError(f"Constant node {node.name!r}: sparse constants are not supported")
    else:
        if isinstance(value, bytes) or (isinstance(value, list) and value
                                        and isinstance(value[0], bytes)):
            arr = np.array(value, dtype=object)
        else:
            arr = np.array(value, dtype=np.float32 if "float" in attr.name else np.int64)
        tensor = numpy_helper.from_array(arr)
    tensor.name = node.output[0]
    return tensor


def _all_inputs(node: onnx.NodeProto) -> list[str]:
    """The node's inputs plus outer-scope names its subgraphs (If/Loop/Scan bodies) read."""
    names = list(node.input)
    for sub in node_bodies(node):
        inner = {i.name for i in sub.input} | {t.name for t in sub.initializer}
        for n in sub.node:
            for name in _all_inputs(n):
                if name and name not in inner:
                    names.append(name)
            inner.update(n.output)
    return names


def _unique(names: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for n in names:
        seen.setdefault(n, None)
    return list(seen)


def _value_info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    """Typed by element type and rank, every dimension left open: with the reference's concrete
    shape, onnxruntime's shape inference would also check the branch of an If that does not run
    for it (silero VAD's 8 kHz branch fails 'LSTM: first input must have rank 3' on 16 kHz
    shapes) and refuse the model."""
    elem = helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype)
    return helper.make_tensor_value_info(name, elem, [None] * np.ndim(value))


def build_batch(ng: NodeGraph, segments: Sequence[Segment],
                reference: Mapping[str, np.ndarray], name: str = "verify-localize") -> Batch:
    """One model running every segment side by side, fed from `reference`.

    Segments must not share nodes. `reference` must hold a value (for dtype and shape) of every
    segment input and output.
    """
    made_here = {t for seg in segments for i in range(seg.lo, seg.hi) for t in ng.makes(i)}
    taken = set(made_here) | set(ng.initializers)
    nodes: list[onnx.NodeProto] = []
    used_inits: dict[str, None] = {}
    inputs: dict[str, onnx.ValueInfoProto] = {}
    outputs: dict[str, onnx.ValueInfoProto] = {}
    pieces = []
    ref_names: dict[str, str] = {}
    for seg in segments:
        feeds: dict[str, str] = {}
        rename: dict[str, str] = {}
        for t in ng.segment_inputs(seg):
            feed = t
            if t in made_here:  # another piece makes it: feed the reference under a new name
                if t not in ref_names:
                    ref_names[t] = _fresh(t + _REF_SUFFIX, taken)
                feed = rename[t] = ref_names[t]
            feeds[feed] = t
            if feed not in inputs:
                inputs[feed] = _value_info(feed, _need(reference, t))
        for i in range(seg.lo, seg.hi):
            node = onnx.NodeProto()
            node.CopyFrom(ng.nodes[i])
            if rename:
                _rename_inputs(node, rename)
            nodes.append(node)
            for t in _all_inputs(ng.nodes[i]):
                if t in ng.initializers:
                    used_inits.setdefault(t, None)
        outs = ng.segment_outputs(seg)
        for t in outs:
            outputs[t] = _value_info(t, _need(reference, t))
        pieces.append(Piece(seg, feeds, tuple(outs)))
    src = ng.model
    graph = helper.make_graph(nodes, name, list(inputs.values()), list(outputs.values()),
                              initializer=[ng.initializers[t] for t in used_inits])
    model = helper.make_model(graph, opset_imports=list(src.opset_import),
                              producer_name="verify-localize")
    model.ir_version = src.ir_version
    for fn in src.functions:
        model.functions.add().CopyFrom(fn)
    return Batch(model=model, pieces=tuple(pieces))


def _need(reference: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    try:
        return reference[name]
    except KeyError:
        raise ModelError(f"no reference value for tensor {name!r} (cannot cut the graph there)") \
            from None


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name


def _rename_inputs(node: onnx.NodeProto, rename: Mapping[str, str]) -> None:
    for k, name in enumerate(node.input):
        if name in rename:
            node.input[k] = rename[name]
    for sub in node_bodies(node):
        for inner in sub.node:
            _rename_inputs(inner, rename)


def split_points(ng: NodeGraph, lo: int, hi: int, fanout: int) -> list[int]:
    """Cut positions strictly inside (lo, hi) splitting it into about `fanout` parts.

    Each cut lands within a quarter of a part of its ideal place, on the narrowest cut there
    (a single tensor when one exists: the cut does not split a residual branch), so every part
    is at most 1.5x its fair share and the search stays logarithmic.
    """
    length = hi - lo
    parts = max(2, min(fanout, length))
    cuts: list[int] = []
    for j in range(1, parts):
        ideal = lo + round(length * j / parts)
        slack = int(length / parts / 4)
        window = range(max(lo + 1, ideal - slack), min(hi - 1, ideal + slack) + 1)
        best = min(window, key=lambda p: (ng.cut_width(p), abs(p - ideal)), default=ideal)
        if lo < best < hi and (not cuts or best > cuts[-1]):
            cuts.append(best)
    return cuts


def sanitize(name: str, limit: int = 60) -> str:
    """A node name made safe for a file name: [A-Za-z0-9._-] only, never empty or hidden."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:limit]
    return text or "node"


def describe_node(ng: NodeGraph, index: int,
                  shapes: Mapping[str, tuple[int, ...]]) -> dict[str, object]:
    """Name, op, attributes (short), inputs with shapes (initializers marked) and outputs."""
    node = ng.nodes[index]
    attrs: dict[str, object] = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            value = "<graph>"
        elif isinstance(value, onnx.TensorProto):
            value = f"tensor{list(value.dims)}"
        elif isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif isinstance(value, list):
            value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
        attrs[attr.name] = value
    inputs = []
    for name in node.input:
        if not name:
            continue
        if name in ng.initializers:
            dims = tuple(int(d) for d in ng.initializers[name].dims)
            inputs.append({"name": name, "shape": list(dims), "initializer": True})
        else:
            shape = shapes.get(name)
            inputs.append({"name": name, "shape": list(shape) if shape is not None else None,
                           "initializer": False})
    return {"name": ng.labels[index], "op": node.op_type, "domain": node.domain,
            "attributes": attrs, "inputs": inputs, "outputs": ng.makes(index)}
