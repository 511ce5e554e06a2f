"""The two sides `verify diff` compares, each opened once: a dump directory or a `.vtc`.

A capture is a `Source` (the case numbers it holds, one case's `Side`, an archive's stored
tolerance record and its PyTorch attribution); a `Side` is one case of it, its tensors in order
with a loader per name. A dump's tensors are mapped from its pack files (kept open, a window
of them at a time: `dump_read.OpenFiles`); an archive's datasets are read into one reused
buffer (`dump.Scratch`) and checked against their digests; an archive packed without
`--layers` has every layer computed on this host (`capture.HostCapture`, chunked, `streamed`
in topological order), so neither capture is ever held whole.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verify.dump import Dump, not_captured_text, open_dump
from verify.dump_read import Scratch
from verify.iodump import is_io_dump
from verify.errors import DumpError, UsageError
from verify.graph import INPUT_OP, parse_model, saturation_floors, value_sources
from verify.origin import Attribution, attribute
from verify.rules import plural


@dataclass(frozen=True)
class Tensor:
    """One tensor of a side: where it comes from, its saturation floor, whether it is an output."""

    name: str
    node: str
    op: str
    floor: float
    is_output: bool
    sources: tuple[str, ...] = ()  # what its values are selected from (graph.value_sources)


@dataclass
class Side:
    """One capture opened for reading: its tensors in order and a loader per name."""

    label: str
    tensors: list[Tensor]
    load: Callable[[str], np.ndarray | None]  # None: no value (a type numpy cannot hold)
    fused_away: set[str] = field(default_factory=set)
    fused_into: dict[str, list[str]] = field(default_factory=dict)
    model_sha256: str = ""
    graph: str = "model"
    nbytes: int = 0  # of the tensors, as the manifest or archive says (0: unknown)
    note: str = ""  # what the report should say about where this side's values came from
    sequential: bool = False  # values computed in its own order: load them in that order
    dump_filter: str | None = None  # the --dump-filter that left some of its tensors out
    not_captured: frozenset[str] = frozenset()  # no .npy form or no tensor: never written
    # tensors onnxruntime's optimizer made (a dump of the optimized graph), and what decides
    # their names (Dump.optimizer_build; empty: not known)
    optimizer_made: frozenset[str] = frozenset()
    optimizer_build: Mapping[str, str] = field(default_factory=dict)
    # name -> shape (None: not derivable), asked only when two model files are compared: a
    # side computed on this host infers them, which the usual diff never needs
    shapes: Callable[[], Mapping[str, tuple[int, ...] | None]] = lambda: {}


@dataclass(frozen=True)
class Source:
    """A capture opened once: the case numbers it holds, one case's side of it, and (an
    archive) the tolerance record it was packed with."""

    cases: tuple[int, ...]
    side: Callable[[int], Side]
    stored_tolerances: Mapping[str, Any] = field(default_factory=dict)
    attribute: Callable[[str, str], Attribution | None] | None = None


def open_source(path: Path, stack: contextlib.ExitStack, *, floors: bool,
                status: Callable[[str], None] | None = None) -> Source:
    """A dump folder or an archive, opened for the whole diff (an archive stays open in
    `stack`); `floors`: read the archive's model for its saturation floors (the reference's
    judge). `status` hears about layers computed on this host."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder")
    if path.is_dir():
        dump = open_dump(path)
        stack.callback(dump.close)
        return Source(tuple(dump.case_numbers), lambda case: _dump_side(dump, case))
    if is_io_dump(path):
        raise UsageError(f"{path}: a text io-dump (--io-dump); verify diff compares "
                         "--bin-io-dump folders and archives (compare text dumps with diff)")
    return _archive_source(path, stack, floors, status)


def _dump_side(dump: Dump, case: int) -> Side:
    if dump.stats_only:
        raise DumpError(f"{dump.path}: a --dump-stats-only dump holds no tensor values to "
                        "compare; diff its --io-dump text, or re-run without --dump-stats-only")
    entries = {e.name: e for e in dump.entries(case)}
    outputs = dump.outputs
    tensors = [Tensor(e.name, e.node, e.op, e.floor, e.name in outputs, e.sources)
               for e in sorted(entries.values(), key=lambda e: e.index)]
    inside = dump.subgraph_tensors
    notes = [f"{plural(inside, 'tensor')} inside If/Loop/Scan bodies were not captured "
             "(onnxruntime can mark only the top-level graph's tensors); their nodes are "
             "compared by their outputs"] if inside > 0 else []
    if dump.not_captured:
        notes.append(not_captured_text(dump.not_captured))
    note = f"{dump.path}: " + "; ".join(notes) if notes else ""
    return Side(
        label=str(dump.path), tensors=tensors,
        # mapped, a pack's tensors up to 16 MiB at a time, every page mapped up front: the
        # whole diff of two PP-OCRv4 det 640 dumps took 0.44-0.53 s so against 0.75 s copying
        # each tensor into a reused buffer (issue 14)
        load=lambda name: dump.load(entries[name]),
        fused_away=set(dump.fused_away), fused_into=dump.fused_into,
        model_sha256=dump.model_sha256, graph=dump.graph, dump_filter=dump.dump_filter,
        not_captured=frozenset(dump.not_captured),
        optimizer_made=frozenset(e.name for e in entries.values() if e.origin == "optimized"),
        optimizer_build=dump.optimizer_build,
        shapes=lambda: {e.name: tuple(e.shape) for e in entries.values()},
        nbytes=sum(_nbytes(e.dtype, e.shape) for e in entries.values()), note=note)


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    try:
        return math.prod(shape) * np.dtype(dtype).itemsize
    except (TypeError, ValueError):  # a dtype numpy does not know: it adds nothing
        return 0


