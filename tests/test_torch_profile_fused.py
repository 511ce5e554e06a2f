"""`profile --torch` beside a device trace: a Linear on 3-D input runs as onnxruntime's
MatMulAddFusion, named after its MatMul ('node_MatMul_3/MatMulAddFusion'); only the NCHWc
suffix was understood, so every such Linear showed no device time and no ONNX node, its time
under "(device nodes from no module)" (found by a review)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from fixtures_devices import run_cli

torch = pytest.importorskip("torch")

PROGRAM = textwrap.dedent("""
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc1 = torch.nn.Linear(32, 64)
            self.fc2 = torch.nn.Linear(64, 32)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    def block():
        return Block().eval(), (torch.ones(1, 8, 32),)
""")


def test_a_fused_linear_keeps_its_module(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    import importlib.util

    spec = importlib.util.spec_from_file_location("prog_for_export", tmp_path / "prog.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    module, args = mod.block()
    onnx_path = tmp_path / "block.onnx"
    torch.onnx.export(module, args, str(onnx_path), dynamo=True, external_data=False,
                      verbose=False)
    archive, trace = tmp_path / "b.vtc", tmp_path / "prof.json"
    assert run_cli(["pack", onnx_path, "-o", archive], capsys)[0] == 0
    code, _, err = run_cli(["run", archive, "--device", "local", "--iter", "2", "--opt-level",
                            "all", "--profile", trace], capsys)
    assert code == 0, err
    doc = json.loads(trace.read_text())
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    names = {e.get("name", "") for e in events if isinstance(e, dict) and e.get("cat") == "Node"}
    if not any("/MatMulAddFusion" in n for n in names):
        pytest.skip("this onnxruntime did not fuse the Linear's MatMul and Add")
    code, out, err = run_cli(["profile", "--torch", f"{tmp_path / 'prog.py'}:block", trace,
                              "--model", archive, "--warmup", "0", "--iterations", "1",
                              "--json"], capsys)
    assert code == 0, err
    modules = {tuple(m["modules"]): m for m in json.loads(out)["modules"]}
    for fc in ("fc1", "fc2"):
        row = modules[(fc,)]
        assert row["onnx_nodes"] >= 1 and row["device"] is not None and row["device"] > 0
