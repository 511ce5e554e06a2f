"""The per-layer dump of a run, in one place: spec → plan → job → pull → manifest.

`DumpSpec` says what the user asked for; `plan_dump` (capture.py) picks the tensors; the dump
job runs on the device in a runner process of its own (bounded memory, a clean heap); each
tensor file is pulled into the dump folder; `manifest` composes the folder's manifest.json,
which `dump.write_manifest` writes beside its reader, `dump.open_dump`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verify.capture import DumpPlan, plan_dump
from verify.dump import manifest_header
from verify.dump_check import file_problem
from verify.errors import RunnerError
from verify.graph import INPUT_OP
from verify.runner.contract import (STAT_KEYS, DumpFirst, DumpResult, FusedAway, Job,
                                    ManifestCase, ManifestOptions, ManifestTensor, Record,
                                    Result)
from verify.runner.contract import DumpSpec as DumpEntry
from verify.runner.contract import Manifest as M
from verify.session import DeviceSession

OPTIMIZED = "optimized.onnx"
DUMP_RESULT = DumpFirst.RESULT.default


@dataclass(frozen=True)
class DumpSpec:
    """A per-layer capture after the run: `dest` receives the tensor files (None: stats
    only); `stats`: each tensor's summary computed on the device too (for --io-dump's text;
    the runner computes it without `dest` whatever this says: it is all such a dump holds)."""

    dest: Path | None = None
    budget_bytes: int | None = None
    dump_filter: str | None = None
    stats: bool = True


@dataclass(frozen=True)
class DumpCapture:
    """What a dump captured: the plan, the budget used, and per case the runner's records
    (name, dtype, shape, stats, and `file`, its name inside `DumpSpec.dest`, or None)."""

    plan: DumpPlan
    budget_bytes: int
    records: tuple[tuple[Mapping[str, Any], ...], ...]
    seconds: float = 0.0
    peak_rss_bytes: int | None = None     # the dump runner's
    segments: int = 0                     # how many pieces the graph was cut into (0: unknown)
    measured: int = 0                     # nodes whose output sizes the runner measured
    not_captured: tuple[str, ...] = ()    # no record from the runner: a type without .npy form

    def largest_bytes(self) -> int:
        """Bytes of the largest node output captured (from the records' dtype and size)."""
        inputs = {t.name for t in self.plan.tensors if t.op == INPUT_OP}
        sizes = [int(r.get(Record.SIZE) or 0) * np.dtype(str(r.get(Record.DTYPE))).itemsize
                 for case in self.records for r in case
                 if r and r.get(Record.DTYPE) and r.get(Record.NAME) not in inputs]
        return max(sizes, default=0)


def input_shapes(cases: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, tuple[int, ...]]]:
    return [{k: tuple(np.shape(v)) for k, v in case.items()} for case in cases]


def prepare_job(job: dict[str, Any], dump: DumpSpec, opt_level: str, model_bytes: bytes,
                cases: Sequence[Mapping[str, np.ndarray]]) -> DumpPlan | None:
    """Add to the timed job what the dump needs. Above opt-level disable the dump captures the
    optimized model onnxruntime writes during the timed run (the graph that ran), planned
    after it; at disable, the model itself, planned now and captured first by the timed runner
    in a child forked before its session (`dump_first`): the returned plan."""
    if opt_level != "disable":
        job[Job.OPTIMIZED_MODEL_PATH] = OPTIMIZED
        return None
    plan = plan_dump(model_bytes, None, dump.dump_filter, input_shapes(cases),
                     Job.EXTERNAL_DATA in job)
    job[Job.DUMP_FIRST] = {**dump_entry(plan, dump), DumpFirst.RESULT: DUMP_RESULT}
    return plan


def dump_entry(plan: DumpPlan, dump: DumpSpec) -> dict[str, Any]:
    """The job's "dump" entry: which tensors, the model's own outputs, budget, save or not."""
    return {DumpEntry.TENSORS: [t.name for t in plan.tensors],
            DumpEntry.OUTPUTS: list(plan.outputs), DumpEntry.BUDGET_BYTES: dump.budget_bytes,
            DumpEntry.DIR: DumpEntry.DIR.default, DumpEntry.SAVE: dump.dest is not None,
            DumpEntry.STATS: dump.stats,
            DumpEntry.SIZES: dict(plan.sizes)}


