"""`verify run`."""

from __future__ import annotations

from pathlib import Path

import click

from verify.cli import CONTEXT, cli, emit_json, json_option, render
from verify.cli.groups import (
    archive_selection,
    device_target,
    option_group,
    session_settings,
    timed_runs,
)
from verify.options import (
    ArchiveSelection,
    DeviceTarget,
    DumpOptions,
    SessionSettings,
    TimedRuns,
)
from verify.errors import EXIT_MISMATCH, EXIT_OK, UsageError


def _dump(bin_io_dump: Path | None, io_dump: Path | None, dump_budget_mb: float | None,
          dump_filter: str | None, dump_stats_only: bool) -> DumpOptions:
    return DumpOptions(bin_io_dump, io_dump, dump_budget_mb, dump_filter, dump_stats_only)


dump_options = option_group("dump", _dump, (
    click.option("--bin-io-dump", type=click.Path(path_type=Path), default=None, metavar="DIR",
                 help="Capture every layer's output into DIR (manifest.json, and per case "
                      "captured one c<k>.npys holding its tensors as .npy images at the "
                      "manifest's offsets) after the timed run, each node run once, in "
                      "segments whose live "
                      "tensors fit the budget; compare two with `verify diff`. DIR: new, "
                      "empty or an earlier dump, which is replaced only once the run has "
                      "succeeded. The manifest's per-tensor summaries (min, max, mean, std, "
                      "NaN/Inf, first values) are computed only with --io-dump too (or "
                      "--dump-stats-only)."),
    click.option("--io-dump", type=click.Path(path_type=Path), default=None, metavar="FILE",
                 help="Write every layer's summary as text (shape, first values, min, max, "
                      "mean, std, NaN/Inf), one block per tensor; diffable with diff/vimdiff. "
                      "With --bin-io-dump, its manifest holds the summaries too."),
    click.option("--dump-budget-mb", type=float, default=None, metavar="MB",
                 help="Live tensors per dump segment (default: 1.5x the model's size, at "
                      "least 16, at most 1/16 of the device's memory, raised to half of what a "
                      "plain run holds at once); a node larger than it runs alone."),
    click.option("--dump-filter", default=None, metavar="REGEX",
                 help="Dump only tensors whose name or producing node's name matches REGEX "
                      "(and the graph inputs)."),
    click.option("--dump-stats-only", is_flag=True,
                 help="Compute the per-tensor summary on the device and transfer no tensors.")))


# --- run-----------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@archive_selection("Run only this case of the archive (default: all).")
@device_target("the runner's job (load, warmups, iterations, dumps)")
@timed_runs("case")
@session_settings()
@click.option("--input", "input_overrides", multiple=True, metavar="NAME:FILE",
              help="Override a case input with a file, read as pack -d reads it (an image "
                   "for a dynamic-size input takes the case's size); there is then no ground "
                   "truth to check.")
@click.option("--bin-out-dump", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Write the final outputs as .npy files (one per case and output) and "
                   "outputs.json into DIR: new, empty or an earlier run's, whose files are "
                   "replaced as a whole once the run has succeeded.")
@dump_options
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), default=None,
              help="Write ONNX Runtime's per-node profile (Chrome trace JSON) here.")
@click.option("--keep", is_flag=True, help="Keep the work directory on the device (for debugging).")
@json_option
def run(selection: ArchiveSelection, device: DeviceTarget, timed: TimedRuns,
        session: SessionSettings, input_overrides: tuple[str, ...], bin_out_dump: Path | None,
        dump: DumpOptions, profile_path: Path | None, keep: bool, as_json: bool) -> int:
    """Run ARCHIVE on a device, time it like load_and_run, and check the outputs.

    Prints model load and prepare times, each warmup and iteration, the total, average,
    standard deviation and min/max, then per output the error against the ground truth
    and whether it is within tolerance.

    \b
      verify run cnn.vtc --device local --iter 10 --warmup 1
      verify run cnn.vtc --device ssh:me@board --opt-level disable
      verify run cnn.vtc --device arm64 --bin-out-dump arm64-out/
      verify run cnn.vtc --device arm64 --bin-io-dump arm64-layers/ --io-dump arm64.txt
    """
    from verify import execute
    from verify.files import check_output_file

    taken: list[tuple[str, Path | str | None]] = [("the archive", selection.archive)]
    folders = [(o, Path(f).resolve()) for o, f in (("--bin-io-dump", dump.bin_io_dump),
                                                   ("--bin-out-dump", bin_out_dump)) if f]
    for option, path in (("--io-dump", dump.io_dump), ("--profile", profile_path)):
        if path is not None and not Path(path).is_dir():  # a folder: execute's own message
            check_output_file(path, option, taken)
            taken.append((f"the {option} file", path))
            for folder_option, folder in folders:  # a dump folder holds its own files only
                if folder in Path(path).resolve().parents:
                    raise UsageError(f"{option} {path}: is inside the {folder_option} folder, "
                                     "which holds the dump's own files only; give a path "
                                     "outside it")
    request = execute.RunRequest(selection, device, session, timed, dump,
                                 input_overrides=input_overrides, bin_out_dump=bin_out_dump,
                                 profile_path=profile_path, keep=keep)
    live = None if as_json else render.RunPrinter()
    outcome = execute.run(request, status=live.status if live else None,
                          progress=render.progress_factory() if live else None)
    if outcome.run.ort_log:  # asked for with --ort-log: onnxruntime's log on the device
        click.echo(outcome.run.ort_log.rstrip("\n"), err=True)
    if as_json:
        emit_json(render.run_document(outcome), "run")
    else:
        live.print_outcome(outcome)
    return EXIT_OK if outcome.passed is not False else EXIT_MISMATCH
