"""Running a model on a device: one job through a `DeviceSession`, its results pulled back.

The same path serves every transport, `local` included: a private work directory, the
content-addressed cache, a job file in, a result file out (docs/runner-contract.md).
`run_on_device` opens a session for one job (`verify run`); bench and localize open one
session per command and call `run_model` for each of their jobs.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verify.devices import Profile
from verify.errors import RunnerError, UsageError
from verify.external import ExternalData
from verify.files import NPY_READ_ERRORS, npy_reason
from verify.graph import sha256_bytes
from verify.reference import requested_ort_log
from verify.layerdump import DumpCapture, DumpSpec, capture, prepare_job
from verify.options import SessionSettings, TimedRuns
from verify.runner import contract as C
from verify.runner.contract import CaseResult, Describe, Job, Result
from verify.session import (  # noqa: F401 (RUNNER_SOURCE and the helpers: conformance's too)
    RUNNER_SOURCE,
    DeviceSession,
    ProgressFactory,
    Status,
    check_support_files,
    push_support_files,
    runner_argv,
    tail,
)



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


def describe_device(profile: Profile, timeout: float = 120.0) -> dict[str, Any]:
    """Connect, run the runner's --describe, and report what the device has.

    The Python runner is also asked to make a session with each of the profile's providers
    (`--probe`): onnxruntime lists a provider whose libraries it cannot load (a CUDA build
    without CUDA or cuDNN) and then silently runs on the CPU, so a listed provider proves
    nothing. Its findings are under "probe"; see `provider_problems`."""
    with DeviceSession(profile) as session:
        probe = [] if profile.runner else ["--probe", ",".join(profile.providers)]
        argv = [*session.argv, "--describe", *probe]
        session.runner_starts += 1
        # run where jobs run: the free disk it reports (of its working folder) is then the
        # device's work folder's, not the CLI's folder's (local) or / (adb)
        session.dev.makedirs(session.dev.jobs_dir)
        res = session.dev.run(argv, timeout=timeout, check=False, cwd=session.dev.jobs_dir)
        if res.status != 0:
            raise RunnerError(f"{profile.spec}: the runner could not start "
                              f"({shlex.join(argv[:3])}… exited {res.status}): "
                              f"{tail(res.stderr) or tail(res.stdout) or 'no output'}")
        try:
            info = json.loads(res.stdout)
        except json.JSONDecodeError:
            raise RunnerError(f"{profile.spec}: the runner's --describe did not print JSON: "
                              f"{tail(res.stdout)}") from None
        info["transport"] = profile.transport
        info["spec"] = profile.spec
        info["transfer_method"] = session.dev.transfer_method()
        info["cache"] = session.dev.cache_usage()
        return info


def provider_problems(profile: Profile, info: Mapping[str, Any]) -> list[str]:
    """Why each of the profile's providers cannot run on the device `info` describes: the
    runner's probe where it made one, else whether the device lists the provider at all."""
    probe = info.get(Describe.PROBE)
    if isinstance(probe, dict):
        return [str(probe[p]) for p in profile.providers if probe.get(p)]
    listed = info.get(Describe.PROVIDERS) or []
    return [f"{p} is not available on this device (available: {', '.join(listed) or 'none'})"
            for p in profile.providers if p not in listed]


def run_on_device(profile: Profile, model_bytes: bytes, cases: Sequence[Mapping[str, np.ndarray]],
                  options: RunOptions, *, status: Status | None = None,
                  progress: ProgressFactory | None = None,
                  profile_dest: Path | None = None, dump: DumpSpec | None = None,
                  external: ExternalData | None = None) -> DeviceRun:
    """`run_model` in a device session of its own (one job: `verify run`)."""
    with DeviceSession(profile, status=status, progress=progress) as session:
        return run_model(session, model_bytes, cases, options, profile_dest=profile_dest,
                         dump=dump, external=external)


