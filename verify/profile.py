"""Read onnxruntime's profile (a Chrome trace) and summarize it the way MegEngine's
profile_analyze does: top-N nodes, filters, aggregation by op type, ordering by any column,
and per node its FLOPs, bytes, achieved FLOP/s and bandwidth (see verify.flops).

What the trace holds (onnxruntime 1.31; the format is undocumented, unknown fields are
ignored). A JSON list of events `{cat, name, ts, dur, tid, args}`, `ts`/`dur` in microseconds
from the profiler's start:
  cat "Session"  model_loading_*, session_initialization (once); per run `model_run`, which
                 contains `SequentialExecutor::Execute` (one more per executed subgraph).
  cat "Node"     `<node name>_kernel_time` per node execution, args: op_name, provider,
                 node_index, input_type_shape/output_type_shape ([{dtype: [dims]}]; absent
                 optional inputs and weights pre-packed by the kernel are left out),
                 parameter_size/activation_size/output_size, thread_scheduling_stats, mem_*.
                 Older releases also wrote `_fence_before`/`_fence_after`; they are ignored.
                 Unnamed model nodes appear as `<OpType>_<index in the file>`; nodes made by
                 graph optimizations have new names and ops (FusedConv, 'r_nchwc', ...).
                 Nodes of If/Loop/Scan bodies are nested inside their parent's kernel_time.
  cat "Kernel"   only in builds with CUDA/ROCm profiling: one per device kernel, listed right
                 after the Node event that launched it; `dur` is device time.

Clocks. A node's host time is its self time: kernel_time minus the kernel_time of nodes nested
in it. Its device time is the sum of its Kernel events when it has any, else its host time
(on the CPU provider the kernel runs on the calling thread). So `--print-only device` is the
table on the device clock, `--print-only host` the table on the host clock (identical on CPU),
`--print-only summary` the summary alone. The summary's run time is the mean `model_run`
duration; host overhead = run time - sum of node self times per run: feeding inputs,
allocating outputs and scheduling, all outside any kernel. There is no `--top-end-key`: the
trace has one duration per kernel and no wait-versus-compute split.

Times are seconds; times, FLOPs and bytes in rows are per run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from verify.errors import UsageError
from verify.flops import TensorSpec
# the model side lives in verify.profile_model; load_model_index is re-exported for the CLI
from verify.profile_model import ModelIndex, load_model_index, variant_cost  # noqa: F401
from verify.trace import NodeStats, TraceProfile
# The trace side lives in verify.trace; these are re-exported for the CLI, tests and benchmarks.
from verify.trace import load_profile, parse_profile  # noqa: F401

AGGREGATES: Mapping[str, Callable[[Sequence[float]], float]] = {
    "sum": math.fsum, "mean": lambda v: math.fsum(v) / len(v), "max": max, "min": min,
}
CLOCKS = ("device", "host")
COLUMNS: Mapping[str, str] = {
    "time": "self time per run on the chosen clock, seconds",
    "calls": "kernel executions over all runs",
    "computation": "FLOPs per run",
    "flops": "achieved FLOP/s: computation / time",
    "memory": "bytes read + written per run",
    "bandwidth": "achieved bytes/s: memory / time",
    "name": "node name (the op type, or 'all', when aggregated)",
    "type": "op type",
    "provider": "execution provider",
}
"""Columns --order-by accepts (prefix '+' for ascending; descending otherwise)."""
_ATTR = {"type": "op_type"}


# --- the analysis -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ProfileOptions:
    """The profile_analyze option set (see analyze)."""

    top: int = 3
    types: tuple[str, ...] = ()
    name: str | None = None
    order_by: str = "time"
    aggregate_by: str | None = None
    aggregate: str | None = None
    min_time: float | None = None
    max_time: float | None = None
    clock: str = "device"


@dataclass(frozen=True)
class ProfileRow:
    """One node (or one aggregate of nodes). Per run: time, computation, bytes."""

    name: str
    op_type: str
    provider: str | None
    nodes: int
    calls: int
    time: float              # seconds per run, chosen clock
    time_per_call: float     # seconds
    share: float             # percent of the summary's total on the chosen clock
    cumulative: float        # seconds: this row and all above it
    cumulative_share: float  # percent
    computation: float | None  # FLOPs
    flops: float | None        # FLOP/s
    bytes_read: float | None
    bytes_written: float | None
    memory: float | None       # bytes read + written
    bandwidth: float | None    # bytes/s
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    module: str = ""           # the PyTorch module path (profile --torch), '' when unknown
    # the shapes it ran with: inputs/outputs are the most-called's, computation and memory
    # sum them all (cases of two sizes: a row showed one shape beside the other's FLOPs)
    shape_variants: int = 1
    unknown_nodes: int = 0     # an aggregate's nodes of unknown FLOPs or bytes, left out of it

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "type": self.op_type, "provider": self.provider,
            **({"module": self.module} if self.module else {}),
            "nodes": self.nodes, "calls": self.calls, "time": self.time,
            "time_per_call": self.time_per_call, "share": self.share,
            "cumulative": self.cumulative, "cumulative_share": self.cumulative_share,
            "computation": self.computation, "flops": self.flops,
            "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
            "memory": self.memory, "bandwidth": self.bandwidth,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "shape_variants": self.shape_variants, "unknown_nodes": self.unknown_nodes,
        }


@dataclass(frozen=True)
class ProfileSummary:
    """Totals per run (seconds) over all nodes, whatever the filters."""

    source: str
    runs: int
    skipped_runs: int
    run_time: float | None       # mean model_run duration ("total host time")
    run_time_min: float | None
    run_time_max: float | None
    kernel_time: float           # node self times, host clock
    device_time: float           # node times, device clock ("total device time")
    host_overhead: float | None  # run_time - kernel_time
    nodes: int
    calls: int
    computation: float           # FLOPs of the nodes whose count is known
    unknown_computation: int     # nodes whose FLOPs are unknown
    session_init: float | None
    model_load: float | None
    device_events: bool          # the trace has device Kernel events
    clock: str                   # the clock the rows use
    total: float                 # denominator of the rows' shares: device or kernel time
    warmup_source: str | None = None  # who said which runs were warmup: "trace", "option"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ProfileReport:
    summary: ProfileSummary
    rows: tuple[ProfileRow, ...]
    options: ProfileOptions = field(default_factory=ProfileOptions)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary.to_dict(), "options": dict(self.options.__dict__),
                "rows": [r.to_dict() for r in self.rows]}


def analyze(profile: TraceProfile, model: Any = None, *, top: int = 3, types: Iterable[str] = (),
            name: str | None = None, order_by: str = "time", aggregate_by: str | None = None,
            aggregate: str | None = None, min_time: float | None = None,
            max_time: float | None = None, clock: str = "device",
            modules: Mapping[str, str] | None = None) -> ProfileReport:
    """Summary plus the top rows of a profile, profile_analyze style.

    model: an onnx.ModelProto (or ModelIndex) for attributes and pre-packed weights; without
    it FLOPs and bytes come from the trace's shapes alone. top: rows kept, 0 for all.
    types: keep these op types. name: keep nodes whose name matches this regex (re.search).
    min_time/max_time: keep nodes whose per-run time (seconds) is within. Filters act on nodes
    before aggregation. aggregate_by 'type' groups by op type, aggregate alone groups all
    nodes into one 'all' row; aggregate is sum/mean/max/min (default sum), applied to time,
    computation and memory separately (None if any member's is unknown); aggregate_by
    'module' groups by PyTorch module path, from `modules` (node name → module path: a
    `profile --torch` profile). order_by: a COLUMNS
    key, '+' prefix for ascending; unknown values sort last. clock: 'device' or 'host'.
    Raises UsageError for an option out of range.
    """
    opts = _validate(ProfileOptions(top, tuple(types), name, order_by, aggregate_by, aggregate,
                                    min_time, max_time, clock))
    if opts.aggregate_by == "module" and modules is None:
        raise UsageError("--aggregate-by module needs a PyTorch profile (--torch PROGRAM)")
    index = model if isinstance(model, ModelIndex) or model is None else ModelIndex.of(model)
    runs = max(profile.runs, 1)
    rows = [_node_row(s, index, runs, opts.clock) for s in profile.nodes]
    if modules is not None:
        rows = [replace(r, module=modules.get(r.name, "")) for r in rows]
    summary = _summary(profile, rows, opts.clock)

    pattern = re.compile(opts.name) if opts.name else None
    kept = [r for r in rows
            if (not opts.types or r.op_type in opts.types)
            and (pattern is None or pattern.search(r.name))
            and (opts.min_time is None or r.time >= opts.min_time)
            and (opts.max_time is None or r.time <= opts.max_time)]
    if opts.aggregate is not None:
        kept = _aggregate(kept, opts.aggregate, opts.aggregate_by)
    kept = _sort(kept, opts.order_by)
    if opts.top:
        kept = kept[: opts.top]
    return ProfileReport(summary, tuple(_with_shares(kept, summary.total)), opts)


def _validate(o: ProfileOptions) -> ProfileOptions:
    if o.top < 0:
        raise UsageError(f"--top must be 0 (all) or more, got {o.top}")
    ascending = o.order_by.startswith("+")
    column = (o.order_by[1:] if ascending else o.order_by).strip().lower()
    if column not in COLUMNS:
        raise UsageError(f"unknown --order-by column {column!r}; valid: {', '.join(COLUMNS)}")
    o = replace(o, order_by=("+" if ascending else "") + column)
    if o.aggregate_by not in (None, "type", "module"):
        raise UsageError(f"unknown --aggregate-by {o.aggregate_by!r}; valid: type, module")
    if o.aggregate is not None and o.aggregate not in AGGREGATES:
        raise UsageError(f"unknown --aggregate {o.aggregate!r}; valid: {', '.join(AGGREGATES)}")
    if o.clock not in CLOCKS:
        raise UsageError(f"unknown clock {o.clock!r}; valid: {', '.join(CLOCKS)}")
    if o.name:
        try:
            re.compile(o.name)
        except re.error as exc:
            raise UsageError(f"--opr-name {o.name!r} is not a valid regular expression: "
                             f"{exc}") from None
    if o.aggregate_by is not None and o.aggregate is None:
        return replace(o, aggregate="sum")
    return o


def _per_run(total: float | None, runs: int) -> float | None:
    if total is None:
        return None
    return total // runs if isinstance(total, int) and total % runs == 0 else total / runs


def _node_row(s: NodeStats, index: ModelIndex | None, runs: int, clock: str) -> ProfileRow:
    on_device = clock == "device" and s.device_total is not None
    seconds = s.device_total if on_device else s.total
    flops: int | None = 0
    read: int | None = 0
    written: int | None = 0
    for v in s.variants:
        c = variant_cost(s, v, index)
        flops = None if flops is None or c.flops is None else flops + c.flops * v.calls
        read = None if read is None or c.bytes_read is None else read + c.bytes_read * v.calls
        written = (None if written is None or c.bytes_written is None
                   else written + c.bytes_written * v.calls)
    main = max(s.variants, key=lambda v: v.calls) if s.variants else None
    return replace(_row(s.name, s.op_type, s.provider, 1, s.calls, seconds / runs,
                        seconds / s.calls, _per_run(flops, runs), _per_run(read, runs),
                        _per_run(written, runs), main.inputs if main else (),
                        main.outputs if main else ()),
                   shape_variants=max(1, len(s.variants)))


def _row(name: str, op_type: str, provider: str | None, nodes: int, calls: int, time: float,
         per_call: float, computation: float | None, read: float | None,
         written: float | None, inputs: tuple[TensorSpec, ...] = (),
         outputs: tuple[TensorSpec, ...] = (), memory: float | None = None) -> ProfileRow:
    if memory is None and read is not None and written is not None:
        memory = read + written
    return ProfileRow(
        name=name, op_type=op_type, provider=provider, nodes=nodes, calls=calls, time=time,
        time_per_call=per_call, share=0.0, cumulative=0.0, cumulative_share=0.0,
        computation=computation,
        flops=computation / time if computation is not None and time > 0 else None,
        bytes_read=read, bytes_written=written, memory=memory,
        bandwidth=memory / time if memory is not None and time > 0 else None,
        inputs=inputs, outputs=outputs)


def _summary(p: TraceProfile, rows: list[ProfileRow], clock: str) -> ProfileSummary:
    runs = max(p.runs, 1)
    kernel = math.fsum(s.total for s in p.nodes) / runs
    device = math.fsum(s.device_total if s.device_total is not None else s.total
                       for s in p.nodes) / runs
    run_time = math.fsum(p.run_times) / len(p.run_times) if p.run_times else None
    return ProfileSummary(
        source=p.source, runs=p.runs, skipped_runs=p.skipped_runs, run_time=run_time,
        run_time_min=min(p.run_times) if p.run_times else None,
        run_time_max=max(p.run_times) if p.run_times else None,
        kernel_time=kernel, device_time=device,
        host_overhead=None if run_time is None else run_time - kernel,
        nodes=len(p.nodes), calls=sum(s.calls for s in p.nodes),
        computation=sum(r.computation for r in rows if r.computation is not None),
        unknown_computation=sum(1 for r in rows if r.computation is None),
        session_init=p.session_init, model_load=p.model_load, device_events=p.device_events,
        clock=clock, total=device if clock == "device" else kernel,
        warmup_source=p.warmup_source)


def _agg(fn: Callable[[Sequence[float]], float], values: list[float | None]) -> float | None:
    """`fn` over the known values (None where none is): a group's node of unknown FLOPs is
    counted in its row's `unknown_nodes`, as the summary counts it, instead of hiding the
    whole group's figure."""
    known = [v for v in values if v is not None]
    return fn(known) if known else None


def _aggregate(rows: list[ProfileRow], how: str, by: str | None) -> list[ProfileRow]:
    fn = AGGREGATES[how]
    groups: dict[str, list[ProfileRow]] = {}
    for r in rows:
        key = {"type": r.op_type, "module": r.module or "(top-level module)"}.get(by or "", "all")
        groups.setdefault(key, []).append(r)
    out = []
    for key, rs in groups.items():
        providers = sorted({r.provider for r in rs if r.provider})
        calls = sum(r.calls for r in rs)
        out.append(replace(_row(
            key, key if by == "type" else ("module" if by == "module" else "all"),
            ",".join(providers) or None, len(rs), calls,
            fn([r.time for r in rs]),
            math.fsum(r.time_per_call * r.calls for r in rs) / calls if calls else 0.0,
            _agg(fn, [r.computation for r in rs]), _agg(fn, [r.bytes_read for r in rs]),
            _agg(fn, [r.bytes_written for r in rs]), memory=_agg(fn, [r.memory for r in rs])),
            unknown_nodes=sum(1 for r in rs if r.computation is None or r.memory is None)))
    return out


def _sort(rows: list[ProfileRow], order_by: str) -> list[ProfileRow]:
    ascending = order_by.startswith("+")
    attr = _ATTR.get(order_by.lstrip("+"), order_by.lstrip("+"))
    known = [r for r in rows if getattr(r, attr) is not None]
    unknown = [r for r in rows if getattr(r, attr) is None]
    return sorted(known, key=lambda r: getattr(r, attr), reverse=not ascending) + unknown


def _with_shares(rows: list[ProfileRow], total: float) -> list[ProfileRow]:
    out, cumulative = [], 0.0
    for r in rows:
        cumulative += r.time
        out.append(replace(r, share=_pct(r.time, total), cumulative=cumulative,
                           cumulative_share=_pct(cumulative, total)))
    return out


def _pct(part: float, total: float) -> float:
    return 100.0 * part / total if total > 0 else 0.0


def si(value: float | None, unit: str, base: int = 1000) -> str:
    """'236.03 MFLO'-style text of a quantity, 'N/A' when unknown (base 1024 for bytes)."""
    if value is None:
        return "N/A"
    prefixes = ("", "K", "M", "G", "T", "P") if base == 1000 else ("", "Ki", "Mi", "Gi", "Ti", "Pi")
    for p in prefixes:
        if abs(value) < base or p == prefixes[-1]:
            return f"{value:.2f} {p}{unit}"
        value /= base
    raise AssertionError("unreachable")
