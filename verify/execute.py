"""`verify run`: archive + device spec + options → timings, outputs and the ground-truth check."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from verify.archive_check import check_cases
from verify.archive_reader import external_data, read_archive
from verify.capture import compile_dump_filter
from verify.check import CaseCheck, check_outputs
from verify.compare import ToleranceSet
from verify.devices import Profile
from verify import layerdump
from verify.dump import not_captured_text
from verify.dump_dir import OUTPUTS, commit_dump, discard_dump, prepare_dir
from verify.errors import UsageError
from verify.files import check_output_file, missing_dirs, save_npy_atomic, write_text_atomic
from verify.graph import parse_model, saturation_floors
from verify.inputs import model_inputs, override_input
from verify.iodump import TITLE as IO_TITLE, io_dump_cases, io_dump_text
from verify.options import (
    ArchiveSelection,
    DeviceTarget,
    DumpOptions,
    SessionSettings,
    TimedRuns,
)
from verify.layerdump import DumpCapture, DumpSpec
from verify.pipeline import (
    DeviceRun,
    ProgressFactory,
    RunOptions,
    Status,
    run_model,
)
from verify.rules import plural
from verify.session import DeviceSession
from verify.sessions import Sessions
from verify.archive_verify import LayerCheck
from verify.testcase import Testcase
from verify.tolerance import tolerance_set
from verify.tolerance_specs import unmatched_specs


@dataclass(frozen=True)
class RunRequest:
    selection: ArchiveSelection
    device: DeviceTarget = DeviceTarget()
    session: SessionSettings = SessionSettings()
    timed: TimedRuns = TimedRuns()
    dump: DumpOptions = DumpOptions()      # every layer, as a folder (dump.py) and/or text (iodump)
    input_overrides: Sequence[str] = ()
    bin_out_dump: Path | None = None
    profile_path: Path | None = None
    keep: bool = False
    control_probe: bool = False           # time the runner's control probe per iteration (ci)
    layers_judged: bool = False           # the caller also judges the archive's layers (ci)
    tol_label: str = "--tol"              # what the tolerance globs are called in a note


@dataclass(frozen=True)
class RunOutcome:
    testcase: Testcase
    run: DeviceRun
    case_indices: tuple[int, ...]
    checks: tuple[CaseCheck, ...]
    tolerances: ToleranceSet  # the rules the checks used (archive record, request's options)
    notes: tuple[str, ...] = ()
    written: Mapping[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool | None:
        """True/False when outputs were checked; None when there was no ground truth."""
        verdicts = [c.passed for c in self.checks if c.passed is not None]
        return all(verdicts) if verdicts else None


class Prepared(NamedTuple):
    """An archive opened for running: its cases chosen, tolerances layered, device resolved."""

    testcase: Testcase
    tolerances: ToleranceSet
    indices: tuple[int, ...]
    profile: Profile
    layer_check: LayerCheck  # the per-layer references, checked while the device works


def prepare(selection: ArchiveSelection, device: DeviceTarget) -> Prepared:
    """The set-up every command that runs an archive does first (bad input fails here, before
    any device time is spent). The archive's per-layer references, which these commands do not
    read, are checked in a background thread from here on: wrap the device work and the verdict
    in `with prepared.layer_check:` so a mismatch is exit 2 and no verdict."""
    tc = read_archive(selection.archive)
    check = LayerCheck(tc.path if tc.has_layers and tc.checked else None)
    try:
        check_cases(tc, parse_model(tc.model_bytes, f"{tc.path}: the archive's model",
                                    tc.external))
        tol = selection.tolerances
        tolerances = tolerance_set(tc.tolerances, tol.atol, tol.rtol, tol.specs)
        return Prepared(tc, tolerances, tc.case_indices(selection.case_index), device.profile(),
                        check)
    except BaseException:
        check.cancel()
        raise


def _overridden_inputs(tc: Testcase, overrides: Sequence[str],
                       case: int) -> dict[str, np.ndarray]:
    """The --input arrays; an image for a dynamic-size input takes `case`'s size."""
    infos = model_inputs(parse_model(tc.model_bytes, str(tc.path), tc.external))
    shapes = {k: tuple(v.shape) for k, v in tc.cases[case].inputs.items()}
    return dict(override_input(infos, spec, shapes) for spec in overrides)


