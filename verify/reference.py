"""Ground truth on the host: ONNX Runtime's CPU provider with graph optimizations off."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from verify.dtypes import NOT_THROUGH_NUMPY, numpy_less_reason
from verify.errors import InputError, ModelError


# How onnxruntime says it has no kernel for an op (its errors are untyped strings).
_UNSUPPORTED = ("NOT_IMPLEMENTED", "Could not find an implementation",
                "is not a registered function/op", "No Op registered")


ORT_LOG_ENV = "VERIFY_ORT_LOG"
# `verify --ort-log LEVEL` (or $VERIFY_ORT_LOG): a name or onnxruntime's number for it
ORT_LOG_LEVELS = {"verbose": 0, "info": 1, "warning": 2, "error": 3, "fatal": 4}


def parse_ort_log(text: str) -> int | None:
    """A log level given by name or number (0 verbose .. 4 fatal); None when it is neither."""
    text = text.strip().lower()
    if text in ORT_LOG_LEVELS:
        return ORT_LOG_LEVELS[text]
    return int(text) if text in ("0", "1", "2", "3", "4") else None


def requested_ort_log() -> int | None:
    """The level the user asked for (`verify --ort-log`, $VERIFY_ORT_LOG), or None; a variable
    set to something else is an InputError (it was ignored without a word)."""
    text = os.environ.get(ORT_LOG_ENV, "")
    level = parse_ort_log(text)
    if level is None and text.strip():
        raise InputError(f"{ORT_LOG_ENV}={text!r}: expected one of {', '.join(ORT_LOG_LEVELS)} "
                         "(or 0..4)")
    return level


def ort_log_severity() -> int:
    """onnxruntime's own log level for sessions verify makes on this host: 4 (fatal only: its
    errors reach the user as verify's one-line messages) unless `verify --ort-log` or
    VERIFY_ORT_LOG asks for more (0 verbose, 1 info, 2 warning, 3 error)."""
    level = requested_ort_log()
    return 4 if level is None else level


def reference_session(model_bytes: bytes, where: str, external_dir: Path | None = None,
                      optimized: bool = False):
    """A plain CPU session (no graph optimizations: the plainest kernels; with `optimized`,
    every optimization, as `verify run` runs by default); `external_dir`: the folder the
    model's external data files lie in."""
    import onnxruntime as ort

    from verify.external import EXTERNAL_FOLDER_KEY

    ort.set_default_logger_severity(ort_log_severity())
    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized else
                                   ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.log_severity_level = ort_log_severity()
    if external_dir is not None:
        so.add_session_config_entry(EXTERNAL_FOLDER_KEY, str(Path(external_dir).resolve()))
    try:
        return ort.InferenceSession(model_bytes, sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors
        text = _first_line(str(exc))
        if any(sign in str(exc) for sign in _UNSUPPORTED):
            raise ModelError(f"{where}: onnxruntime {ort.__version__} cannot run this model: {text}") from None
        raise ModelError(f"{where}: onnxruntime could not load the model: {text}") from None


def check_host_io(session, where: str) -> None:
    """ModelError for an input or output this host's onnxruntime cannot pass through numpy
    (bfloat16, float8), and for an output verify cannot carry: a string tensor (a .npy file
    holds strings only through pickle) or no tensor at all (sklearn-onnx's ZipMap gives a
    sequence of maps)."""
    for what, io in (("input", session.get_inputs()), ("output", session.get_outputs())):
        for o in io:
            element = o.type[len("tensor("):-1] if o.type.startswith("tensor(") else ""
            if element in NOT_THROUGH_NUMPY:
                raise ModelError(f"{where}: " + numpy_less_reason(f"{what} {o.name!r}", element))
    for o in session.get_outputs():
        if o.type == "tensor(string)":
            raise ModelError(f"{where}: output {o.name!r} is a string tensor; verify carries "
                             "numeric and bool tensors only (a .npy file holds strings only "
                             "through pickle)")
        if not o.type.startswith("tensor("):
            raise ModelError(f"{where}: output {o.name!r} is {o.type}, not a tensor; verify "
                             "compares tensor outputs only (an sklearn-onnx classifier: "
                             "convert it with options={'zipmap': False})")


def run_reference(session, feeds: Mapping[str, np.ndarray], where: str,
                  hint: str = "") -> dict[str, np.ndarray]:
    """The outputs of one case; InputError (with `hint` appended) when onnxruntime refuses."""
    import onnxruntime as ort

    names = [o.name for o in session.get_outputs()]
    ro = ort.RunOptions()
    ro.log_severity_level = ort_log_severity()
    try:
        values = session.run(names, dict(feeds), ro)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors are untyped
        raise InputError(f"{where}: onnxruntime rejected the inputs: "
                         f"{_first_line(str(exc))}{hint}") from None
    return {n: np.asarray(v) for n, v in zip(names, values)}


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else text
