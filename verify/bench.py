"""`verify bench`: one archive on one device under several settings — latency and correctness.

The ONNX Runtime counterpart of trying load_and_run's optimization switches (nchw44,
fast-run, winograd) and checking each one's speed and output: each setting is one job through
`pipeline.run_model`, all in one device session (one connection, the model and inputs pushed
once, and one runner process serving every job where the runner offers it),
timed like `verify run`, its outputs checked against the archive's ground truth with the
archive's tolerances. With `repeat` > 1 the settings run in interleaved rounds (A B C A B C …)
so a drift of the machine's speed hits every setting alike.

A setting is `KEY=VALUE` pairs joined by commas:
  opt=disable|basic|extended|layout|all
                                     graph optimization level
  threads=N                          intra-op threads (0: onnxruntime's default)
  provider=NAME[+NAME…]              execution providers in order (cpu, cuda, … or full names)
  layout=auto|nchw                   auto: onnxruntime's layout transforms (NCHWc blocked
                                     convolutions on x86 at opt=layout and all, NHWC where a
                                     provider prefers it); nchw: both transformers disabled
  spin=0|1                           intra-op threads spin while waiting (allow_spinning)
  prepack=0|1                        kernels may pre-pack weights (0: session.disable_prepacking)
  any.dotted.key=VALUE               a raw onnxruntime session config entry
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verify.archive_reader import external_data
from verify.check import check_outputs
from verify.compare import TensorDiff, tol_rank
from verify.timing import Timing  # noqa: F401 (part of bench's results)
from verify.errors import UsageError
from verify.execute import Prepared, output_floors, prepare
from verify.external import ExternalData
from verify.ort_keys import typo_of, unknown
from verify.options import (
    OPT_LEVELS,
    ArchiveSelection,
    DeviceTarget,
    SessionSettings,
    TimedRuns,
)
from verify.pipeline import ProgressFactory, RunOptions, Status, run_model
from verify.session import DeviceSession

# onnxruntime splits this entry's value on ';' (a ',' list silently disables nothing)
DISABLE_OPTIMIZERS = "optimization.disable_specified_optimizers"
LAYOUT_TRANSFORMERS = "NchwcTransformer;NhwcTransformer"
SPINNING = "session.intra_op.allow_spinning"
DISABLE_PREPACKING = "session.disable_prepacking"
LAYOUTS = ("auto", "nchw")
PROVIDER_NAMES = {
    "cpu": "CPU", "cuda": "CUDA", "tensorrt": "Tensorrt", "rocm": "ROCM", "openvino": "OpenVINO",
    "dml": "Dml", "coreml": "CoreML", "nnapi": "Nnapi", "qnn": "QNN", "xnnpack": "Xnnpack",
    "acl": "ACL", "armnn": "ArmNN", "webgpu": "WebGpu",
}
NOISY_CV = 0.10  # sd above this fraction of the mean earns a note


@dataclass(frozen=True)
class Setting(SessionSettings):
    """One way to run the model: session settings and a layout; `label` is how tables and
    JSON name it."""

    layout: str = "auto"

    @property
    def label(self) -> str:
        parts = [f"opt={self.opt_level}"]
        if self.threads:
            parts.append(f"threads={self.threads}")
        if self.providers:
            parts.append("provider=" + "+".join(p.removesuffix("ExecutionProvider")
                                                 for p in self.providers))
        if self.layout != "auto":
            parts.append(f"layout={self.layout}")
        parts += [f"{k}={v}" for k, v in self.session_config]
        return ",".join(parts)

    def config(self) -> dict[str, str]:
        cfg = dict(self.session_config)
        if self.layout == "nchw":
            cfg[DISABLE_OPTIMIZERS] = ";".join(
                x for x in (cfg.get(DISABLE_OPTIMIZERS), LAYOUT_TRANSFORMERS) if x)
        return cfg

    def session(self) -> SessionSettings:
        """The settings a job runs with: the layout folded into the session config."""
        return SessionSettings(self.opt_level, self.threads, self.providers,
                               tuple(self.config().items()))

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "opt_level": self.opt_level, "threads": self.threads,
                "providers": list(self.providers), "layout": self.layout,
                "session_config": self.config()}


def provider_name(text: str) -> str:
    """'cuda' -> 'CUDAExecutionProvider'; full names pass through."""
    text = text.strip()
    if text.endswith("ExecutionProvider"):
        return text
    short = PROVIDER_NAMES.get(text.lower())
    if short is None:
        raise UsageError(f"unknown provider {text!r}: give a full name such as "
                         f"CPUExecutionProvider or one of {', '.join(PROVIDER_NAMES)}")
    return short + "ExecutionProvider"


def parse_setting(text: str, origin: str | None = None) -> Setting:
    """A Setting from 'opt=all,threads=1,layout=nchw' (see the module docstring).

    `origin` names what the user typed, for error messages (default: `--setting 'TEXT'`)."""
    label = origin or f"--setting {text!r}"
    fields: dict[str, Any] = {}
    config: list[tuple[str, str]] = []
    for item in (p.strip() for p in text.split(",")):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise UsageError(f"{label}: expected KEY=VALUE pairs joined by commas, "
                             f"got {item!r}")
        if key == "opt":
            fields["opt_level"] = _choice(value, OPT_LEVELS, "opt", label)
        elif key == "threads":
            fields["threads"] = _count(value, "threads", label)
        elif key == "provider":
            fields["providers"] = tuple(provider_name(p) for p in value.split("+"))
        elif key == "layout":
            fields["layout"] = _choice(value, LAYOUTS, "layout", label)
        elif key == "spin":
            config.append((SPINNING, _choice(value, ("0", "1"), "spin", label)))
        elif key == "prepack":
            flag = _choice(value, ("0", "1"), "prepack", label)
            config.append((DISABLE_PREPACKING, "1" if flag == "0" else "0"))
        elif "." in key:
            meant = typo_of(key)
            if meant is not None:  # onnxruntime would ignore it: the row would time the default
                raise UsageError(f"{label}: {key!r} is not an onnxruntime session config key; "
                                 f"did you mean {meant!r}?")
            config.append((key, value))
        else:
            raise UsageError(f"{label}: unknown key {key!r}; valid: opt, threads, "
                             "provider, layout, spin, prepack, or a dotted onnxruntime session "
                             "config key")
    return Setting(**fields, session_config=tuple(config))


def _choice(value: str, valid: Sequence[str], key: str, label: str) -> str:
    if value not in valid:
        raise UsageError(f"{label}: {key} must be one of {', '.join(valid)}, "
                         f"got {value!r}")
    return value


def _count(value: str, key: str, label: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise UsageError(f"{label}: {key} must be a whole number >= 0, got {value!r}")
    return n


DEFAULT_OPT_LEVELS = ("disable", "basic", "extended", "all")  # layout on request: ORT >= 1.21


def settings_from(opt_levels: str | None, threads: str | None, providers: str | None,
                  layouts: str | None, explicit: Sequence[str] = ()) -> list[Setting]:
    """The cartesian grid of the comma-separated list options, then each explicit setting.

    With nothing given, the grid is every opt level. Every word goes through `parse_setting`,
    so the lists validate like --setting does, and errors name the option the user typed."""
    lists = {"--opt-levels": (opt_levels, "opt"), "--threads": (threads, "threads"),
             "--providers": (providers, "provider"), "--layouts": (layouts, "layout")}
    settings: list[Setting] = []
    if any(v is not None for v, _ in lists.values()) or not explicit:
        parsed: dict[str, list[Setting]] = {}
        for option, (value, key) in lists.items():
            words = [w.strip() for w in (value or "").split(",") if w.strip()]
            if value is not None and not words:
                raise UsageError(f"{option} {value!r}: give a comma-separated list")
            parsed[option] = [parse_setting(f"{key}={w}", origin=f"{option} {w!r}")
                              for w in words]
        opts = [s.opt_level for s in parsed["--opt-levels"]] or (
            list(DEFAULT_OPT_LEVELS) if all(v is None for v, _ in lists.values()) else ["all"])
        settings = grid(opts, [s.threads for s in parsed["--threads"]] or [0],
                        [s.providers for s in parsed["--providers"]] or [()],
                        [s.layout for s in parsed["--layouts"]] or ["auto"])
    return settings + [parse_setting(s) for s in explicit]


def grid(opt_levels: Iterable[str] = ("all",), threads: Iterable[int] = (0,),
         providers: Iterable[tuple[str, ...]] = ((),),
         layouts: Iterable[str] = ("auto",)) -> list[Setting]:
    """Every combination, in the order given (the first is the baseline)."""
    return [Setting(opt_level=o, threads=t, providers=p, layout=lay) for o, t, p, lay in
            itertools.product(opt_levels, threads, providers, layouts)]


# --- running ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchRequest:
    selection: ArchiveSelection
    settings: tuple[Setting, ...]
    device: DeviceTarget = DeviceTarget()
    timed: TimedRuns = TimedRuns()
    repeat: int = 1


@dataclass(frozen=True)
class SettingResult:
    setting: Setting
    iter_ms: tuple[float, ...]
    timing: Timing
    speedup: float                 # the baseline's mean over this one's
    prepare_ms: float              # session creation, first round
    diffs: tuple[TensorDiff, ...]  # every checked output of every case

    @property
    def passed(self) -> bool:
        return all(d.passed for d in self.diffs)

    @property
    def worst(self) -> TensorDiff | None:
        """The output closest to (or furthest over) its tolerance."""
        return max(self.diffs, key=lambda d: (not d.passed, tol_rank(d)), default=None)

    def to_dict(self) -> dict[str, Any]:
        worst = self.worst
        return {"setting": self.setting.to_dict(), "timing": self.timing.to_dict(),
                "speedup": self.speedup, "prepare_ms": self.prepare_ms,
                "iter_ms": list(self.iter_ms), "passed": self.passed,
                "max_abs": max((d.max_abs for d in self.diffs), default=None),
                "worst": None if worst is None else worst.to_dict()}


@dataclass(frozen=True)
class BenchReport:
    archive: str
    device: Mapping[str, Any]
    cases: tuple[int, ...]
    iterations: int
    warmup: int
    repeat: int
    results: tuple[SettingResult, ...]
    notes: tuple[str, ...] = field(default=())
    connections: int = 0     # device connections the bench opened (one session: 1)
    runner_starts: int = 0   # runner processes started (1 where the runner serves)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {"archive": self.archive, "device": dict(self.device), "cases": list(self.cases),
                "iterations": self.iterations, "warmup": self.warmup, "repeat": self.repeat,
                "baseline": self.results[0].setting.label,
                "results": [r.to_dict() for r in self.results],
                "passed": self.passed, "notes": list(self.notes),
                "session": {"connections": self.connections, "runner_starts": self.runner_starts,
                            "jobs": len(self.results) * self.repeat}}


def bench(request: BenchRequest, *, status: Status | None = None,
          progress: ProgressFactory | None = None) -> BenchReport:
    """Run every setting (in `repeat` interleaved rounds), time it and check its outputs."""
    if not request.settings:
        raise UsageError("no settings to compare: give --opt-levels/--threads/--providers/"
                         "--layouts or --setting")
    labels = [s.label for s in request.settings]
    dup = next((x for x in labels if labels.count(x) > 1), None)
    if dup is not None:
        raise UsageError(f"setting {dup!r} is given twice")
    if request.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    prepared = prepare(request.selection, request.device)
    # joined before the report (a verdict) is returned; external data extracted once
    with prepared.layer_check, external_data(prepared.testcase) as external:
        return _bench(request, prepared, status, progress, external)


def _bench(request: BenchRequest, prepared: Prepared, status: Status | None,
           progress: ProgressFactory | None, external: ExternalData | None = None
           ) -> BenchReport:
    tc, tolerances, indices, profile, _ = prepared
    labels = [s.label for s in request.settings]
    feeds = [tc.cases[i].inputs for i in indices]
    floors = output_floors(tc)
    say = status or (lambda _m: None)
    times: dict[str, list[float]] = {s.label: [] for s in request.settings}
    prepare_ms: dict[str, float] = {}
    diffs: dict[str, list[TensorDiff]] = {s.label: [] for s in request.settings}
    device: Mapping[str, Any] = {}
    with DeviceSession(profile, status=status, progress=progress, serve=True) as session:
        for round_no in range(request.repeat):
            for s in request.settings:
                say(f"round {round_no + 1}/{request.repeat}: {s.label}")
                options = RunOptions(session=s.session(), timed=request.timed,
                                     timeout=request.device.timeout)
                run = run_model(session, tc.model_bytes, feeds, options,
                                external=external)
                device = run.device
                prepare_ms.setdefault(s.label, run.prepare_ms)
                for pos, ci in enumerate(indices):
                    times[s.label].extend(run.cases[pos].iter_ms)
                    if round_no == 0:
                        diffs[s.label].extend(check_outputs(
                            run.cases[pos].outputs, tc.cases[ci].outputs, tolerances, floors,
                            f"{profile.spec} ({s.label})"))
        starts = (session.connections, session.runner_starts)
    timings = {label: Timing.of(ms) for label, ms in times.items()}
    base = timings[labels[0]]
    results = tuple(SettingResult(s, tuple(times[s.label]), timings[s.label],
                                  base.avg / timings[s.label].avg if timings[s.label].avg > 0
                                  else math.inf, prepare_ms[s.label], tuple(diffs[s.label]))
                    for s in request.settings)
    return BenchReport(str(request.selection.archive), {"spec": profile.spec, **dict(device)},
                       indices, request.timed.iterations, request.timed.warmup, request.repeat,
                       results,
                       tuple(_config_notes(request.settings) + timing_notes(results)), *starts)


def _config_notes(settings: Sequence[Setting]) -> list[str]:
    """Keys onnxruntime's header does not list: ignored by a build that does not know them."""
    keys = dict.fromkeys(k for s in settings for k, _ in s.session_config if unknown(k))
    return [f"{k!r} is not a session config key onnxruntime's header lists; a build that "
            "does not know it ignores it (the setting then times the default)" for k in keys]


def timing_notes(results: Sequence[SettingResult]) -> list[str]:
    """Where the timings cannot carry a comparison: intervals overlapping the baseline's, or a
    spread too large for the mean to mean much."""
    notes = []
    base = results[0]
    if base.timing.n < 2:
        notes.append("one timed iteration per setting: no spread to judge a difference by; "
                     "use --iter 5 or more")
        return notes
    for r in results:
        cv = r.timing.sd / r.timing.avg if r.timing.avg > 0 else 0.0
        if cv > NOISY_CV:
            notes.append(f"{r.setting.label}: sd is {cv:.0%} of the mean; the machine is noisy "
                         "or the iterations differ (compare min and median too)")
    for r in results[1:]:
        if r.timing.overlaps(base.timing):
            notes.append(
                f"{r.setting.label} vs {base.setting.label}: the 95% intervals of the mean "
                f"overlap ({_ci(r.timing)} vs {_ci(base.timing)}): the {r.speedup:.2f}x is "
                "within the noise; use more --iter or --repeat")
    return notes


def _ci(t: Timing) -> str:
    return f"{t.avg:.3f} ± {t.ci_high - t.avg:.3f} ms"