def run(request: RunRequest, *, status: Status | None = None,
        progress: ProgressFactory | None = None, sessions: Sessions | None = None) -> RunOutcome:
    """`sessions`: run in the device's session kept there (`verify ci`'s jobs on one device);
    by default the run opens and closes a session of its own."""
    prepared = prepare(request.selection, request.device)
    with prepared.layer_check:  # joined before the outcome (a verdict) is returned
        return _run(request, prepared, status, progress, sessions)


def unmatched_spec_notes(specs: Sequence[str], outputs: Sequence[str], label: str = "--tol",
                     layers: Sequence[str] = ()) -> list[str]:
    """A note for each --tol whose glob names no output run judges (nor, where the caller
    judges them too, a layer): a typo ('prob:' for 'probs') otherwise left the default rule
    judging without a word."""
    names = list(dict.fromkeys(outputs))
    shown = ", ".join(names[:8]) + (" …" if len(names) > 8 else "")
    what = ("no output or layer of the archive" if layers else "no output") + f" ({shown})"
    tail = "" if layers else ", and run judges the outputs only"
    return [f"{label} {spec!r} matches {what}; the glob must match a whole name{tail}"
            for spec in unmatched_specs(specs, [*names, *layers])]


def _run(request: RunRequest, prepared: Prepared, status: Status | None,
         progress: ProgressFactory | None, sessions: Sessions | None) -> RunOutcome:
    tc, tolerances, indices, profile, _ = prepared
    overrides = (_overridden_inputs(tc, request.input_overrides, indices[0])
                 if request.input_overrides else {})
    feeds = [{**tc.cases[i].inputs, **overrides} for i in indices]
    options = RunOptions(session=request.session, timed=request.timed,
                         profile=request.profile_path is not None, keep=request.keep,
                         timeout=request.device.timeout, control_probe=request.control_probe)
    dump, out_dir = request.dump, request.bin_out_dump
    _refuse_nested(out_dir, dump.bin_io_dump)
    made_dump = missing_dirs(dump.bin_io_dump) if dump.bin_io_dump is not None else []
    made_out = missing_dirs(out_dir) if out_dir is not None else []
    dump_spec = out_staging = None
    try:
        dump_spec = _dump_spec(dump)
        if out_dir is not None:  # checked and locked before the run, like the dump's folder
            out_staging = prepare_dir(out_dir, layout=OUTPUTS)
        with external_data(tc) as external:  # extracted for the push, gone after it
            opened = (sessions.use(profile) if sessions is not None
                      else DeviceSession(profile, status=status, progress=progress,
                                         serve=dump_spec is not None))
            with opened as session:
                device_run = run_model(session, tc.model_bytes, feeds, options,
                                       profile_dest=request.profile_path, dump=dump_spec,
                                       external=external)
        # joined before anything is judged or written: corrupt references are exit 2 (and the
        # dump pulled so far goes with them)
        prepared.layer_check.result()
        written: dict[str, str] = {}
        if device_run.profile_file is not None:
            written["profile"] = str(device_run.profile_file)
        notes = []
        if overrides:
            checks = [CaseCheck(ci, None) for ci in indices]
            notes.append("inputs overridden with --input: no ground truth to check against")
        else:
            floors = output_floors(tc, device_run.dump)
            checks = [CaseCheck(ci, tuple(check_outputs(
                device_run.cases[pos].outputs, tc.cases[ci].outputs, tolerances, floors,
                profile.spec))) for pos, ci in enumerate(indices)]
            layers = ([t.name for t in tc.tensor_order]
                      if request.layers_judged and tc.has_layers else [])
            notes.extend(unmatched_spec_notes(request.selection.tolerances.own_specs(),
                                          [n for i in indices for n in tc.cases[i].outputs],
                                          request.tol_label, layers))
            notes.extend(tolerances.notes() if request.tol_label == "--tol" else  # ci
                         tolerances.notes("the suite's or testcase's atol/rtol", "a glob in "
                                          "its [*.tolerance] tensors keeps one"))
        out_index = stage_outputs(out_staging, indices, device_run) if out_staging else None
        if device_run.dump is not None:
            written.update(write_layer_dumps(dump, tc, indices, device_run, dump_spec.dest))
            notes.append(_dump_note(device_run.dump))
        if out_dir is not None and out_index is not None:  # last: all else has succeeded
            commit_dump(out_dir, out_staging, out_index, layout=OUTPUTS)
            written["bin_out_dump"] = str(out_dir)
        return RunOutcome(testcase=tc, run=device_run, case_indices=indices, checks=tuple(checks),
                          tolerances=tolerances, notes=tuple(notes), written=written)
    except BaseException:  # a failed run leaves no partial dump behind (nor a folder it made),
        if out_dir is not None:  # undone in the reverse of the order they were made ready
            discard_dump(out_dir, out_staging, made=made_out, layout=OUTPUTS)
        if dump.bin_io_dump is not None:
            discard_dump(dump.bin_io_dump, dump_spec.dest if dump_spec else None,
                         made=made_dump)
        raise


