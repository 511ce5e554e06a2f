"""Running a job on a device: push (cached), run the runner, pull the results back.

The same path serves every transport, `local` included: a private work directory, the
content-addressed cache, a job file in, a result file out (docs/runner-contract.md).
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verify.capture import DumpPlan, plan_dump
from verify.devices import Profile
from verify.drivers import make_driver
from verify.drivers.base import Driver, Progress
from verify.dump import is_tensor_file
from verify.external import ExternalData
from verify.errors import (
    DeviceError,
    InputError,
    ModelError,
    ProfileError,
    ProviderUnavailable,
    RunnerError,
    UsageError,
)
from verify.graph import sha256_bytes
from verify.options import SessionSettings, TimedRuns
from verify.reference import requested_ort_log
from verify.runner.runner import CONTRACT, CONTRACT_VERSION

RUNNER_SOURCE = Path(__file__).resolve().parent / "runner" / "runner.py"

# A callback for the CLI: status(message) between phases, and a progress factory for transfers.
Status = Callable[[str], None]
ProgressFactory = Callable[[str, int], "Progress | None"]


@dataclass(frozen=True)
class RunOptions:
    """One job's options: the session, the timed runs, and what to bring back."""

    session: SessionSettings = SessionSettings()
    timed: TimedRuns = TimedRuns()
    provider_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    profile: bool = False
    keep: bool = False
    timeout: float | None = None
    control_probe: bool = False              # time the runner's control probe per iteration


@dataclass(frozen=True)
class CaseRun:
    warmup_ms: tuple[float, ...]
    iter_ms: tuple[float, ...]
    outputs: Mapping[str, np.ndarray]
    control_ms: tuple[float, ...] = ()   # the control probe before each iteration, when asked


@dataclass(frozen=True)
class DumpSpec:
    """A per-layer capture after the run: `dest` receives the .npy files (None: stats only)."""

    dest: Path | None = None
    budget_bytes: int | None = None
    dump_filter: str | None = None


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


@dataclass(frozen=True)
class DeviceRun:
    device: Mapping[str, Any]
    spec: str
    load_ms: float
    prepare_ms: float
    cases: tuple[CaseRun, ...]
    transfers: Mapping[str, int]
    options: RunOptions
    providers: tuple[str, ...]
    profile_file: Path | None = None
    workdir: str | None = None
    dump: DumpCapture | None = None
    peak_rss_bytes: int | None = None     # the runner's, as it reported it
    model_sha256: str = ""
    ort_log: str = ""                     # the runner's stderr, when --ort-log asked for it


def runner_argv(profile: Profile, runner_path: str | None) -> list[str]:
    """How the device starts the runner: a native runner, or Python running runner.py."""
    if profile.runner:
        return list(profile.runner)
    python = list(profile.python) or (
        [sys.executable] if profile.transport == "local" else ["python3"])
    assert runner_path is not None
    return [*python, runner_path]


def check_support_files(profile: Profile) -> None:
    """Every [[push]] file of the profile exists: checked before connecting, so nothing is sent
    for a run that cannot start (not when the profile loads: `devices list` must not fail)."""
    for item in profile.push:
        if not item.src.is_file():
            raise ProfileError(f"{profile.source or profile.name}: [[push]] src {item.src} "
                               "does not exist")


def push_support_files(driver: Driver, profile: Profile, progress: ProgressFactory | None) -> None:
    """Push the profile's extra files (libraries, binaries) through the cache, linked in place."""
    for item in profile.push:
        cached = driver.push_cached(item.src, _progress(progress, item.src.name, item.src))
        dest = item.dest if item.dest.startswith("/") else f"{driver.base_dir}/{item.dest}"
        parent = dest.rsplit("/", 1)[0] or "/"
        driver.makedirs(parent)
        argv = ["ln", "-sf", cached, dest]
        if item.src.stat().st_mode & 0o111:
            driver.run(["chmod", "755", cached], what="chmod on device")
        driver.run(argv, what=f"linking {item.dest} on device")


