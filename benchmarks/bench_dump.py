"""Peak memory of `verify run --bin-io-dump` against a plain `verify run`, measured in one go.

    python benchmarks/bench_dump.py [--models resnet50,wide] [--levels disable,all]

For each model and opt level: the device runner's peak RSS (it reports its own) in a plain
timed run, in a `--bin-io-dump` run's dumping runner at the default budget ("dump s" is that
whole run's wall time), and in a dump with everything marked
at once (one chunk: what a naive mark-all capture costs), as ratios to the plain run.
Target (issue 3): the default dump within ~1.3x of the plain run however deep or wide.
Models: the ResNet-50-like model from scripts/build_resnet50_like.py (25M parameters, 122
tensors, ~106 MB of activations) and a wide fully convolutional model built here (16 channels
at 640x640, 10 conv+relu pairs: ~500 MB of activations, weights negligible, like a
text detector). Runs on the local device; the host cache and temp files go to a temp folder.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from verify import execute  # noqa: E402
from verify.cli import main  # noqa: E402


def build_wide(path: Path, layers: int = 10, channels: int = 16, size: int = 640) -> None:
    rng = np.random.default_rng(0)
    nodes, inits, prev, cin = [], [], "x", 3
    for i in range(layers):
        w = (rng.standard_normal((channels, cin, 3, 3)) * (2.0 / (cin * 9)) ** 0.5).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"conv{i}"], pads=[1, 1, 1, 1],
                                      name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"))
        prev, cin = f"relu{i}", channels
    nodes.append(helper.make_node("ReduceMean", [prev], ["y"], keepdims=0, name="mean"))
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, size, size])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)


def plain_peak(archive: Path, level: str) -> int:
    o = execute.run(execute.RunRequest(archive=archive, iterations=1, warmup=0, opt_level=level))
    assert o.run.peak_rss_bytes
    return o.run.peak_rss_bytes


def dump_peak(archive: Path, level: str, out: Path, budget_mb: float | None) -> tuple[int, float]:
    """The dump's runner peak (at opt-level disable a child forked by the timed run's process
    before its session; above it, a runner process of its own)."""
    t = time.perf_counter()
    o = execute.run(execute.RunRequest(archive=archive, iterations=1, warmup=0, opt_level=level,
                                       bin_io_dump=out, dump_budget_mb=budget_mb))
    assert o.run.dump is not None and o.run.dump.peak_rss_bytes
    return o.run.dump.peak_rss_bytes, time.perf_counter() - t


def main_(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,wide")
    ap.add_argument("--levels", default="disable,all")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-dump-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")  # a private device work area
        models = {}
        for name in args.models.split(","):
            onnx_path = tmp / f"{name}.onnx"
            if name == "resnet50":
                subprocess.run([sys.executable, str(REPO / "scripts" / "build_resnet50_like.py"),
                                str(onnx_path)], check=True, stdout=subprocess.DEVNULL)
            else:
                build_wide(onnx_path)
            assert main(["pack", str(onnx_path), "-o", str(tmp / f"{name}.vtc"), "--json"]) == 0
            models[name] = tmp / f"{name}.vtc"
        print(f"{'model':<10} {'opt':<8} {'plain MB':>9} {'dump MB':>8} {'ratio':>6} "
              f"{'dump s':>7} {'mark-all MB':>12} {'ratio':>6}")
        for name, archive in models.items():
            for level in args.levels.split(","):
                plain = plain_peak(archive, level)
                dump, secs = dump_peak(archive, level, tmp / "d", None)
                naive, _ = dump_peak(archive, level, tmp / "d", 1e6)
                print(f"{name:<10} {level:<8} {plain / 2**20:9.0f} {dump / 2**20:8.0f} "
                      f"{dump / plain:6.2f} {secs:7.1f} {naive / 2**20:12.0f} {naive / plain:6.2f}")
    print("target: dump/plain <= 1.3 at the default --dump-budget-mb")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
