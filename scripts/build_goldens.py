"""Build the golden sample models and images into goldens/ (byte-identical on every run).

Usage:
    python scripts/build_goldens.py              # write into the repo's goldens/
    python scripts/build_goldens.py --out DIR    # write into DIR/models and DIR/images
    python scripts/build_goldens.py --check      # rebuild in a temp dir, compare with goldens/

Every file depends only on this script and a fixed seed: no timestamps, no downloads. The
models use IR version 8 / opset 17 so that older onnxruntime builds on devices load them too
(onnx 1.23 would write IR 14, which onnxruntime 1.31 rejects). The images are encoded here
rather than through Pillow's PNG writer, because Pillow's compressed bytes depend on the zlib
(or zlib-ng) it was built with; Pillow is used only to check that they decode.
"""

from __future__ import annotations

import argparse
import filecmp
import struct
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20240601
IR_VERSION = 8
OPSET = 17
PRODUCER = "verify goldens"
REPO_GOLDENS = Path(__file__).resolve().parent.parent / "goldens"

MODEL_FILES = (
    "cnn.onnx",
    "cnn_nhwc.onnx",
    "two_io.onnx",
    "int_bool.onnx",
    "dynamic.onnx",
    "unsupported_op.onnx",
)
IMAGE_FILES = ("sample.png", "sample.ppm")


# --------------------------------------------------------------------------- helpers


def _finish(graph: onnx.GraphProto, extra_opsets: tuple[tuple[str, int], ...] = ()) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, producer_name=PRODUCER, doc_string=PRODUCER)
    model.ir_version = IR_VERSION
    model.producer_version = "1"
    return model


