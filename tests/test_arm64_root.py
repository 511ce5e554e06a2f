"""The emulated aarch64 target that scripts/build_arm64_root.py builds (qemu-user + a Debian
arm64 Python with numpy and onnxruntime): it really is aarch64, it computes what the host does
to within the last bits, and rebuilding it is a no-op.

Skipped when the root is not built; CI builds it first (`python scripts/build_arm64_root.py`).
One emulated Python process serves every test here (an emulated onnxruntime import costs ~2 s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.arm64, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build_arm64_root.py"

PROBE = """\
import json, os, platform, sys
import numpy as np
import onnxruntime as ort

model, inputs, out = sys.argv[1:4]
opts = ort.SessionOptions()
opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
opts.intra_op_num_threads = 1
sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
np.save(out, sess.run(None, {"x": np.load(inputs)})[0])
print(json.dumps({"machine": platform.machine(), "cwd": os.getcwd(), "argv": sys.argv[1:],
                  "executable": sys.executable, "numpy": np.__version__,
                  "numpy_file": np.__file__, "onnxruntime": ort.__version__,
                  "onnxruntime_file": ort.__file__,
                  "providers": ort.get_available_providers()}))
"""


def load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_arm64_root", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


builder = load_builder()


@pytest.fixture(scope="module")
def root() -> Path:
    path = Path(os.path.abspath(builder.default_root()))
    if not builder.is_built(path):
        pytest.skip(f"no emulated arm64 root at {path}: build it with "
                    f"`python scripts/build_arm64_root.py` (or point ${builder.ROOT_ENV} at one)")
    if shutil.which(builder.QEMU) is None:
        pytest.skip(f"{builder.QEMU} not on PATH: apt-get install qemu-user-static")
    return path


def tiny_model(path: Path) -> None:
    """MatMul + Relu with unit-scale outputs, IR 13 (onnxruntime 1.31 rejects onnx 1.23's IR 14)."""
    from onnx import TensorProto, helper, numpy_helper, save

    w = (np.random.default_rng(1).standard_normal((64, 32)) / 8).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 32])],
        [numpy_helper.from_array(w, "w")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=13),
         str(path))


def host_run(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def probe(root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the tiny model once under emulation, from an unrelated cwd, script path relative."""
    data = tmp_path_factory.mktemp("arm64-data")
    cwd = tmp_path_factory.mktemp("arm64-cwd")
    (cwd / "probe.py").write_text(PROBE, encoding="utf-8")
    tiny_model(data / "tiny.onnx")
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    np.save(data / "x.npy", x)
    argv = [*builder.command_prefix(root), "probe.py",
            str(data / "tiny.onnx"), str(data / "x.npy"), str(data / "out.npy")]
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{shlex.join(argv)} failed:\n{proc.stderr[-3000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["device"] = np.load(data / "out.npy")
    report["host"] = host_run(data / "tiny.onnx", x)
    report["expected_cwd"] = str(cwd)
    return report


def test_runs_on_aarch64_from_any_cwd(root: Path, probe: dict[str, Any]) -> None:
    assert probe["machine"] == "aarch64"
    assert probe["cwd"] == probe["expected_cwd"]
    assert probe["argv"][0].endswith("tiny.onnx")
    assert probe["executable"] == str(root / builder.GUEST_PYTHON)


def test_numpy_and_onnxruntime_come_from_the_root(root: Path, probe: dict[str, Any]) -> None:
    stamp = builder.read_stamp(root)
    assert probe["numpy"] == stamp["wheels"]["numpy"]
    assert probe["onnxruntime"] == stamp["wheels"]["onnxruntime"]
    for key in ("numpy_file", "onnxruntime_file"):
        assert Path(probe[key]).is_relative_to(root / builder.GUEST_SITE), probe[key]
    assert "CPUExecutionProvider" in probe["providers"]


def test_tiny_model_matches_host(probe: dict[str, Any]) -> None:
    device, host = probe["device"], probe["host"]
    assert device.dtype == host.dtype == np.float32
    assert device.shape == host.shape == (8, 32)
    assert float(np.abs(host).max()) > 0.5  # the check below is meaningful at this scale
    assert float(np.abs(device - host).max()) <= 1e-6


def test_print_prefix(root: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--print-prefix"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == builder.command_prefix(root)
    empty = tmp_path / "not-built"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--root", str(empty), "--print-prefix"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert f"no arm64 root at {empty}" in proc.stderr
    assert not empty.exists()


def test_second_build_is_a_noop(root: Path) -> None:
    if not builder.is_current(root, builder.wanted_spec()):
        pytest.skip(f"{root} was built for other numpy/onnxruntime versions than this host's; "
                    "rebuilding it here would need the network")
    stamp = root / builder.STAMP_NAME
    before = (root.stat().st_ino, stamp.stat().st_mtime_ns)
    assert builder.build(root) is False
    proc = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == f"{root}: up to date"
    assert proc.stdout.strip() == shlex.join(builder.command_prefix(root))
    assert (root.stat().st_ino, stamp.stat().st_mtime_ns) == before
    assert not root.with_name(root.name + ".tmp").exists()
