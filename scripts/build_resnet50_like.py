"""Build a ResNet-50-sized ONNX model with random weights, for benchmarks only (not committed).

Usage: python scripts/build_resnet50_like.py OUT.onnx [--seed N]

ResNet-50 v1.5 topology with batch norm folded into the convolutions, as in exported
inference models: 53 Conv, 49 Relu, 16 Add, MaxPool, GlobalAveragePool, Flatten, Gemm
(122 nodes, ~25.5M parameters, ~102 MB file, ~4.1 GMACs). Input `data` float32
[1,3,224,224], output `logits` float32 [1,1000]. Weights are seeded He-init, with the last
conv of each bottleneck scaled down so activations stay bounded through 16 residual adds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8
OPSET = 17
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # width, blocks, first stride
EXPANSION = 4


class _Builder:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def node(self, op: str, name: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        out = out or f"{name}:0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def conv(self, name: str, x: str, cin: int, cout: int, k: int, stride: int = 1,
             gain: float = 1.0) -> str:
        std = gain * np.sqrt(2.0 / (cin * k * k))
        w = self.rng.standard_normal((cout, cin, k, k), dtype=np.float32) * np.float32(std)
        b = self.rng.standard_normal(cout, dtype=np.float32) * np.float32(0.05)
        self.inits.append(numpy_helper.from_array(w, f"{name}/W"))
        self.inits.append(numpy_helper.from_array(b, f"{name}/B"))
        pad = k // 2
        return self.node("Conv", name, [x, f"{name}/W", f"{name}/B"], kernel_shape=[k, k],
                         strides=[stride, stride], pads=[pad, pad, pad, pad])


def make_model(seed: int = 0) -> onnx.ModelProto:
    """The ResNet-50-like ModelProto (about 100 MB of weights in memory)."""
    b = _Builder(np.random.default_rng(seed))
    y = b.conv("stem/conv", "data", 3, 64, 7, stride=2)
    y = b.node("Relu", "stem/relu", [y])
    y = b.node("MaxPool", "stem/pool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for s, (width, blocks, first_stride) in enumerate(STAGES, start=1):
        cout = width * EXPANSION
        for i in range(blocks):
            stride = first_stride if i == 0 else 1
            p = f"layer{s}.{i}"
            skip = y
            h = b.conv(f"{p}/conv1", y, cin, width, 1)
            h = b.node("Relu", f"{p}/relu1", [h])
            h = b.conv(f"{p}/conv2", h, width, width, 3, stride=stride)
            h = b.node("Relu", f"{p}/relu2", [h])
            h = b.conv(f"{p}/conv3", h, width, cout, 1, gain=0.2)
            if i == 0:
                skip = b.conv(f"{p}/downsample", y, cin, cout, 1, stride=stride, gain=1.0)
            y = b.node("Add", f"{p}/add", [h, skip])
            y = b.node("Relu", f"{p}/relu", [y])
            cin = cout
    y = b.node("GlobalAveragePool", "head/pool", [y])
    y = b.node("Flatten", "head/flatten", [y], axis=1)
    w = b.rng.standard_normal((1000, cin), dtype=np.float32) * np.float32(np.sqrt(1.0 / cin))
    b.inits.append(numpy_helper.from_array(w, "head/fc/W"))
    b.inits.append(numpy_helper.from_array(np.zeros(1000, dtype=np.float32), "head/fc/B"))
    y = b.node("Gemm", "head/fc", [y, "head/fc/W", "head/fc/B"], out="logits", transB=1)

    graph = helper.make_graph(
        b.nodes, "resnet50_like",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 1000])],
        initializer=b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="verify benchmarks", doc_string="verify benchmarks")
    model.ir_version = IR_VERSION  # onnx 1.23 would write 14; onnxruntime 1.31 takes at most 13
    return model


def build(path: str | Path, seed: int = 0) -> Path:
    """Write the model to path (about 100 MB) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(make_model(seed).SerializeToString())
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where to write the .onnx file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build(args.out, args.seed)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