class _Graph:
    """Collects nodes and initializers; tensor names are '<node name>:0' unless given."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, name: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        out = out or f"{name}:0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def conv(self, name: str, x: str, cin: int, cout: int, k: int, stride: int = 1,
             bias: bool = False, gain: float = 1.0) -> str:
        # He init: keeps the activation scale roughly constant through Conv+Relu.
        std = gain * np.sqrt(2.0 / (cin * k * k))
        w = (self.rng.standard_normal((cout, cin, k, k)) * std).astype(np.float32)
        ins = [x, self.init(f"{name}/W", w)]
        if bias:
            ins.append(self.init(f"{name}/B", (self.rng.standard_normal(cout) * 0.1).astype(np.float32)))
        pad = k // 2
        return self.node("Conv", name, ins, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad, pad, pad, pad])

    def bn(self, name: str, x: str, c: int) -> str:
        # Non-trivial stats: scale/shift/mean/var all differ per channel.
        r = self.rng
        scale = r.uniform(0.6, 1.4, c).astype(np.float32)
        shift = (r.standard_normal(c) * 0.1).astype(np.float32)
        mean = (r.standard_normal(c) * 0.1).astype(np.float32)
        var = r.uniform(0.6, 1.6, c).astype(np.float32)
        ins = [x] + [self.init(f"{name}/{p}", a) for p, a in
                     (("scale", scale), ("B", shift), ("mean", mean), ("var", var))]
        return self.node("BatchNormalization", name, ins, epsilon=1e-5)


# --------------------------------------------------------------------------- models


def _cnn_body(g: _Graph, x: str) -> str:
    """Stem, three residual blocks (identity, projection + stride 2, identity + SE), head."""
    y = g.conv("stem/conv", x, 3, 8, 3, stride=2)
    y = g.bn("stem/bn", y, 8)
    y = g.node("Relu", "stem/relu", [y])
    y = g.node("MaxPool", "stem/pool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])

    # block1: 8 -> 8 at 56x56, identity skip
    skip = y
    y = g.conv("block1/conv1", y, 8, 8, 3)
    y = g.bn("block1/bn1", y, 8)
    y = g.node("Relu", "block1/relu1", [y])
    y = g.conv("block1/conv2", y, 8, 8, 3, gain=0.7)
    y = g.bn("block1/bn2", y, 8)
    y = g.node("Add", "block1/add", [y, skip])
    y = g.node("Relu", "block1/relu", [y])

    # block2: 8 -> 16, stride 2 to 28x28, 1x1 projection on the skip
    skip = y
    y = g.conv("block2/conv1", y, 8, 16, 3, stride=2)
    y = g.bn("block2/bn1", y, 16)
    y = g.node("Relu", "block2/relu1", [y])
    y = g.conv("block2/conv2", y, 16, 16, 3, gain=0.7)
    y = g.bn("block2/bn2", y, 16)
    p = g.conv("block2/proj/conv", skip, 8, 16, 1, stride=2, gain=0.7)
    p = g.bn("block2/proj/bn", p, 16)
    y = g.node("Add", "block2/add", [y, p])
    y = g.node("Relu", "block2/relu", [y])

    # block3: 16 -> 16 at 28x28, identity skip, squeeze-excitation gate (the Sigmoid)
    skip = y
    y = g.conv("block3/conv1", y, 16, 16, 3)
    y = g.bn("block3/bn1", y, 16)
    y = g.node("Relu", "block3/relu1", [y])
    y = g.conv("block3/conv2", y, 16, 16, 3, gain=0.7)
    y = g.bn("block3/bn2", y, 16)
    s = g.node("GlobalAveragePool", "block3/se/pool", [y])
    s = g.conv("block3/se/fc1", s, 16, 4, 1, bias=True)
    s = g.node("Relu", "block3/se/relu", [s])
    s = g.conv("block3/se/fc2", s, 4, 16, 1, bias=True)
    s = g.node("Sigmoid", "block3/se/sigmoid", [s])
    y = g.node("Mul", "block3/se/scale", [y, s])
    y = g.node("Add", "block3/add", [y, skip])
    y = g.node("Relu", "block3/relu", [y])

    y = g.node("GlobalAveragePool", "head/pool", [y])
    y = g.node("Flatten", "head/flatten", [y], axis=1)
    w = (g.rng.standard_normal((10, 16)) * np.sqrt(1.0 / 16)).astype(np.float32)
    b = (g.rng.standard_normal(10) * 0.1).astype(np.float32)
    y = g.node("Gemm", "head/fc", [y, g.init("head/fc/W", w), g.init("head/fc/B", b)],
               out="logits", transB=1)
    return g.node("Softmax", "head/softmax", [y], out="prob", axis=1)


def build_cnn(nhwc: bool = False) -> onnx.ModelProto:
    """ResNet-style CNN; the NHWC variant has the same weights behind a Transpose."""
    g = _Graph(np.random.default_rng(SEED))
    if nhwc:
        shape = [1, 224, 224, 3]
        x = g.node("Transpose", "input/to_nchw", ["data"], perm=[0, 3, 1, 2])
    else:
        shape = [1, 3, 224, 224]
        x = "data"
    out = _cnn_body(g, x)
    graph = helper.make_graph(
        g.nodes, "cnn_nhwc" if nhwc else "cnn",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 10])],
        initializer=g.inits, doc_string=PRODUCER,
    )
    return _finish(graph)


def build_two_io() -> onnx.ModelProto:
    """Two inputs, two outputs, two paths joining in a Concat."""
    g = _Graph(np.random.default_rng(SEED + 1))
    s = g.node("Add", "sum/add", ["a", "b"])
    s = g.node("Relu", "sum/relu", [s], out="sum_relu")
    m = g.node("Mul", "branch/mul", ["a", "b"])
    m = g.node("Tanh", "branch/tanh", [m])
    j = g.node("Concat", "join/concat", [s, m], axis=1)
    w = (g.rng.standard_normal((32, 8)) * np.sqrt(1.0 / 32)).astype(np.float32)
    p = g.node("MatMul", "join/matmul", [j, g.init("join/W", w)], out="prod")
    graph = helper.make_graph(
        g.nodes, "two_io",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 16]) for n in ("a", "b")],
        [helper.make_tensor_value_info(s, TensorProto.FLOAT, [1, 16]),
         helper.make_tensor_value_info(p, TensorProto.FLOAT, [1, 8])],
        initializer=g.inits, doc_string=PRODUCER,
    )
    return _finish(graph)


VOCAB = 16


def build_int_bool() -> onnx.ModelProto:
    """int64 and bool tensors: Mod, Gather, ReduceSum, Greater, Where, Cast, ArgMax."""
    g = _Graph(np.random.default_rng(SEED + 2))
    emb = g.rng.standard_normal((VOCAB, 4)).astype(np.float32)
    # Mod keeps any int64 id (random, negative, huge) inside the vocabulary.
    ids = g.node("Mod", "ids/mod", ["ids", g.init("ids/vocab", np.array(VOCAB, dtype=np.int64))])
    e = g.node("Gather", "embed/gather", [g.init("embed/table", emb), ids], axis=0)
    e = g.node("ReduceSum", "embed/sum", [e, g.init("embed/axes", np.array([2], dtype=np.int64))],
               keepdims=0)
    mask = g.node("Greater", "select/greater", ["x", e], out="mask")
    sel = g.node("Where", "select/where", [mask, "x", e], out="selected")
    cnt = g.node("Cast", "count/cast", [mask], to=TensorProto.INT64)
    cnt = g.node("ReduceSum", "count/sum", [cnt, g.init("count/axes", np.array([1], dtype=np.int64))],
                 out="count", keepdims=0)
    am = g.node("ArgMax", "select/argmax", [sel], out="argmax", axis=1, keepdims=0)
    graph = helper.make_graph(
        g.nodes, "int_bool",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(am, TensorProto.INT64, [1]),
         helper.make_tensor_value_info(mask, TensorProto.BOOL, [1, 8]),
         helper.make_tensor_value_info(sel, TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info(cnt, TensorProto.INT64, [1])],
        initializer=g.inits, doc_string=PRODUCER,
    )
    return _finish(graph)


def build_dynamic() -> onnx.ModelProto:
    """Input with a symbolic batch dimension 'N'."""
    g = _Graph(np.random.default_rng(SEED + 3))
    w = (g.rng.standard_normal((4, 3)) * np.sqrt(2.0 / 4)).astype(np.float32)
    y = g.node("MatMul", "fc/matmul", ["x", g.init("fc/W", w)])
    y = g.node("Relu", "fc/relu", [y], out="y")
    graph = helper.make_graph(
        g.nodes, "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N", 3])],
        initializer=g.inits, doc_string=PRODUCER,
    )
    return _finish(graph)


def build_unsupported_op() -> onnx.ModelProto:
    """Valid ONNX, but onnxruntime has no kernel for com.example:Frobnicate."""
    g = _Graph(np.random.default_rng(SEED + 4))
    y = g.node("Relu", "pre/relu", ["x"])
    g.nodes.append(helper.make_node("Frobnicate", [y], ["y"], name="custom/frobnicate",
                                    domain="com.example", strength=3))
    graph = helper.make_graph(
        g.nodes, "unsupported_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        doc_string=PRODUCER,
    )
    return _finish(graph, extra_opsets=(("com.example", 1),))


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "cnn.onnx": build_cnn,
    "cnn_nhwc.onnx": lambda: build_cnn(nhwc=True),
    "two_io.onnx": build_two_io,
    "int_bool.onnx": build_int_bool,
    "dynamic.onnx": build_dynamic,
    "unsupported_op.onnx": build_unsupported_op,
}


# --------------------------------------------------------------------------- image


def sample_pixels(width: int = 256, height: int = 192) -> np.ndarray:
    """uint8 HxWx3: gradients, stripes, circles and a little seeded noise."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    img = np.empty((height, width, 3), dtype=np.float64)
    img[..., 0] = 255.0 * xx / (width - 1)
    img[..., 1] = 255.0 * yy / (height - 1)
    img[..., 2] = 128.0 + 100.0 * ((xx // 8 + yy // 8) % 2 * 2 - 1) * (yy > height / 2)
    stripes = (xx + yy) % 24 < 6
    img[stripes] = img[stripes] * 0.3 + np.array([240.0, 240.0, 60.0]) * 0.7
    for cx, cy, r, color in ((64, 64, 40, (230, 40, 40)), (180, 110, 55, (30, 60, 220)),
                             (120, 150, 25, (250, 250, 250))):
        img[(xx - cx) ** 2 + (yy - cy) ** 2 <= r * r] = color
    noise = np.random.default_rng(SEED + 5).integers(-12, 13, size=img.shape)
    return np.clip(np.rint(img) + noise, 0, 255).astype(np.uint8)


def encode_ppm(pixels: np.ndarray) -> bytes:
    h, w, _ = pixels.shape
    return f"P6\n{w} {h}\n255\n".encode("ascii") + pixels.tobytes()


def encode_png(pixels: np.ndarray) -> bytes:
    """8-bit RGB PNG with stored (uncompressed) deflate blocks: identical bytes everywhere."""
    h, w, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[row].tobytes() for row in range(h))
    blocks = []
    for start in range(0, len(raw), 65535):
        chunk = raw[start:start + 65535]
        final = 1 if start + 65535 >= len(raw) else 0
        blocks.append(struct.pack("<BHH", final, len(chunk), len(chunk) ^ 0xFFFF) + chunk)
    zdata = b"\x78\x01" + b"".join(blocks) + struct.pack(">I", zlib.adler32(raw))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zdata) + chunk(b"IEND", b"")


