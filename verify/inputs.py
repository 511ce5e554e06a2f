"""Turning `-d/--data` specs into named input arrays, one dict per case.

Spec grammar (one `-d` value; `;` separates several items inside one value):

  NAME:FILE      FILE for input NAME. NAME is matched as the longest model input name
                 followed by ':', so names holding ':' or '/' (e.g. `input:0`) work.
  FILE           a bare FILE for a single-input model; for several inputs only a .npz,
                 a JSON object or a .pb whose array names are the model's input names.
  NAME:LITERAL   a JSON literal: `x:[[1,2],[3,4]]`, `x:3.5`, `mask:[true,false]`;
                 bare `[[1,2]]` for a single input, `{"a":[1],"b":2}` for several.
  NAME:rand      seeded random data of the declared shape and dtype: floats U(-1,1),
  NAME:rand(L,H) ints in [0,10), bools 0/1; or U(L,H) / ints in [L,H).
                 Inputs not given at all are filled the same way.

Files: .npy (never unpickled), .npz (arrays matched by name; a lone array fits any one
input), .json (nested lists, or an object mapping input names to nested lists), .pb (an
ONNX TensorProto, as in onnx_test_runner's input_0.pb), images .png .jpg .jpeg .bmp .ppm
.pgm. An image is decoded with Pillow (EXIF rotation applied), converted to RGB (L for a
1-channel input), resized bilinearly to the input's H x W (dynamic H/W must be set with
--shape: the error names the image's own size), laid out NCHW or NHWC as the input's shape says (channel dim: the one of size 1 or
3 right after the batch dim or last; --layout overrides), batch dim added; then
x*scale, (x-mean)/std per channel (RGB order), the BGR swap if asked, cast to the dtype.
Arrays from files and literals are never preprocessed.

Cases: items accumulate into one case until an input name repeats, which starts the next
case (`-d a:1.npy -d b:1.npy -d a:2.npy -d b:2.npy` is 2 cases; `-d 1.png -d 2.png` on a
one-input model is 2 cases). No `-d` at all is one random case. Inputs a case leaves out
are random; each case and input draws from its own stream derived from --seed.

Dims declared as a symbol (`batch`), unnamed, -1 or 0 are dynamic. Given arrays must match
the declared static dims (and --shape); dynamic dims take any size, but random data needs them
set: `--shape NAME:1x3x224x224` (or `1,3,224,224`), or a symbol another input's array or
--shape fixed (`state` (2,batch,128) takes `batch` from `input`). With a probe (pack has
one), the hint for unset dims is a --shape the model was seen to run with.
Dtypes are cast only without loss: float to any float (unless finite values overflow),
int/bool to int, float or bool when every value fits exactly. Float to int is refused.
Relative paths resolve against base_dir, else the current directory.

This module splits the specs into items and the items into cases; the pieces it uses live
beside it: one item read into arrays and a case's missing inputs filled (`input_items`), dtype
casts (`input_casts`), --shape and shape checks (`input_shapes`), images (`input_images`) and
random data (`input_random`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx

from verify.datafiles import fmt_names, is_image
from verify.errors import InputError
from verify.input_images import ImageSizeError
from verify.input_items import ItemParser, MissingShapeError, split_items
from verify.input_random import RANDOM_INT_HIGH, RandomSpec
from verify.input_shapes import Dim, effective_shapes, parse_shape_option, parse_shape_options

__all__ = ["RANDOM_INT_HIGH", "Dim", "InputInfo", "MissingShapeError", "Preprocess",
           "build_cases", "model_inputs", "override_input", "parse_shape_option",
           "parse_shape_options"]


@dataclass(frozen=True)
class InputInfo:
    """One model input as declared. `shape` is None when the model declares no rank."""

    name: str
    shape: tuple[Dim, ...] | None
    dtype: np.dtype


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes an array: x*scale, then (x-mean)/std per channel, then BGR."""

    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    scale: float = 1.0
    bgr: bool = False
    layout: str | None = None  # "nchw" | "nhwc" | None: infer from the input's shape

    def __post_init__(self) -> None:
        if self.layout not in (None, "nchw", "nhwc"):
            raise InputError(f"--layout {self.layout}: use nchw or nhwc")
        if not math.isfinite(self.scale):
            raise InputError(f"--scale {self.scale}: must be a finite number")
        for opt, vals in (("--mean", self.mean), ("--std", self.std)):
            if vals is not None and (not vals or not all(math.isfinite(v) for v in vals)):
                raise InputError(f"{opt} {_fmt_floats(vals)}: give finite numbers, e.g. 0.485,0.456,0.406")
        if self.std is not None and any(v == 0 for v in self.std):
            raise InputError(f"--std {_fmt_floats(self.std)}: a zero std would divide by zero")