def _progress(factory: ProgressFactory | None, label: str, path: Path) -> Progress | None:
    return factory(label, path.stat().st_size) if factory else None


def describe_device(profile: Profile, timeout: float = 120.0) -> dict[str, Any]:
    """Connect, run the runner's --describe, and report what the device has.

    The Python runner is also asked to make a session with each of the profile's providers
    (`--probe`): onnxruntime lists a provider whose libraries it cannot load (a CUDA build
    without CUDA or cuDNN) and then silently runs on the CPU, so a listed provider proves
    nothing. Its findings are under "probe"; see `provider_problems`."""
    check_support_files(profile)
    with make_driver(profile) as driver:
        runner_path = None if profile.runner else driver.push_cached(RUNNER_SOURCE)
        push_support_files(driver, profile, None)
        probe = [] if profile.runner else ["--probe", ",".join(profile.providers)]
        argv = [*runner_argv(profile, runner_path), "--describe", *probe]
        res = driver.run(argv, timeout=timeout, check=False)
        if res.status != 0:
            raise RunnerError(f"{profile.spec}: the runner could not start "
                              f"({shlex.join(argv[:3])}… exited {res.status}): "
                              f"{_tail(res.stderr) or _tail(res.stdout) or 'no output'}")
        try:
            info = json.loads(res.stdout)
        except json.JSONDecodeError:
            raise RunnerError(f"{profile.spec}: the runner's --describe did not print JSON: "
                              f"{_tail(res.stdout)}") from None
        info["transport"] = profile.transport
        info["spec"] = profile.spec
        info["transfer_method"] = driver.transfer_method()
        info["cache"] = driver.cache_usage()
        return info


def provider_problems(profile: Profile, info: Mapping[str, Any]) -> list[str]:
    """Why each of the profile's providers cannot run on the device `info` describes: the
    runner's probe where it made one, else whether the device lists the provider at all."""
    probe = info.get("probe")
    if isinstance(probe, dict):
        return [str(probe[p]) for p in profile.providers if probe.get(p)]
    listed = info.get("providers") or []
    return [f"{p} is not available on this device (available: {', '.join(listed) or 'none'})"
            for p in profile.providers if p not in listed]