# --------------------------------------------------------------------------- validation


def _validate_model(name: str, model: onnx.ModelProto) -> None:
    import onnxruntime as ort

    onnx.checker.check_model(model, full_check=True)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if name == "unsupported_op.onnx":
        try:
            ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own pybind exception types
            if "Frobnicate" not in str(exc):
                raise RuntimeError(f"{name}: unexpected load error: {exc}") from exc
            return
        raise RuntimeError(f"{name}: onnxruntime loaded a model it should reject")

    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) else 2 for d in inp.shape]
        if inp.type == "tensor(int64)":
            feeds[inp.name] = rng.integers(-100, 100, size=shape, dtype=np.int64)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    for out, value in zip(sess.get_outputs(), sess.run(None, feeds)):
        if value.dtype.kind == "f":
            if not np.all(np.isfinite(value)):
                raise RuntimeError(f"{name}: output {out.name} is not finite")
            if value.size > 1 and np.ptp(value) == 0:
                raise RuntimeError(f"{name}: output {out.name} is constant")
    if name.startswith("cnn") and sess.run(["prob"], feeds)[0].max() > 0.9:
        raise RuntimeError(f"{name}: softmax saturated on random input")


def _validate_image(pixels: np.ndarray, png: bytes, ppm: bytes) -> None:
    import io

    from PIL import Image

    for data in (png, ppm):
        with Image.open(io.BytesIO(data)) as im:
            if im.mode != "RGB" or not np.array_equal(np.asarray(im), pixels):
                raise RuntimeError("sample image does not decode to the generated pixels")


