"""An archive's cases checked against its own model: what a run would reject on the device
(an unknown or missing input, a wrong dtype or shape, a case without all outputs) is an
ArchiveError here, exit 2, before any device time is spent; `inspect` reports the same."""

from __future__ import annotations

import numpy as np
import onnx

from verify.errors import ArchiveError, InputError
from verify.inputs import model_inputs
from verify.testcase import Testcase


def _fmt(shape: object) -> str:
    return "(" + ",".join("?" if d is None else str(d) for d in shape) + ")"  # type: ignore[attr-defined]


def check_cases(tc: Testcase, model: onnx.ModelProto) -> None:
    """Raise one ArchiveError line for the first case that does not fit the model."""
    where = str(tc.path)
    try:
        infos = model_inputs(model)
    except InputError as exc:
        raise ArchiveError(f"{where}: the archive's model: {exc}") from None
    outputs = {}
    for o in model.graph.output:
        elem = o.type.tensor_type.elem_type if o.type.HasField("tensor_type") else 0
        try:
            outputs[o.name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else None
        except (KeyError, ValueError, TypeError):
            outputs[o.name] = None
    for i, case in enumerate(tc.cases):
        label = f"{where}: case {i}"
        names = [info.name for info in infos]
        extra = sorted(set(case.inputs) - set(names))
        if extra:
            raise ArchiveError(f"{label}: input {extra[0]!r} is not an input of the model "
                               f"(it takes {', '.join(map(repr, names))})")
        for info in infos:
            if info.name not in case.inputs:
                raise ArchiveError(f"{label}: no value for the model's input {info.name!r}")
            value = case.inputs[info.name]
            if value.dtype != info.dtype:
                raise ArchiveError(f"{label}: input {info.name!r} is {value.dtype}, the model "
                                   f"takes {info.dtype}")
            if info.shape is not None and (
                    len(value.shape) != len(info.shape)
                    or any(isinstance(w, int) and w > 0 and g != w
                           for g, w in zip(value.shape, info.shape))):
                raise ArchiveError(f"{label}: input {info.name!r} has shape {_fmt(value.shape)}, "
                                   f"the model takes {_fmt(info.shape)}")
        extra = sorted(set(case.outputs) - set(outputs))
        if extra:
            raise ArchiveError(f"{label}: output {extra[0]!r} is not an output of the model")
        for name, dtype in outputs.items():
            if name not in case.outputs:
                raise ArchiveError(f"{label}: no ground truth for the model's output {name!r}")
            if dtype is not None and case.outputs[name].dtype != dtype:
                raise ArchiveError(f"{label}: output {name!r} is {case.outputs[name].dtype}, "
                                   f"the model computes {dtype}")
