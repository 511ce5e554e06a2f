"""`verify pack`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from verify.cli import CONTEXT, cli, emit_json, json_option, render_archive
from verify.cli.groups import tolerance_group
from verify.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from verify.options import Tolerances


# --- pack----------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-d", "--data", multiple=True, metavar="SPEC",
              help="Input data: FILE or NAME:FILE (.npy .npz .json .pb, or any image Pillow "
                   "reads), a literal NAME:[[1,2]], NAME:rand (floats in [-1,1), ints in "
                   "[0,10)) or NAME:rand(L,H) (in [L,H)). Repeat for more inputs; a repeated "
                   "input name starts a new case. Omitted inputs get seeded random data. Whole "
                   "cases from another tool: an onnx_test_runner folder "
                   "(test_data_set_N/input_K.pb; its output_K.pb become the ground truth) or a "
                   "Polygraphy --save-inputs JSON file.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Archive to write (default: MODEL with .vtc).")
@click.option("--shape", "shapes", multiple=True, metavar="NAME:DIMS",
              help="Shape for an input with dynamic dims, e.g. data:1x3x224x224 (NAME: "
                   "may be left out when the model has one input).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random inputs.")
@click.option("--mean", default=None, metavar="M[,M,M]", help="Image preprocessing: subtract per channel (after --scale).")
@click.option("--std", default=None, metavar="S[,S,S]", help="Image preprocessing: divide per channel.")
@click.option("--scale", type=float, default=1.0, show_default=True, help="Image preprocessing: multiply pixels (e.g. 0.00392 for 1/255).")
@click.option("--bgr", is_flag=True, help="Image preprocessing: channels in BGR order.")
@click.option("--layout", type=click.Choice(["nchw", "nhwc"]), default=None,
              help="Image layout (default: inferred from the input's shape).")
@click.option("--expected", multiple=True, metavar="[NAME:]FILE",
              help="Ground truth computed elsewhere, stored instead of this host's: a "
                   "Polygraphy --save-outputs JSON, an onnx_test_runner folder, a .npz by "
                   "output name, or NAME:FILE per output (a repeated NAME starts the next "
                   "case). Checked against this host's run for names, shapes and dtypes; "
                   "where this host's values already differ beyond the tolerances, a "
                   "WARNING names the first output.")
@click.option("--layers", is_flag=True,
              help="Also store the reference value of every intermediate tensor (one of a "
                   "type numpy has no form for, bfloat16, float8, string, is left out and "
                   "named in a note).")
@click.option("--reference", default="onnxruntime", show_default=True, metavar="REF",
              help="Who computes the ground truth: onnxruntime (CPU provider, optimizations "
                   "off) or torch:PROGRAM, PROGRAM a torch.export program saved as .pt2 or "
                   "FILE.py:FACTORY returning the module (or (module, example_inputs)); "
                   "needs pip install 'onnx-verify[torch]'. With --layers, every FX node's value "
                   "is mapped onto the ONNX tensor the exporter made of it.")
@click.option("--keep-external-data", "keep_external", is_flag=True,
              help="Keep a model's external data files as such (stored beside the model in "
                   "the archive, pushed beside it to the device) even when they fit in one "
                   "2 GiB message; over 2 GiB they always are.")
@tolerance_group
@json_option
def pack(model: Path, data: tuple[str, ...], output: Path | None, shapes: tuple[str, ...],
         seed: int, mean: str | None, std: str | None, scale: float, bgr: bool,
         layout: str | None, expected: tuple[str, ...], layers: bool, reference: str,
         keep_external: bool, tolerances: "Tolerances", as_json: bool) -> int:
    """Pack MODEL, its inputs and ground-truth outputs into one .vtc testcase archive.

    Ground truth is computed here, on the host, by ONNX Runtime's CPU provider with
    graph optimizations off, or by PyTorch on the CPU (--reference torch:PROGRAM); then
    onnxruntime on this host is checked against PyTorch, and where it already differs
    (the export changed the numbers) is recorded and reported.

    \b
      verify pack goldens/models/cnn.onnx -d goldens/images/sample.png --scale 0.00392 -o cnn.vtc
      verify pack resnet18.onnx --reference torch:resnet18.pt2 --layers -o r18.vtc
      verify pack two_io.onnx -d a:a.npy -d b:b.npy -d a:a2.npy -d b:b2.npy   (2 cases)
      verify pack model.onnx -d model_dir/            (onnx_test_runner's test_data_set_N)
      verify pack model.onnx -d inputs.json --expected outputs.json   (Polygraphy's files)
    """
    from verify import pack as packing
    from verify.inputs import Preprocess, parse_shape_options
    from verify.files import check_output_file
    from verify.foreign import is_case_file
    from verify.tolerance import tolerance_record

    out = output or model.with_suffix(".vtc")
    if not out.is_dir():  # a folder: pack's own message names what to give
        # every file the archive is made from: [NAME:]FILE specs by their whole text and
        # their FILE; a torch:PROGRAM reference by its .pt2, or the FILE.py of FILE.py:FACTORY
        inputs: list[tuple[str, str | Path]] = [("the model", model)]
        for what, specs in (("a -d file", data), ("an --expected file", expected)):
            inputs += [(what, spec) for spec in specs]
            inputs += [(what, spec.split(":", 1)[1]) for spec in specs if ":" in spec]
            # a file a -d/--expected folder's cases are read from (onnx_test_runner's
            # test_data_set_N/input_K.pb) is one too; the folder's other files are not
            folders = [Path(p) for spec in specs for p in {spec, spec.split(":", 1)[-1]}
                       if Path(p).is_dir()]
            inputs += [(f"a file of the {what.split()[1]} folder {d}", out) for d in folders
                       if out.is_file() and is_case_file(d, out)]
        program = reference[len("torch:"):] if reference.startswith("torch:") else ""
        if program:
            inputs.append(("the --reference program", program.split(".py:", 1)[0] + ".py"
                           if ".py:" in program else program))
        check_output_file(out, "-o", inputs)
    pre = Preprocess(mean=_floats(mean, "--mean"), std=_floats(std, "--std"), scale=scale,
                     bgr=bgr, layout=layout)
    options = packing.PackOptions(
        data=data, shapes=parse_shape_options(shapes), seed=seed, pre=pre,
        tolerances=tolerance_record(tolerances.atol, tolerances.rtol, tolerances.specs),
        layers=layers, expected=expected, reference=reference, keep_external=keep_external)
    notes: list[str] = []
    tc = packing.pack(model, out, options, note=notes.append)
    from verify.execute import unmatched_spec_notes  # a glob that matches nothing: as run says

    notes += unmatched_spec_notes(tolerances.specs, list(tc.cases[0].outputs) if tc.cases else [],
                                  layers=[t.name for t in tc.tensor_order])  # diff judges them
    summary = {**render_archive.pack_summary(tc, out), "notes": notes}
    if as_json:
        emit_json(summary, "pack")
    else:
        click.echo(render_archive.pack_text(summary))
        for text in notes:
            click.echo(f"note: {text}")
    return EXIT_OK


def _floats(text: str | None, option: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise UsageError(f"{option} takes numbers separated by commas, got {text!r}") from None