def run_on_device(profile: Profile, model_bytes: bytes, cases: Sequence[Mapping[str, np.ndarray]],
                  options: RunOptions, *, status: Status | None = None,
                  progress: ProgressFactory | None = None,
                  profile_dest: Path | None = None, dump: DumpSpec | None = None,
                  external: ExternalData | None = None) -> DeviceRun:
    """Run a model on a device for each case's inputs; return timings and outputs.
    `external`: the model's external data files, pushed through the cache too and linked
    under their locations in the work directory's `ext/` folder (the job's "external_data").

    With `dump`, every tensor is captured after the timed run (see `_run_dump`): of the model
    itself at opt-level disable, else of the optimized model onnxruntime wrote during the run,
    so the dump shows the graph that ran. The timed run's outputs come from the unmarked model.

    The model, runner and inputs go through the device's content-addressed cache, so a
    second run of the same testcase sends only the job file.
    """
    say = status or (lambda _msg: None)
    session = options.session
    providers = session.providers or profile.providers
    with tempfile.TemporaryDirectory(prefix="verify-run-") as tmp_name:
        tmp = Path(tmp_name)
        model_sha256 = sha256_bytes(model_bytes)
        input_files: list[dict[str, Path]] = []
        for ci, case in enumerate(cases):
            files = {}
            for k, (name, value) in enumerate(case.items()):
                path = tmp / f"case{ci}_in{k}.npy"
                np.save(path, np.asarray(value, order="C"), allow_pickle=False)  # keeps 0-d
                files[name] = path
            input_files.append(files)
        check_support_files(profile)
        say(f"connecting to {profile.spec}")
        with make_driver(profile) as driver:
            runner_path = None if profile.runner else driver.push_cached(
                RUNNER_SOURCE, _progress(progress, "runner", RUNNER_SOURCE))
            push_support_files(driver, profile, progress)
            remote_model = driver.push_cached(
                tmp / "model.onnx", progress("model", len(model_bytes)) if progress else None,
                model_sha256, data=model_bytes)
            job_cases = []
            for files in input_files:
                job_cases.append({"inputs": {
                    name: driver.push_cached(path, _progress(progress, f"input {name}", path))
                    for name, path in files.items()}})
            external_links = [(driver.push_cached(f.path, _progress(progress, f.location, f.path),
                                                  f.sha256 or None), f.location)
                              for f in (external.files if external else ()) if f.path]
            workdir = driver.make_workdir()
            try:
                _link_external(driver, workdir, external_links)
                job = {
                    "contract": CONTRACT, "version": CONTRACT_VERSION,
                    "model": remote_model, "cases": job_cases,
                    "providers": list(providers),
                    "provider_options": {k: dict(v) for k, v in
                                         {**profile.provider_options, **options.provider_options}.items()},
                    "opt_level": session.opt_level, "threads": session.threads,
                    "session_config": dict(session.session_config),
                    "warmup": options.timed.warmup, "iterations": options.timed.iterations,
                    "outputs_dir": "out", "result": "result.json",
                    "profile": "profile.json" if options.profile else None,
                }
                if options.control_probe:
                    job["control_probe"] = True
                if external is not None:
                    job["external_data"] = _EXTERNAL_DIR
                if requested_ort_log() is not None:
                    job["ort_log_severity"] = requested_ort_log()
                plan = None
                if dump is not None and session.opt_level != "disable":
                    job["optimized_model_path"] = _OPTIMIZED
                elif dump is not None:  # the model itself: the timed runner dumps it first
                    plan = plan_dump(model_bytes, None, dump.dump_filter, _shapes(cases),
                                     external is not None)
                    job["dump_first"] = {**_dump_entry(plan, dump), "result": _DUMP_RESULT}
                job_file = tmp / "job.json"
                job_file.write_text(json.dumps(job, indent=1))
                driver.put(job_file, f"{workdir}/job.json")
                argv = [*runner_argv(profile, runner_path), f"{workdir}/job.json"]
                say(f"running on {profile.spec}")
                res = driver.run(argv, cwd=workdir, timeout=options.timeout, check=False)
                result = _fetch_result(driver, workdir, tmp, res.status, res.stderr, profile)
                case_runs = []
                for ci, case_result in enumerate(result["cases"]):
                    outputs = {}
                    for name, rel in case_result["outputs"].items():
                        local = tmp / f"out_{ci}_{len(outputs)}.npy"
                        driver.get(f"{workdir}/{rel}", local)
                        outputs[name] = _load_npy(local, f"{profile.spec}: output {name!r}")
                    case_runs.append(CaseRun(tuple(case_result["warmup_ms"]),
                                             tuple(case_result["iter_ms"]), outputs,
                                             tuple(case_result.get("control_ms", ()))))
                profile_file = None
                if options.profile and result.get("profile"):
                    if profile_dest is None:
                        raise UsageError("a profiled run needs a file for the trace "
                                         "(profile_dest)")
                    profile_file = profile_dest  # pulled straight there, atomically
                    driver.get(f"{workdir}/{result['profile']}", profile_file,
                               move=not options.keep)
                capture = None
                if dump is not None:
                    capture = _run_dump(driver, profile, runner_argv(profile, runner_path),
                                        workdir, tmp, job, model_bytes, dump, say,
                                        options.timeout, plan, result.get("dump_result"),
                                        keep=options.keep, input_shapes=_shapes(cases))
            finally:
                if not options.keep:  # quiet while failing: a dead link must not hide why
                    driver.remove(workdir, quiet=sys.exc_info()[1] is not None)
            return DeviceRun(device=result.get("device", {}), spec=profile.spec,
                             load_ms=float(result["load_ms"]), prepare_ms=float(result["prepare_ms"]),
                             cases=tuple(case_runs), transfers=driver.stats.as_dict(),
                             options=options, providers=tuple(providers),
                             profile_file=profile_file,
                             workdir=workdir if options.keep else None, dump=capture,
                             peak_rss_bytes=result.get("peak_rss_bytes"),
                             model_sha256=model_sha256,
                             ort_log=res.stderr if requested_ort_log() is not None else "")