def _refuse_nested(out_dir: Path | None, dump_dir: Path | None) -> None:
    """The final outputs and the layer dump each need a folder of their own: one inside the
    other would be a foreign entry to it."""
    if out_dir is None or dump_dir is None:
        return
    a, b = os.path.realpath(out_dir), os.path.realpath(dump_dir)
    if os.path.commonpath([a, b]) in (a, b):
        raise UsageError(f"--bin-out-dump {out_dir} and --bin-io-dump {dump_dir}: the same "
                         "folder, or one inside the other; give each a folder of its own")


def output_floors(tc: Testcase, capture: DumpCapture | None = None) -> Mapping[str, float]:
    """Saturation floors for the output check: from the dump's plan when there is one (it
    parsed the model already, ~0.05 s for 100 MB), else parsed here."""
    if capture is not None:
        return capture.plan.model_floors
    return saturation_floors(parse_model(tc.model_bytes, str(tc.path), tc.external))


def _dump_note(capture: DumpCapture) -> str:
    plan = capture.plan
    note = f"layer dump: {len(plan.tensors)} tensors of the {plan.graph} graph"
    if plan.graph == "optimized":
        note += (f" ({len(plan.fused_away)} of the model's tensors fused away, "
                 f"{len(plan.optimized_only)} only in the optimized graph)")
    if plan.filtered_out:
        note += f", {plan.filtered_out} left out by --dump-filter"
    if plan.subgraph_tensors:
        note += (f"; {plural(plan.subgraph_tensors, 'tensor')} inside If/Loop/Scan bodies not "
                 "captured (onnxruntime can mark only the top-level graph's tensors)")
    if capture.not_captured:
        note += f"; {not_captured_text(capture.not_captured)}"
    if not capture.segments:  # a runner that re-runs the model per chunk (runner/native)
        return note + (f"; the whole model run once per chunk of at most "
                       f"{capture.budget_bytes / 2**20:.3g} MB of marked tensors (a runner "
                       f"without segments), captured in {capture.seconds:.2f} s")
    pieces = f"{capture.segments} segment(s)"
    # sized on the device: runner.py measures them (one profiled run), the native runner
    # runs each such node alone (docs/native-runner.md)
    measured = (f", {capture.measured} node(s) with outputs of a size the host could not "
                "derive (sized on the device)" if capture.measured else "")
    largest = capture.largest_bytes()
    over = (f" (the largest tensor, {largest / 2**20:.3g} MB, is over it: a node with larger "
            "outputs ran alone)" if largest > capture.budget_bytes else "")
    return note + (f"; each node run once, in {pieces} of at most "
                   f"{capture.budget_bytes / 2**20:.3g} MB of live tensors{over}{measured}, "
                   f"captured in {capture.seconds:.2f} s")


