"""`verify diff`: two layer captures compared tensor by tensor, first divergent tensor named.

Each side is a dump directory (`run --bin-io-dump`) or a `.vtc`: its per-layer references
when packed with `--layers`, else every layer computed on this host (`capture.HostCapture`,
chunked), opened by `diff_sources`. Tensors are matched by name and reported in the reference's
topological order, one pair at a time, loaded into reused buffers or streamed, so neither
capture is ever held whole. Every metric comes from `compare.compare` (one fused pass per
tensor); small float32 pairs are batched into one kernel call (`compare.compare_batch`). Tensors
on one side only are listed (fused away by the device's optimizer, filtered, not captured),
never errors; the first tensor over tolerance is the first divergent one.

Captures of two different model files are compared when they share names for at least half of
their computed tensors (else exit 2: unrelated models). A quantized model against its float
original pairs reference tensor X with the actual's `X_DequantizeLinear_Output`, and float
tensors of another precision (an fp16 model) are compared in the reference's dtype; with an
SQNR gate (`--tol '*:sqnr>=30'`) the first divergent tensor is the first layer below it.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from verify.compare import (BatchItem, TensorDiff, ToleranceSet, compare, compare_batch,
                            expect_bytes)
from verify.diff_sources import (Side, Source, open_source, same_model_or_refuse,
                                 unpaired_namesakes, unpaired_why)
from verify.dtypes import float_eps
from verify.dump import not_captured_text
from verify.errors import DumpError, UsageError
from verify.graph import INPUT_OP
from verify.diff_report import DiffReport, DiffRow
from verify.layer_judge import LayerJudge
from verify.rules import plural
from verify.scan import Batch
from verify.tolerance import describe_record
from verify.tolerance_specs import exact_anyway_notes


def diff_captures(actual: Path, reference: Path, tolerances: ToleranceSet, *, case: int = 0,
                  engine: str = "auto") -> DiffReport:
    """Compare two captures (dump directories or .vtc archives, see the module doc).

    Raises DumpError/ArchiveError (exit 2) for unusable inputs: missing, incomplete, corrupt,
    stats-only, or sharing no tensor (dumps of different models). A tensor over tolerance,
    with another shape or dtype, is a failing row, not an error.
    """
    return diff_cases(actual, reference, tolerances, [case], engine=engine)[0]


TolerancesFor = Callable[[Mapping[str, Any]], ToleranceSet]


def diff_cases(actual: Path, reference: Path, tolerances: ToleranceSet | TolerancesFor,
               cases: Sequence[int] | None = None, *, engine: str = "auto",
               status: Callable[[str], None] | None = None) -> tuple[DiffReport, ...]:
    """`diff_captures` for several cases, each side opened once (an archive is read, its model
    parsed and its floors found once, not once per case): one report per case, in order.
    `cases` None: every case both captures hold (a dump of `run --case 2` holds just case 2);
    cases only one side holds are named in the first report's notes. `status` hears about
    work that takes time (layers computed on this host for an archive packed without them).
    `tolerances`: the rules, or a function making them from an archive's stored tolerance
    record (the reference's when it is an archive, else the actual's, else {}), which is how
    `verify diff` puts its options over an archive's tolerances, as `run` does."""
    with contextlib.ExitStack() as stack:
        act = open_source(Path(actual), stack, floors=False,  # the reference's floors judge
                           status=status)
        ref = open_source(Path(reference), stack, floors=True, status=status)
        notes: list[str] = []
        if not isinstance(tolerances, ToleranceSet):
            stored, owner = next(((s.stored_tolerances, path) for s, path in
                                  ((ref, reference), (act, actual)) if s.stored_tolerances),
                                 ({}, None))
            tolerances = tolerances(stored)
            if owner is not None:
                notes.append(f"tolerances: {owner}'s own ({describe_record(stored)}), under "
                             "any given on the command line")
        if cases is None:
            cases = [c for c in ref.cases if c in act.cases]
            if not cases:
                raise UsageError(f"{actual} holds case(s) {_numbers(act.cases)} and {reference} "
                                 f"case(s) {_numbers(ref.cases)}: none in common to compare")
            for side, other, where in ((act, ref, "actual"), (ref, act, "reference")):
                alone = [c for c in side.cases if c not in other.cases]
                if alone:
                    notes.append(f"case(s) {_numbers(alone)} only in the {where} capture: "
                                 "not compared")
        reports = [_attributed(_walk(act.side(case), ref.side(case), tolerances, case, engine),
                               (ref, act)) for case in cases]
    if notes:  # only when cases were found in common: there is a first report
        reports[0] = replace(reports[0], notes=(*reports[0].notes, *notes))
    return tuple(reports)


