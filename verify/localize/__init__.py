"""`verify localize`: from "outputs differ on the device" to the faulty node and a repro archive.

Two searches, both on the device itself and both batching pieces into few round trips:
- dump (the per-layer references, from the archive's layers or a host run, fit the memory
  budget): one per-layer run on the device, rank nodes by where the error jumps, then run the
  candidates in isolation (each fed the reference values of its inputs) side by side in one
  trip;
- bisect (`--no-dump`, or too big to dump): cut the failing range into parts on single-tensor
  cuts, run the parts with reference boundary inputs in one trip, keep the failing part.
Either ends with a node whose own output is wrong ("faulty here"), or the smallest subgraph that
fails while none of its parts does; that piece is written as a `.vtc` repro. When every marked
layer passes but the plain model does not (marking blocked the fusion that is wrong), the
per-layer search hands over to bisection with unmarked pieces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from verify.archive_reader import external_data
from verify.check import check_outputs
from verify.compare import TensorDiff, ToleranceSet, first_divergent
from verify.errors import UsageError
from verify.graph import INPUT_OP, inferred_types, parse_model, saturation_floors, value_sources
from verify.origin import HOST, Attribution, attribute
from verify.layer_judge import LayerJudge
from verify.localize.cases import (activation_bytes, choose_case, control_flow_note,
                                   path_errors, reference_outputs, rounding_note)
from verify.localize.repro import repro_label, repro_path, write_repro
from verify.localize.search import (DeviceRounds, References, Round, bisect, isolate,
                                    outputs_pass_note, path_to, rank_candidates, worst)
from verify.options import ArchiveSelection, DeviceTarget, SessionSettings, TimedRuns
from verify.pipeline import RunOptions, Status
from verify.runner import runner as _rt
from verify.subgraph import NodeGraph, Segment, describe_node, node_graph
from verify.external import ExternalData
from verify.testcase import Testcase
from verify.tolerance import layered_record

if TYPE_CHECKING:
    from verify.devices import Profile
    from verify.execute import Prepared

MODES = ("auto", "dump", "bisect")
FAULTY = "faulty here"
PROPAGATED = "propagated"
SUBGRAPH = "failing subgraph"
CLEAN = "no faulty node"
DEFAULT_BUDGET = 512 << 20


@dataclass(frozen=True)
class LocalizeRequest:
    selection: ArchiveSelection          # case_index None: the first case whose outputs fail
    device: DeviceTarget = DeviceTarget()
    session: SessionSettings = SessionSettings()
    mode: str = "auto"
    fanout: int = 2
    max_isolated: int = 16
    budget_bytes: int = DEFAULT_BUDGET
    out_dir: Path | None = None
    write_repro: bool = True


@dataclass(frozen=True)
class Step:
    """A tensor on the way from the inputs to the suspect, with its error in the full run."""

    tensor: str
    node: str
    op: str
    diff: TensorDiff | None

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "node": self.node, "op": self.op,
                "diff": self.diff.to_dict() if self.diff else None}


@dataclass(frozen=True)
class NodeFinding:
    """One node judged in isolation: its own error (fed reference inputs) and what it inherited."""

    index: int
    name: str
    op: str
    own: tuple[TensorDiff, ...]
    inherited: tuple[TensorDiff, ...]
    cumulative: tuple[TensorDiff, ...]

    @property
    def verdict(self) -> str:
        return FAULTY if not all(d.passed for d in self.own) else PROPAGATED

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "op": self.op, "verdict": self.verdict,
                "own_error": _finite_or_text(worst(self.own)),
                "inherited_error": _finite_or_text(worst(self.inherited)),
                "own": [d.to_dict() for d in self.own],
                "inherited": [d.to_dict() for d in self.inherited],
                "cumulative": [d.to_dict() for d in self.cumulative]}


@dataclass(frozen=True)
class LocalizeResult:
    archive: Path
    device: str
    device_info: Mapping[str, Any]
    mode: str
    case_index: int
    opt_level: str
    reference_source: str
    node_count: int
    outputs: tuple[TensorDiff, ...]           # final outputs in the full run
    first_divergent: Step | None              # first tensor over tolerance in the full run
    verdict: str                              # CLEAN, FAULTY or SUBGRAPH
    suspect: NodeFinding | None
    suspect_info: Mapping[str, Any] | None    # name, op, attributes, input shapes
    subgraph: tuple[str, ...] = ()            # the failing piece's nodes (one when FAULTY)
    candidates: tuple[NodeFinding, ...] = ()
    path: tuple[Step, ...] = ()
    rounds: tuple[Round, ...] = ()
    repro: Path | None = None
    notes: tuple[str, ...] = field(default=())
    attribution: Attribution | None = None    # the suspect in PyTorch's terms (origin.py)
    session: SessionSettings = SessionSettings()  # what the search ran with, for its replay

    @property
    def found(self) -> bool:
        return self.verdict != CLEAN


def localize(req: LocalizeRequest, *, status: Status | None = None) -> LocalizeResult:
    if req.mode not in MODES:
        raise UsageError(f"--mode must be one of {', '.join(MODES)}")
    if req.fanout < 2:
        raise UsageError("--fanout must be at least 2")
    from verify.execute import prepare

    prepared = prepare(req.selection, req.device)  # also validates --case
    # joined before the result (a verdict) is returned; external data extracted once
    with prepared.layer_check, external_data(prepared.testcase) as external:
        return _localize(req, prepared, status, external)


def _localize(req: LocalizeRequest, prepared: Prepared, status: Status | None,
              external: ExternalData | None = None) -> LocalizeResult:
    tc, tolerances, _, profile, _ = prepared
    folder = external.folder if external is not None else None
    model = parse_model(tc.model_bytes, str(req.selection.archive), tc.external)
    ng = node_graph(model)
    if not len(ng):
        raise UsageError(f"{req.selection.archive}: the model has no computing nodes to localize")
    floors = saturation_floors(model)
    judge = LayerJudge(tolerances, floors, value_sources(model),
                       {o: n.op_type for n in model.graph.node for o in n.output})
    options = RunOptions(session=req.session, timed=TimedRuns(iterations=1, warmup=0),
                         timeout=req.device.timeout)
    with DeviceRounds(profile, options, status, external) as device:  # one session, every round
        return _localize_on(req, tc, tolerances, profile, model, ng, floors, judge, device,
                            folder)


def _localize_on(req: LocalizeRequest, tc: Testcase, tolerances: ToleranceSet, profile: Profile,
                 model: Any, ng: NodeGraph, floors: Mapping[str, float], judge: LayerJudge,
                 device: DeviceRounds, folder: Path | None) -> LocalizeResult:
    from verify.execute import unmatched_spec_notes

    def check(outs: Mapping[str, np.ndarray], refs: Mapping[str, np.ndarray]) -> list[TensorDiff]:
        return check_outputs(outs, refs, tolerances, floors, profile.spec)  # as `run` checks

    case_index, whole, notes = choose_case(tc, req.selection.case_index, device, check, len(ng))
    case = tc.cases[case_index]
    types = inferred_types(model)  # shape inference once: marking in by_dump
    need, unknown = activation_bytes(model, tc, case_index)
    fits = need <= req.budget_bytes
    refs = References(tc.model_bytes, case.inputs, tc.path if tc.has_layers else None,
                      case_index, req.budget_bytes, fetch_all=fits, model=model,
                      external_dir=folder)
    with refs:  # its host capture's scratch copy of the model goes when done
        mode = req.mode
        if mode == "auto":
            mode = "dump" if fits else "bisect"
            if not fits:
                notes = (*notes, f"bisection, not a per-layer run: case {case_index}'s "
                         f"per-layer references need {need / 2**20:.0f} MB"
                         + (f" ({unknown} tensor size(s) not derivable from its input shapes, "
                            "each counted as its largest input)" if unknown else "")
                         + f", over --budget {req.budget_bytes / 2**20:g}")
        search = _Search(ng, refs, device, judge, check, req)
        # the archive's ground truth, unless this host's own run already differs from it
        # (packed with --expected, or a torch reference): the search then finds where the
        # device departs from this host, judged against it
        wanted, differs = reference_outputs(case.outputs, refs, check, ng.initializers,
                                            str(tc.provenance.get("reference", "")))
        notes = (*notes, *differs, *unmatched_spec_notes(  # a --tol typo, noted as run notes it
            req.selection.tolerances.own_specs(), list(case.outputs), layers=ng.computed()))
        if mode == "dump":
            outcome = search.by_dump(model, types, tc.model_bytes, wanted, whole)
        else:
            outcome = search.by_bisection(tc.model_bytes, wanted, whole)
        outcome = replace(outcome, notes=(*notes, *tolerances.notes(), *outcome.notes))
        mode = outcome.mode or mode
        base = dict(archive=req.selection.archive, device=profile.spec, mode=mode,
                    case_index=case_index, opt_level=req.session.opt_level,
                    node_count=len(ng), outputs=outcome.final, session=req.session)
        if outcome.range is None:
            return LocalizeResult(**base, device_info=device.device_info,
                                  reference_source=refs.source, first_divergent=None,
                                  verdict=CLEAN, suspect=None, suspect_info=None,
                                  rounds=tuple(device.rounds), notes=outcome.notes)
        lo, hi = outcome.range
        cumulative, unmeasured = path_errors(ng, refs, device, judge, lo, hi, outcome.cumulative)
        own = outcome.own
        suspect = _finding(ng, lo, own, cumulative, subgraph=hi - lo > 1)
        verdict = FAULTY if hi - lo == 1 else SUBGRAPH
        shapes = {n: tuple(np.shape(v)) for n, v in
                  refs.get(ng.reads(lo) + ng.makes(lo)).items()}
        info = describe_node(ng, lo, shapes)
        path = tuple(_step(ng, t, cumulative.get(t)) for t in
                     path_to(ng, lo, lambda t: worst([cumulative[t]]) if t in cumulative else -1.0))
        repro = None
        if req.write_repro:
            found = {"device": profile.spec, "device_info": dict(device.device_info),
                     "opt_level": req.session.opt_level, "node": ng.labels[lo],
                     "providers": list(req.session.providers), "threads": req.session.threads,
                     "op": ng.nodes[lo].op_type,
                     "verdict": verdict, "own_error_units": _finite_or_text(worst(own)),
                     "rule": own[0].rule if own else ""}
            repro = _write_repro(req, tc, ng, refs, case_index, Segment(lo, hi), found, folder)
        first = first_divergent(cumulative[t] for t in ng.computed() if t in cumulative)
        return LocalizeResult(
            **base, device_info=device.device_info, reference_source=refs.source,
            first_divergent=_step(ng, first.name, first) if first else None,
            verdict=verdict, suspect=suspect, suspect_info=info,
            subgraph=tuple(ng.labels[lo:hi]), candidates=outcome.candidates, path=path,
            rounds=tuple(device.rounds), repro=repro,
            notes=(*outcome.notes, *unmeasured, *outputs_pass_note(outcome.final),
                   *control_flow_note(ng.nodes[lo]), *rounding_note(ng.labels[lo], own)),
            attribution=_attribution(model, tc, ng, lo))


def _attribution(model: Any, tc: Testcase, ng: NodeGraph, index: int) -> Attribution | None:
    """The suspect node's PyTorch module, and whether onnxruntime on the packing host already
    differed from PyTorch at one of its outputs (an archive packed with --reference torch)."""
    node = ng.nodes[index]
    found = [a for o in node.output if o and (a := attribute(model, tc.provenance, o, node.name))]
    return next((a for a in found if a.where == HOST), found[0] if found else None)


def _write_repro(req: LocalizeRequest, tc: Testcase, ng: NodeGraph, refs: References,
                 case_index: int, segment: Segment, found: Mapping[str, Any],
                 external_dir: Path | None = None) -> Path:
    lo, hi = segment.lo, segment.hi
    label = repro_label(ng.labels[lo], ng.labels[hi - 1] if hi - lo > 1 else None)
    path = repro_path(req.selection.archive, label, req.out_dir,
                      case_index if len(tc.cases) > 1 else None)
    values = refs.get([*ng.segment_inputs(segment), *ng.segment_outputs(segment)])
    tol = req.selection.tolerances
    write_repro(path, ng, segment, values, tc, case_index,
                layered_record(tc.tolerances, tol.atol, tol.rtol, tol.specs),
                found, external_dir)
    return path


def _finite_or_text(x: float) -> float | str:
    """Strict JSON has no infinity: an error without a finite size becomes the text 'inf'."""
    return x if np.isfinite(x) else str(x)


def _finding(ng: NodeGraph, index: int, own: tuple[TensorDiff, ...],
             cumulative: Mapping[str, TensorDiff], subgraph: bool = False) -> NodeFinding:
    """Node `index` judged in isolation (`own`), with the full run's errors on what it reads
    (inherited) and makes (cumulative; a `subgraph`'s: where `own` was judged, its outputs)."""
    made = [d.name for d in own] if subgraph else ng.makes(index)
    return NodeFinding(index, ng.labels[index], ng.nodes[index].op_type, own,
                       tuple(cumulative[t] for t in ng.reads(index) if t in cumulative),
                       tuple(cumulative[t] for t in made if t in cumulative))


def _step(ng: NodeGraph, tensor: str, diff: TensorDiff | None) -> Step:
    i = ng.producer.get(tensor)
    if i is None:
        return Step(tensor, "", INPUT_OP, diff)
    return Step(tensor, ng.labels[i], ng.nodes[i].op_type, diff)


@dataclass(frozen=True)
class _Outcome:
    final: tuple[TensorDiff, ...]
    range: tuple[int, int] | None
    own: tuple[TensorDiff, ...] = ()
    cumulative: Mapping[str, TensorDiff] = field(default_factory=dict)
    candidates: tuple[NodeFinding, ...] = ()
    notes: tuple[str, ...] = ()
    mode: str = ""                      # set when the search switched modes


class _Search:
    def __init__(self, ng: NodeGraph, refs: References, device: DeviceRounds, judge: Any,
                 check: Any, req: LocalizeRequest) -> None:
        self.ng, self.refs, self.device, self.req = ng, refs, device, req
        self.judge, self.check = judge, check  # one tensor; the final outputs, as run checks

    def by_dump(self, model: Any, types: Mapping[str, Any], model_bytes: bytes,
                reference_outputs: Mapping[str, np.ndarray],
                whole: Mapping[str, np.ndarray] | None = None) -> _Outcome:
        """One per-layer run (in chunks under the budget), rank, isolate candidates in one trip.

        When every layer passes, a plain run (no outputs marked) must pass too: if it does not,
        the error lives in an optimization that marking blocks (a fusion), and is bisected
        with unmarked pieces instead.
        """
        from verify.graph import with_outputs

        ng = self.ng
        names = ng.computed()
        values = self.refs.get(names)
        cumulative: dict[str, TensorDiff] = {}
        notes: list[str] = []
        last: dict[str, np.ndarray] = {}  # the device's outputs, judged as `run` judges them
        present = [n for n in names if n in values]
        for chunk in _rt.plan_chunks(present, [int(values[n].nbytes) for n in present],
                                     self.req.budget_bytes):
            marked, skipped = with_outputs(model, chunk, types=dict(types))
            if skipped:
                notes.append(f"{len(skipped)} tensor(s) could not be marked as outputs")
            outs = self.device.run(marked.SerializeToString(), self.refs.get(ng.graph_inputs),
                                   f"per-layer run of {len(chunk)} tensors", nodes=len(ng))
            for t in chunk:
                if t in outs:
                    cumulative[t] = self.judge(t, outs[t], values[t])
            # the round's over-tolerance tensors (its JSON's "failing" was always empty)
            self.device.mark_failing([t for t in chunk if t in cumulative
                                      and not cumulative[t].passed])
            # every run returns the model's own outputs, those no node computes too (a graph
            # input, an initializer, a Constant's): `run` checks them as well
            last.update((t, outs[t]) for t in reference_outputs if t in outs)
        # not the layer judge's view, which lends upstream errors: "verify run would pass"
        # was said of outputs `run` fails
        final = tuple(self.check(last, reference_outputs))
        failing_nodes = rank_candidates(ng, cumulative)
        if not failing_nodes:
            plain = self.by_bisection(model_bytes, reference_outputs, whole)
            if plain.range is None:
                return _Outcome(plain.final, None, cumulative=cumulative, notes=tuple(notes))
            notes.append("every layer is within tolerance when marked as an output but the "
                         "plain run is not: the error lives in an optimization that marking "
                         "blocks (a fusion); bisected with unmarked pieces")
            return replace(plain, notes=tuple(notes), mode="bisect")
        first = min(failing_nodes)
        chosen = sorted(set(failing_nodes[:self.req.max_isolated]) | {first})
        own = isolate(ng, self.refs, self.device, self.judge.plain, chosen,
                      f"{len(chosen)} suspect node(s) in isolation")
        findings = tuple(_finding(ng, i, own[i], cumulative) for i in chosen)
        faulty = [f for f in findings if f.verdict == FAULTY]
        if faulty:
            return _Outcome(final, (faulty[0].index, faulty[0].index + 1), faulty[0].own,
                            cumulative, findings, tuple(notes))
        notes.append("no node is wrong on its own: bisecting for the smallest failing subgraph")
        outs = tuple(cumulative[t] for t in ng.makes(first))
        b = bisect(ng, self.refs, self.device, self.judge.plain, 0, first + 1, outs, self.req.fanout)
        return _Outcome(final, (b.lo, b.hi), b.diffs, cumulative, findings, tuple(notes))

    def by_bisection(self, model_bytes: bytes, reference_outputs: Mapping[str, np.ndarray],
                     outs: Mapping[str, np.ndarray] | None = None) -> _Outcome:
        """`outs`: the plain run's outputs when the case was chosen by one already."""
        ng = self.ng
        if outs is None:
            outs = self.device.run(model_bytes, self.refs.get(ng.graph_inputs),
                                   "the whole model", nodes=len(ng))
        final = tuple(self.check(outs, reference_outputs))
        if all(d.passed for d in final):
            return _Outcome(final, None)
        b = bisect(ng, self.refs, self.device, self.judge.plain, 0, len(ng), final, self.req.fanout)
        return _Outcome(final, (b.lo, b.hi), b.diffs)