def _dump_spec(request: DumpOptions) -> DumpSpec | None:
    if not request.wanted:
        if request.stats_only or request.dump_filter is not None \
                or request.budget_mb is not None:
            raise UsageError("--dump-filter, --dump-budget-mb and --dump-stats-only need "
                             "--bin-io-dump DIR or --io-dump FILE")
        return None
    budget = None
    if request.budget_mb is not None:
        if not 0 < request.budget_mb < math.inf:
            raise UsageError(f"--dump-budget-mb must be a number > 0, got {request.budget_mb:g}")
        # below a byte: one tensor a segment; past int64 (a runner's integer): no limit
        budget = min(max(1, int(request.budget_mb * (1 << 20))), (1 << 63) - 1)
    compile_dump_filter(request.dump_filter)  # fail before anything runs
    if request.io_dump is not None and Path(request.io_dump).is_dir():
        raise UsageError(f"--io-dump {request.io_dump}: is a folder; give a file name "
                         "(the text dump), and --bin-io-dump DIR for a dump folder")
    if request.io_dump is not None:
        check_output_file(request.io_dump, "--io-dump")
    dest = None
    if request.bin_io_dump is not None:  # last: the staging folder it makes is ours to remove
        dest = prepare_dir(request.bin_io_dump, stage=not request.stats_only)
    # the summaries are --io-dump's text (and all a stats-only dump holds): a dump for diff
    # goes without them (on PP-OCRv4 det, a third of the capture's CPU time)
    return DumpSpec(dest=dest, budget_bytes=budget, dump_filter=request.dump_filter,
                    stats=request.io_dump is not None or request.stats_only)


def write_layer_dumps(request: DumpOptions, tc: Testcase, indices: Sequence[int],
                      device_run: DeviceRun, staging: Path | None) -> dict[str, str]:
    """The text io-dump, then the dump folder completed: the staged tensor files (`staging`)
    replace any previous dump, the manifest written last."""
    capture = device_run.dump
    assert capture is not None
    cases = layerdump.manifest_cases(capture, indices)
    written: dict[str, str] = {}
    opts = device_run.options.session
    if request.io_dump is not None:  # first: the dump's commit is the last step that can fail
        lines = [f"{IO_TITLE} {tc.path.name if tc.path else 'model'} on {device_run.spec}"
                 f" (opt-level {opts.opt_level}, {capture.plan.graph} graph)"]
        text = io_dump_text(lines, io_dump_cases(cases))
        write_text_atomic(Path(request.io_dump), text)
        written["io_dump"] = str(request.io_dump)
    if request.bin_io_dump is not None:
        commit_dump(Path(request.bin_io_dump), staging, layerdump.manifest(
            capture, cases, device=device_run.device, spec=device_run.spec,
            providers=device_run.providers, opt_level=opts.opt_level, threads=opts.threads,
            dump_filter=request.dump_filter, stats_only=request.stats_only,
            model_sha256=device_run.model_sha256))
        written["bin_io_dump"] = str(request.bin_io_dump)
    return written


def stage_outputs(staging: Path, indices: Sequence[int],
                  device_run: DeviceRun) -> dict[str, Any]:
    """Final outputs as .npy, one file per case and output (load_and_run's run0-var… files),
    written into `staging` (`prepare_dir` with `OUTPUTS`); returned: the outputs.json that
    maps them back to names, for `commit_dump` to swap them in with, as a dump's files are.

    Files are named by index (`case0-out0.npy`), never by tensor name.
    """
    index: list[dict[str, Any]] = []
    for pos, ci in enumerate(indices):
        for k, (name, value) in enumerate(device_run.cases[pos].outputs.items()):
            file = f"case{ci}-out{k}.npy"
            save_npy_atomic(staging / file, value)
            index.append({"case": ci, "output": name, "file": file,
                          "dtype": str(value.dtype), "shape": list(value.shape)})
    return {"device": device_run.device, "outputs": index}