def _attributed(report: DiffReport, sources: Sequence[Source]) -> DiffReport:
    """The report with its first divergent tensor named in PyTorch's terms, by the first side
    (the reference's, then the actual's) that is an archive with something to say."""
    fd = report.first_divergent
    if fd is None:
        return report
    for source in sources:
        found = source.attribute(fd.name, fd.node) if source.attribute else None
        if found is not None:
            return replace(report, attribution=found)
    return report


def _numbers(cases: Sequence[int]) -> str:
    return ", ".join(map(str, cases))


def _walk(act: Side, ref: Side, tolerances: ToleranceSet, case: int,
          engine: str) -> DiffReport:
    act_names = {t.name for t in act.tensors}
    ref_names = {t.name for t in ref.tensors}
    computed = {t.name for t in ref.tensors if t.op != INPUT_OP} & {
        t.name for t in act.tensors if t.op != INPUT_OP}
    if not computed:
        empty = next((side for side in (act, ref) if not side.tensors), None)
        if empty is not None:  # a damaged capture, not a mismatch of filters or models
            raise DumpError(f"{empty.label}: case {case} holds no tensor to compare")
        if act.model_sha256 and act.model_sha256 == ref.model_sha256:
            raise DumpError(f"{act.label} and {ref.label} are captures of the same model but "
                            "share no computed tensor (each dumped with another --dump-filter?)")
        raise DumpError(f"{act.label} and {ref.label} share no computed tensor: captures of "
                        "different models?")
    two_files = bool(act.model_sha256 and ref.model_sha256
                     and act.model_sha256 != ref.model_sha256)
    if two_files:
        same_model_or_refuse(act, ref)
    notes = [side.note for side in (act, ref) if side.note] + list(tolerances.notes())
    if two_files:
        notes.append("the two captures come from different model files (sha256 "
                     f"{act.model_sha256[:12]} vs {ref.model_sha256[:12]})")
    if engine == "auto":
        expect_bytes(act.nbytes + ref.nbytes)
    # Compared in the reference's order, unless only the actual side computes its values in
    # its own order (an archive without layers on that side): then in the actual's, so its
    # host capture runs once; the rows are in the reference's order either way.
    alias = _paired(act, ref, ref_names)
    if alias:
        notes.append(f"{len(alias)} tensor(s) paired with the actual model's dequantized values "
                     f"(X with X{DQ_SUFFIX})")
        act_names = act_names | set(alias)
    unpaired, why_unpaired = unpaired_namesakes(act, ref, act_names & ref_names)
    if unpaired:
        notes.append(f"{plural(len(unpaired), 'tensor')} named alike on both sides not paired: "
                     "onnxruntime's optimizer made them, and names them per build "
                     f"(reorder_token_<n>), so a name can stand for another tensor ({why_unpaired})")
        act_names, ref_names = act_names - unpaired, ref_names - unpaired
    cross = act.model_sha256 != ref.model_sha256
    common = {t.name: t for t in ref.tensors if t.name in act_names}
    order = ([t.name for t in act.tensors if t.name in common]
             if act.sequential and not ref.sequential else list(common))
    diffs: dict[str, TensorDiff] = {}
    over: list[TensorDiff] = []  # outputs within what their sources hand them, not as `run` judges
    # not blamed for the error its sources hand it (a ReLU6 after a convolution; LayerJudge)
    judge = LayerJudge(tolerances, {t.name: t.floor for t in ref.tensors},
                       {t.name: t.sources for t in ref.tensors if t.sources},
                       {t.name: t.op for t in ref.tensors})
    cast: dict[str, np.dtype] = {}  # compared in the reference's dtype: an fp16 copy's, say
    # Small float32 pairs are copied into one batch and scanned by one kernel call (a fixed
    # cost per call made hundreds of small tensors ~17x slower than one array; issue 14); the
    # batch is judged before any other tensor, so tensors are still judged in this order.
    batch: Batch | None = None
    pending: list[BatchItem] = []

    def flush() -> None:
        if pending and batch is not None:
            for d in compare_batch(pending, batch, engine):  # type: ignore[arg-type]
                diffs[d.name] = judge.judged(d)
            pending.clear()
            batch.reset()

    skipped: list[str] = []  # no value on a side: a type numpy has no form for (bfloat16, ...)
    # A tensor the optimizer of one side laid out anew keeps its name (a QDQ bias constant's
    # DequantizeLinear output, (1,1,1,64) at all vs (1,64,1,1) at disable): same elements,
    # another shape. Not compared, and said so; it was named the first divergent tensor.
    relaid: dict[str, str] = {}
    optimized = "optimized" in (act.graph, ref.graph)
    for name in order:
        t = common[name]
        a, r = act.load(alias.get(name, name)), ref.load(name)
        if a is None or r is None:
            skipped.append(name)
            continue
        if optimized and not t.is_output and a.shape != r.shape and a.size == r.size:
            relaid[name] = f"{tuple(a.shape)} vs {tuple(r.shape)}"
            continue
        if cross and a.dtype != r.dtype and a.dtype.kind == r.dtype.kind == "f":
            cast[name] = a.dtype  # an fp16 model against its float original: seen through
            a = a.astype(r.dtype)
        if t.sources and any(item[0] in t.sources for item in pending):
            flush()  # its sources' errors first
        rule = judge.rule(name, r.dtype, t.floor)
        # an output is also judged as `run` judges it (the rule of its own floor), where the
        # walk's rule lent it its sources' error
        if t.is_output and rule != (own := judge.own_rule(name, r.dtype, t.floor)):
            plain = compare(name, a, r, own, engine=engine)
            if not plain.passed:
                over.append(plain)
        if _batchable(a, r):
            batch = batch or Batch(BATCH_ELEMENTS)
            if not batch.room_for(a.size):
                flush()
            xa, xr, span = batch.add(a, r)
            pending.append((name, xa, xr, rule, t.is_output, span))
        else:
            flush()
            diffs[name] = judge.judged(compare(name, a, r, rule, topk=t.is_output,
                                               engine=engine))  # type: ignore[arg-type]
        del a, r
    flush()
    if cast:
        notes.append("the actual model's float tensors of another precision were compared in "
                     "the reference's dtype")
    if skipped:
        notes.append(not_captured_text(skipped) + ": not compared")
    notes += exact_anyway_notes(tolerances, ((n, d.reference_dtype) for n, d in diffs.items()
                                             if not d.passed))
    if relaid:
        notes.append(f"{plural(len(relaid), 'tensor')} laid out anew by an optimizer (the same "
                     "elements in another shape) not compared: " + ", ".join(
                         f"{n} {shapes}" for n, shapes in list(relaid.items())[:3])
                     + (" …" if len(relaid) > 3 else ""))
    rows: list[DiffRow] = []
    # a tensor one side could not capture (no .npy form, or a sequence) is not compared, as
    # one with no value on a side (skipped): its side's note names it, no missing row
    uncaptured = act.not_captured | ref.not_captured
    for i, t in enumerate(ref.tensors):
        if t.name in skipped or t.name in uncaptured or t.name in relaid:
            continue
        if t.name in unpaired:
            rows.append(DiffRow(i, t.name, t.node, t.op, None, "actual",
                                unpaired_why(t.name, ref, act, "reference", "actual")))
        elif t.name not in act_names:
            why = ("fused away by the actual side's optimizer" if t.name in act.fused_away
                   else (MADE_BY_OPTIMIZER.format("reference") if ref.graph == "optimized"
                         else NOT_IN_ACTUAL) + _filtered(act, " (dumped with {})"))
            rows.append(DiffRow(i, t.name, t.node, t.op, None, "actual", why))
        else:
            rows.append(DiffRow(i, t.name, t.node, t.op, diffs[t.name],
                                fused=tuple(act.fused_into.get(t.name, ()))))
    paired = set(alias.values())
    only_act = [t for t in act.tensors if t.name not in ref_names and t.name not in paired
                and t.name not in uncaptured]
    for k, t in enumerate(only_act):
        if t.name in unpaired:
            rows.append(DiffRow(len(ref.tensors) + k, t.name, t.node, t.op, None, "reference",
                                unpaired_why(t.name, act, ref, "actual", "reference")))
            continue
        why = ("fused away by the reference side's optimizer" if t.name in ref.fused_away
               else (MADE_BY_OPTIMIZER.format("actual") if act.graph == "optimized"
                     else ONLY_IN_ACTUAL) + _filtered(ref, "; the reference was dumped with {}"))
        rows.append(DiffRow(len(ref.tensors) + k, t.name, t.node, t.op, None, "reference", why))
    fed = [r for r in rows if r.op == INPUT_OP and r.passed is False and r.diff is not None
           and not (r.name in cast and  # an fp16 copy's: different only by its rounding
                    r.diff.max_abs <= (float_eps(cast[r.name]) or 0.0) * r.diff.ref_peak)]
    if fed:  # every layer after them differs for that alone: no device is to blame
        d = fed[0].diff
        raise UsageError(
            f"{act.label} and {ref.label} were fed different inputs in case {case}: "
            f"{', '.join(repr(r.name) for r in fed[:3])} differ{'s' if len(fed) == 1 else ''} "
            f"({d.reason if d.reason.startswith('shape ') else f'max|a-r| {d.max_abs:.3g}'}); "
            "compare captures of the same inputs (one run with "
            "--input, another archive or case?)")
    first = next((r for r in rows if r.passed is False), None)
    return DiffReport(
        actual=act.label, reference=ref.label, case=case, rows=tuple(rows),
        first_divergent=first, passed=first is None and not over, outputs_over=tuple(over),
        only_in_actual=tuple(t.name for t in only_act),
        only_in_reference=tuple(r.name for r in rows if r.missing == "actual"),
        notes=tuple(notes))


