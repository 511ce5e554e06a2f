"""Rendering for the CLI: text in load_and_run's shape, rich tables, JSON documents.

Part of the CLI layer: only cli.py calls it. Library modules never print.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from verify.timing import timing_summary
from verify.tolerance import describe_record

if TYPE_CHECKING:
    from verify.devices import Profile
    from verify.execute import RunOutcome
    from verify.testcase import Testcase


def console(stderr: bool = False, width: int = 140):
    """A rich console for tables: the terminal's width, or `width` columns when the stream
    it writes to is not a terminal (CI logs, pipes)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, soft_wrap=False,
                   width=None if stream.isatty() else width)


def interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def fmt_shape(shape: Sequence[Any]) -> str:
    return "(" + ",".join(str(d) for d in shape) + ")"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            break
        n /= 1024
    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"


# --- pack / inspect -----------------------------------------------------------------------------
def _model_info(model_bytes: bytes, where: str, external: Sequence[Any] = ()) -> dict[str, Any]:
    import onnx

    from verify.graph import count_ops, opset_of, parse_model

    model = parse_model(model_bytes, where, external)  # corrupt: one ModelError line, exit 2
    g = model.graph
    inits = {i.name for i in g.initializer}

    def io(values: Any) -> list[dict[str, Any]]:
        out = []
        for v in values:
            if v.name in inits:
                continue
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                    else (d.dim_param or "?") for d in t.shape.dim]
            out.append({"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(
                t.elem_type).name if t.elem_type else "?", "shape": dims})
        return out

    return {"ir_version": model.ir_version, "opset": opset_of(model),
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "nodes": len(g.node), "initializers": len(g.initializer),
            "parameters": int(sum(np.prod(i.dims, dtype=np.int64) for i in g.initializer)),
            "ops": count_ops(g.node), "inputs": io(g.input), "outputs": io(g.output),
            "size_bytes": len(model_bytes),
            "external_data": [{"location": f.location, "bytes": f.size} for f in external]}


def _array_info(a: np.ndarray) -> dict[str, Any]:
    info: dict[str, Any] = {"dtype": a.dtype.name, "shape": list(a.shape)}
    if a.size and a.dtype.kind in "fiub":
        finite = a[np.isfinite(a)] if a.dtype.kind == "f" else a
        if finite.size:
            info["min"] = float(finite.min())
            info["max"] = float(finite.max())
            info["mean"] = float(finite.astype(np.float64).mean())
    return info


def inspect_summary(tc: "Testcase") -> dict[str, Any]:
    return {
        "archive": str(tc.path), "format_version": tc.format_version,
        "model": _model_info(tc.model_bytes, f"{tc.path}: the archive's model", tc.external),
        "cases": [{"index": i, "source": c.source,
                   "inputs": {k: _array_info(v) for k, v in c.inputs.items()},
                   "outputs": {k: _array_info(v) for k, v in c.outputs.items()}}
                  for i, c in enumerate(tc.cases)],
        "per_layer_references": tc.has_layers,
        "tensors": len(tc.tensor_order),
        "tolerances": dict(tc.tolerances),
        "tolerance_rule": describe_record(tc.tolerances),
        "provenance": tc.provenance,
    }


def model_summary(path: Path, model_bytes: bytes, external: Sequence[Any] = ()) -> dict[str, Any]:
    """`inspect` of a plain .onnx file: the model part of an archive's summary."""
    return {"model_file": str(path), "model": _model_info(model_bytes, str(path), external)}


def print_model(s: Mapping[str, Any]) -> None:
    con = console()
    con.print(f"[bold]{s['model_file']}[/bold]  (an ONNX model, not an archive: "
              "verify pack it to add inputs and ground truth)")
    _print_model_part(con, s["model"])


def pack_summary(tc: "Testcase", out: Path) -> dict[str, Any]:
    return {**inspect_summary(tc), "archive": str(out), "archive_bytes": out.stat().st_size}


