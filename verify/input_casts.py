"""Input arrays cast to a model input's dtype only without loss (float to any float unless
finite values overflow; int/bool to int, float or bool when every value fits exactly; float to
int refused), and images, float64 after preprocessing, cast for integer (quantized) inputs."""

from __future__ import annotations

import math

import numpy as np

from verify.errors import InputError


def kind(dt: np.dtype) -> str:
    """'f' float, 'i'/'u' int, 'b' bool, 's' text, '?' other; ml_dtypes' bfloat16, float8,
    int4 (numpy kind 'V') sorted by name."""
    if dt.kind in "fiub":
        return dt.kind
    if dt.kind in "OUS":
        return "s"
    if "float" in dt.name:
        return "f"
    if dt.name.startswith("uint"):
        return "u"
    return "i" if dt.name.startswith("int") else "?"


def dtype_name(dt: np.dtype) -> str:
    return "string" if kind(dt) == "s" else dt.name


def int_limits(dt: np.dtype) -> tuple[int, int]:
    if dt.kind in "iu":
        info = np.iinfo(dt)
    else:
        import ml_dtypes  # onnx's own dependency, which defines int4 and friends

        info = ml_dtypes.iinfo(dt)
    return int(info.min), int(info.max)


def cast(arr: np.ndarray, dt: np.dtype, name: str, label: str) -> np.ndarray:
    """Cast to `dt` only when no value changes; otherwise say why not."""
    src, dst = kind(arr.dtype), kind(dt)
    if arr.dtype == dt:
        return arr
    prefix = f"{label}: input '{name}' takes {dtype_name(dt)}"
    if dst == "s":
        if src == "s":
            return arr.astype(object)
        raise InputError(f"{prefix}, got {dtype_name(arr.dtype)} values; give strings")
    if src not in "fiub" or dst == "?":
        raise InputError(f"{prefix}, got {dtype_name(arr.dtype)} values; give numbers")
    if src == "f" and dst != "f":
        raise InputError(f"{prefix}, got {arr.dtype.name} values; floats are never rounded "
                         f"to integers, save the array as {dt.name}")
    if dst == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            out = arr.astype(dt)
        if src == "f":
            # past the largest value: inf, or NaN in formats without inf (float8e4m3fn)
            overflow = ~np.isfinite(out.astype(np.float64)) & np.isfinite(arr)
            if overflow.any():
                raise InputError(f"{prefix}, but {arr.dtype.name} values up to "
                                 f"{np.abs(arr[overflow]).max():g} overflow it")
            return out
        if src == "i" or src == "u":
            # below 2**53 float64 holds every int, so compare there; check the rest one by one
            # (2**53 + 1 rounds to 2**53 in float64: the boundary itself goes one by one too)
            wide, back = arr.astype(np.float64), out.astype(np.float64)
            big = np.abs(wide) >= 2.0**53
            inexact = [int(v) for v in arr[~big][back[~big] != wide[~big]].flat[:1]]
            inexact += [int(v) for v, o in zip(arr[big].flat, back[big].flat)
                        if not math.isfinite(o) or int(o) != int(v)][:1]
            if inexact:
                raise InputError(f"{prefix}, but {arr.dtype.name} values like {inexact[0]} are not "
                                 "exact in it")
        return out
    if dst == "b":
        if src == "b" or np.isin(arr, (0, 1)).all():
            return arr.astype(bool)
        bad = arr[~np.isin(arr, (0, 1))].flat[0]
        raise InputError(f"{prefix}, but {arr.dtype.name} values include {bad}; "
                         "give 0/1 or true/false")
    lo, hi = int_limits(dt)
    if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        raise InputError(f"{prefix}, but the {arr.dtype.name} values span "
                         f"[{int(arr.min())}, {int(arr.max())}]; they do not fit [{lo}, {hi}]")
    return arr.astype(dt)


def image_cast(x: np.ndarray, dt: np.dtype, name: str, label: str) -> np.ndarray:
    """Images are float64 here; float inputs take them as `cast` takes float data (an
    overflow is refused, never fed as inf); integer inputs (quantized models) take them when
    every value after preprocessing is a whole number in range."""
    if kind(dt) == "f":
        return cast(x, dt, name, label)
    lo, hi = int_limits(dt)
    if not np.array_equal(x, np.round(x)) or (x.size and (x.min() < lo or x.max() > hi)):
        raise InputError(f"{label}: input '{name}' takes {dt.name}, but the image after "
                         f"--scale/--mean/--std spans [{x.min():g}, {x.max():g}] with fractions "
                         "or out of range; adjust them or feed a float model")
    return x.astype(dt)
