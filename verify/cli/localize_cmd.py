"""`verify localize`: the report on the terminal, the JSON document, the exit code."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from verify.cli import CONTEXT, cli, emit_json, json_option, render
from verify.cli.groups import archive_selection, device_target, session_settings
from verify.errors import EXIT_MISMATCH, EXIT_OK
from verify.graph import INPUT_OP

if TYPE_CHECKING:
    from verify.compare import TensorDiff
    from verify.localize import LocalizeResult, NodeFinding, Step
    from verify.options import ArchiveSelection, DeviceTarget, SessionSettings

SHOW_PROPAGATED = 4    # propagated suspects listed in the text report (--json has all)
SHOW_PATH_TAIL = 4     # path steps always shown before the suspect


@cli.command(context_settings=CONTEXT)
@archive_selection("Which case of the archive to localize with (default: the first whose "
                   "outputs fail on the device).", click.IntRange(min=0))
@device_target("each device round trip")
@click.option("--no-dump", is_flag=True,
              help="Do not compare every layer: bisect with subgraph runs instead "
                   "(O(log n) device round trips; for models too big to dump).")
@click.option("--fanout", type=click.IntRange(min=2), default=2, show_default=True,
              help="Bisection: parts per round trip (more parts, fewer trips).")
@click.option("--max-isolated", type=click.IntRange(min=1), default=16, show_default=True,
              help="Per-layer mode: how many ranked suspects to run in isolation.")
@click.option("--budget", "budget_mb", type=click.IntRange(min=1), default=512,
              show_default=True,
              help="MB the per-layer references may take: a model whose activations need "
                   "more is bisected instead.")
@session_settings(" on the device")
@click.option("-o", "--out-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder for the repro archive (default: beside ARCHIVE).")
@click.option("--no-repro", is_flag=True, help="Do not write a repro archive.")
@json_option
def localize(selection: "ArchiveSelection", device: "DeviceTarget", no_dump: bool, fanout: int,
             max_isolated: int, budget_mb: int, session: "SessionSettings",
             out_dir: Path | None, no_repro: bool, as_json: bool) -> int:
    """Find the node that computes wrong on a device, and write a one-node repro archive.

    Runs ARCHIVE's model on the device and compares every layer with the reference (or, with
    --no-dump, bisects the graph with subgraphs fed reference inputs). Suspects are re-run in
    isolation on the device, each fed the reference values of its inputs, so a node whose own
    output is wrong ("faulty here") is told apart from one that only inherits error from
    upstream ("propagated"). The failing node, or the smallest failing subgraph, is written
    as ARCHIVE-STEM.repro-NODE.vtc, which fails on that device and passes on --device local.

    \b
      verify localize cnn.vtc --device adb:phone
      verify localize cnn.vtc --device ssh:me@board --no-dump --json
      verify run cnn.repro-block2_conv1.vtc --device adb:phone    # the repro fails there

    Exit codes: 0 nothing over tolerance, 1 a faulty node or subgraph was found (repro
    written), 2 bad input, 3 device trouble.
    """
    from verify import localize as loc
    from verify.files import check_output_dir

    if not no_repro:  # before the search, which may take long: not after it
        check_output_dir(out_dir if out_dir is not None else selection.archive.parent,
                         "-o" if out_dir is not None else "-o (by default ARCHIVE's folder)")
    request = loc.LocalizeRequest(
        selection, device, session, mode="bisect" if no_dump else "auto", fanout=fanout,
        max_isolated=max_isolated, budget_bytes=budget_mb << 20, out_dir=out_dir,
        write_repro=not no_repro)
    printer = None if as_json else render.RunPrinter()
    result = loc.localize(request, status=printer.status if printer else None)
    if as_json:
        emit_json(localize_document(result), "localize")
    else:
        print_report(result, device.insecure_host_key)
    return EXIT_MISMATCH if result.found else EXIT_OK


# --- rendering ---------------------------------------------------------------------------------
def input_shape(shape: list[int] | None) -> str:
    """A faulty node's input shape: `()` is a scalar's (it read '(?)', as an unknown one)."""
    return "(?)" if shape is None else "() scalar" if not shape else render.fmt_shape(shape)


def _units(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}x tol"


def _diff_line(d: "TensorDiff | None", fed: bool = False) -> str:
    if d is None:
        return "(fed as is)" if fed else "(not measured)"
    mark = "ok  " if d.passed else "OVER"
    return f"{mark} max_abs={render._g(d.max_abs)} ({_units(d.tol_units)})"


def _worst(diffs: "tuple[TensorDiff, ...]") -> "TensorDiff | None":
    from verify.localize.search import worst

    return max(diffs, key=lambda d: worst([d]), default=None)


def print_report(r: "LocalizeResult", insecure_host_key: bool = False) -> None:
    from verify.localize import FAULTY

    echo = click.echo
    dev = r.device_info
    given = r.session
    echo(f"device {r.device}: {dev.get('arch', '?')} {dev.get('os', '')}, onnxruntime "
         f"{dev.get('onnxruntime', '?')}; opt-level {r.opt_level}"
         + (f"; providers {','.join(given.providers)}" if given.providers else "")
         + (f"; threads {given.threads}" if given.threads else ""))
    how = ("per-layer comparison, then suspects in isolation" if r.mode == "dump"
           else "bisection with subgraphs fed reference inputs")
    if r.mode != "dump" and any(x.purpose.startswith("per-layer run") for x in r.rounds):
        how = ("per-layer comparison (every layer within tolerance), then bisection with "
               "unmarked subgraphs fed reference inputs")
    echo(f"localizing {r.archive} case {r.case_index}: {r.node_count} nodes, {how} "
         f"(reference values: {r.reference_source})")
    for d in r.outputs:
        echo(f"output {d.name}: {_diff_line(d)}  [{d.rule}]")
    if r.first_divergent is not None:
        fd = r.first_divergent
        where = "in the full run" if r.mode == "dump" else "measured on the path"
        echo(f"first tensor over tolerance {where}: {fd.tensor} "
             f"(node {fd.node}, {fd.op}) {_diff_line(fd.diff)}")
    if r.path:
        echo("path from the inputs to the suspect (error in the full run):")
        for step in _elide_path(r.path):
            if isinstance(step, str):
                echo(f"  {step}")
                continue
            where = "graph input" if step.op == INPUT_OP else f"{step.node} ({step.op})"
            echo(f"  {step.tensor:<28} {where:<36} "
                 f"{_diff_line(step.diff, step.op == '<input>')}")
    if r.candidates:
        echo("suspects run in isolation (own error: fed reference inputs; inherited: the "
             "worst input in the full run):")
        shown = [c for c in r.candidates if c.verdict == FAULTY]
        shown += [c for c in r.candidates if c.verdict != FAULTY][:SHOW_PROPAGATED]
        for c in sorted(shown, key=lambda c: c.index):
            _print_finding(c, indent="  ")
        if len(r.candidates) > len(shown):
            echo(f"  … {len(r.candidates) - len(shown)} more propagated (--json lists them)")
    if not r.found:
        # bisection stops at passing outputs: a layer over tolerance behind them is unseen
        only = (" (the outputs only: bisection; a per-layer run also judges every layer)"
                if r.mode == "bisect" else "")
        echo(click.style(f"=== no faulty node: every tensor compared is within tolerance{only}",
                         fg="green"))
    else:
        _print_suspect(r, insecure_host_key)
    for note in r.notes:
        echo(f"note: {note}")
    trips = len(r.rounds)
    echo(f"device round trips: {trips} "
         f"({'; '.join(f'{x.purpose}' for x in r.rounds)})")


def _elide_path(path: "tuple[Step, ...]") -> list["Step | str"]:
    """The path with long runs of in-tolerance steps before the last few folded into a line."""
    from verify.localize.search import worst

    keep_tail = SHOW_PATH_TAIL
    out: list[Step | str] = []
    run: list[Step] = []
    for k, step in enumerate(path):
        quiet = step.diff is not None and step.diff.passed and k < len(path) - keep_tail
        if quiet and k > 0:
            run.append(step)
            continue
        out.extend(_fold(run, worst))
        run = []
        out.append(step)
    out.extend(_fold(run, worst))
    return out


def _fold(run: "list[Step]", worst: Any) -> "list[Step | str]":
    if len(run) <= 2:
        return list(run)
    peak = worst([s.diff for s in run if s.diff is not None])
    return [run[0], f"… {len(run) - 2} more steps within tolerance (worst {_units(peak)})",
            run[-1]]


def _print_finding(c: "NodeFinding", indent: str) -> None:
    from verify.localize import FAULTY
    from verify.localize.search import worst

    echo = click.echo
    verdict = c.verdict
    color = "red" if verdict == FAULTY else "yellow"
    echo(f"{indent}{c.name:<28} {c.op:<20} own {_units(worst(c.own)):<14} inherited "
         f"{_units(worst(c.inherited)):<14} " + click.style(verdict, fg=color, bold=True))


def _print_suspect(r: "LocalizeResult", insecure_host_key: bool = False) -> None:
    from verify.localize import FAULTY
    from verify.localize.search import worst

    echo = click.echo
    s, info = r.suspect, r.suspect_info or {}
    assert s is not None
    if r.verdict == FAULTY:
        echo(click.style(f"=== FAULTY NODE: {s.name} ({s.op}) — faulty here", fg="red",
                         bold=True))
    else:
        echo(click.style(f"=== FAILING SUBGRAPH of {len(r.subgraph)} nodes: {r.subgraph[0]} .. "
                         f"{r.subgraph[-1]} (no part of it fails alone)", fg="red", bold=True))
    attrs = ", ".join(f"{k}={v}" for k, v in info.get("attributes", {}).items())
    # a subgraph's lines below describe its first node (they read as the whole subgraph's)
    label = "node" if r.verdict == FAULTY else "first node"
    echo(f"  {label:<11} {info.get('name', s.name)}  op {info.get('op', s.op)}"
         + (f"  {attrs}" if attrs else ""))
    for inp in info.get("inputs", []):
        kind = "initializer" if inp["initializer"] else "input"
        echo(f"  {kind:<11} {inp['name']}  {input_shape(inp['shape'])}")
    if r.attribution is not None:
        for line in r.attribution.lines():
            key, sep, rest = line.partition(": ")
            echo(f"  {'pytorch':<11} {rest}" if key == "PyTorch module" else f"  {line}")
    # each figure names the tensor it was taken at: a subgraph's own error is at one of its
    # outputs, the full run's at another (the same two lines read as one tensor's)
    fed = "the subgraph fed" if r.verdict != FAULTY else "fed"
    if s.own:
        w = _worst(s.own)
        echo(f"  own error   {_diff_line(w)}  at {w.name if w else '?'}, {fed} the reference "
             f"inputs  [{w.rule if w else ''}]")
        if w is not None and not w.passed and w.reason:
            echo(f"              {w.reason}")
    echo(f"  inherited   {_units(worst(s.inherited))} (worst input"
         f"{'' if r.verdict == FAULTY else ' of the first node'} in the full run)")
    if s.cumulative:
        c = _worst(s.cumulative)
        echo(f"  full run    {_diff_line(c)} at {c.name if c else '?'}")
    if r.repro is not None:
        echo(f"wrote repro: {r.repro}")
        flags = render.session_flags(r.opt_level, r.session.providers, r.session.threads)
        # the search reached the device only with it: the replay would be refused without
        insecure = " --insecure-host-key" if insecure_host_key else ""
        echo(f"  replay:    verify run {r.repro} --device {r.device} {flags}{insecure}")
        # the ground truth's own settings: onnxruntime's CPU kernels, optimizations off
        echo(f"  reference: verify run {r.repro} --device local --opt-level disable")


def localize_document(r: "LocalizeResult") -> dict[str, Any]:
    def step(x: "Step | None") -> Any:
        return x.to_dict() if x is not None else None

    return {
        "archive": str(r.archive), "device": {"spec": r.device, **dict(r.device_info)},
        "mode": r.mode, "case": r.case_index, "opt_level": r.opt_level,
        "providers": list(r.session.providers), "threads": r.session.threads,
        "reference_source": r.reference_source, "nodes": r.node_count,
        "verdict": r.verdict, "found": r.found,
        "outputs": [d.to_dict() for d in r.outputs],
        "first_divergent": step(r.first_divergent),
        "suspect": ({**r.suspect.to_dict(), "node": dict(r.suspect_info or {}),
                     "verdict": r.verdict} if r.suspect else None),
        "subgraph": list(r.subgraph),
        "path": [step(x) for x in r.path],
        "candidates": [c.to_dict() for c in r.candidates],
        "round_trips": len(r.rounds),
        "rounds": [x.to_dict() for x in r.rounds],
        "repro": str(r.repro) if r.repro else None,
        "notes": list(r.notes),
        "attribution": r.attribution.to_dict() if r.attribution else None,
    }