def pack_text(s: Mapping[str, Any]) -> str:
    m = s["model"]
    lines = [f"packed {s['archive']} ({fmt_bytes(s['archive_bytes'])}): "
             f"{len(s['cases'])} case(s), {m['nodes']} nodes, opset {m['opset']}"
             + (", per-layer references" if s["per_layer_references"] else "")]
    for case in s["cases"]:
        for name, o in case["outputs"].items():
            rng = f" range [{o['min']:.4g}, {o['max']:.4g}]" if "min" in o else ""
            lines.append(f"  case {case['index']}: {name} {o['dtype']}{fmt_shape(o['shape'])}{rng}")
    prov = s["provenance"]
    ref = str(prov.get("reference", ""))
    if "torch" in prov:
        lines.append(f"ground truth: {ref}")
        lines.extend(torch_pack_lines(prov))
    else:
        lines.append(f"ground truth: {ref}" + ("" if ref.startswith("given") else
                     f" (onnxruntime {prov.get('onnxruntime', '?')})"))
    return "\n".join(lines)


def torch_pack_lines(prov: Mapping[str, Any]) -> list[str]:
    """What a PyTorch reference found: the mapping of FX nodes, and onnxruntime on this host."""
    from verify import schema

    lines = []
    mapping = prov.get(schema.PROV_TORCH_MAP)
    if mapping:
        unmapped = mapping.get("unmapped", [])
        lines.append(f"per-layer: {mapping['mapped']} of {mapping['onnx_tensors']} ONNX tensors "
                     f"hold PyTorch's value (mapped by {mapping['how']}); {len(unmapped)} FX "
                     "node(s) map onto no tensor (listed in the provenance: verify inspect "
                     "--json)")
    check = prov.get(schema.PROV_HOST_CHECK) or {}
    first = check.get("first")
    if first:
        where = f" ({first['module']})" if first.get("module") else ""
        lines.append(f"WARNING: onnxruntime {prov.get('onnxruntime', '?')} on this host already "
                     f"differs from PyTorch: the export changed the numbers; first at "
                     f"{first['tensor']!r} (node {first['node']}, op {first['op']}){where}, "
                     f"max abs err {first['max_abs']:.3g}; {len(check.get('failing', []))} "
                     "tensor(s) over tolerance")
    elif check:
        lines.append(f"onnxruntime {prov.get('onnxruntime', '?')} on this host matches PyTorch "
                     f"({check.get('compared', 'outputs')}) within the archive's tolerances")
    return lines


def _print_model_part(con: Any, m: Mapping[str, Any]) -> None:
    from rich.table import Table

    con.print(f"model: {m['nodes']} nodes, {m['initializers']} initializers "
              f"({m['parameters']:,} parameters), opset {m['opset']}, IR {m['ir_version']}, "
              f"{fmt_bytes(m['size_bytes'])}, producer {m['producer'] or '?'}")
    if m.get("external_data"):
        files = m["external_data"]
        con.print(f"external data: {len(files)} file(s), "
                  f"{fmt_bytes(sum(f['bytes'] for f in files))} "
                  f"({', '.join(f['location'] for f in files[:4])}{' …' if len(files) > 4 else ''})")
    ops = ", ".join(f"{k} {v}" for k, v in list(m["ops"].items())[:12])
    con.print(f"ops: {ops}{' …' if len(m['ops']) > 12 else ''}")
    table = Table(title=None, show_edge=False, pad_edge=False)
    for col in ("", "name", "dtype", "shape"):
        table.add_column(col)
    for kind, items in (("input", m["inputs"]), ("output", m["outputs"])):
        for item in items:
            table.add_row(kind, item["name"], item["dtype"], fmt_shape(item["shape"]))
    con.print(table)


def print_inspect(s: Mapping[str, Any]) -> None:
    from rich.table import Table

    con = console()
    m = s["model"]
    con.print(f"[bold]{s['archive']}[/bold]  (archive format v{s['format_version']})")
    _print_model_part(con, m)
    for case in s["cases"]:
        con.print(f"case {case['index']}: {case['source'] or ''}")
        for role in ("inputs", "outputs"):
            for name, a in case[role].items():
                rng = f"  min {a['min']:.4g} max {a['max']:.4g} mean {a['mean']:.4g}" if "min" in a else ""
                con.print(f"  {role[:-1]:6} {name}: {a['dtype']}{fmt_shape(a['shape'])}{rng}")
    con.print(f"per-layer references: {'yes' if s['per_layer_references'] else 'no'} "
              f"({s['tensors']} tensors in graph order)")
    con.print(f"tolerances: {s['tolerance_rule']}")
    if "integrity" in s:
        con.print(f"integrity: {s['integrity']}")
    p = s["provenance"]
    con.print(f"provenance: {p.get('reference', '')}; onnxruntime {p.get('onnxruntime')}, "
              f"onnx {p.get('onnx')}, numpy {p.get('numpy')}, verify {p.get('verify')}; "
              f"{p.get('host_arch')} {p.get('host_os')}; {p.get('created_utc')}; "
              f"model sha256 {str(p.get('model_sha256', ''))[:16]}…")
    origin = p.get("repro_of")
    if isinstance(origin, Mapping):
        nodes = ", ".join(map(str, origin.get("nodes", ()))) or "?"
        con.print(f"repro of: {origin.get('archive') or '?'} case {origin.get('case', '?')}, "
                  f"node(s) {nodes}", soft_wrap=True)
        if origin.get("device"):
            con.print(f"  {origin.get('verdict') or 'found'} on device {origin['device']} at "
                      f"--opt-level {origin.get('opt_level') or '?'}: reproduce with "
                      f"`verify run {s['archive']} --device {origin['device']} --opt-level "
                      f"{origin.get('opt_level') or 'all'}`", soft_wrap=True)