_OPTIMIZED = "optimized.onnx"
_EXTERNAL_DIR = "ext"


def _link_external(driver: Driver, workdir: str, links: Sequence[tuple[str, str]]) -> None:
    """Each cached external data file hard-linked (copied where the file system refuses)
    under its location in the work directory's `ext/` folder, where onnxruntime is pointed to
    find them: onnxruntime refuses a symbolic link that leads out of that folder."""
    for cached, location in links:
        dest = f"{workdir}/{_EXTERNAL_DIR}/{location}"
        driver.makedirs(dest.rsplit("/", 1)[0])
        if driver.run(["ln", "-f", cached, dest], check=False).status != 0:
            driver.run(["cp", cached, dest], what=f"copying {location} on device")
_DUMP_RESULT = "dump_result.json"


def _dump_entry(plan: DumpPlan, dump: DumpSpec) -> dict[str, Any]:
    """The job's "dump" entry: which tensors, the model's own outputs, budget, save or not."""
    if not plan.tensors:
        raise UsageError(f"--dump-filter {dump.dump_filter!r} matches no tensor or node name")
    return {"tensors": [t.name for t in plan.tensors], "outputs": list(plan.outputs),
            "budget_bytes": dump.budget_bytes, "dir": "dump", "save": dump.dest is not None,
            "sizes": dict(plan.sizes)}


def _shapes(cases: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, tuple[int, ...]]]:
    return [{k: tuple(np.shape(v)) for k, v in case.items()} for case in cases]


def _run_dump(driver: Driver, profile: Profile, argv: list[str], workdir: str, tmp: Path,
              job: Mapping[str, Any], model_bytes: bytes, dump: DumpSpec, say: Status,
              timeout: float | None, plan: DumpPlan | None = None,
              forked: str | None = None, keep: bool = False,
              input_shapes: Sequence[Mapping[str, Sequence[int]]] = ()) -> DumpCapture:
    """The dump, captured on the device in segments in a runner process of its own (bounded
    memory), then each tensor file pulled into `dump.dest`. At opt-level disable it captures
    the model itself: planned before the timed run (`plan`), and done by the timed runner in
    a child forked before its session (`forked` names that child's result file; None when
    the runner could not fork, or does not know "dump_first": then a job of its own runs it).
    Above disable, it captures the optimized model onnxruntime wrote during the timed run,
    with optimization off, so the dump shows the graph that ran."""
    if plan is not None and forked:
        result = _fetch_result(driver, workdir, tmp, 0, "", profile, name=_DUMP_RESULT)
        return _pull_dump(driver, profile, workdir, dump, plan, result, keep)
    job = {k: v for k, v in job.items() if k != "dump_first"}
    model_ref, optimized = job["model"], None
    if "optimized_model_path" in job:
        local = tmp / _OPTIMIZED
        if not driver.exists(f"{workdir}/{_OPTIMIZED}"):
            raise RunnerError(f"{profile.spec}: the device's runner wrote no optimized model "
                              "(optimized_model_path), so the graph that ran cannot be dumped; "
                              "use verify's own runner.py, or --opt-level disable")
        driver.get(f"{workdir}/{_OPTIMIZED}", local)
        model_ref, optimized = _OPTIMIZED, local.read_bytes()
        if job.get("external_data"):  # its weights went beside it (the runner's .data file)
            job = {**job, "external_data": "."}
    plan = plan or plan_dump(model_bytes, optimized, dump.dump_filter, input_shapes,
                             "external_data" in job)
    dump_job = {**job, "model": model_ref, "warmup": 0, "iterations": 1, "profile": None,
                "optimized_model_path": None, "result": _DUMP_RESULT,
                "dump": _dump_entry(plan, dump)}
    job_file = tmp / "dump_job.json"
    job_file.write_text(json.dumps(dump_job, indent=1))
    driver.put(job_file, f"{workdir}/dump_job.json")
    say(f"dumping {len(plan.tensors)} tensors ({plan.graph} graph) on {profile.spec}")
    res = driver.run([*argv, f"{workdir}/dump_job.json"], cwd=workdir, timeout=timeout,
                     check=False)
    result = _fetch_result(driver, workdir, tmp, res.status, res.stderr, profile,
                           name=_DUMP_RESULT)
    return _pull_dump(driver, profile, workdir, dump, plan, result, keep)