def capture(session: DeviceSession, workdir: str, job: Mapping[str, Any], timed: Mapping[str, Any],
            model_bytes: bytes, dump: DumpSpec, plan: DumpPlan | None, timeout: float | None,
            keep: bool, cases: Sequence[Mapping[str, np.ndarray]]) -> DumpCapture:
    """The dump after the timed job `job` (whose result is `timed`), captured on the device in
    segments and each tensor file pulled into `dump.dest`: from the forked child's result
    where the timed runner made one, else by a dump job in a runner process of its own
    (a runner that could not fork, or knows no "dump_first", or a dump of the optimized model)."""
    if plan is not None and timed.get(Result.DUMP_RESULT):
        return _pull(session, workdir, dump, plan, session.result(workdir, DUMP_RESULT), keep)
    job = {k: v for k, v in job.items() if k != Job.DUMP_FIRST}
    model_ref, optimized = job[Job.MODEL], None
    if Job.OPTIMIZED_MODEL_PATH in job:
        if not session.dev.exists(f"{workdir}/{OPTIMIZED}"):
            raise RunnerError(f"{session.spec}: the device's runner wrote no optimized model "
                              "(optimized_model_path), so the graph that ran cannot be dumped; "
                              "use verify's own runner.py, or --opt-level disable")
        local = session.tmp / OPTIMIZED
        session.pull(f"{workdir}/{OPTIMIZED}", local)
        model_ref, optimized = OPTIMIZED, local.read_bytes()
        if Job.EXTERNAL_DATA.of(job):  # its weights went beside it (the runner's .data file)
            job = {**job, Job.EXTERNAL_DATA: "."}
    plan = plan or plan_dump(model_bytes, optimized, dump.dump_filter, input_shapes(cases),
                             Job.EXTERNAL_DATA in job)
    dump_job = {**job, Job.MODEL: model_ref, Job.WARMUP: 0, Job.ITERATIONS: 1,
                Job.PROFILE: None, Job.OPTIMIZED_MODEL_PATH: None, Job.RESULT: DUMP_RESULT,
                Job.DUMP: dump_entry(plan, dump)}
    session.say(f"dumping {len(plan.tensors)} tensors ({plan.graph} graph) on {session.spec}")
    result = session.job(dump_job, workdir, name="dump_job.json", timeout=timeout)
    return _pull(session, workdir, dump, plan, result, keep)


def _pull(session: DeviceSession, workdir: str, dump: DumpSpec, plan: DumpPlan,
          result: Mapping[str, Any], keep: bool) -> DumpCapture:
    """The dump runner's records, each tensor file pulled into `dump.dest` (moved, not
    copied, where the transport can and the work directory is not kept)."""
    info = result.get(Result.DUMP)
    if not isinstance(info, dict) or not isinstance(info.get(DumpResult.CASES), list):
        raise RunnerError(f"{session.spec}: the device's runner does not capture layers (its "
                          "result has no 'dump'); use verify's own runner.py for dumps")
    records = []
    missing: dict[str, None] = {}  # in order, once
    pulled: dict[str, str] = {}  # local name -> the device's file: a pack is pulled once
    for case_records in info[DumpResult.CASES]:
        problem = _records_problem(plan, case_records)
        if problem:  # a runner of another make: nothing it says is taken on trust
            raise RunnerError(f"{session.spec}: the runner's dump records are wrong: {problem}")
        kept = []
        for t, rec in zip(plan.tensors, case_records):  # one each (_records_problem)
            if rec is None:  # the runner could not write it (a type with no .npy form)
                missing[t.name] = None
                continue
            rec = dict(rec)
            if rec.get(Record.FILE) and dump.dest is not None:
                device_file = str(rec[Record.FILE])
                name = device_file.rsplit("/", 1)[-1]
                # the device names it: never a path of its choice, an offset where it belongs
                problem = file_problem(name, Record.OFFSET.of(rec))
                if problem or pulled.get(name, device_file) != device_file:
                    raise RunnerError(f"{session.spec}: the runner's dump record for "
                                      f"{str(rec.get(Record.NAME))[:60]!r} is wrong: "
                                      f"{problem or f'a second file named {name}'}")
                if name not in pulled:  # atomic
                    session.pull(f"{workdir}/{device_file}", dump.dest / name, move=not keep)
                    pulled[name] = device_file
                rec[Record.FILE] = name
            kept.append(rec)
        records.append(tuple(kept))
    segments = info.get(DumpResult.SEGMENTS)
    return DumpCapture(plan, int(info.get(DumpResult.BUDGET_BYTES) or 0), tuple(records),
                       float(info.get(DumpResult.MS) or 0.0) / 1000.0,
                       result.get(Result.PEAK_RSS_BYTES),
                       segments=len(segments) if isinstance(segments, list) else 0,
                       measured=int(info.get(DumpResult.MEASURED) or 0),
                       not_captured=tuple(missing))


