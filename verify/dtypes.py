"""The dtype helpers the comparison uses on both sides of a tensor pair: machine epsilon,
smallest normal, kind ('float', 'int', 'bool', 'other') and name, for numpy's dtypes and
ml_dtypes' own (bfloat16, float8_*, int4...). Cached per dtype: they run once per tensor."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


def _ml_info(dtype: np.dtype, which: str) -> Any:
    """ml_dtypes' finfo/iinfo for its own types (bfloat16, float8_*, int4...), else None."""
    if dtype.kind != "V":
        return None
    try:
        import ml_dtypes
        return getattr(ml_dtypes, which)(dtype)
    except (ImportError, ValueError, TypeError):
        return None


@functools.lru_cache(maxsize=64)
def float_eps(dtype: np.dtype) -> float | None:
    if dtype.kind == "f":
        return float(np.finfo(dtype).eps)
    info = _ml_info(dtype, "finfo")
    return float(info.eps) if info is not None else None


@functools.lru_cache(maxsize=64)
def dtype_kind(dtype: np.dtype) -> str:
    """'float', 'int', 'bool' or 'other' (strings, objects, complex: compared for equality)."""
    if dtype.kind == "b":
        return "bool"
    if dtype.kind in "iu" or (dtype.kind == "V" and _ml_info(dtype, "iinfo") is not None):
        return "int"
    if float_eps(dtype) is not None:
        return "float"
    return "other"


@functools.lru_cache(maxsize=64)
def dtype_name(dtype: np.dtype) -> str:
    return str(dtype)


@functools.lru_cache(maxsize=64)
def float_max(dtype: np.dtype) -> float | None:
    """The largest finite value of a float dtype (bfloat16's too), else None."""
    if dtype.kind == "f":
        return float(np.finfo(dtype).max)
    info = _ml_info(dtype, "finfo")
    return float(info.max) if info is not None else None


@functools.lru_cache(maxsize=64)
def tiny_of(dtype: np.dtype) -> float:
    if dtype.kind == "f":
        return float(np.finfo(dtype).tiny)
    info = _ml_info(dtype, "finfo")
    return float(info.tiny) if info is not None else 1.0


# element types onnxruntime's Python API neither takes from numpy nor gives back ("Numpy_type
# 256 can't be converted to MLDataType", "No corresponding Numpy type for Tensor Type"),
# by the name onnx and onnxruntime give them
NOT_THROUGH_NUMPY = frozenset(("bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2",
                               "float8e5m2fnuz"))


def numpy_less_reason(what: str, type_name: str) -> str:
    """Why an input or output of element type `type_name` cannot be fed or checked."""
    return (f"{what} is {type_name}, which onnxruntime's Python API neither takes from numpy "
            "nor gives back: verify cannot feed or check it; cast at the model's edge (a Cast "
            "from or to float32) to test the rest")