# --------------------------------------------------------------------------- main


def build(out: Path, validate: bool = True) -> list[Path]:
    """Write every golden file under out/models and out/images; return the paths."""
    (out / "models").mkdir(parents=True, exist_ok=True)
    (out / "images").mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in MODELS.items():
        model = make()
        if validate:
            _validate_model(name, model)
        path = out / "models" / name
        path.write_bytes(model.SerializeToString())
        written.append(path)
    pixels = sample_pixels()
    png, ppm = encode_png(pixels), encode_ppm(pixels)
    if validate:
        _validate_image(pixels, png, ppm)
    for name, data in (("sample.png", png), ("sample.ppm", ppm)):
        path = out / "images" / name
        path.write_bytes(data)
        written.append(path)
    return written


def check(reference: Path) -> list[str]:
    """Rebuild in a temp dir; return the relative paths that differ from reference."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        build(fresh, validate=False)
        differ = []
        for sub, names in (("models", MODEL_FILES), ("images", IMAGE_FILES)):
            for name in names:
                ref = reference / sub / name
                if not ref.is_file() or not filecmp.cmp(ref, fresh / sub / name, shallow=False):
                    differ.append(f"{sub}/{name}")
        return differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_GOLDENS, help="goldens directory (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="rebuild in a temp dir and compare byte for byte with --out")
    args = parser.parse_args(argv)
    if args.check:
        differ = check(args.out)
        for rel in differ:
            print(f"differs: {args.out / rel}", file=sys.stderr)
        if differ:
            return 1
        print(f"ok: {len(MODEL_FILES) + len(IMAGE_FILES)} files match {args.out}")
        return 0
    for path in build(args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
