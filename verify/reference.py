"""Ground truth on the host: ONNX Runtime's CPU provider with graph optimizations off."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from verify.errors import InputError, ModelError


# How onnxruntime says it has no kernel for an op (its errors are untyped strings).
_UNSUPPORTED = ("NOT_IMPLEMENTED", "Could not find an implementation",
                "is not a registered function/op", "No Op registered")


def reference_session(model_bytes: bytes, where: str):
    """A plain CPU session (no graph optimizations: the plainest kernels)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(model_bytes, sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors
        text = _first_line(str(exc))
        if any(sign in str(exc) for sign in _UNSUPPORTED):
            raise ModelError(f"{where}: onnxruntime {ort.__version__} cannot run this model: {text}") from None
        raise ModelError(f"{where}: onnxruntime could not load the model: {text}") from None


def run_reference(session, feeds: Mapping[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    try:
        values = session.run(names, dict(feeds))
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors are untyped
        raise InputError(f"{where}: onnxruntime rejected the inputs: {_first_line(str(exc))}") from None
    return {n: np.asarray(v) for n, v in zip(names, values)}


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else text
