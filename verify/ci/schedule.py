"""Running a suite's jobs: devices in parallel, one job at a time per device, each device's
jobs in one device session (one connection, the runner pushed once) while they succeed.

A job that fails on the transport (ConnectError, TransferError, DeviceTimeout) is retried; a
mismatch never is (it is a result, not an error). A device still unreachable after the retries
marks its remaining jobs as errors without trying them; every other device goes on.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from verify import execute
from verify.ci import baseline as baselines
from verify.ci import gates, layers, machine
from verify.ci.jobs import Job
from verify.ci.results import (
    ERROR,
    FAIL,
    FAILED,
    NO_BASELINE,
    PASSED,
    RECORDED,
    UPDATED,
    GateResult,
    JobResult,
    Latency,
    TensorError,
)
from verify.errors import (
    ConnectError,
    DeviceError,
    DeviceTimeout,
    OutputError,
    TransferError,
    UsageError,
    VerifyError,
)
from verify.options import TimedRuns
from verify.sessions import Sessions

if TYPE_CHECKING:
    from verify.ci.staging import StagedBaselines

RETRYABLE = (ConnectError, TransferError, DeviceTimeout)
RETRY_PAUSE_S = 1.0
T = TypeVar("T")


@dataclass(frozen=True)
class CiRun:
    """How to run: where baselines live, and whether to rewrite them; `staged`: where this
    run's baselines wait until it has finished (None: written in place at once)."""

    suite_name: str
    baselines: Path
    update_goldens: bool = False
    require_baselines: bool = False
    staged: StagedBaselines | None = None

    def write(self, path: Path, doc: Any) -> None:
        (self.staged.write if self.staged is not None else baselines.write)(path, doc)


class _Attempts:
    def __init__(self) -> None:
        self.count = 0


def _retrying(fn: Callable[[], T], retries: int, attempts: _Attempts) -> T:
    while True:
        attempts.count += 1
        try:
            return fn()
        except RETRYABLE:
            if attempts.count > retries:
                raise
            time.sleep(RETRY_PAUSE_S * attempts.count)


HUNG_AFTER = 2  # jobs in a row whose last attempt timed out: the device is out of the run


def run_jobs(jobs: Sequence[Job], ci: CiRun,
             on_result: Callable[[JobResult], None] | None = None) -> list[JobResult]:
    """Run every job; results come back in the order of `jobs`."""
    lanes: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        lanes.setdefault(job.device.lane, []).append(i)
    results: list[JobResult | None] = [None] * len(jobs)
    lock = threading.Lock()
    stop = threading.Event()   # set on Ctrl-C or SIGTERM: no job records or starts after it
    workers: set[int] = set()  # the threads running a lane now

    def device_worker(indices: list[int]) -> None:
        with lock:
            workers.add(threading.get_ident())
        try:
            with _closing(Sessions()) as sessions:
                lane(indices, sessions)
        finally:
            with lock:
                workers.discard(threading.get_ident())

    def lane(indices: list[int], sessions: Sessions) -> None:
        down: dict[str, str] = {}    # device name -> why it is out of this run
        hung: dict[str, int] = {}    # device name -> jobs in a row that timed out
        for i in indices:
            if stop.is_set():
                return
            job = jobs[i]
            if job.device.name in down:
                result = JobResult(job, ERROR, error=f"not run: {down[job.device.name]}",
                                   error_kind="device")
            else:
                result = run_job(job, ci, sessions)
                if stop.is_set():  # finished as the run was stopped: neither shown nor kept
                    return
                if result.unreachable:
                    down[job.device.name] = (f"device {job.device.name} was unreachable "
                                             f"earlier in this run ({result.error})")
                # a board that hangs costs every job of it (retries + 1) x its timeout: after
                # HUNG_AFTER jobs in a row timed out, it is out of the run as if unreachable
                hung[job.device.name] = hung.get(job.device.name, 0) + 1 \
                    if result.timed_out else 0
                if hung[job.device.name] >= HUNG_AFTER:
                    down[job.device.name] = (f"device {job.device.name} timed out in "
                                             f"{HUNG_AFTER} jobs in a row earlier in this run "
                                             f"(the last: {result.job.id}: {result.error})")
            results[i] = result
            if on_result is not None:
                with lock:
                    on_result(result)

    pool = ThreadPoolExecutor(max_workers=max(1, len(lanes)), thread_name_prefix="verify-ci")
    try:
        for fut in [pool.submit(device_worker, idx) for idx in lanes.values()]:
            fut.result()
    except BaseException as exc:
        stop.set()
        # the jobs running are stopped too, as a command's own job is on Ctrl-C: the same
        # interruption raised in each lane's thread unwinds it (its device command killed,
        # its work folder removed; the transports wait in slices, so it lands within ~0.25 s)
        # instead of a job of up to its timeout finishing, and writing its baselines, after
        # "terminated"
        with lock:
            for ident in workers:
                _interrupt(ident, type(exc) if isinstance(exc, KeyboardInterrupt)
                           else KeyboardInterrupt)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [r for r in results if r is not None]


