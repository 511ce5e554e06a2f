"""Random input data: `NAME:rand`, `NAME:rand(L,H)` and every input a case leaves out. Each case
and input draws from its own stream, derived from --seed, the case index and the input's name
(crc32: the same in every process)."""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from verify.archive_file import max_tensor_bytes
from verify.dtypes import float_max
from verify.errors import InputError
from verify.input_casts import dtype_name, int_limits, kind
from verify.input_shapes import Dim

if TYPE_CHECKING:
    from verify.inputs import InputInfo

RANDOM_INT_HIGH = 10  # random ints lie in [0, 10): safe as indices into most tables


@dataclass(frozen=True)
class RandomSpec:
    """Data to draw when the case is complete (the stream depends on the case index)."""

    low: float | None = None
    high: float | None = None


def parse_rand(value: str, item: str) -> RandomSpec:
    m = re.fullmatch(r"\s*rand\s*(?:\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\))?\s*", value)
    try:
        low, high = (float(m.group(1)), float(m.group(2))) if m and m.group(1) else (None, None)
    except ValueError:
        m = None
    if m is None or (low is not None and not (math.isfinite(low) and math.isfinite(high)
                                              and low < high)):  # type: ignore[operator]
        raise InputError(f"-d {item!r}: write rand or rand(LOW,HIGH) with LOW < HIGH, e.g. rand(-1,1)")
    return RandomSpec(low, high)


def _check_size(info: InputInfo, dims: tuple[int, ...]) -> None:
    """A shape whose data no archive could hold (--max-tensor-mb) is refused before anything is
    allocated: `--shape x:100000x3x4800x32000` was numpy's MemoryError and a traceback."""
    nbytes = math.prod(dims) * np.dtype(info.dtype).itemsize
    limit = max_tensor_bytes()
    if nbytes > limit:
        shown = "x".join(str(d) for d in dims)
        raise InputError(f"input '{info.name}' of shape {shown} ({dtype_name(info.dtype)}) would "
                         f"be {nbytes / (1 << 20):.6g} MB of random data, over the "
                         f"{limit / (1 << 20):g} MB an archive holds per tensor; give a smaller "
                         f"--shape {info.name}:DIMS (or raise verify --max-tensor-mb MB)")


def random_input(info: InputInfo, shape: tuple[Dim, ...] | None, spec: RandomSpec,
                 index: int, seed: int) -> np.ndarray:
    """Seeded random data for input `info` (case `index`): floats U(-1,1), ints in
    [0, RANDOM_INT_HIGH), bools 0/1, or the range `spec` gives."""
    if shape is None:
        raise InputError(f"input '{info.name}' declares no shape; "
                         f"pass --shape {info.name}:DIMS, e.g. {info.name}:1x16")
    dims = tuple(int(d) for d in shape)  # type: ignore[arg-type]
    _check_size(info, dims)
    # crc32, not hash(): the stream must be the same in every process
    rng = np.random.default_rng([seed % 2**64, index, zlib.crc32(info.name.encode())])
    k = kind(info.dtype)
    if k == "f":
        low, high = (-1.0, 1.0) if spec.low is None else (spec.low, spec.high)
        top = float_max(np.dtype(info.dtype)) or float(np.finfo(info.dtype).max)
        if not (-top <= low and high <= top):  # float16 past 65504 was inf, float32 past 3.4e38
            raise InputError(f"input '{info.name}' takes {dtype_name(info.dtype)}; "
                             f"rand({low:g},{high:g}) must lie within [{-top:g}, {top:g}]")
        return rng.uniform(low, high, size=dims).astype(info.dtype)
    if k in "iu":
        lo_lim, hi_lim = int_limits(info.dtype)
        low, high = ((0, min(RANDOM_INT_HIGH, hi_lim + 1)) if spec.low is None
                     else (math.ceil(spec.low), math.ceil(spec.high)))  # type: ignore[arg-type]
        if low < lo_lim or high - 1 > hi_lim or low >= high:
            raise InputError(f"input '{info.name}' takes {dtype_name(info.dtype)}; "
                             f"rand({spec.low:g},{spec.high:g}) must hold integers within "
                             f"[{lo_lim}, {hi_lim}]")
        return rng.integers(low, high, size=dims).astype(info.dtype)
    if k == "b":
        return rng.integers(0, 2, size=dims).astype(bool)
    raise InputError(f"input '{info.name}' takes {dtype_name(info.dtype)} and cannot be "
                     f"filled randomly; pass -d {info.name}:FILE.json")
