"""Capturing intermediate tensors in bounded memory, on the host and (planned here) on devices.

A tensor is visible only as a graph output, and marking every tensor at once keeps every
activation alive until the run ends (ResNet-50: peak memory 333 -> 718 MB). So the graph is cut
into consecutive segments whose live tensors fit a budget, each run once on the boundary values
the previous one left, each value handed on as soon as it arrives; the sizes come from shape
inference with the case's concrete input shapes (`verify.shapes`), and what that cannot derive
is measured on the device. The segmenting is the device runner's own code
(`verify/runner/runner.py`), so the host and every device capture the same way.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from verify.errors import InputError, ModelError, UsageError
from verify.graph import (INPUT_OP, TensorInfo, fused_away, graph_and_bodies, output_names,
                          parse_model, saturation_floors, tensor_order, value_sources)
from verify.reference import ort_log_severity
from verify.runner import runner as _rt
from verify.runner.contract import CPU_PROVIDER, Job
from verify.shapes import tensor_sizes

# The host reference: plain CPU kernels, as for ground truth (reference.py).
_HOST_JOB = {Job.OPT_LEVEL: "disable", Job.PROVIDERS: [CPU_PROVIDER]}


class HostCapture:
    """The host reference (ONNX Runtime CPU, optimizations disabled) of one model, set up once
    (model parsed, tensor order, a scratch copy of the model) for any number of cases.

    Use it as a context manager: the scratch folder goes when it closes. Each `layers` call
    captures one case on its own (one case's values are all that is ever held, however many
    cases there are), so cases can be consumed one after the other.
    """

    def __init__(self, model_bytes: bytes, *, budget_bytes: int | None = None,
                 model: onnx.ModelProto | None = None, external_dir: Path | None = None) -> None:
        """`model`: `model_bytes` already parsed by the caller (it is not parsed again);
        `external_dir`: the folder its external data files lie in (then `model` is given)."""
        model = model if model is not None else parse_model(model_bytes, "model")
        self._job = {**_HOST_JOB, Job.ORT_LOG_SEVERITY: ort_log_severity()}
        if external_dir is not None:
            self._job[Job.EXTERNAL_DATA] = str(Path(external_dir).resolve())
        self._order = [t.name for t in tensor_order(model)]
        self._outputs = output_names(model)
        self._model = model
        self._sizes: dict[tuple[tuple[str, tuple[int, ...]], ...], dict[str, int | None]] = {}
        self._budget = budget_bytes or int(_rt.default_budget(len(model_bytes)))
        # the tensors left out so far, in the order met: no .npy form (bfloat16, float8, ...)
        self.not_captured: dict[str, None] = {}
        self._scratch = tempfile.TemporaryDirectory(prefix="verify-capture-")
        self._path = Path(self._scratch.name) / "model.onnx"
        self._path.write_bytes(model_bytes)

    def __enter__(self) -> HostCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._scratch.cleanup()

    def layers(self, feeds: Mapping[str, np.ndarray], names: Sequence[str] | None = None,
               *, with_missing: bool = False) -> Iterator[tuple[str, np.ndarray | None]]:
        """Reference values of `names` (default: every tensor of `graph.tensor_order`, graph
        inputs included) for one case, yielded in topological order, computed in segments of
        at most the budget of marked activations. Names not in the graph are a UsageError.
        A tensor of a type numpy has no form for (bfloat16, float8, string) is left out, or
        with `with_missing` yielded with the value None (a reader going by name learns that it
        went by). Drop each value once used to keep memory bounded."""
        wanted = self._order
        if names is not None:
            known = set(self._order)
            unknown = [n for n in names if n not in known]
            if unknown:
                raise UsageError(f"no tensor named {', '.join(repr(n) for n in unknown[:5])} "
                                 "in the model")
            chosen = set(names)
            wanted = [n for n in self._order if n in chosen]
        feeds = {k: np.asarray(v) for k, v in feeds.items()}
        key = tuple(sorted((k, tuple(v.shape)) for k, v in feeds.items()))
        if key not in self._sizes:
            self._sizes[key] = tensor_sizes(self._model, [dict(key)])
        chunks = _rt.capture_segments(np, _ort(), str(self._path), wanted, [feeds],
                                      self._budget,
                                      self._job,
                                      self._scratch.name, sizes=self._sizes[key])
        try:
            for _case, name, value in _host_errors(chunks):
                if value is not None:
                    yield name, np.asarray(value)
                else:  # a type numpy has no form for (bfloat16, ...)
                    self.not_captured.setdefault(name)
                    if with_missing:
                        yield name, None
        finally:
            chunks.close()


def host_layers(model_bytes: bytes, feeds: Mapping[str, np.ndarray],
                names: Sequence[str] | None = None, *,
                budget_bytes: int | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """`HostCapture.layers` of one case (budget default: sized to the model and this machine);
    for several cases of one model, set up one HostCapture instead."""
    with HostCapture(model_bytes, budget_bytes=budget_bytes) as capture:
        yield from capture.layers(feeds, names)


def _ort():  # imported lazily: `verify --help` must not pay for onnxruntime
    import onnxruntime

    return onnxruntime


def _host_errors(chunks: Iterator[tuple[int, str, np.ndarray]]
                 ) -> Iterator[tuple[int, str, np.ndarray]]:
    """The runner's JobErrors as verify's own errors."""
    while True:
        try:
            item = next(chunks)
        except StopIteration:
            return
        except _rt.JobError as exc:
            if exc.kind == "input":
                raise InputError(f"onnxruntime rejected the inputs: {exc}") from None
            raise ModelError(str(exc)) from None
        yield item


# --- planning a device dump --------------------------------------------------------------------

@dataclass(frozen=True)
class DumpPlan:
    """What a device dump captures: the tensors (of `graph`, 'model' or 'optimized') in order,
    with the graph's own outputs, and how the captured graph relates to the original model."""

    graph: str
    tensors: tuple[TensorInfo, ...]
    outputs: tuple[str, ...]
    floors: Mapping[str, float]
    optimized_only: tuple[str, ...] = ()
    fused_away: tuple[TensorInfo, ...] = ()
    fused_into: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    filtered_out: int = 0
    model_floors: Mapping[str, float] = field(default_factory=dict)  # the original model's, all
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # graph.value_sources
    sizes: Mapping[str, int | None] = field(default_factory=dict)  # bytes of every node output
    subgraph_tensors: int = 0  # computed inside If/Loop/Scan bodies: onnxruntime cannot mark them


