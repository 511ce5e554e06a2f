"""`verify inspect`."""

from __future__ import annotations

from pathlib import Path

import click

from verify.cli import CONTEXT, cli, emit_json, json_option, render
from verify.errors import EXIT_OK


# --- inspect-------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.argument("archive", type=click.Path(path_type=Path))
@json_option
def inspect(archive: Path, as_json: bool) -> int:
    """Show what a .vtc archive holds: model, inputs/outputs, cases, tolerances, provenance.

    \b
      verify inspect cnn.vtc
      verify inspect cnn.vtc --json | jq .provenance
    """
    from verify.testcase import read_archive

    summary = render.inspect_summary(read_archive(archive))
    if as_json:
        emit_json(summary)
    else:
        render.print_inspect(summary)
    return EXIT_OK