def run_model(session: DeviceSession, model_bytes: bytes,
              cases: Sequence[Mapping[str, np.ndarray]], options: RunOptions, *,
              profile_dest: Path | None = None, dump: DumpSpec | None = None,
              external: ExternalData | None = None) -> DeviceRun:
    """Run a model on the session's device for each case's inputs; return timings and outputs.
    `external`: the model's external data files, pushed through the cache too and linked
    under their locations in the work directory's `ext/` folder (the job's "external_data").

    With `dump`, every tensor is captured after the timed run (layerdump.py): of the model
    itself at opt-level disable, else of the optimized model onnxruntime wrote during the run,
    so the dump shows the graph that ran. The timed run's outputs come from the unmarked model.

    The model, runner and inputs go through the device's content-addressed cache, so a
    second run of the same testcase sends only the job file.
    """
    if options.profile and profile_dest is None:
        raise UsageError("a profiled run needs a file for the trace (profile_dest)")
    profile = session.profile
    providers = options.session.providers or profile.providers
    model_sha256 = sha256_bytes(model_bytes)
    remote_model = session.push_bytes(model_bytes, ".onnx", "model")
    job_cases = [C.job_case({name: session.push_array(value, f"input {name}")
                             for name, value in case.items()}) for case in cases]
    external_links = [(session.push_file(f.path, f.location, f.sha256 or None), f.location)
                      for f in (external.files if external else ()) if f.path]
    workdir = session.workdir()
    try:
        _link_external(session, workdir, external_links)
        job = _job(profile, options, providers, remote_model, job_cases)
        if external is not None:
            job[Job.EXTERNAL_DATA] = EXTERNAL_DIR
        plan = prepare_job(job, dump, options.session.opt_level, model_bytes, cases) \
            if dump is not None else None
        session.say(f"running on {profile.spec}")
        result = session.job(job, workdir, timeout=options.timeout)
        case_runs = [_case_run(session, workdir, ci, case_result)
                     for ci, case_result in enumerate(result[Result.CASES])]
        profile_file = None
        if options.profile and result.get(Result.PROFILE):
            assert profile_dest is not None
            profile_file = profile_dest  # pulled straight there, atomically
            session.pull(f"{workdir}/{result[Result.PROFILE]}", profile_file,
                         move=not options.keep)
        dumped = None
        if dump is not None:
            dumped = capture(session, workdir, job, result, model_bytes, dump, plan,
                             options.timeout, options.keep, cases)
    finally:
        if not options.keep:  # quiet while failing: a dead link must not hide why
            session.remove(workdir, quiet=sys.exc_info()[1] is not None)
    return DeviceRun(device=result.get(Result.DEVICE, {}), spec=profile.spec,
                     load_ms=float(result[Result.LOAD_MS]),
                     prepare_ms=float(result[Result.PREPARE_MS]),
                     cases=tuple(case_runs),
                     transfers=session.stats,  # the session's so far
                     options=options, providers=tuple(providers), profile_file=profile_file,
                     workdir=workdir if options.keep else None, dump=dumped,
                     peak_rss_bytes=result.get(Result.PEAK_RSS_BYTES), model_sha256=model_sha256,
                     ort_log=session.last_stderr if requested_ort_log() is not None else "")


EXTERNAL_DIR = "ext"


def _link_external(session: DeviceSession, workdir: str,
                   links: Sequence[tuple[str, str]]) -> None:
    """Each cached external data file hard-linked (copied where the file system refuses)
    under its location in the work directory's `ext/` folder, where onnxruntime is pointed to
    find them: onnxruntime refuses a symbolic link that leads out of that folder."""
    driver = session.dev
    for cached, location in links:
        dest = f"{workdir}/{EXTERNAL_DIR}/{location}"
        driver.makedirs(dest.rsplit("/", 1)[0])
        if driver.run(["ln", "-f", cached, dest], check=False).status != 0:
            driver.run(["cp", cached, dest], what=f"copying {location} on device")


def _job(profile: Profile, options: RunOptions, providers: Sequence[str], model: str,
         cases: list[dict[str, Any]]) -> dict[str, Any]:
    job = C.new_job(model, cases, {
        Job.PROVIDERS: list(providers),
        Job.PROVIDER_OPTIONS: {k: dict(v) for k, v in
                               {**profile.provider_options, **options.provider_options}.items()},
        Job.OPT_LEVEL: options.session.opt_level, Job.THREADS: options.session.threads,
        Job.SESSION_CONFIG: dict(options.session.session_config),
        Job.WARMUP: options.timed.warmup, Job.ITERATIONS: options.timed.iterations,
        Job.PROFILE: "profile.json" if options.profile else None,
        Job.CONTROL_PROBE: options.control_probe,
    })
    if requested_ort_log() is not None:
        job[Job.ORT_LOG_SEVERITY] = requested_ort_log()
    return job


def _case_run(session: DeviceSession, workdir: str, ci: int,
              case_result: Mapping[str, Any]) -> CaseRun:
    outputs = {}
    for name, rel in case_result[CaseResult.OUTPUTS].items():
        local = session.tmp / f"out_{ci}_{len(outputs)}.npy"
        session.pull(f"{workdir}/{rel}", local)
        outputs[name] = _load_npy(local, f"{session.spec}: output {name!r}")
    return CaseRun(tuple(case_result[CaseResult.WARMUP_MS]),
                   tuple(case_result[CaseResult.ITER_MS]), outputs,
                   tuple(CaseResult.CONTROL_MS.of(case_result)))


def _load_npy(path: Path, what: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except NPY_READ_ERRORS as exc:
        raise RunnerError(f"{what}: unreadable .npy from the device: {npy_reason(exc)}") from None