def _interrupt(ident: int, exc_type: type[BaseException]) -> None:
    """Raise `exc_type` in the thread `ident` at its next Python instruction (CPython's
    PyThreadState_SetAsyncExc; elsewhere nothing: the job then finishes, as it used to)."""
    try:
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                   ctypes.py_object(exc_type))
    except (ImportError, AttributeError):
        pass


@contextmanager
def _closing(sessions: Sessions) -> Iterator[Sessions]:
    try:
        yield sessions
    finally:
        try:
            sessions.close()
        except VerifyError:  # a link lost after the last job: its results stand
            pass


def run_job(job: Job, ci: CiRun, sessions: Sessions | None = None) -> JobResult:
    """Run one job and judge it; errors become an `error` result, never an exception.
    `sessions`: the worker's open device sessions (None: the job opens its own)."""
    started = time.monotonic()
    attempts = _Attempts()
    try:
        result = _run_and_judge(job, ci, attempts, sessions)
    except VerifyError as exc:
        kind = ("device" if isinstance(exc, DeviceError) else
                "input" if isinstance(exc, UsageError) else "internal")
        result = JobResult(job, ERROR, error=str(exc), error_kind=kind,
                           error_type=type(exc).__name__,
                           unreachable=isinstance(exc, ConnectError),
                           timed_out=isinstance(exc, DeviceTimeout))
    except Exception as exc:  # a bug must not take the other jobs down; keep its trace
        result = JobResult(job, ERROR, error=f"{type(exc).__name__}: {exc}",
                           error_kind="internal", error_type=type(exc).__name__,
                           notes=(traceback.format_exc(),))
    return replace(result, attempts=attempts.count, seconds=time.monotonic() - started)


def _request(job: Job, **extra: Any) -> execute.RunRequest:
    """The job as a run; `extra` sets the request's other fields (timed, dump, control_probe)."""
    return execute.RunRequest(**{"selection": job.selection, "device": job.target,
                                 "session": job.options.session, "timed": job.timed,
                                 "layers_judged": job.layers and bool(
                                     {"accuracy", "regression"} & set(job.gates)),
                                 "tol_label": "the testcase's tolerance", **extra})


def _outputs(outcome: execute.RunOutcome) -> tuple[TensorError, ...]:
    ops = {t.name: t.op for t in outcome.testcase.tensor_order}
    rows = []
    for check in outcome.checks:
        for k, diff in enumerate(check.diffs or ()):
            rows.append(TensorError.from_diff(check.index, k, diff, ops.get(diff.name, "")))
    return tuple(rows)