# --- run ------------------------------------------------------------------------------------------
def progress_factory():
    """A factory of per-transfer progress callbacks: bars on a terminal, nothing in CI logs."""
    if not interactive():
        return None
    threshold = 8 << 20

    def make(label: str, total: int):
        if total < threshold:
            return None
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TransferSpeedColumn,
        )

        bar = Progress(TextColumn(f"push {label}"), BarColumn(), DownloadColumn(),
                       TransferSpeedColumn(), transient=True, console=console(stderr=True))
        task = bar.add_task(label, total=total)
        bar.start()
        done = [0]

        def advance(n: int) -> None:
            done[0] += n
            bar.update(task, advance=n)
            if done[0] >= total:
                bar.stop()
        return advance
    return make


class RunPrinter:
    """Prints `verify run` the way load_and_run does, plus the check."""

    def status(self, message: str) -> None:
        if interactive():
            click.echo(click.style(f"… {message}", dim=True), err=True)

    def print_outcome(self, o: "RunOutcome") -> None:
        r = o.run
        dev = r.device
        echo = click.echo
        echo(f"device {r.spec}: {dev.get('arch', '?')} {dev.get('os', '')}, python "
             f"{dev.get('python', '?')}, onnxruntime {dev.get('onnxruntime', '?')}; "
             f"providers {','.join(r.providers)}; opt-level {r.options.session.opt_level}"
             + (f"; threads {r.options.session.threads}" if r.options.session.threads else ""))
        t = r.transfers
        echo(f"transfers: {t.get('files_put', 0)} file(s) pushed ({fmt_bytes(t.get('bytes_put', 0))}), "
             f"{t.get('files_cached', 0)} already cached")
        echo(f"load model: {r.load_ms:.3f}ms")
        echo(f"=== prepare: {r.prepare_ms:.3f}ms; going to warmup")
        if len(o.case_indices) > 1:
            echo(f"=== going to run {len(o.case_indices)} testcases")
        for pos, ci in enumerate(o.case_indices):
            case = r.cases[pos]
            for k, w in enumerate(case.warmup_ms):
                echo(f"warmup {k}: {w:.3f}ms")
            n = len(case.iter_ms)
            echo(f"=== going to run input for {n} times")
            for k, ms in enumerate(case.iter_ms):
                echo(f"iter {k}/{n}: {ms:.3f}ms")
            s = timing_summary(case.iter_ms)
            echo(f"=== finished test #{ci}: time={s['total_ms']:.3f}ms avg_time={s['avg_ms']:.3f}ms "
                 f"sd={s['sd_ms']:.3f}ms minmax={s['min_ms']:.3f},{s['max_ms']:.3f}")
        for check in o.checks:
            self._print_check(check)
        for note in o.notes:
            echo(f"note: {note}")
        for what, where in o.written.items():
            echo(f"wrote {what.replace('_', '-')}: {where}")
        if r.workdir:
            echo(f"kept work directory on {r.spec}: {r.workdir} (remove it with "
                 f"`verify devices clean {r.spec}`)")
        verdict = o.passed
        if verdict is None:
            echo("=== no check (no ground truth)")
        elif verdict:
            echo(click.style(f"=== PASS: all outputs within tolerance in {len(o.checks)} case(s)",
                             fg="green"))
        else:
            bad = sum(1 for c in o.checks for d in (c.diffs or ()) if not d.passed)
            echo(click.style(f"=== FAIL: {bad} output(s) over tolerance", fg="red", bold=True))

    def _print_check(self, check: Any) -> None:
        if check.diffs is None:
            return
        for d in check.diffs:
            mark = click.style("PASS", fg="green") if d.passed else click.style("FAIL", fg="red", bold=True)
            click.echo(f"check #{check.index}: {d.name}: {describe_diff(d)}  [{d.rule}]  {mark}")
            if not d.passed and d.reason:
                click.echo(f"    {d.reason}")
            if getattr(d, "note", ""):
                click.echo(f"    note: {d.note}: this check can tell little")