def _archive_source(path: Path, stack: contextlib.ExitStack, with_floors: bool,
                    status: Callable[[str], None] | None) -> Source:
    from verify import schema
    from verify.archive_reader import ArchiveReader, external_data  # h5py: archives only

    reader = stack.enter_context(ArchiveReader(path))
    tc = reader.testcase()
    needs_host = any(not c.get(schema.LAYERS) for c in reader.cases)
    model = (parse_model(tc.model_bytes, str(path), tc.external) if with_floors or needs_host
             else None)
    floors = saturation_floors(model) if with_floors and model is not None else {}
    sources = value_sources(model) if with_floors and model is not None else {}
    scratch = Scratch()  # one read buffer for every case: a loaded tensor lives until the next

    def side(case: int) -> Side:
        tc.case_indices(case)  # a case the archive does not hold: one UsageError line
        entries = reader.cases[case].get(schema.LAYERS)
        if not entries:
            return _host_side(case)
        datasets = {e.name: (e, reader.dataset(e)) for e in entries}
        order = [t for t in tc.tensor_order if t.name in datasets]

        def load(name: str) -> np.ndarray:
            entry, ds = datasets[name]
            if ds.size == 0:
                return reader.read(entry)
            out = scratch.take(int(ds.size) * ds.dtype.itemsize).view(ds.dtype).reshape(ds.shape)
            return reader.read(entry, out)  # checked against its digest

        return Side(label=str(path),
                     tensors=[Tensor(t.name, t.node, t.op, floors.get(t.name, 0.0), t.is_output,
                                     sources.get(t.name, ()))
                              for t in order],
                     load=load, model_sha256=str(tc.provenance.get("model_sha256", "")),
                     shapes=lambda: {n: tuple(int(d) for d in ds.shape)
                                     for n, (_, ds) in datasets.items()},
                     nbytes=sum(int(datasets[t.name][1].nbytes) for t in order))

    from verify.capture import HostCapture  # onnx and onnxruntime only where a side needs them
    from verify.shapes import case_shapes

    hosts: list[HostCapture] = []  # set up once for all cases, on the first that needs it

    def _host_side(case: int) -> Side:
        """Packed without --layers: every layer computed here from the archive's model and
        this case's inputs (onnxruntime CPU, optimizations off, bounded memory), as pack
        --layers would have stored them."""
        if status is not None:
            status(f"{path}: no per-layer references; computing case {case}'s "
                   f"{len(tc.tensor_order)} tensors on this host (onnxruntime CPU, "
                   "optimizations off)")
        if not hosts:
            external = stack.enter_context(external_data(tc))  # extracted for the capture
            hosts.append(stack.enter_context(HostCapture(
                tc.model_bytes, model=model,
                external_dir=external.folder if external is not None else None)))
        inputs = tc.cases[case].inputs

        def shapes() -> dict[str, tuple[int, ...] | None]:
            found = case_shapes(model, {k: v.shape for k, v in inputs.items()}) if model else {}
            return {**found, **{k: tuple(v.shape) for k, v in inputs.items()}}

        computed, stored = streamed(hosts[0], inputs), tc.cases[case].outputs

        def load(name: str) -> np.ndarray | None:
            # the outputs are the archive's ground truth, as `run` judges them: PyTorch's,
            # or --expected's, which this host's onnxruntime need not reproduce (a diff
            # against its own numbers passed where run failed)
            return stored[name] if name in stored else computed(name)  # (the pass goes by)

        return Side(label=str(path),
                     tensors=[Tensor(t.name, t.node, t.op, floors.get(t.name, 0.0), t.is_output,
                                     sources.get(t.name, ()))
                              for t in tc.tensor_order],
                     load=load, shapes=shapes,
                     model_sha256=str(tc.provenance.get("model_sha256", "")),
                     note=f"{path} holds no per-layer references (packed without --layers): "
                          "computed on this host (onnxruntime CPU, optimizations off) from its "
                          f"model and case {case}'s inputs; its outputs are the ground truth it "
                          "stores, as `run` judges them", sequential=True)

    def attribute_at(tensor: str, node: str) -> Attribution | None:
        parsed = model if model is not None else parse_model(tc.model_bytes, str(path), tc.external)
        return attribute(parsed, tc.provenance, tensor, node)

    return Source(tuple(range(len(tc.cases))), side, dict(tc.tolerances), attribute_at)


