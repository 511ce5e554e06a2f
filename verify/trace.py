"""onnxruntime's profiling trace, parsed: per node its calls, self times, shapes and provider.

See `verify.profile` for what the trace holds and how it is summarized; this module only reads
it (a plain event list or Chrome's object form with verify's warmup record in `otherData`),
drops warmup runs and computes self times. Times are seconds.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verify import schema
from verify.errors import ProfileError, UsageError
from verify.files import read_user_file
from verify.flops import UNKNOWN, NodeCost, TensorSpec

KERNEL_SUFFIX = "_kernel_time"
WARMUP_KEY = "verify_warmup_runs"  # in a trace's otherData, written by the runner


# --- parsed trace -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ShapeVariant:
    """One set of input/output shapes a node ran with, and how many times."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    calls: int
    cost: NodeCost | None = None  # counted where the shapes were taken (a PyTorch program's
    # nodes, verify.torchcost); None: from the shapes and the model (profile_model.variant_cost)


@dataclass(frozen=True)
class NodeStats:
    """All executions of one node: times in seconds (self time, host clock)."""

    name: str
    op_type: str
    provider: str | None
    node_index: int | None
    calls: int
    total: float
    min: float
    max: float
    device_total: float | None  # sum of its Kernel events; None when it has none
    variants: tuple[ShapeVariant, ...]

    @property
    def mean(self) -> float:
        return self.total / self.calls


@dataclass(frozen=True)
class TraceProfile:
    """A parsed trace: per-run totals and per-node statistics (nodes in execution order)."""

    source: str
    runs: int
    skipped_runs: int
    run_times: tuple[float, ...]  # model_run durations, seconds; empty if the trace has none
    nodes: tuple[NodeStats, ...]
    session_init: float | None
    model_load: float | None
    device_events: bool
    warmup_source: str | None = None  # "trace" (the runner's record), "option", None: none


@dataclass
class _Call:
    name: str
    op_type: str
    provider: str | None
    node_index: int | None
    ts: float
    dur: float
    tid: Any
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    self_time: float = 0.0
    device: float | None = None