def _filtered(side: Side, text: str) -> str:
    """`text` naming the --dump-filter `side` was taken with, where it left tensors out."""
    if not side.dump_filter:
        return ""
    return text.format(f"--dump-filter {shlex.quote(side.dump_filter)}")


# why a tensor one side lacks when nothing explains it further (no fusion, no --dump-filter):
# the report's summary line, which already says as much, gives no reason then
NOT_IN_ACTUAL = "not in the actual capture"
ONLY_IN_ACTUAL = "only in the actual capture"
PLAIN_REASONS = frozenset((NOT_IN_ACTUAL, ONLY_IN_ACTUAL))
# a tensor of a side's optimized graph the other side lacks: a kernel onnxruntime's optimizer
# made (reorder_token_1, a fused Conv's new output), which the summary line counts as such
MADE_BY_OPTIMIZER = "made by the {} side's optimizer (its optimized graph only)"

BATCH_BELOW = 1 << 18  # elements: float32 pairs smaller than this (1 MiB a side) are batched
BATCH_ELEMENTS = 1 << 22  # elements a side per batch (16 MiB a side)


def _batchable(a: np.ndarray, r: np.ndarray) -> bool:
    return (a.dtype == r.dtype == np.float32 and a.shape == r.shape and 0 < a.size < BATCH_BELOW
            and a.flags.c_contiguous and r.flags.c_contiguous)


DQ_SUFFIX = "_DequantizeLinear_Output"  # onnxruntime.quantization's name for X after Q/DQ


def _paired(act: Side, ref: Side, ref_names: set[str]) -> dict[str, str]:
    """For a quantized (QDQ) model against its float original: reference tensor X -> the
    actual's X_DequantizeLinear_Output, X as the quantized model's next layer sees it."""
    if not act.model_sha256 or act.model_sha256 == ref.model_sha256:
        return {}
    return {t.name[:-len(DQ_SUFFIX)]: t.name for t in act.tensors
            if t.op == "DequantizeLinear" and t.name.endswith(DQ_SUFFIX)
            and t.name[:-len(DQ_SUFFIX)] in ref_names}