def describe_diff(d: Any) -> str:
    parts = [f"max_abs={_g(d.max_abs)}", f"max_rel={_g(d.max_rel)}"]
    if getattr(d, "cosine", None) is not None:
        parts.append(f"cos={_cos(d.cosine)}")
    if "sqnr" in getattr(d, "rule", "") and getattr(d, "sqnr_db", None) is not None:
        parts.append(f"sqnr={d.sqnr_db:.1f}dB")
    if d.nan_actual or d.nan_reference:
        parts.append(f"NaN {d.nan_actual}/{d.nan_reference}")
    if d.inf_actual or d.inf_reference:
        parts.append(f"Inf {d.inf_actual}/{d.inf_reference}")
    return " ".join(parts)


def _g(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}"


def _cos(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.9f}" if x > 0.999 else f"{x:.4f}"


def run_document(o: "RunOutcome") -> dict[str, Any]:
    r = o.run
    return {
        "archive": str(o.testcase.path), "device": {"spec": r.spec, **dict(r.device)},
        "options": {"iterations": r.options.timed.iterations, "warmup": r.options.timed.warmup,
                    "opt_level": r.options.session.opt_level,
                    "threads": r.options.session.threads,
                    "providers": list(r.providers)},
        "load_ms": r.load_ms, "prepare_ms": r.prepare_ms,
        "transfers": dict(r.transfers),
        "cases": [{"index": ci, "warmup_ms": list(r.cases[pos].warmup_ms),
                   "iter_ms": list(r.cases[pos].iter_ms),
                   "timing": timing_summary(r.cases[pos].iter_ms),
                   "check": None if o.checks[pos].diffs is None
                   else [d.to_dict() for d in o.checks[pos].diffs]}
                  for pos, ci in enumerate(o.case_indices)],
        "passed": o.passed, "notes": list(o.notes), "written": dict(o.written),
        "kept_workdir": r.workdir,
    }


# --- devices ------------------------------------------------------------------------------------
def profile_row(p: "Profile") -> dict[str, Any]:
    return {"name": p.name, "spec": p.target, "transport": p.transport,
            "description": p.description, "providers": list(p.providers),
            "runner": "native" if p.runner else "python", "file": str(p.source or "")}


def print_profiles(rows: Sequence[Mapping[str, Any]]) -> None:
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False)
    for col in ("name", "transport", "address / spec", "runner", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["transport"], r["spec"], r["runner"], r["description"])
    console().print(table)


def print_device(info: Mapping[str, Any]) -> None:
    echo = click.echo
    echo(f"device {info.get('spec')}: reachable")
    if info.get("runner"):  # a runner other than runner.py names itself (the native one)
        echo(f"  {'runner':12} {info['runner']}")
    for key, label in (("arch", "arch"), ("os", "os"), ("hostname", "hostname"),
                       ("python", "python"), ("numpy", "numpy"), ("onnxruntime", "onnxruntime"),
                       ("cpu_count", "cpus")):
        echo(f"  {label:12} {info.get(key)}")
    echo(f"  {'providers':12} {', '.join(info.get('providers') or []) or 'none'}")
    free = info.get("free_disk_bytes")
    echo(f"  {'free disk':12} {fmt_bytes(free) if free is not None else '?'}")
    cache = info.get("cache")
    if isinstance(cache, dict):
        parts = cache.get("partial_transfers", 0)
        echo(f"  {'cache':12} {fmt_bytes(cache.get('bytes', 0))} in {cache.get('files', 0)} "
             f"file(s)" + (f", {parts} partial transfer(s)" if parts else "")
             + " (trim it: verify devices clean SPEC --keep-mb N)")
    if info.get("transfer_method"):
        echo(f"  {'transfers':12} {info['transfer_method']}")
    for key in ("numpy_error", "onnxruntime_error"):
        if info.get(key):
            echo(f"  warning: {info[key]}")