def load_profile(path: Path, *, skip_runs: int | None = None) -> TraceProfile:
    """Parse onnxruntime's profile JSON at `path`, without its warmup runs.

    The warmup runs are those `verify run --profile` recorded in the trace; `skip_runs`
    overrides that record and drops the first N runs instead (0 keeps every run).

    Raises ProfileError (one line) for a missing or unreadable file, one that is not a JSON
    trace, or a trace with no node events.
    """
    raw = read_user_file(path, ProfileError, "a profile .json file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        if raw.startswith(schema.SIGNATURE):
            raise ProfileError(f"{path}: a testcase archive, not a trace: record one with "
                               f"`verify run {path} --profile prof.json`, then "
                               f"`verify profile prof.json --model {path}`") from None
        raise ProfileError(f"{path}: not a JSON trace (not UTF-8 text)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not a JSON trace ({exc.msg} at line {exc.lineno} "
                           f"column {exc.colno})") from None
    return parse_profile(data, source=str(path), skip_runs=skip_runs)


def trace_events(data: object, source: str = "<profile>") -> list[dict[str, Any]]:
    """The event list of a trace: a JSON list, or an object with a 'traceEvents' list."""
    if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        data = data["traceEvents"]
    if not isinstance(data, list):
        raise ProfileError(f"{source}: not an ONNX Runtime profile "
                           "(expected a JSON list of trace events, or an object with a "
                           "'traceEvents' list)")
    return [e for e in data if isinstance(e, dict)]


def warmup_runs(data: object) -> tuple[int, ...] | None:
    """The indices (in time order) of the model_run events the runner recorded as warmup
    (`otherData.verify_warmup_runs` in a trace `verify run --profile` wrote); None if absent."""
    other = data.get("otherData") if isinstance(data, dict) else None
    runs = other.get(WARMUP_KEY) if isinstance(other, dict) else None
    if isinstance(runs, list) and all(isinstance(r, int) and not isinstance(r, bool)
                                      and r >= 0 for r in runs):
        return tuple(runs)
    return None


def parse_profile(data: object, *, source: str = "<profile>",
                  skip_runs: int | None = None) -> TraceProfile:
    """Parse an already-decoded trace (see load_profile)."""
    if skip_runs is not None and skip_runs < 0:
        raise UsageError(f"cannot skip {skip_runs} runs; give 0 or more")
    recorded = warmup_runs(data) if skip_runs is None else None
    dropped = frozenset(recorded if recorded is not None else range(skip_runs or 0))
    calls: list[_Call] = []
    runs: list[tuple[float, float]] = []
    executes: list[tuple[float, float]] = []
    init = load = None
    last: _Call | None = None
    device_events = False
    for i, e in enumerate(trace_events(data, source)):
        cat, name = e.get("cat"), e.get("name")
        if not isinstance(name, str):
            continue
        if cat == "Node" and name.endswith(KERNEL_SUFFIX):
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            last = _Call(name[: -len(KERNEL_SUFFIX)], str(args.get("op_name") or "?"),
                         _str_or_none(args.get("provider")), _int_or_none(args.get("node_index")),
                         _number(e, "ts", i, source), _number(e, "dur", i, source), e.get("tid"),
                         _specs(args.get("input_type_shape")),
                         _specs(args.get("output_type_shape")))
            calls.append(last)
        elif cat == "Kernel" and last is not None:
            device_events = True
            last.device = (last.device or 0.0) + _number(e, "dur", i, source)
        elif cat == "Session":
            if name == "model_run":
                runs.append((_number(e, "ts", i, source), _number(e, "dur", i, source)))
            elif name == "SequentialExecutor::Execute":
                executes.append((_number(e, "ts", i, source), _number(e, "dur", i, source)))
            elif name == "session_initialization":
                init = _number(e, "dur", i, source)
            elif name.startswith("model_loading"):
                load = _number(e, "dur", i, source)
    if not calls:
        raise ProfileError(f"{source}: no node events; the session never ran while "
                           "profiling was on")
    _compute_self_times(calls)
    runs = sorted(runs) or _outermost(executes)
    calls.sort(key=lambda c: (c.ts, -c.dur))
    skipped: list[tuple[float, float]] = []
    if runs:
        if dropped and len(dropped) >= len(runs) and recorded is None:
            raise ProfileError(f"{source}: cannot skip {len(dropped)} warmup runs, the profile "
                               f"has {len(runs)}")
        skipped = [span for i, span in enumerate(runs) if i in dropped]
        runs = [span for i, span in enumerate(runs) if i not in dropped]
        if not runs:
            raise ProfileError(f"{source}: the profile holds warmup runs only; pass "
                               "--skip-runs 0 to analyze them")
        if skipped:
            calls = [c for c in calls if not _inside(c.ts, skipped)]
        run_count = len(runs)
    else:
        if dropped:
            raise ProfileError(f"{source}: cannot skip warmup runs: the profile has no "
                               "model_run events")
        run_count = sum(1 for c in calls if c.name == calls[0].name)
    return TraceProfile(source=source, runs=run_count, skipped_runs=len(skipped),
                   run_times=tuple(d / 1e6 for _, d in runs),
                   nodes=_node_stats(calls), session_init=_sec(init), model_load=_sec(load),
                   device_events=device_events,
                   warmup_source="trace" if recorded is not None else
                   ("option" if skip_runs else None))


def _inside(ts: float, spans: list[tuple[float, float]]) -> bool:
    """Whether `ts` falls in one of `spans` ((start, duration), sorted, not overlapping)."""
    i = bisect.bisect_right(spans, (ts, math.inf)) - 1
    return i >= 0 and ts <= spans[i][0] + spans[i][1]


def _outermost(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for ts, dur in sorted(spans):
        if not out or ts >= out[-1][0] + out[-1][1]:
            out.append((ts, dur))
    return out


def _compute_self_times(calls: list[_Call]) -> None:
    """Subtract from each kernel the kernels nested in it (If/Loop/Scan bodies), per thread."""
    by_thread: dict[Any, list[_Call]] = {}
    for c in calls:
        c.self_time = c.dur
        by_thread.setdefault(repr(c.tid), []).append(c)
    for group in by_thread.values():
        stack: list[_Call] = []
        for c in sorted(group, key=lambda c: (c.ts, -c.dur)):
            while stack and c.ts >= stack[-1].ts + stack[-1].dur:
                stack.pop()
            if stack:
                stack[-1].self_time = max(stack[-1].self_time - c.dur, 0.0)
            stack.append(c)


def _node_stats(calls: list[_Call]) -> tuple[NodeStats, ...]:
    groups: dict[tuple[str, str], list[_Call]] = {}
    for c in calls:
        groups.setdefault((c.name, c.op_type), []).append(c)
    stats = []
    for (name, op_type), cs in groups.items():
        variants: dict[tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]], int] = {}
        for c in cs:
            variants[(c.inputs, c.outputs)] = variants.get((c.inputs, c.outputs), 0) + 1
        times = [c.self_time / 1e6 for c in cs]
        device = [c.device for c in cs if c.device is not None]
        stats.append(NodeStats(
            name=name, op_type=op_type, provider=cs[0].provider, node_index=cs[0].node_index,
            calls=len(cs), total=math.fsum(times), min=min(times), max=max(times),
            device_total=math.fsum(device) / 1e6 if device else None,
            variants=tuple(ShapeVariant(i, o, n) for (i, o), n in variants.items())))
    return tuple(stats)


def _number(e: Mapping[str, Any], key: str, index: int, source: str) -> float:
    v = e.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ProfileError(f"{source}: event {index} ({e.get('name')}): {key!r} is not a number")
    if key == "dur" and v < 0:
        raise ProfileError(f"{source}: event {index} ({e.get('name')}): 'dur' is negative "
                           f"({v}); a hand-edited trace?")
    return float(v)


def _int_or_none(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _sec(us: float | None) -> float | None:
    return None if us is None else us / 1e6


def _specs(entries: Any) -> tuple[TensorSpec, ...]:
    if not isinstance(entries, list):
        return ()
    out = []
    for entry in entries:
        if isinstance(entry, dict) and len(entry) == 1:
            ((dtype, dims),) = entry.items()
            ok = isinstance(dims, list) and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims)
            out.append(TensorSpec(str(dtype), tuple(dims) if ok else None))
        else:
            out.append(UNKNOWN)
    return tuple(out)
