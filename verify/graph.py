"""ONNX graph work: loading models with clear errors, and the topological order of tensors."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from verify.errors import ModelError
from verify.external import PROTO_LIMIT, ExternalFile, check_locations, find_external
from verify.files import read_user_file

if TYPE_CHECKING:  # onnx is imported where a function needs it: `verify --help` and a diff of
    import onnx    # two dumps never load it

INPUT_OP = "<input>"


@dataclass(frozen=True)
class TensorInfo:
    """One computed tensor: where it comes from and where it stands in graph order."""

    index: int
    name: str
    node: str      # producing node's name ('' for graph inputs)
    op: str        # producing node's op type (INPUT_OP for graph inputs)
    is_output: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, object]) -> "TensorInfo":
        return TensorInfo(index=int(d["index"]), name=str(d["name"]), node=str(d["node"]),
                          op=str(d["op"]), is_output=bool(d.get("is_output", False)))


def load_model_bytes(path: Path) -> bytes:
    return read_user_file(path, ModelError, "an .onnx file")


def parse_model(data: bytes, where: str, external: Sequence[ExternalFile] | bool = ()
                ) -> onnx.ModelProto:
    """Parse and sanity-check ONNX bytes; every failure is one ModelError line. A weight in
    external data must name one of `external` (an archive's stored files); True: any (the
    model's structure is all that is read)."""
    import onnx
    from google.protobuf.message import DecodeError

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelError(f"{where}: not an ONNX model (protobuf parse failed: {exc})") from None
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"{where}: not an ONNX model (no graph found)")
    if external is True:
        return model
    if external:
        check_locations(model, external, where)
        return model
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            raise ModelError(f"{where}: refers to weights in external data files; a model "
                             "given as bytes must hold its weights (load_model reads them in)")
    return model


def load_model(path: Path, keep_external: bool = False,
               found: list[ExternalFile] | None = None
               ) -> tuple[onnx.ModelProto, bytes, tuple[ExternalFile, ...]]:
    """A model file as a ModelProto, its bytes and its external data files. Weights stored as
    external data (`location` files beside the model) are read in, so the model is one
    self-contained message, unless `keep_external` asks otherwise or they do not fit
    protobuf's 2 GiB limit: then the model keeps its references and the files are returned
    (checked to lie beside it; nothing of them is read). `found`, when given, receives the
    external data files either way (files an output must not overwrite)."""
    import onnx
    from google.protobuf.message import DecodeError

    data = load_model_bytes(path)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        return parse_model(data, str(path)), data, ()  # parse_model says what is wrong
    files = find_external(model, Path(path))
    if found is not None:
        found.extend(files)
    if not files:
        return parse_model(data, str(path)), data, ()
    if keep_external or len(data) + sum(f.size for f in files) > PROTO_LIMIT:
        return parse_model(data, str(path), files), data, files
    from onnx.external_data_helper import load_external_data_for_model

    try:
        load_external_data_for_model(model, str(Path(path).parent))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read its external data: {exc}") from None
    data = model.SerializeToString()
    return parse_model(data, str(path)), data, ()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def topological_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The graph's nodes in a topological order (stable: keeps file order where it is valid)."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        progressed = []
        for node in pending:
            if all(name in available for name in node.input):
                ordered.append(node)
                available.update(node.output)
            else:
                progressed.append(node)
        if len(progressed) == len(pending):
            missing = sorted({n for node in progressed for n in node.input if n not in available})
            raise ModelError(f"graph has a cycle or undefined tensors: {', '.join(missing[:5])}")
        pending = progressed
    return ordered


def node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def tensor_order(model: onnx.ModelProto) -> list[TensorInfo]:
    """Graph inputs, then every node output in topological order.

    Initializers are constants, not computed, so they are not listed. Tensors inside the
    bodies of If/Loop/Scan belong to their parent node and are not listed either.
    """
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    infos: list[TensorInfo] = []
    for inp in graph.input:
        if inp.name not in initializers:
            infos.append(TensorInfo(len(infos), inp.name, "", INPUT_OP, inp.name in outputs))
    for i, node in enumerate(topological_nodes(graph)):
        for out in node.output:
            if out:
                infos.append(TensorInfo(len(infos), out, node_label(node, i), node.op_type,
                                        out in outputs))
    return infos


