"""The user's PyTorch program runs inside verify (`pack --reference torch:FILE.py:FACTORY`): what
it prints, raises or exits with is its own (found by a review). A sys.exit(0) in a factory
ended verify with status 0 and no archive; a print broke --json; an IndexError in forward was
verify's traceback, "internal error", exit 4; a factory importing a module beside it failed."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from fixtures_devices import run_cli

torch = pytest.importorskip("torch")

PROGRAM = textwrap.dedent("""
    import sys
    import torch

    class Lin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x)

    class Emb(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.e = torch.nn.Embedding(5, 3)

        def forward(self, ids):
            return self.e(ids)

    def lin():
        return Lin(), (torch.ones(1, 4),)

    def exits():
        sys.exit(0)

    def noisy():
        print("loading my model...")
        return lin()

    def sibling():
        from net import Net  # beside this file, as `python FILE.py` would find it
        return Net(), (torch.ones(1, 4),)

    def emb():
        return Emb(), (torch.tensor([[1, 2, 3]]),)

    class Block(torch.nn.Module):  # Linears on 3-D input: onnxruntime's MatMulAddFusion
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


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("torchprog")
    (folder / "mymods.py").write_text(PROGRAM)
    (folder / "net.py").write_text("from mymods import Lin as Net\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("mymods_for_export", folder / "mymods.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, (module, args) in (("lin", mod.lin()), ("emb", mod.emb())):
        torch.onnx.export(module.eval(), args, str(folder / f"{name}.onnx"), dynamo=False,
                          input_names=["x" if name == "lin" else "ids"], output_names=["y"])
    return folder


def test_sys_exit_in_a_factory_is_an_error_not_verify_s_exit(
        programs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "ex.vtc"
    code, out, err = run_cli(["pack", programs / "lin.onnx", "--reference",
                              f"torch:{programs / 'mymods.py'}:exits", "-o", out_file], capsys)
    assert (code, out) == (2, "") and not out_file.exists()
    assert err == f"error: {programs / 'mymods.py'}:exits() called sys.exit(0)\n"


def test_a_factory_that_prints_keeps_json_whole_and_finds_its_sibling_module(
        programs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for factory in ("noisy", "sibling"):
        code, out, err = run_cli(["pack", programs / "lin.onnx", "--reference",
                                  f"torch:{programs / 'mymods.py'}:{factory}", "-o",
                                  tmp_path / f"{factory}.vtc", "--json"], capsys)
        assert code == 0, err
        json.loads(out)  # the program's print went to stderr
        assert ("loading my model..." in err) == (factory == "noisy")


def test_a_program_failing_on_the_inputs_is_one_line(
        programs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["pack", programs / "emb.onnx", "-d", "ids:[[7,1,2]]",
                              "--reference", f"torch:{programs / 'mymods.py'}:emb", "-o",
                              tmp_path / "emb.vtc"], capsys)
    assert (code, out) == (2, "") and len(err.splitlines()) == 1
    assert err.startswith(f"error: {programs / 'mymods.py'}:emb: running the program on the "
                          "inputs failed: IndexError: ")


@pytest.mark.parametrize("layer", ["BatchNorm1d(4)", "Dropout(0.5)"])
def test_a_program_exported_in_training_mode_is_refused(
        layer: str, programs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A .pt2 exported from a module left in training mode was taken as the reference: its
    batch norm used each batch's statistics (and updated its running ones between cases),
    its dropout was random, and diff blamed the first such node of the ONNX model."""
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), eval(f"torch.nn.{layer}")).train()
    saved = tmp_path / "train.pt2"
    torch.export.save(torch.export.export(module, (torch.ones(2, 4),)), str(saved))
    out_file = tmp_path / "t.vtc"
    for argv in (["pack", programs / "lin.onnx", "--reference", f"torch:{saved}", "-o",
                  out_file], ["profile", "--torch", saved]):
        code, out, err = run_cli(argv, capsys)
        assert (code, out) == (2, "") and not out_file.exists()
        what = "batch norm" if "Batch" in layer else "dropout"
        assert err == (f"error: {saved}: exported in training mode ({what}); export it from "
                       "module.eval()\n")


def test_the_provenance_names_the_dtype_the_program_ran_in(
        programs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "float32 as exported" of every program, a float64 one included."""
    (programs / "dbl.py").write_text(
        "import torch\n"
        "from mymods import Lin\n"
        "def dbl():\n"
        "    return Lin().double(), (torch.ones(1, 4, dtype=torch.float64),)\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("dbl_for_export", programs / "dbl.py")
    mod = importlib.util.module_from_spec(spec)
    import sys

    sys.path.insert(0, str(programs))
    try:
        spec.loader.exec_module(mod)
        module, args = mod.dbl()
    finally:
        sys.path.remove(str(programs))
    torch.onnx.export(module.eval(), args, str(programs / "dbl.onnx"), dynamo=False,
                      input_names=["x"], output_names=["y"])
    vtc = tmp_path / "dbl.vtc"
    code, out, err = run_cli(["pack", programs / "dbl.onnx", "--reference",
                              f"torch:{programs / 'dbl.py'}:dbl", "-o", vtc], capsys)
    assert code == 0, err
    code, out, err = run_cli(["inspect", vtc, "--json"], capsys)
    prov = json.loads(out)["provenance"]
    assert "(float64 as exported)" in prov["reference"] and prov["torch_dtype"] == ["float64"]


def test_profile_torch_keeps_the_module_of_a_linear_onnxruntime_fused(
        programs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`profile --torch` beside a device trace: a Linear on 3-D input runs as onnxruntime's
    MatMulAddFusion, named after its MatMul ('node_MatMul_3/MatMulAddFusion'); only the NCHWc
    suffix was understood, so every such Linear showed no device time and no ONNX node."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("block_for_export", programs / "mymods.py")
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
    code, out, err = run_cli(["profile", "--torch", f"{programs / 'mymods.py'}:block", trace,
                              "--model", archive, "--warmup", "0", "--iterations", "1",
                              "--json"], capsys)
    assert code == 0, err
    modules = {tuple(m["modules"]): m for m in json.loads(out)["modules"]}
    for fc in ("fc1", "fc2"):
        row = modules[(fc,)]
        assert row["onnx_nodes"] >= 1 and row["device"] is not None and row["device"] > 0
