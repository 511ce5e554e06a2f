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
    dynamic dims). Which it is goes by the file's content, not its name. Given a
    --bin-io-dump folder, show where and how it was captured, its cases and tensors, after
    reading every tensor back against its manifest.

    Checks all of it first, as `verify run` would: every tensor and the model against their
    checksums (per-layer references included), the cases against the model's inputs and
    outputs (names, dtypes, shapes). Anything wrong is one line and exit 2.

    \b
      verify inspect cnn.vtc
      verify inspect cnn.vtc --json | jq .provenance
      verify inspect model.onnx
      verify inspect phone/
    """
    from verify.files import read_head
    from verify.iodump import is_io_dump
    from verify.schema import SIGNATURE

    if archive.is_dir():
        from verify.dump import dump_summary, open_dump

        summary = dump_summary(open_dump(archive))
        if as_json:
            emit_json(summary, "inspect-dump")
        else:
            _print_dump(summary)
        return EXIT_OK
    if archive.is_file() and is_io_dump(archive):
        from verify.errors import UsageError

        raise UsageError(f"{archive}: a text io-dump (--io-dump), to be read as text; inspect "
                         "reads archives, models and --bin-io-dump folders")

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


def _print_dump(s: dict) -> None:
    from verify.cli.render import fmt_bytes
    from verify.runner.contract import Describe as D
    from verify.runner.contract import Manifest as M
    from verify.runner.contract import ManifestOptions as MO

    echo = click.echo
    device, options = s[M.DEVICE] or {}, s[M.OPTIONS] or {}
    where = " ".join(str(device[k]) for k in (D.ARCH, D.OS) if device.get(k))
    echo(f"{s['folder']}: a verify dump (format {s[M.FORMAT_VERSION]}), written "
         f"{s[M.CREATED_UTC] or '?'} by verify {s[M.VERIFY] or '?'}")
    echo(f"device: {s[M.SPEC] or '?'}: {where or '?'}"
         + (f", onnxruntime {device[D.ONNXRUNTIME]}" if device.get(D.ONNXRUNTIME) else "")
         + f"; providers {', '.join(s[M.PROVIDERS]) or '?'}")
    budget = MO.BUDGET_BYTES.of(options)
    echo(f"run: opt-level {MO.OPT_LEVEL.of(options) or '?'}; captured the {s[M.GRAPH]} graph at "
         f"{MO.CAPTURED_AT_OPT_LEVEL.of(options)}"
         + (f", budget {fmt_bytes(budget)}" if budget else "") + f", {s[M.SEGMENTS]} segment(s)"
         + (f"; --dump-filter {MO.FILTER.of(options)!r}" if MO.FILTER.of(options) else "")
         + ("; --dump-stats-only" if MO.STATS_ONLY.of(options) else ""))
    for c in s["case_counts"]:
        echo(f"case {c['number']}: {c['tensor_count']} tensor(s), {fmt_bytes(c['tensor_bytes'])}")
    if s["fused_away_count"]:
        echo(f"fused away by the optimizer: {s['fused_away_count']} tensor(s) of the model")
    missing = s[M.NOT_CAPTURED]
    if missing:
        echo(f"not captured (no .npy form): {', '.join(missing[:5])}"
             + (" …" if len(missing) > 5 else ""))
    if s[M.SUBGRAPH_TENSORS]:
        echo(f"inside If/Loop/Scan bodies, not captured: {s[M.SUBGRAPH_TENSORS]} tensor(s)")
    echo(f"model sha256 {s[M.MODEL_SHA256] or '?'}")
    echo(f"verified: {s['verified']} tensor(s) read back, matching the manifest (dtype, shape, "
         "length)" if s["verified"] else "no tensor files (a --dump-stats-only dump)")
