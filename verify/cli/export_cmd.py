"""`verify export`: the model inside an archive as an ordinary .onnx file (opens in Netron)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from verify.cli import CONTEXT, cli, emit_json, json_option
from verify.errors import EXIT_OK, UsageError
from verify.files import (check_output_dir, check_output_file, made_dirs, remove_empty_dirs,
                          same_file, write_bytes_atomic)

if TYPE_CHECKING:
    from verify.testcase import Testcase


@cli.command(context_settings=CONTEXT)
@click.argument("archive", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Where to write the model (default: ARCHIVE with the suffix .onnx).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False),
              default=None,
              help="Also write each case's inputs and outputs in this folder as "
                   "onnx_test_runner's test_data_set_N/input_K.pb and output_K.pb, and as "
                   "Polygraphy's polygraphy_inputs.json and polygraphy_outputs.json "
                   "(polygraphy run --load-inputs / --load-outputs).")
@click.option("--force", is_flag=True,
              help="Replace a file already there that holds other bytes than the archive's "
                   "(by default refused: ARCHIVE.onnx is often the model you packed, and may "
                   "have changed since).")
@json_option
def export(archive: Path, output: Path | None, data_dir: Path | None, force: bool,
           as_json: bool) -> int:
    """Write the ONNX model held in ARCHIVE to a file (open it in Netron, or any ONNX tool).

    A model whose weights the archive keeps as external data gets its data files written
    beside it, under the names the model gives them.

    \b
      verify export cnn.repro-block2_conv1.vtc -o block2_conv1.onnx
      verify export cnn.vtc -o cnn.onnx --data cnn-data/    # plus test_data_set_0/*.pb
    """
    from verify.archive_reader import export_external, read_archive
    from verify.graph import parse_model

    target = output if output is not None else archive.with_suffix(".onnx")
    if same_file(target, archive):
        raise UsageError(f"{target}: would overwrite the archive itself; pass -o model.onnx")
    check_output_file(target, "-o")  # not a link or a device, which --force would replace
    if data_dir is not None:
        check_output_dir(data_dir, "--data")
        from verify.dump import MANIFEST

        if (data_dir / MANIFEST).exists():  # a dump folder holds its own files only
            raise UsageError(f"--data {data_dir}: is a verify dump folder (it holds "
                             "manifest.json); writing there would break it, give another folder")
    tc = read_archive(archive)
    parse_model(tc.model_bytes, str(archive), tc.external)  # a corrupt model is an error, not a file
    if any((target.parent / f.location).resolve() == target.resolve() for f in tc.external):
        raise UsageError(f"{target}: the model's external data is named so; pick another name")
    if not force:
        _refuse_to_replace(tc, target)
    written = {"model": str(target)}
    with made_dirs(target.parent):  # a missing folder is made, as for every output
        for k, path in enumerate(export_external(tc, target.parent)):  # first: the model
            written[f"external data {k}" if k else "external data"] = str(path)  # needs them
        write_bytes_atomic(target, tc.model_bytes)
    if data_dir is not None:
        written["data"] = str(_write_test_data(tc, data_dir))
    if as_json:
        emit_json({"archive": str(archive), **written,
                   "model_sha256": tc.provenance.get("model_sha256", "")}, "export")
    else:
        for what, where in written.items():
            click.echo(f"wrote {what}: {where}")
    return EXIT_OK


def _refuse_to_replace(tc: "Testcase", target: Path) -> None:
    """A file already at the model's or an external data file's place that holds other bytes
    (the user's own model, edited since it was packed) is not replaced without --force; one
    that holds the same bytes is rewritten as it was."""
    from verify.external import file_sha256

    clash = None
    if target.exists() and not (target.is_file()
                                and target.stat().st_size == len(tc.model_bytes)
                                and target.read_bytes() == tc.model_bytes):
        clash = target
    for f in tc.external:
        dest = target.parent / f.location
        if clash is None and dest.exists() and not (
                dest.is_file() and dest.stat().st_size == f.size
                and (not f.sha256 or file_sha256(dest) == f.sha256)):
            clash = dest
    if clash is not None:
        raise UsageError(f"{clash}: already exists and differs from the archive's copy; pass "
                         "another -o to write the model elsewhere, or --force to replace it")


def _write_test_data(tc: "Testcase", folder: Path) -> Path:
    """onnx_test_runner's layout (test_data_set_N/{input,output}_K.pb) and Polygraphy's JSON."""
    from onnx import numpy_helper

    from verify.foreign import polygraphy_inputs, polygraphy_outputs

    written: list[Path] = []
    # all of it or nothing: on failure the files written so far go, then the folders made here
    with made_dirs(folder):
        for i, case in enumerate(tc.cases):
            with made_dirs(folder / f"test_data_set_{i}") as case_dir:
                try:
                    for kind, values in (("input", case.inputs), ("output", case.outputs)):
                        for k, (name, value) in enumerate(values.items()):
                            proto = numpy_helper.from_array(value, name)
                            written.append(case_dir / f"{kind}_{k}.pb")
                            write_bytes_atomic(written[-1], proto.SerializeToString())
                except BaseException:
                    for path in written:
                        path.unlink(missing_ok=True)
                    remove_empty_dirs(sorted({p.parent for p in written} - {case_dir}))
                    raise
    write_bytes_atomic(folder / "polygraphy_inputs.json",
                       polygraphy_inputs([case.inputs for case in tc.cases]).encode())
    write_bytes_atomic(folder / "polygraphy_outputs.json",
                       polygraphy_outputs([case.outputs for case in tc.cases],
                                          "verify-ground-truth").encode())
    return folder
