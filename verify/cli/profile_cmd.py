"""`verify profile`: summarize an ONNX Runtime profile the way profile_analyze does."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from verify.cli import CONTEXT, cli, emit_json, json_option, render
from verify.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from verify.flops import TensorSpec
    from verify.profile import ProfileReport, ProfileRow, ProfileSummary

PRINT_ONLY = ("summary", "device", "host")
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|µs|ns)?\s*$")
_UNITS = {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_time(text: str | None, option: str) -> float | None:
    """Seconds from '0.002', '2ms', '150us' (profile_analyze takes seconds)."""
    if text is None:
        return None
    m = _TIME.match(text)
    if not m:
        raise UsageError(f"{option} {text!r}: expected a time such as 0.002, 2ms or 150us")
    return float(m.group(1)) * _UNITS[m.group(2)]


@cli.command(context_settings=CONTEXT)
@click.argument("trace", type=click.Path(path_type=Path), required=False)
@click.option("--torch", "torch_program", default=None, metavar="PROGRAM",
              help="Profile a PyTorch program on this host instead (a torch.export .pt2 or "
                   "FILE.py:FACTORY): every FX node timed by an FX interpreter, in the same "
                   "tables. With TRACE (a device profile of the exported model) and --model "
                   "(that model), also each PyTorch module's host time beside the device's time "
                   "for the ONNX nodes that came from it. Needs pip install "
                   "'onnx-verify[torch]'.")
@click.option("--warmup", type=int, default=3, show_default=True,
              help="--torch: untimed runs first.")
@click.option("--iterations", type=int, default=10, show_default=True,
              help="--torch: timed runs.")
@click.option("--model", "model_path", type=click.Path(path_type=Path), default=None,
              help="The profiled model (.onnx or .vtc archive): node attributes and weights "
                   "the kernels pre-packed, for FLOPs the trace alone cannot give. One that "
                   "shares no node with the trace is refused.")
@click.option("-t", "--top", type=int, default=3, show_default=True,
              help="Rows to show (0: all).")
@click.option("--type", "types", multiple=True, metavar="OP",
              help="Only nodes of this op type (repeatable), e.g. Conv.")
@click.option("--opr-name", metavar="REGEX", default=None,
              help="Only nodes whose name matches this regular expression.")
@click.option("--order-by", default="time", show_default=True, metavar="COLUMN",
              help="Sort by time, calls, computation, flops, memory, bandwidth, name, type or "
                   "provider; descending, or ascending with a '+' prefix (+memory).")
@click.option("--aggregate-by", default=None, metavar="type|module",
              help="Group nodes by op type, or (--torch) by PyTorch module (with --aggregate; "
                   "sum by default).")
@click.option("--aggregate", default=None, metavar="sum|mean|max|min",
              help="How to combine a group's times, FLOPs and bytes; alone, one row for all.")
@click.option("--min-time", default=None, metavar="TIME",
              help="Only nodes taking at least this long per run (seconds, or 2ms, 150us).")
@click.option("--max-time", default=None, metavar="TIME",
              help="Only nodes taking at most this long per run.")
@click.option("--print-only", default=None, metavar="summary|device|host",
              help="Only the summary, or only the table on the device or host clock "
                   "(the same on the CPU provider).")
@click.option("--skip-runs", type=int, default=None, metavar="N",
              help="Drop the first N runs instead of the warmup runs `verify run` recorded "
                   "in the trace (0 keeps every run).")
@json_option
def profile(trace: Path | None, torch_program: str | None, warmup: int, iterations: int,
            model_path: Path | None, top: int, types: tuple[str, ...],
            opr_name: str | None, order_by: str, aggregate_by: str | None,
            aggregate: str | None, min_time: str | None, max_time: str | None,
            print_only: str | None, skip_runs: int | None, as_json: bool) -> int:
    """Summarize TRACE, a profile from `verify run --profile` (or any ONNX Runtime
    profile): total time first, then the top nodes with their self and cumulative time,
    FLOPs, achieved FLOP/s, bytes moved, bandwidth and shapes. Warmup runs are left out.

    \b
      verify run cnn.vtc --device arm64 --profile prof.json
      verify profile prof.json --model cnn.vtc -t 5
      verify profile prof.json --type Conv --order-by +memory
      verify profile prof.json -t 5 --aggregate-by type --aggregate sum
      verify profile prof.json --min-time 50us --print-only device --json
      verify profile --torch r18.pt2 -t 10 --aggregate-by module
      verify profile --torch r18.pt2 phone.json --model r18.vtc
    """
    from verify.profile import analyze, load_model_index, load_profile

    if print_only is not None and print_only not in PRINT_ONLY:
        raise UsageError(f"unknown --print-only {print_only!r}; valid: {', '.join(PRINT_ONLY)}")
    filters = dict(top=top, types=types, name=opr_name, order_by=order_by,
                   aggregate_by=aggregate_by, aggregate=aggregate,
                   min_time=parse_time(min_time, "--min-time"),
                   max_time=parse_time(max_time, "--max-time"))
    if torch_program is not None:
        return _torch_profile(torch_program, trace, model_path, warmup, iterations, filters,
                              print_only, skip_runs, as_json)
    if trace is None:
        raise UsageError("give TRACE (a profile from verify run --profile), or --torch PROGRAM")
    parsed = load_profile(trace, skip_runs=skip_runs)
    index = load_model_index(model_path) if model_path is not None else None
    if index is not None and parsed.nodes and not any(n.name in index.nodes for n in parsed.nodes):
        raise UsageError(f"--model {model_path}: none of the trace's {len(parsed.nodes)} nodes "
                         "is in this model; give the model the trace was taken of")
    clock = "host" if print_only == "host" else "device"
    report = analyze(parsed, index, top=top, types=types, name=opr_name, order_by=order_by,
                     aggregate_by=aggregate_by, aggregate=aggregate,
                     min_time=parse_time(min_time, "--min-time"),
                     max_time=parse_time(max_time, "--max-time"), clock=clock)
    if as_json:
        doc = report.to_dict()
        if print_only == "summary":
            doc.pop("rows")
        emit_json(doc, "profile")
        return EXIT_OK
    console = render.console(width=200)
    if print_only in (None, "summary"):
        console.print(summary_table(report.summary, with_model=index is not None))
    if print_only != "summary":
        console.print(rows_table(report) if report.rows else _none_matched(types, parsed))
    return EXIT_OK


def _none_matched(types: tuple[str, ...], parsed: Any) -> str:
    """What to say when the filters keep no node: with --type, the op types there are (they
    are case-sensitive: `--type conv` kept nothing, and said only that)."""
    have = sorted({n.op_type for n in parsed.nodes})
    if not types or set(types) & set(have):
        return "no node matches the filters"
    return (f"no node matches the filters: no op type {', '.join(map(repr, types))} here "
            f"(case-sensitive; the trace's: {', '.join(have[:12])}"
            f"{' …' if len(have) > 12 else ''})")


def _torch_profile(program: str, trace: Path | None, model_path: Path | None, warmup: int,
                   iterations: int, filters: dict, print_only: str | None,
                   skip_runs: int | None, as_json: bool) -> int:
    from verify.profile import analyze, load_profile
    from verify.torchprofile import model_and_inputs, module_times, torch_profile

    if trace is not None and model_path is None:
        raise UsageError("--torch with a device TRACE needs --model (the exported .onnx or its "
                         ".vtc) to map its ONNX nodes onto PyTorch modules")
    model, inputs = model_and_inputs(model_path) if model_path is not None else (None, None)
    device = load_profile(trace, skip_runs=skip_runs) if trace is not None else None
    host = torch_profile(program, inputs, warmup, iterations)
    report = analyze(host.profile, None, clock="host", modules=host.modules, **filters)
    rows, unclaimed = (module_times(host, model, device) if device is not None and model
                       else ((), 0.0))
    if as_json:
        doc = report.to_dict()
        if print_only == "summary":
            doc.pop("rows")
        doc["torch"] = host.version
        if device is not None:
            doc["modules"] = [r.to_dict() for r in rows]
            doc["device_unclaimed"] = unclaimed
        emit_json(doc, "profile")
        return EXIT_OK
    console = render.console(width=200)
    console.print(f"PyTorch {host.version}, {program}: {iterations} timed run(s) of the FX "
                  f"interpreter after {warmup} warmup run(s)")
    if print_only in (None, "summary"):
        console.print(summary_table(report.summary, with_model=True))
    if print_only != "summary":
        console.print(rows_table(report) if report.rows
                      else _none_matched(tuple(filters.get("types", ())), host.profile))
    if device is not None:
        console.print(module_table(rows, unclaimed, str(trace)))
    return EXIT_OK


def module_table(rows, unclaimed: float, trace: str):
    from rich import box
    from rich.table import Table

    table = Table(box=box.SQUARE, title=f"per PyTorch module: this host vs {trace}")
    for col in ("module", "PyTorch host", "FX nodes", "device", "ONNX nodes", "device/host"):
        table.add_column(col, overflow="fold")
    for r in rows:
        ratio = (f"{r.device / r.host:.2f}x" if r.device is not None and r.host
                 else "-")
        table.add_row(r.label, fmt_time(r.host), str(r.fx_nodes), fmt_time(r.device),
                      str(r.onnx_nodes), ratio)
    if unclaimed:
        table.add_row("(device nodes from no module)", "-", "-", fmt_time(unclaimed), "-", "-")
    return table


# --- rendering ------------------------------------------------------------------------------------
def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "N/A"
    if abs(seconds) >= 1:
        return f"{seconds:.3f} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} µs"


def _shapes(specs: Sequence["TensorSpec"]) -> str:
    return "\n".join("{" + ",".join(map(str, t.shape)) + "}" if t.shape is not None else "?"
                     for t in specs)


def summary_table(s: "ProfileSummary", with_model: bool = True):
    from rich.table import Table

    from verify.profile import si

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    warm = {"trace": "as `verify run` recorded", "option": "--skip-runs",
            "torch": "--warmup"}.get(
        s.warmup_source or "", "")
    runs = f"{s.runs}" + (f" (dropped {s.skipped_runs} warmup run(s), {warm})"
                          if s.skipped_runs else
                          " (no warmup record: every run kept, the first and often slowest "
                          "one too; --skip-runs 1 drops it)"
                          if s.warmup_source is None and s.runs > 1 else "")
    table.add_row("runs analyzed", runs)
    if s.run_time is not None:
        what = "interpreted run" if s.source.startswith("torch:") else "model_run"
        table.add_row("total host time", f"{fmt_time(s.run_time)} per run ({what}; min "
                      f"{fmt_time(s.run_time_min)}, max {fmt_time(s.run_time_max)})")
    if s.source.startswith("torch:"):
        table.add_row("sum of node times", f"{fmt_time(s.kernel_time)} per run (each FX node "
                      "timed alone)")
    else:
        table.add_row("total device time", f"{fmt_time(s.device_time)} per run"
                      + ("" if s.device_events else " (sum of node times; CPU kernels run on "
                         "the host thread)"))
    if s.host_overhead is not None:
        table.add_row("outside kernels", f"{fmt_time(s.host_overhead)} per run (feeding "
                      "inputs, allocating outputs, scheduling"
                      + (", the interpreter's own work" if s.source.startswith("torch:") else "")
                      + ")")
    unknown = ""
    if s.unknown_computation:
        hint = "" if with_model else "; --model may tell"
        unknown = f" ({s.unknown_computation} node(s) unknown{hint})"
    table.add_row("computation", f"{si(s.computation, 'FLO')} per run{unknown}")
    table.add_row("nodes", f"{s.nodes} ({s.calls} kernel calls)")
    if s.session_init is not None:
        table.add_row("session init", fmt_time(s.session_init))
    return table


def rows_table(report: "ProfileReport"):
    from rich import box
    from rich.table import Table

    from verify.profile import si

    clock = report.summary.clock
    table = Table(box=box.SQUARE, show_lines=True)
    for col in (f"{clock} self time", "cumulative", "operator info", "computation", "FLOP/s",
                "memory", "bandwidth", "in shapes", "out shapes"):
        table.add_column(col, overflow="fold")
    for rank, r in enumerate(report.rows):
        table.add_row(
            f"#{rank}\n{fmt_time(r.time)}\n{r.share:.1f}%",
            f"{fmt_time(r.cumulative)}\n{r.cumulative_share:.1f}%",
            _operator(r, report.options.aggregate is not None),
            si(r.computation, "FLO"), si(r.flops, "FLOP/s"),
            si(r.memory, "B", 1024), si(r.bandwidth, "B/s", 1024),
            _shapes(r.inputs) + _more_shapes(r), _shapes(r.outputs))
    return table


def _more_shapes(r: "ProfileRow") -> str:
    """Where a node ran with several shapes: the row shows the most-called one, and its
    computation and memory are all of them per run."""
    more = r.shape_variants - 1
    return f"\n(+{more} other shape{'s' if more > 1 else ''}: figures are all)" if more else ""


def _operator(r: "ProfileRow", aggregated: bool) -> str:
    provider = (r.provider or "").replace("ExecutionProvider", "")
    if aggregated:
        unknown = f", {r.unknown_nodes} of unknown FLOPs or bytes (left out)" \
            if r.unknown_nodes else ""
        return f"{r.name}\n{r.nodes} nodes, {r.calls} calls{unknown}\n{provider}"
    return f"{r.name}\n{r.op_type}\n{provider}"