def streamed(host: Any, feeds: Mapping[str, np.ndarray]
             ) -> Callable[[str], np.ndarray | None]:
    """A loader over one host capture pass, in topological order: asked in that order (the
    walk does, on whichever side computes here) it costs one pass, holding one chunk at a
    time; a name asked for after the pass went by it is computed on its own. None for a tensor
    the capture leaves out (a type numpy has no form for)."""
    stream = host.layers(feeds, with_missing=True)  # a tensor without a value goes by too
    passed: set[str] = set()

    def load(name: str) -> np.ndarray | None:
        if name not in passed:
            for got, value in stream:
                passed.add(got)
                if got == name:
                    return value
        return dict(host.layers(feeds, [name], with_missing=True))[name]

    return load


def unpaired_namesakes(act: Side, ref: Side, shared: set[str]) -> tuple[frozenset[str], str]:
    """The names both sides hold that must not be paired, and why: a tensor onnxruntime's
    optimizer made on either side is paired only when both captures ran the same build
    (Dump.optimizer_build) and made it at the same node with the same op. Its names are
    numbered per build: across onnxruntime versions reorder_token_202 is another node's
    output, and across CPUs the same name holds another NCHWc block layout."""
    suspect = shared & (act.optimizer_made | ref.optimizer_made)
    if not suspect:
        return frozenset(), ""
    a_build, r_build = act.optimizer_build, ref.optimizer_build
    if not (a_build and a_build == r_build):
        key = next((k for k in r_build if a_build.get(k) != r_build[k]), "") \
            if a_build and r_build else ""
        why = ("the captures do not both say which onnxruntime build made them" if not key
               else "captured on two machines" if key == "machine"
               else f"{key} {a_build[key]} vs {r_build[key]}")
        return frozenset(suspect), why
    a_made = {t.name: (t.node, t.op) for t in act.tensors}
    r_made = {t.name: (t.node, t.op) for t in ref.tensors}
    bad = frozenset(n for n in suspect if n not in act.optimizer_made
                    or n not in ref.optimizer_made or a_made[n] != r_made[n])
    return bad, "made by other nodes on the two sides"


def unpaired_why(name: str, side: Side, other: Side, side_word: str, other_word: str) -> str:
    """Why `side`'s tensor `name` was not paired with `other`'s namesake."""
    if name in side.optimizer_made:
        return (f"made by the {side_word} side's optimizer (not paired with the {other_word}'s "
                "namesake, which may be another tensor)")
    return f"not paired with the {other_word}'s namesake, which its optimizer made"


def same_model_or_refuse(act: Side, ref: Side) -> None:
    """Captures of two model files (an fp16 or quantized copy of a model, say) are compared
    when at least half the smaller one's computed tensors have a namesake of the same shape on
    the other side. Different models share names by chance: onnxruntime's reorder_token_1;
    PaddleOCR's exporter names every model's weights and activations conv2d_0.w_0,
    conv2d_0.tmp_0, ... (its det and rec models share 394 names, no activation alike in shape),
    so Constant outputs do not count, nor the optimizer's own (reorder_token_N: 37 of them
    made one network at opt-level all another model), and shapes must agree where known."""
    def counted(t: Tensor, side: Side) -> bool:
        return t.op not in (INPUT_OP, "Constant") and t.name not in side.optimizer_made

    theirs = {t.name for t in act.tensors if counted(t, act)}
    named = [t.name for t in ref.tensors if counted(t, ref) and t.name in theirs]
    act_shapes, ref_shapes = act.shapes(), ref.shapes()
    alike = sum(1 for n in named if None in (act_shapes.get(n), ref_shapes.get(n))
                or act_shapes[n] == ref_shapes[n])
    smaller = min(sum(1 for t in side.tensors if counted(t, side)) for side in (act, ref))
    if alike < smaller / 2:
        if len(named) >= smaller / 2:
            why = (f"{len(named)} of {smaller} computed tensors share a name, {alike} of them "
                   "its shape: another model, or inputs of another shape")
        else:
            why = f"{alike} of {smaller} computed tensors have a namesake of the same shape"
        raise DumpError(
            f"{act.label} and {ref.label} are captures of different models (model sha256 "
            f"{act.model_sha256[:12]}… vs {ref.model_sha256[:12]}…; {why})")