def _records_problem(plan: DumpPlan, records: Any) -> str | None:
    """What is wrong with one case's records from a runner, or None: the contract gives one
    per planned tensor, in the plan's order, each a record of that tensor or null."""
    if not isinstance(records, list) or len(records) != len(plan.tensors):
        got = len(records) if isinstance(records, list) else type(records).__name__
        return f"{got} records for {len(plan.tensors)} tensors"
    for t, rec in zip(plan.tensors, records):
        if rec is not None and (not isinstance(rec, dict) or rec.get(Record.NAME) != t.name):
            name = rec.get(Record.NAME) if isinstance(rec, dict) else rec
            return f"a record for {str(name)[:60]!r} where {t.name[:60]!r} belongs"
    return None


def manifest_cases(capture: DumpCapture, indices: Sequence[int]) -> list[dict[str, Any]]:
    """Per case the manifest's tensor entries, in the order captured."""
    plan = capture.plan
    if len(indices) != len(capture.records):
        raise RunnerError(f"the runner's dump holds {len(capture.records)} case(s) for the "
                          f"{len(indices)} run")
    info = {t.name: t for t in plan.tensors}
    optimized_only = set(plan.optimized_only)
    cases = []
    for ci, records in zip(indices, capture.records, strict=True):
        tensors = []
        for rec in records:
            t = info[rec[Record.NAME]]
            T = ManifestTensor
            tensors.append({
                T.INDEX: t.index, T.NAME: t.name, T.NODE: t.node, T.OP: t.op,
                T.ORIGIN: "optimized" if t.name in optimized_only else "model",
                T.FLOOR: plan.floors.get(t.name, 0.0), T.DTYPE: rec[Record.DTYPE],
                T.SHAPE: rec[Record.SHAPE], T.FILE: rec.get(Record.FILE),
                T.OFFSET: Record.OFFSET.of(rec),
                T.STATS: {k: rec[k] for k in STAT_KEYS if k in rec},
                T.SOURCES: list(plan.sources.get(t.name, ()))})
        cases.append({ManifestCase.CASE: ci, ManifestCase.TENSORS: tensors})
    return cases


def manifest(capture: DumpCapture, cases: list[dict[str, Any]], *, device: Mapping[str, Any],
             spec: str, providers: Sequence[str], opt_level: str, threads: int,
             dump_filter: str | None, stats_only: bool, model_sha256: str) -> dict[str, Any]:
    """The dump folder's whole manifest (dump.py reads it back: `open_dump`)."""
    plan = capture.plan
    header = manifest_header(
        device=device, spec=spec, providers=providers,
        options={ManifestOptions.OPT_LEVEL: opt_level, ManifestOptions.THREADS: threads,
                 ManifestOptions.CAPTURED_AT_OPT_LEVEL: "disable",
                 ManifestOptions.BUDGET_BYTES: capture.budget_bytes,
                 ManifestOptions.FILTER: dump_filter, ManifestOptions.STATS_ONLY: stats_only},
        model_sha256=model_sha256, graph=plan.graph, outputs=plan.outputs)
    return {**header, M.CASES: cases,
            M.OPTIMIZED_ONLY: list(plan.optimized_only),
            M.FUSED_AWAY: [{FusedAway.NAME: t.name, FusedAway.NODE: t.node, FusedAway.OP: t.op}
                           for t in plan.fused_away],
            M.FUSED_INTO: {k: list(v) for k, v in plan.fused_into.items()},
            M.FILTERED_OUT: plan.filtered_out,
            M.SUBGRAPH_TENSORS: plan.subgraph_tensors,
            M.NOT_CAPTURED: list(capture.not_captured),
            M.SEGMENTS: capture.segments}