_NO_SHAPES: Mapping[str, tuple[int, ...]] = MappingProxyType({})

Probe = Callable[[Mapping[str, np.ndarray]], bool]


# --- public API ------------------------------------------------------------------------------
def model_inputs(model: onnx.ModelProto) -> list[InputInfo]:
    """The graph inputs that are not initializers, in declaration order."""
    initializers = {t.name for t in model.graph.initializer}
    infos = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        if vi.type.WhichOneof("value") != "tensor_type":
            raise InputError(f"input '{vi.name}' is not a tensor ({vi.type.WhichOneof('value')}); "
                             "verify feeds tensor inputs only")
        tt = vi.type.tensor_type
        if tt.elem_type == onnx.TensorProto.STRING:
            raise InputError(f"input '{vi.name}' takes strings; verify feeds numeric and bool "
                             "tensors only (a .npy file holds strings only through pickle)")
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except (KeyError, ValueError, TypeError):
            raise InputError(f"input '{vi.name}' has an unknown element type "
                             f"{tt.elem_type}; the model is malformed") from None
        shape: tuple[Dim, ...] | None = None
        if tt.HasField("shape"):
            # dim_value -1 or 0 is how several exporters (PaddlePaddle's p2o) say "dynamic"
            shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                          else d.dim_param if d.HasField("dim_param") and d.dim_param
                          else None for d in tt.shape.dim)
        infos.append(InputInfo(vi.name, shape, dtype))
    return infos


def build_cases(inputs: Sequence[InputInfo], data: Sequence[str], *,
                shapes: Mapping[str, tuple[int, ...]] = _NO_SHAPES, seed: int = 0,
                pre: Preprocess = Preprocess(), base_dir: Path | None = None,
                probe: Probe | None = None,
                given: Sequence[Mapping[str, np.ndarray]] = ()) -> list[dict[str, np.ndarray]]:
    """Parse the `-d` specs (grammar in the module docstring) into complete cases: one dict
    per case, every model input present, keys in the model's input order.

    Random data for an input with dims nothing fixed is a `MissingShapeError`. With `probe`
    (a callable that runs the model on a case and says whether it ran) the error's hint is a
    `--shape` set the model was seen to run with, tried from a few common sizes.

    `given`: whole cases read elsewhere (another tool's files), by input name; each array is
    checked and cast as a `-d` file's would be, and inputs a case lacks are random."""
    try:
        return _build(inputs, data, shapes, seed, pre, base_dir, given)
    except MissingShapeError as exc:
        if probe is None:
            raise
        raise _probed(exc, inputs, data, shapes, seed, pre, base_dir, probe) from None
    except ImageSizeError as exc:  # the image's size, else rounded up to 32, if the model runs
        for shape, said in exc.tries if probe is not None else ():
            try:
                cases = _build(inputs, data, {**shapes, exc.name: shape}, seed, pre, base_dir)
            except InputError:
                continue
            if probe(cases[0]):
                raise InputError(f"{exc.head}: pass --shape {exc.name}:"
                                 f"{'x'.join(map(str, shape))} {said}") from None
        raise


def _build(inputs: Sequence[InputInfo], data: Sequence[str],
           shapes: Mapping[str, tuple[int, ...]], seed: int, pre: Preprocess,
           base_dir: Path | None, given: Sequence[Mapping[str, np.ndarray]] = (),
           ) -> list[dict[str, np.ndarray]]:
    ctx = ItemParser(inputs, effective_shapes(inputs, shapes), pre,
                   Path(base_dir) if base_dir is not None else Path.cwd())
    if given:
        return [ctx.complete({n: ctx.conform(np.asarray(a), n, f"case {i} input '{n}'")
                              for n, a in case.items()}, i, seed)
                for i, case in enumerate(given)]
    cases: list[dict[str, np.ndarray | RandomSpec]] = []
    current: dict[str, np.ndarray | RandomSpec] = {}
    for raw in data:
        if not raw.strip():
            raise InputError(f"-d {raw!r}: empty data spec; give NAME:FILE, FILE, a literal or NAME:rand")
        for item in split_items(raw):
            given = ctx.parse_item(item)
            if any(n in current for n in given):
                cases.append(current)
                current = {}
            current.update(given)
    if current or not cases:
        cases.append(current)
    return [ctx.complete(case, i, seed) for i, case in enumerate(cases)]