def _pull_dump(driver: Driver, profile: Profile, workdir: str, dump: DumpSpec, plan: DumpPlan,
               result: Mapping[str, Any], keep: bool) -> DumpCapture:
    """The dump runner's records, each tensor file pulled into `dump.dest` (moved, not
    copied, where the transport can and the work directory is not kept)."""
    info = result.get("dump")
    if not isinstance(info, dict) or not isinstance(info.get("cases"), list):
        raise RunnerError(f"{profile.spec}: the device's runner does not capture layers (its "
                          "result has no 'dump'); use verify's own runner.py for dumps")
    records = []
    for case_records in info.get("cases", []):
        kept = []
        for rec in case_records:
            if rec is None:
                continue
            rec = dict(rec)
            if rec.get("file") and dump.dest is not None:
                name = str(rec["file"]).rsplit("/", 1)[-1]
                if not is_tensor_file(name):  # the device names it: never a path of its choice
                    raise RunnerError(f"{profile.spec}: the runner named a dump file "
                                      f"{rec['file']!r}, not c<case>_t<index>.npy")
                driver.get(f"{workdir}/{rec['file']}", dump.dest / name,  # atomic by itself
                           move=not keep)
                rec["file"] = name
            kept.append(rec)
        records.append(tuple(kept))
    segments = info.get("segments")
    return DumpCapture(plan, int(info.get("budget_bytes", 0)), tuple(records),
                       float(info.get("ms", 0.0)) / 1000.0, result.get("peak_rss_bytes"),
                       segments=len(segments) if isinstance(segments, list) else 0,
                       measured=int(info.get("measured") or 0))


def _fetch_result(driver: Driver, workdir: str, tmp: Path, status: int, stderr: str,
                  profile: Profile, name: str = "result.json") -> dict[str, Any]:
    local = tmp / name
    try:
        driver.get(f"{workdir}/{name}", local)
    except DeviceError:
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        raise RunnerError(f"{profile.spec}: the runner {how} without writing a result: "
                          f"{_tail(stderr) or 'no output'}") from None
    try:
        result = json.loads(local.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RunnerError(f"{profile.spec}: the runner wrote an unreadable result file") from None
    if result.get("status") != "ok":
        err = result.get("error") or {}
        kind, message = err.get("kind", "runtime"), err.get("message", "unknown error")
        where = f"{profile.spec}"
        if kind == "model":
            raise ModelError(f"{where}: {message}")
        if kind == "input":
            raise InputError(f"{where}: {message}")
        if kind == "provider":
            raise ProviderUnavailable(f"{where}: {message}")
        raise RunnerError(f"{where}: the runner failed: {message}")
    return result


def _load_npy(path: Path, what: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise RunnerError(f"{what}: unreadable .npy from the device: {exc}") from None


def _tail(text: str, n: int = 1) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])