def _run_and_judge(job: Job, ci: CiRun, attempts: _Attempts,
                   sessions: Sessions | None) -> JobResult:
    # The baseline first: a bad one fails before any device time is spent, and one that
    # --update-goldens is about to replace need not be readable at all.
    path = baselines.baseline_path(ci.baselines, ci.suite_name, job)
    shown = _shown(path)
    replaced: list[str] = []
    try:
        base = baselines.load(path)
    except UsageError as exc:
        if not ci.update_goldens:
            raise
        base = None
        replaced.append(f"replacing an unreadable baseline: {exc}")
    probe = "latency" in job.gates and job.settings.latency_control == "probe"
    outcome = _retrying(lambda: execute.run(_request(job, control_probe=probe),
                                            sessions=sessions), job.retries, attempts)
    outputs = _outputs(outcome)
    latency = Latency(tuple(ms for case in outcome.run.cases for ms in case.iter_ms),
                      tuple(ms for case in outcome.run.cases for ms in case.control_ms))
    fingerprint = machine.fingerprint(outcome.run.device)
    lat_path = baselines.latency_path(ci.baselines, ci.suite_name, fingerprint, job)
    lat_shown = _shown(lat_path)
    try:
        base_latency = baselines.load_latency(lat_path)
    except UsageError as exc:
        if not ci.update_goldens:
            raise
        base_latency = None
        replaced.append(f"replacing an unreadable latency baseline: {exc}")
    layer_rows: tuple[TensorError, ...] = ()
    second: execute.RunOutcome | None = None  # another run of the job, when one was made
    notes: list[str] = [*outcome.notes, *replaced]
    if job.layers and ("accuracy" in job.gates or "regression" in job.gates):
        if not outcome.testcase.has_layers:
            notes.append(f"{job.archive.name} has no per-layer references (pack it with "
                         "--layers): outputs only")
        else:
            layer_rows, second = _retrying(
                lambda: layers.run_with_dump(job, _request, sessions), job.retries, _Attempts())
    sha = outcome.run.model_sha256  # of the bytes that ran, hashed once by the pipeline
    stale = base is not None and base.model_sha256 not in ("", sha)
    if stale and not ci.update_goldens:
        notes.append(f"the baseline was recorded for another model (sha256 "
                     f"{base.model_sha256[:12]}…, now {sha[:12]}…); refresh it with "
                     "--update-goldens if the change is intended")
    # hashed only where a baseline recorded one to compare with, or one is written
    cases = (baselines.cases_sha256(outcome.testcase)
             if ci.update_goldens or (base is not None and base.cases_sha256) else "")
    if (base is not None and not stale and base.cases_sha256 not in ("", cases)
            and not ci.update_goldens):
        notes.append(f"the baseline was recorded for other inputs or ground truth (cases "
                     f"sha256 {base.cases_sha256[:12]}…, now {cases[:12]}…): its errors are "
                     "another experiment's; refresh it with --update-goldens if the change "
                     "is intended")
    if base is not None and not ci.update_goldens:
        notes += _setting_notes(base, job)
    verdicts: list[GateResult] = []
    if "accuracy" in job.gates:
        verdicts.append(gates.accuracy(outputs, layer_rows))
    if "determinism" in job.gates:
        again = second or _retrying(lambda: execute.run(_request(job, timed=TimedRuns(1, 0)),
                                                        sessions=sessions),
                                    job.retries, _Attempts())
        verdicts.append(gates.determinism([c.outputs for c in outcome.run.cases],
                                          [c.outputs for c in again.run.cases]))
    result = JobResult(job, PASSED, outputs=outputs, layers=layer_rows, latency=latency,
                       baseline_latency=base_latency,
                       baseline_errors={**base.outputs, **base.layers} if base else {},
                       device=dict(outcome.run.device), machine=fingerprint)
    gate_failed = any(g.status == FAIL for g in verdicts)
    if ci.update_goldens:
        if gate_failed:
            kept = f"{shown} left as it was" if path.exists() else f"no {shown} was written"
            notes.append(f"baseline not written: a gate failed ({kept})")
        else:
            ci.write(path, baselines.document(result, ci.suite_name, sha, cases))
            if "regression" in job.gates:
                verdicts.append(GateResult("regression", UPDATED, f"baseline written to {shown}"))
            if "latency" in job.gates:
                _write_latency(result, ci, lat_path, sha)
                verdicts.append(GateResult("latency", UPDATED, f"latency baseline of machine "
                                           f"{fingerprint} written to {lat_shown}",
                                           {"machine": fingerprint}))
    else:
        if "regression" in job.gates:
            verdicts.append(gates.regression(outputs, layer_rows, base.outputs if base else None,
                                             base.layers if base else {}, job.settings, shown))
        if "latency" in job.gates:
            # the first run on this machine records its latency, where the suite keeps
            # baselines at all (a suite without any is reported, never given a tree silently)
            # (not after any gate failed, the regression gate just above included)
            gate_failed = any(g.status == FAIL for g in verdicts)
            if base_latency is None and not gate_failed and latency.samples_ms \
                    and (ci.baselines / ci.suite_name).is_dir():
                try:
                    _write_latency(result, ci, lat_path, sha)
                    recorded = True
                except (OSError, OutputError) as exc:  # writes raise OutputError
                    recorded = False
                    why = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
                    notes.append(f"could not record the latency baseline at {lat_shown}: {why}")
                verdicts.append(gates.no_latency_baseline(fingerprint, lat_shown, recorded))
            else:
                verdicts.append(gates.latency(latency, base_latency, job.settings, job.id,
                                              lat_shown, fingerprint))
    lat = next((g for g in verdicts if g.gate == "latency" and g.status == FAIL), None)
    if lat is not None and lat.details.get("control") == "probe" \
            and job.options.session.threads != 1:
        n = job.options.session.threads
        ran = f"{n} intra-op threads" if n else "an intra-op thread per core (threads = 0)"
        notes.append(f"the session ran {ran}: the control probe is single-threaded and cannot "
                     "see other work taking their cores, so on a shared machine gate latency "
                     "with threads = 1 (docs/suite.md)")
    failed = any(g.status == FAIL or (ci.require_baselines and g.status in (NO_BASELINE,
                                                                           RECORDED))
                 for g in verdicts)
    return replace(result, status=FAILED if failed else PASSED, gates=tuple(verdicts),
                   notes=tuple(notes))


def _write_latency(result: JobResult, ci: CiRun, path: Path, sha: str) -> None:
    facts = machine.facts(result.device)
    ci.write(path, baselines.latency_document(result, ci.suite_name, facts, sha))


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _setting_notes(base: baselines.Baseline, job: Job) -> list[str]:
    """Where the job's baseline was recorded on another device spec or with other session
    options than the job now has: its errors are another setting's (a device profile swapped
    under the same name compared against the old one's figures without a word)."""
    notes = []

    def same_spec(a: str, b: str) -> bool:  # a profile file's path depends on where ci ran
        if a.lower().endswith(".toml") and b.lower().endswith(".toml"):
            return Path(a).name == Path(b).name
        return a == b

    if base.device_spec and not same_spec(base.device_spec, job.device.spec):
        notes.append(f"the baseline was recorded on device spec {base.device_spec!r}, now "
                     f"{job.device.spec!r}: its errors are another device's; refresh it with "
                     "--update-goldens if the change is intended")
    now = job.options.to_dict()
    if base.options is not None:
        changed = [f"{k} {base.options[k]!r}, now {v!r}" for k, v in now.items()
                   if k in base.options and base.options[k] != v]
        if changed:
            notes.append(f"the baseline was recorded with other options ({'; '.join(changed)}); "
                         "refresh it with --update-goldens if the change is intended")
    return notes
