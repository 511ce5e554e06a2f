"""`verify pack`: a model, its inputs and the ground truth computed on the host, in one archive."""

from __future__ import annotations

import datetime as _dt
import getpass
import math
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from verify import __version__, schema
from verify.capture import HostCapture
from verify.dump import not_captured_text
from verify.graph import load_model, saturation_floors, sha256_bytes, tensor_order
from verify.errors import InputError, UsageError, VerifyError
from verify.external import ExternalFile
from verify.files import check_output_file
from verify.expected import (check_expected, host_agreement, read_case_sources,
                             read_expected)
from verify.inputs import RANDOM_INT_HIGH, InputInfo, Preprocess, build_cases, model_inputs
from verify.reference import check_host_io, reference_session, run_reference
from verify.testcase import Case, Testcase, write_archive
from verify.torchpack import layer_items, torch_spec, torch_truth


@dataclass(frozen=True)
class PackOptions:
    data: Sequence[str] = ()
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    seed: int = 0
    pre: Preprocess = Preprocess()
    tolerances: Mapping[str, object] = field(default_factory=dict)
    layers: bool = False
    expected: Sequence[str] = ()  # ground truth computed elsewhere (see verify/expected.py)
    reference: str = "onnxruntime"   # or torch:PROGRAM (torchpack.py)
    keep_external: bool = False   # keep external data external even when it would fit inline


def provenance(model_bytes: bytes, model_path: Path) -> dict[str, object]:
    import onnx
    import onnxruntime

    return {
        "model_file": model_path.name,
        "model_sha256": sha256_bytes(model_bytes),
        "reference": "onnxruntime CPUExecutionProvider, graph optimizations disabled",
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "verify": __version__,
        "host_arch": platform.machine(),
        "host_os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "user": _user(),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def pack(model_path: Path, out: Path, options: PackOptions,
         note: Callable[[str], None] = lambda text: None) -> Testcase:
    """Build the cases, compute ground truth on the host, write the archive atomically.
    `note` hears what the user should know of the archive written (tensors --layers left out)."""
    found: list[ExternalFile] = []
    model, model_bytes, external = load_model(model_path, options.keep_external, found)
    # before any work: the archive written over the weights it is made from (the next pack
    # then fed onnxruntime HDF5 bytes as weights and stored NaN ground truth without a word)
    if found:
        check_output_file(out, "-o", [("the model's external data file", f.path) for f in found])
    folder = model_path.parent if external else None
    infos: list[InputInfo] = model_inputs(model)
    session = reference_session(model_bytes, str(model_path), folder)
    check_host_io(session, str(model_path))
    foreign = read_case_sources(options.data)
    given_inputs = foreign.inputs(infos) if foreign is not None else []
    cases_inputs = build_cases(infos, [] if foreign is not None else options.data,
                               shapes=options.shapes, seed=options.seed, pre=options.pre,
                               probe=lambda feeds: _runs(session, feeds), given=given_inputs)
    if foreign is not None:  # an input the other tool's files lack was drawn at random
        for i, case in enumerate(given_inputs):
            drawn = [info.name for info in infos if info.name not in case]
            if drawn:
                note(f"case {i}: {' '.join(foreign.labels)} holds no value for input(s) "
                     f"{', '.join(repr(n) for n in drawn)}: drawn at random (--seed); give them "
                     "in the folder or file if the model needs particular values")
    output_names = [o.name for o in session.get_outputs()]
    given = read_expected(options.expected, output_names, foreign)
    if given and len(given) != len(cases_inputs):
        raise InputError(f"the expected outputs hold {len(given)} case(s) but the inputs "
                         f"{len(cases_inputs)}; give one set of outputs per case")
    spec = torch_spec(options.reference)
    if spec is not None:
        if given:
            raise UsageError("--expected and --reference torch: both give the ground truth; "
                             "use one")
        del session
        if external:
            raise UsageError(f"{model_path}: --reference torch: takes models that hold their "
                             "weights; this one keeps them in external data")
        return _pack_torch(spec, model, model_bytes, model_path, out, options, cases_inputs)
    cases, host = [], []
    for i, feeds in enumerate(cases_inputs):
        outputs = run_reference(session, feeds, f"{model_path} case {i}",
                                _random_int_hint(infos, options.data))
        if given:
            host.append(outputs)
            outputs = check_expected(given[i], outputs, i)
        cases.append(Case(inputs=feeds, outputs=outputs, source=_case_source(options.data, i)))
    reference = ({"reference": "given: " + "; ".join(
        [*(foreign.labels if foreign is not None and foreign.has_outputs else []),
         *options.expected]) + " (checked for names, shapes and dtypes against onnxruntime "
        "on this host)", schema.PROV_HOST_VS_GIVEN: host_agreement(
            [c.outputs for c in cases], host, options.tolerances, saturation_floors(model))}
        if given else {})
    del session  # before the optimized one is made: one model's session in memory at a time
    if not given:  # the archive's first reader is usually `verify run` on this very host
        note_text = optimized_host_note(model, model_bytes, str(model_path), folder, cases,
                                        options.tolerances)
        if note_text:
            note(note_text)
    tc = Testcase(model_bytes=model_bytes, cases=tuple(cases),
                  tensor_order=tuple(tensor_order(model)),
                  tolerances=dict(options.tolerances),
                  provenance={**provenance(model_bytes, model_path), **reference,
                              "seed": options.seed, "data": list(options.data)},
                  has_layers=options.layers, external=external)
    if not options.layers:
        del model
        write_archive(out, tc)
        return tc
    # Per-layer references stream from the chunked capture straight into the archive, one
    # case after the other, from one capture set-up (on the model parsed above).
    with HostCapture(model_bytes, model=model, external_dir=folder) as capture:
        del model
        write_archive(out, tc, [capture.layers(case.inputs) for case in cases])
        if capture.not_captured:
            note(f"{not_captured_text(list(capture.not_captured))}: no per-layer reference "
                 "stored for them (`verify diff` against this archive leaves them out)")
    return tc


