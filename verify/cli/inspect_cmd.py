"""`verify inspect`."""

from __future__ import annotations

from pathlib import Path

import click

from verify.cli import CONTEXT, cli, emit_json, json_option, render_archive
from verify.errors import EXIT_OK


# --- inspect-------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.argument("archive", type=click.Path(path_type=Path))
@json_option
def inspect(archive: Path, as_json: bool) -> int:
    """Show what a .vtc archive holds: model, inputs/outputs, cases, tolerances, provenance.
    Given a plain ONNX model, show the model part (ops, inputs and outputs with their
    dynamic dims). Which it is goes by the file's content, not its name.

    Checks all of it first, as `verify run` would: every tensor and the model against their
    checksums (per-layer references included), the cases against the model's inputs and
    outputs (names, dtypes, shapes). Anything wrong is one line and exit 2.

    \b
      verify inspect cnn.vtc
      verify inspect cnn.vtc --json | jq .provenance
      verify inspect model.onnx
    """
    from verify.files import read_head
    from verify.schema import SIGNATURE

    # by content, as run decides: an archive named .onnx is an archive, a model named
    # otherwise (model.pb, a file without a suffix) a model; a .vtc that is no HDF5 file gets
    # the archive reader's error
    if (archive.is_file() and archive.suffix.lower() != ".vtc"
            and read_head(archive, len(SIGNATURE)) != SIGNATURE):
        from verify.graph import load_model

        _, data, external = load_model(archive, keep_external=True)  # weights not read
        summary = render_archive.model_summary(archive, data, external)
        if as_json:
            emit_json(summary, "inspect-model")
        else:
            render_archive.print_model(summary)
        return EXIT_OK
    from verify.archive_check import check_cases
    from verify.archive_reader import ArchiveReader
    from verify.graph import parse_model
    from verify.schema import LAYERS
    from verify.tolerance import tolerance_set

    with ArchiveReader(archive) as reader:
        tc = reader.testcase()
        layers = 0
        for case in reader.cases:  # one at a time: read, checked, dropped
            for entry in case.get(LAYERS, ()):
                reader.read(entry)
                layers += 1
        reader.check_external()
    check_cases(tc, parse_model(tc.model_bytes, f"{archive}: the archive's model", tc.external))
    tolerance_set(tc.tolerances, None, None, ())  # a record run would refuse: refused here
    summary = render_archive.inspect_summary(tc)
    tensors = sum(len(c.inputs) + len(c.outputs) for c in tc.cases) + layers
    summary["integrity"] = (f"verified: the model, {tensors} tensor(s) and "
                            f"{len(tc.external)} external data file(s) match their checksums"
                            if tc.external else
                            f"verified: the model and {tensors} tensor(s) match their checksums"
                            if tc.checked else
                            f"not verified: archive format {tc.format_version} has no checksums "
                            "(re-pack it)")
    if as_json:
        emit_json(summary, "inspect")
    else:
        render_archive.print_inspect(summary)
    return EXIT_OK