def compile_dump_filter(pattern: str | None) -> re.Pattern[str] | None:
    """The --dump-filter regular expression; UsageError naming it when it does not compile."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--dump-filter {shlex.quote(pattern)}: not a regular expression: "
                         f"{exc}") from None


def plan_dump(original_bytes: bytes, captured_bytes: bytes | None = None,
              dump_filter: str | None = None,
              input_shapes: Sequence[Mapping[str, Sequence[int]]] = (),
              external: bool = False) -> DumpPlan:
    """The tensors to dump: those of the original model, or with `captured_bytes` (the
    optimized model onnxruntime wrote on the device) those of the optimized graph, with the
    original tensors it fused away and the tensors it alone has. `dump_filter` is a regular
    expression searched in each tensor's and producing node's name. `input_shapes` (per case,
    input name -> shape) sizes every tensor of the graph that runs (`DumpPlan.sizes`).
    `external`: the models keep weights in external data (only their structure is read)."""
    pattern = compile_dump_filter(dump_filter)
    original = parse_model(original_bytes, "model", external)
    captured = original if captured_bytes is None else parse_model(
        captured_bytes, "the optimized model written on the device", external)
    order = tensor_order(captured)
    matched = {t.name for t in order if pattern is None or pattern.search(t.name)
               or pattern.search(t.node)}
    if not matched and dump_filter is not None:
        raise UsageError(f"--dump-filter {shlex.quote(dump_filter)} matches no tensor or node "
                         "name")
    # the graph inputs always: without them diff could not tell captures fed different inputs
    # from a layer that computes wrong (a filtered dump's every layer was blamed)
    kept = [t for t in order if t.name in matched or t.op == INPUT_OP]
    floors = saturation_floors(captured)
    sizes = tensor_sizes(captured, input_shapes) if input_shapes else {}
    inside = subgraph_tensor_count(captured)
    if captured_bytes is None:
        return DumpPlan("model", tuple(_reindex(kept)), tuple(output_names(captured)),
                        {t.name: floors.get(t.name, 0.0) for t in kept},
                        fused_into={}, filtered_out=len(order) - len(kept), model_floors=floors,
                        sizes=sizes, subgraph_tensors=inside, sources=value_sources(captured))
    original_order = tensor_order(original)
    names = {t.name for t in order}
    original_names = {t.name for t in original_order}
    original_floors = saturation_floors(original)
    groups = fused_away(original, names)
    return DumpPlan(
        "optimized", tuple(_reindex(kept)), tuple(output_names(captured)),
        {t.name: original_floors.get(t.name, floors.get(t.name, 0.0)) for t in kept},
        optimized_only=tuple(t.name for t in order if t.name not in original_names),
        fused_away=tuple(t for t in original_order if t.name not in names),
        fused_into={k: tuple(v) for k, v in groups.items()},
        filtered_out=len(order) - len(kept), model_floors=original_floors, sizes=sizes,
        subgraph_tensors=inside, sources=value_sources(captured))


def subgraph_tensor_count(model: onnx.ModelProto) -> int:
    """How many tensors the nodes inside If/Loop/Scan bodies compute (nested bodies included):
    onnxruntime can mark only the top-level graph's tensors as outputs, so a dump cannot
    capture these; reports say how many there are."""
    bodies = list(graph_and_bodies(model.graph))[1:]
    return sum(1 for body in bodies for node in body.node for o in node.output if o)


def _reindex(infos: Sequence[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo(i, t.name, t.node, t.op, t.is_output) for i, t in enumerate(infos)]