def output_names(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output]


def opset_of(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


def node_bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The node's own subgraphs (an If's branches, a Loop's or Scan's body), not nested ones."""
    return [sub for attr in node.attribute
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)]


def graph_and_bodies(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph`, then every If/Loop/Scan body in it, nested ones included."""
    yield graph
    for node in graph.node:
        for body in node_bodies(node):
            yield from graph_and_bodies(body)


def count_ops(nodes: Iterable[onnx.NodeProto]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# Ops whose output stays within the range of their data input's values (a mean or an extreme
# of them): a saturating op's output seen through them keeps its floor.
_RANGE_KEEPING_OPS = frozenset({"ReduceMean", "ReduceMax", "ReduceMin", "AveragePool",
                                "GlobalAveragePool", "MaxPool", "GlobalMaxPool"})


def saturation_floors(model: onnx.ModelProto) -> dict[str, float]:
    """The magnitude floor of every computed tensor of the top-level graph (see
    `rules.saturating_floor`).

    A tensor gets the floor when its producer is a saturating op, or an op that only moves
    values (shape-only) or keeps them within their range (a mean, a max) whose data input
    (input 0) has it. An If output has it when the matching output of both branches has it
    (followed inside the bodies, nested Ifs included), so a Sigmoid behind an If and an
    Identity (silero VAD's output) keeps its floor.
    """
    floors: dict[str, float] = {}
    scope = _Scope(model.graph, None)
    for node in model.graph.node:
        for out in node.output:
            if out:
                floors[out] = scope.floor(out)
    return floors


# Ops whose output's error is bounded by their data inputs' (they select, move or average
# values, computing none): Relu, Clip, Max of two tensors, a max pool. Their output can be far
# smaller than their input (a ReLU6 after a convolution peaking at 590), while the absolute
# noise of the values they pass on is the input's: judged against the output's own peak, it
# failed (PP-OCRv4 rec on raw 0-255 pixels: every Clip after a large convolution, between two
# opt levels on one CPU). So such an output is not blamed for its sources' error.
_SELECTING_OPS = frozenset({"Relu", "Clip", "Max", "Min", "MaxPool", "GlobalMaxPool",
                            "ReduceMax", "ReduceMin", "ReduceMean", "AveragePool",
                            "GlobalAveragePool"})


def value_sources(model: onnx.ModelProto) -> dict[str, tuple[str, ...]]:
    """For each top-level tensor made by an op that only selects, moves or averages values
    (`_SELECTING_OPS`, `rules.SHAPE_ONLY_OPS`, LeakyRelu with alpha <= 1) or squashes them
    with a bounded slope (`rules.SOURCE_FACTORS`: a Sigmoid), the tensors its values come from:
    its data input (every input of Max and Min), where another node computes it (a weight or a
    graph input carries no computing error)."""
    from verify.rules import SHAPE_ONLY_OPS, SOURCE_FACTORS

    made = {o for n in model.graph.node if n.op_type != "Constant" for o in n.output if o}
    sources: dict[str, tuple[str, ...]] = {}
    for node in model.graph.node:
        op = node.op_type
        if op in ("Max", "Min"):
            data = list(node.input)
        elif op in _SELECTING_OPS or op in SHAPE_ONLY_OPS or op in SOURCE_FACTORS or (
                op == "LeakyRelu" and next((a.f for a in node.attribute if a.name == "alpha"),
                                           0.01) <= 1):
            data = list(node.input[:1])
        else:
            continue
        found = tuple(dict.fromkeys(n for n in data if n in made))
        for out in node.output:
            if out and found:
                sources[out] = found
    return sources


class _Scope:
    """One graph's producers, with the enclosing graph's for names defined outside it."""

    def __init__(self, graph: onnx.GraphProto, parent: _Scope | None) -> None:
        self.parent = parent
        self.producer: dict[str, onnx.NodeProto] = {}
        for node in graph.node:
            for out in node.output:
                if out:
                    self.producer[out] = node
        self._memo: dict[str, float] = {}

    def floor(self, name: str, depth: int = 0) -> float:
        from verify.rules import SATURATING_OPS, SATURATION_FLOOR, SHAPE_ONLY_OPS

        if name in self._memo:
            return self._memo[name]
        node = self.producer.get(name)
        if node is None:
            return self.parent.floor(name, depth) if self.parent is not None else 0.0
        value = 0.0
        if depth < 256:
            if node.op_type in SATURATING_OPS:
                value = SATURATION_FLOOR
            elif node.op_type in SHAPE_ONLY_OPS or node.op_type in _RANGE_KEEPING_OPS:
                value = self.floor(node.input[0], depth + 1) if node.input else 0.0
            elif node.op_type == "If":
                k = list(node.output).index(name)
                branches = [a.g for a in node.attribute if a.name in ("then_branch",
                                                                        "else_branch")]
                values = [_Scope(g, self).floor(g.output[k].name, depth + 1)
                          for g in branches if k < len(g.output)]
                value = min(values) if len(values) == 2 else 0.0
        self._memo[name] = value
        return value


def inferred_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The type of every tensor onnx knows or can infer: the graph's inputs, outputs and
    value_info, then shape inference (which may fail on ops it does not know: those tensors
    simply stay unknown)."""
    import onnx

    types: dict[str, onnx.TypeProto] = {}

    def take(infos: Iterable[onnx.ValueInfoProto]) -> None:
        for vi in infos:
            if vi.name not in types and vi.type.WhichOneof("value") is not None \
                    and _known_elem_type(vi.type):
                types[vi.name] = vi.type

    graph = model.graph
    take(graph.input)
    take(graph.output)
    take(graph.value_info)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - onnx raises assorted errors for ops it cannot infer
        return types
    take(inferred.graph.value_info)
    take(inferred.graph.output)
    return types


def _known_elem_type(tp: onnx.TypeProto) -> bool:
    import onnx

    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return tp.tensor_type.elem_type != onnx.TensorProto.UNDEFINED
    return kind is not None


def with_outputs(model: onnx.ModelProto, names: Sequence[str], *,
                 types: dict[str, onnx.TypeProto] | None = None
                 ) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of `model` whose graph outputs are its own outputs plus `names` (in order, once
    each), typed by shape inference; and the names skipped because their type could not be
    inferred. Names that are already outputs are kept once. Pass `types`
    (`inferred_types(model)`) to mark several sets without re-running inference."""
    types = inferred_types(model) if types is None else types
    import onnx

    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    present = {o.name for o in marked.graph.output}
    skipped: list[str] = []
    for name in names:
        if name in present:
            continue
        tp = types.get(name)
        if tp is None:
            skipped.append(name)
            continue
        vi = marked.graph.output.add()
        vi.name = name
        vi.type.CopyFrom(tp)
        present.add(name)
    return marked, skipped


def fused_away(original: onnx.ModelProto, kept: Iterable[str]) -> dict[str, list[str]]:
    """For each tensor of `original` that is in `kept` (the tensors of an optimized graph), the
    original tensors that optimization fused into its producer: those not kept, reached
    walking up from it through tensors that are not kept either."""
    kept = set(kept)
    producer: dict[str, onnx.NodeProto] = {}
    for node in original.graph.node:
        for out in node.output:
            if out:
                producer[out] = node
    order = {t: i for i, t in enumerate(producer)}
    groups: dict[str, list[str]] = {}
    for name in producer:
        if name not in kept:
            continue
        found: list[str] = []
        stack = [i for i in producer[name].input if i]
        seen: set[str] = set()
        while stack:
            t = stack.pop()
            if t in seen or t in kept or t not in producer:
                continue
            seen.add(t)
            found.append(t)
            stack.extend(i for i in producer[t].input if i)
        if found:
            groups[name] = sorted(found, key=order.__getitem__)
    return groups