def optimized_host_note(model: onnx.ModelProto, model_bytes: bytes, where: str,
                        folder: Path | None, cases: Sequence[Case],
                        tolerances: Mapping[str, Any]) -> str:
    """What to say where `verify run` of the new archive on this host (onnxruntime with every
    optimization, its default) already fails the archive's tolerances: an fp16 or QDQ model's
    optimized kernels differ from the unoptimized ground truth by far more than float32's
    default rule allows, and the archive failed on the host that packed it without a word."""
    from verify.check import check_outputs
    from verify.compare import tol_rank
    from verify.tolerance import tolerance_set

    try:
        session = reference_session(model_bytes, where, folder, optimized=True)
        runs = [run_reference(session, c.inputs, f"{where} case {i}")
                for i, c in enumerate(cases)]
    except VerifyError as exc:
        return f"this host's onnxruntime could not run the model at --opt-level all: {exc}"
    rules, floors = tolerance_set(dict(tolerances)), saturation_floors(model)
    failing = [d for outs, c in zip(runs, cases)
               for d in check_outputs(outs, c.outputs, rules, floors, "this host")
               if not d.passed]
    if not failing:
        return ""
    d = max(failing, key=tol_rank)
    why = _low_precision(model)
    text = (f"`verify run` on this host (onnxruntime at --opt-level all, its default) already "
            f"fails this archive: {d.name} max_abs={d.max_abs:.3g} over {d.threshold:.3g} "
            f"[{d.rule}]" + (f", {len(failing) - 1} more over it" if len(failing) > 1 else "")
            + (f"; {why}" if why else ""))
    # per failing output, the power of two over 4x this host's error relative to its peak (none
    # where the error is no number or NaN/Inf sit elsewhere: a k cannot cover that)
    need: dict[str, int] = {}
    for f in failing:
        if f.ref_peak > 0 and math.isfinite(f.max_abs) and f.max_abs > 0:
            e = math.ceil(math.log2(4 * f.max_abs / f.ref_peak))
            need[f.name] = max(e, need.get(f.name, e))
    if need and len(need) == len({f.name for f in failing}):
        text += (". Pack with tolerances it meets, e.g. " + " ".join(
            f"--tol '{n}:k=2^{e}'" for n, e in need.items()) + " (4x this host's error), or a "
            "metric gate such as --tol '*:sqnr>=30'; or run with --opt-level disable")
    return text


def _low_precision(model: onnx.ModelProto) -> str:
    """Why optimized kernels may depart from the ground truth: float16 weights or casts, or
    quantize/dequantize pairs (their fused int8 kernels round differently)."""
    half = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    f16 = sum(1 for t in model.graph.initializer if t.data_type in half) + sum(
        1 for n in model.graph.node if n.op_type == "Cast"
        and any(a.name == "to" and a.i in half for a in n.attribute))
    quant = sum(1 for n in model.graph.node
                if n.op_type in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                                 "ConvInteger", "MatMulInteger") or n.op_type.startswith("QLinear"))
    if quant:
        return (f"the model is quantized ({quant} quantize/dequantize or integer nodes), and "
                "the default rule allows float32's rounding only")
    if f16:
        return (f"the model computes in float16 ({f16} float16 weights or casts), and the "
                "default rule allows float32's rounding only")
    return ""


def _runs(session, feeds: Mapping[str, np.ndarray]) -> bool:
    try:
        run_reference(session, feeds, "probe")
    except InputError:
        return False
    return True


def _random_int_hint(infos: Sequence[InputInfo], data: Sequence[str]) -> str:
    """What to say when onnxruntime refuses a case some of whose integer inputs were drawn at
    random (silero VAD's int64 `sr` takes 8000 or 16000, not a draw from [0, 10))."""
    given = {i.name for i in infos for d in data if d.startswith(i.name + ":")
             and not d[len(i.name) + 1:].strip().startswith("rand")}
    if len(infos) == 1 and data:
        given.add(infos[0].name)
    drawn = [i.name for i in infos if i.name not in given and i.dtype.kind in "iu"]
    if not drawn:
        return ""
    names = ", ".join(f"'{n}'" for n in drawn)
    return (f" (random ints in [0, {RANDOM_INT_HIGH}) went to {names}; if one takes a specific "
            f"value, give it: -d {drawn[0]}:VALUE)")


def _pack_torch(spec: str, model: onnx.ModelProto, model_bytes: bytes, model_path: Path,
                out: Path, options: PackOptions, cases_inputs: Sequence[dict[str, np.ndarray]]
                ) -> Testcase:
    truth = torch_truth(spec, model, model_bytes, cases_inputs, options.tolerances,
                        options.layers)
    order = tuple(tensor_order(model))
    cases = tuple(Case(inputs=feeds, outputs=outputs, source=_case_source(options.data, i))
                  for i, (feeds, outputs) in enumerate(zip(cases_inputs, truth.outputs)))
    tc = Testcase(model_bytes=model_bytes, cases=cases, tensor_order=order,
                  tolerances=dict(options.tolerances),
                  provenance={**provenance(model_bytes, model_path), "seed": options.seed,
                              "data": list(options.data), **truth.provenance},
                  has_layers=options.layers)
    names = [t.name for t in order]
    write_archive(out, tc, None if truth.layers is None else
                  [layer_items(names, values) for values in truth.layers])
    return tc


def _case_source(data: Sequence[str], index: int) -> str:
    return "; ".join(data) if data else f"random (case {index})"
