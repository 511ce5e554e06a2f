"""`verify run`."""

from __future__ import annotations

from pathlib import Path

import click

from verify.cli import (
    CONTEXT,
    cli,
    device_option,
    emit_json,
    insecure_host_key_option,
    iteration_options,
    json_option,
    render,
    session_options,
    timeout_option,
    tolerance_options,
)
from verify.errors import EXIT_MISMATCH, EXIT_OK


# --- run-----------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.argument("archive", type=click.Path(path_type=Path))
@device_option
@iteration_options("case")
@session_options()
@click.option("--input", "input_overrides", multiple=True, metavar="NAME:FILE",
              help="Override a case input with a file; there is then no ground truth to check.")
@click.option("--case", "case_index", type=int, default=None,
              help="Run only this case of the archive (default: all).")
@click.option("--bin-out-dump", type=click.Path(path_type=Path), default=None,
              help="Write the final outputs as .npy files into this folder.")
@click.option("--bin-io-dump", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Capture every layer's output into DIR (manifest.json + one .npy per "
                   "tensor) after the timed run, each node run once, in segments whose live "
                   "tensors fit the budget; compare two with `verify diff`.")
@click.option("--io-dump", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Write every layer's summary as text (shape, first values, min, max, mean, "
                   "std, NaN/Inf), one block per tensor; diffable with diff/vimdiff.")
@click.option("--dump-budget-mb", type=float, default=None, metavar="MB",
              help="Live tensors per dump segment (default: 1.5x the model's size, at "
                   "least 16, at most 1/16 of the device's memory, raised to half of what a "
                   "plain run holds at once); a node larger than it runs alone.")
@click.option("--dump-filter", default=None, metavar="REGEX",
              help="Dump only tensors whose name or producing node's name matches REGEX.")
@click.option("--dump-stats-only", is_flag=True,
              help="Compute the per-tensor summary on the device and transfer no tensors.")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), default=None,
              help="Write ONNX Runtime's per-node profile (Chrome trace JSON) here.")
@timeout_option("the device")
@click.option("--keep", is_flag=True, help="Keep the work directory on the device (for debugging).")
@insecure_host_key_option
@tolerance_options
@json_option
def run(archive: Path, device_spec: str, iterations: int, warmup: int, providers: tuple[str, ...],
        opt_level: str, threads: int, input_overrides: tuple[str, ...], case_index: int | None,
        bin_out_dump: Path | None, bin_io_dump: Path | None, io_dump: Path | None,
        dump_budget_mb: float | None, dump_filter: str | None, dump_stats_only: bool,
        profile_path: Path | None, timeout: float | None, keep: bool,
        insecure_host_key: bool, atol: float | None, rtol: float | None,
        tol_specs: tuple[str, ...], as_json: bool) -> int:
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

    request = execute.RunRequest(
        archive=archive, device=device_spec, iterations=iterations, warmup=warmup,
        providers=providers, opt_level=opt_level, threads=threads,
        input_overrides=input_overrides, case_index=case_index, bin_out_dump=bin_out_dump,
        bin_io_dump=bin_io_dump, io_dump=io_dump, dump_budget_mb=dump_budget_mb,
        dump_filter=dump_filter, dump_stats_only=dump_stats_only,
        profile_path=profile_path, timeout=timeout, keep=keep,
        insecure_host_key=insecure_host_key, atol=atol, rtol=rtol, tol_specs=tol_specs)
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