# Sizes tried for dynamic dims when looking for a --shape to suggest: the leading dim of each
# input takes 1 (a batch), the others one of these (1 first: sequence models; then the
# multiples of 32 detectors need, the usual classifier and audio-frame sizes). An image
# input (a channel dim fixed at 1 or 3 beside dynamic height and width) starts at the usual
# image sizes instead: 1x1 "runs" a detector but is no image (PP-OCR det, rec and cls).
PROBE_SIZES = (1, 32, 64, 224, 256, 512, 640)
IMAGE_PROBE_SIZES = (224, 320, 640, 256, 512, 64, 32)


def _image_like(shapes: Sequence[tuple[Any, ...]]) -> bool:
    """Every input needing sizes is (N,C,H,W) or (N,H,W,C), C fixed at 1 or 3, H and W not."""
    def one(shape: tuple[Any, ...]) -> bool:
        return len(shape) == 4 and any(
            shape[c] in (1, 3) and not any(isinstance(shape[i], int) for i in hw)
            for c, hw in ((1, (2, 3)), (3, (1, 2))))
    return bool(shapes) and all(one(tuple(s)) for s in shapes)


def _probed(exc: MissingShapeError, inputs: Sequence[InputInfo], data: Sequence[str],
            shapes: Mapping[str, tuple[int, ...]], seed: int, pre: Preprocess,
            base_dir: Path | None, probe: Probe) -> MissingShapeError:
    """The same error with a hint the model was seen to run with, or saying none ran."""
    randint = exc.random_ints
    sizes = IMAGE_PROBE_SIZES if _image_like([s for _, s in exc.needed]) else PROBE_SIZES
    for size in sizes:
        fill = dict(shapes)
        for name, shape in exc.needed:
            fill[name] = tuple(d if isinstance(d, int) else 1 if i == 0 else size
                               for i, d in enumerate(shape))
        try:
            cases = _build(inputs, data, fill, seed, pre, base_dir)
        except InputError:
            continue
        if probe(cases[0]):
            opts = " ".join(f"--shape {n}:{'x'.join(map(str, fill[n]))}" for n, _ in exc.needed)
            return MissingShapeError(f"{exc.head}; pass {opts} (the model runs with it here)",
                                     exc.needed, randint)
    names = " ".join(f"--shape {n}:{'x'.join('N' if not isinstance(d, int) else str(d) for d in s)}"
                     for n, s in exc.needed)
    tried = ", ".join(map(str, sizes))
    hint = (f"; pass {names} with the sizes it expects (random data of size {tried} in those "
            "dims did not run here")
    if randint:
        hint += (f"; random ints in [0, {RANDOM_INT_HIGH}) went to " + fmt_names(randint) + ": if one takes a "
                 f"specific value, give it, e.g. -d {randint[0]}:VALUE")
    return MissingShapeError(exc.head + hint + ")", exc.needed, randint)


def override_input(inputs: Sequence[InputInfo], spec: str,
                   case_shapes: Mapping[str, tuple[int, ...]] = _NO_SHAPES
                   ) -> tuple[str, np.ndarray]:
    """One `run --input NAME:FILE` (or NAME:LITERAL): the input it names and its array, read,
    shape-checked and cast without loss exactly as `pack -d` does, on this host. An image
    for an input of dynamic height or width takes the size of that input in `case_shapes`
    (the case it replaces); an array keeps its own shape."""
    ctx = ItemParser(inputs, effective_shapes(inputs, _NO_SHAPES), Preprocess(), Path.cwd())
    name = next((n for n in ctx.names_longest if spec.startswith(n + ":")), None)
    if name is None:
        raise InputError(f"--input {spec!r}: expected NAME:FILE with NAME one of "
                         f"{ctx.listing()}")
    if is_image(Path(spec[len(name) + 1:]).suffix) and name in case_shapes:
        dynamic = {name: case_shapes[name]} if any(
            not isinstance(d, int) for d in (ctx.shapes[name] or ())) else {}
        ctx = ItemParser(inputs, effective_shapes(inputs, dynamic), Preprocess(), Path.cwd())
    value = ctx.parse_item(spec)[name]
    if isinstance(value, RandomSpec):
        raise InputError(f"--input {spec!r}: give a file or a literal (random data has no "
                         "reason to replace a case's input)")
    return name, value


# --- formatting ------------------------------------------------------------------------------
def _fmt_floats(vals: Sequence[float]) -> str:
    return ",".join(f"{v:g}" for v in vals)
