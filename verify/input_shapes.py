"""Input shapes: `--shape` parsed and laid over the declared dims (only dynamic dims may be
set), whether an array fits a declared shape, and the likeliest fix when it does not."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from verify.datafiles import fmt_names
from verify.errors import InputError

if TYPE_CHECKING:
    from verify.inputs import InputInfo

Dim = int | str | None


def parse_shape_option(text: str) -> tuple[str, tuple[int, ...]]:
    """`name:1x3x224x224` or `name:1,3,224,224` -> (name, dims). A bare `1x3x224` gives
    name "" which build_cases takes to mean the model's only input. Names may hold ':'."""
    name, _, dims_text = text.strip().rpartition(":")
    parts = re.split(r"[x,]", dims_text.strip()) if dims_text.strip() else []
    if not parts or not all(p.strip().isdigit() for p in parts):
        raise InputError(f"--shape {text!r}: write NAME:1x3x224x224 (or NAME:1,3,224,224) "
                         "with non-negative integer dims")
    return name, tuple(int(p) for p in parts)


def parse_shape_options(texts: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Every --shape, by input name; one input given twice is an InputError (the last one was
    kept without a word)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for text in texts:
        name, dims = parse_shape_option(text)
        if name in shapes and shapes[name] != dims:
            shown = f"input '{name}'" if name else "the model's input"
            raise InputError(f"--shape {text!r}: {shown} already has --shape "
                             f"{'x'.join(map(str, shapes[name]))}; give one shape per input")
        shapes[name] = dims
    return shapes


def effective_shapes(inputs: Sequence[InputInfo],
                     shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[Dim, ...] | None]:
    """Declared shapes with --shape laid over them; --shape may only set dynamic dims."""
    out: dict[str, tuple[Dim, ...] | None] = {i.name: i.shape for i in inputs}
    names = fmt_names([i.name for i in inputs]) if inputs else "(none)"
    for name, dims in shapes.items():
        opt = f"--shape {name + ':' if name else ''}{'x'.join(map(str, dims))}"
        if name == "" and len(inputs) == 1:
            name = inputs[0].name
        if name not in out:
            what = "names no input" if name == "" else f"no input named '{name}'"
            raise InputError(f"{opt}: {what}; the model's inputs are {names}")
        declared = out[name]
        if declared is not None:
            if len(declared) != len(dims):
                raise InputError(f"{opt} gives {len(dims)} dims but input '{name}' has "
                                 f"{len(declared)}: {fmt_shape(declared)}")
            if not shape_fits(dims, declared):
                raise InputError(f"{opt} conflicts with input '{name}' declared as "
                                 f"{fmt_shape(declared)}; only dynamic dims can be set")
        out[name] = tuple(dims)
    return out


def fmt_shape(shape: Sequence[Dim]) -> str:
    return "(" + ",".join("?" if d is None else str(d) for d in shape) + ")"


def shape_fits(got: Sequence[int], want: Sequence[Dim]) -> bool:
    return len(got) == len(want) and all(not isinstance(w, int) or g == w for g, w in zip(got, want))


def shape_hint(got: tuple[int, ...], want: tuple[Dim, ...]) -> str:
    """The likeliest fix: a transpose (NHWC vs NCHW), a missing or extra batch dim, a reshape."""
    static = all(isinstance(d, int) for d in want)
    if static and len(got) == len(want) and sorted(got) == sorted(want):  # type: ignore[type-var]
        perm, used = [], set()
        for w in want:
            j = next(j for j, g in enumerate(got) if g == w and j not in used)
            used.add(j)
            perm.append(j)
        return f"It looks transposed; use arr.transpose({','.join(map(str, perm))})."
    if len(got) + 1 == len(want) and (want[0] == 1 or not isinstance(want[0], int)) \
            and shape_fits(got, want[1:]):
        return "Add the batch dim: arr[None]."
    if len(got) == len(want) + 1 and got[0] == 1 and shape_fits(got[1:], want):
        return "Drop the leading dim: arr[0]."
    if static and math.prod(got) == math.prod(want):  # type: ignore[arg-type]
        return f"Reshape it: arr.reshape({','.join(map(str, want))})."
    return "Give an array of that shape."
