"""PyTorch as the reference (`pack --reference torch:PROGRAM`), on real torchvision architectures
(resnet18, mobilenet_v3_small; random weights, nothing downloaded), exported by torch.onnx's
dynamo exporter: a fault injected on the device side (tests/faulty_runner.py) is named as the
exact ONNX node *and* the PyTorch module it came from; one weight altered in the exported model
is reported as differing from PyTorch already on the host.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from fixtures_devices import run_cli

torch = pytest.importorskip("torch")
TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow

# arch → (the Conv whose weight initializer names it, the modules it computes, its source file)
ARCHS = {
    "resnet18": ("layer3.1.conv2.weight", ["layer3.1.conv2", "layer3.1.bn2"], "resnet.py"),
    "mobilenet_v3_small": ("features.4.block.0.0.weight",
                           ["features.4.block.0.0", "features.4.block.0.1"], "mobilenetv3.py"),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """Each architecture exported to ONNX (dynamo exporter, one file) and saved as a .pt2."""
    sys.path.insert(0, str(TESTS))
    import torch_models

    folder = tmp_path_factory.mktemp("torch")
    made = {}
    for arch in ARCHS:
        module, (x,) = getattr(torch_models, arch)()
        program = torch.export.export(module, (x,))
        torch.export.save(program, str(folder / f"{arch}.pt2"))
        torch.onnx.export(program, (x,), str(folder / f"{arch}.onnx"), dynamo=True,
                          external_data=False, verbose=False)
        made[arch] = {"onnx": folder / f"{arch}.onnx", "pt2": folder / f"{arch}.pt2",
                      "factory": Path(f"{TESTS / 'torch_models.py'}:{arch}")}
    return made


def _node_with(model: onnx.ModelProto, initializer: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if initializer in n.input)


def _pack(capsys: pytest.CaptureFixture[str], model: Path, program: str, out: Path,
          *extra: str) -> dict[str, Any]:
    code, stdout, err = run_cli(["pack", model, "--reference", f"torch:{program}", "--layers",
                                 "-o", out, "--json", *extra], capsys)
    assert code == 0, err
    return json.loads(stdout)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_device_fault_named_as_node_and_module(arch: str, exported: dict, faulty_profile,
                                               tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    files = exported[arch]
    program = str(files["pt2"] if arch == "resnet18" else files["factory"])
    archive = tmp_path / f"{arch}.vtc"
    doc = _pack(capsys, files["onnx"], program, archive)
    prov = doc["provenance"]
    assert prov["torch"] == torch.__version__ and prov["torch_program"] == program
    assert prov["host_vs_torch"]["passed"] is True, prov["host_vs_torch"]
    mapping = prov["torch_map"]
    assert mapping["how"] == "names" and mapping["mapped"] == mapping["onnx_tensors"]
    weight, modules, source = ARCHS[arch]
    model = onnx.load(str(files["onnx"]))
    node = _node_with(model, weight).name
    spec = faulty_profile(f"torch-{arch}", "scale", node, 1.01)

    code, out, err = run_cli(["localize", archive, "--device", spec, "-o", tmp_path, "--json"],
                             capsys)
    assert code == 1, err
    found = json.loads(out)
    assert (found["verdict"], found["suspect"]["name"]) == ("faulty here", node)
    origin = found["attribution"]["origin"]
    assert origin["modules"] == modules
    assert origin["source"].startswith(f"{source}:")
    assert found["attribution"]["where"] == "device"

    code, out, _ = run_cli(["localize", archive, "--device", spec, "-o", tmp_path], capsys)
    assert f"  pytorch     {' + '.join(modules)} ({origin['source']})" in out.splitlines()
    assert ("  only on the device: onnxruntime on the packing host matches PyTorch at this "
            "tensor") in out.splitlines()


def test_altered_weight_differs_from_pytorch_already_on_the_host(
        exported: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = exported["resnet18"]
    model = onnx.load(str(files["onnx"]))
    weight = "layer2.0.conv1.weight"
    init = next(i for i in model.graph.initializer if i.name == weight)
    value = numpy_helper.to_array(init).copy()
    value.flat[0] += 0.5
    init.CopyFrom(numpy_helper.from_array(value, weight))
    altered = tmp_path / "altered.onnx"
    onnx.save(model, str(altered))
    node = _node_with(model, weight)

    archive = tmp_path / "altered.vtc"
    code, out, err = run_cli(["pack", altered, "--reference", f"torch:{files['pt2']}",
                              "--layers", "-o", archive], capsys)
    assert code == 0, err
    assert (f"WARNING: onnxruntime {__import__('onnxruntime').__version__} on this host already "
            f"differs from PyTorch: the export changed the numbers; first at "
            f"{node.output[0]!r} (node {node.name}, op Conv) (layer2.0.conv1 + layer2.0.bn1 "
            "(resnet.py:") in out

    dump = tmp_path / "dump"
    code, _, err = run_cli(["run", archive, "--device", "local", "--opt-level", "disable",
                            "--bin-io-dump", dump], capsys)
    assert code == 1, err
    code, out, err = run_cli(["diff", dump, archive, "--case", "0", "--json"], capsys)
    assert code == 1, err
    report = json.loads(out)
    assert report["first_divergent"]["name"] == node.output[0]
    assert report["attribution"]["where"] == "host"
    assert report["attribution"]["origin"]["modules"] == ["layer2.0.conv1", "layer2.0.bn1"]
    code, out, _ = run_cli(["diff", dump, archive], capsys)
    assert ("  differs from PyTorch already on the host: onnxruntime on the packing host gives "
            "the same divergence (the export changed the numbers)") in out.splitlines()

    # packed without --layers: the layers are computed on this host, which reproduces the
    # altered weight, but the outputs are PyTorch's, as `run` judges them. diff passed (it
    # judged against its own outputs) and localize blamed the healthy device whole.
    plain = tmp_path / "altered-plain.vtc"
    code, out, err = run_cli(["pack", altered, "--reference", f"torch:{files['pt2']}", "-o",
                              plain], capsys)
    assert code == 0, err
    code, out, err = run_cli(["diff", dump, plain, "--case", "0", "--json"], capsys)
    report = json.loads(out)
    assert code == 1, err
    assert report["first_divergent"]["name"] in {o.name for o in model.graph.output}
    assert any("its outputs are the ground truth it stores" in n for n in report["notes"])
    code, out, err = run_cli(["localize", plain, "--device", "local", "--json", "--no-repro"],
                             capsys)
    doc = json.loads(out)
    assert (code, doc["verdict"]) == (0, "no faulty node"), err
    assert any("this host's own onnxruntime run is over tolerance" in n for n in doc["notes"])

    # verify ci's HTML report says the same beside its first divergent layer
    from fixtures_ci import local_suite, run_ci

    suite = local_suite(tmp_path, testcases={"cnn": archive})
    html = tmp_path / "ci.html"
    run = run_ci([suite, "--baselines", tmp_path / "bl", "--only", "altered/local/opt-off",
                  "--html", html], capsys, tmp_path)
    assert run.code == 1
    page = html.read_text()
    assert (f"<li>first divergent tensor: <code>{node.output[0]}</code>" in page)
    assert "<li>PyTorch module: <code>layer2.0.conv1 + layer2.0.bn1 (resnet.py:" in page
    assert ("<li>differs from PyTorch already on the host: onnxruntime on the packing host "
            "gives the same divergence (the export changed the numbers)</li>") in page


def test_torchscript_export_maps_at_module_boundaries_without_false_divergence(
        exported: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The TorchScript exporter folds each BatchNorm into its Conv and names a module's
    second call `relu_1`: those are left unmapped, so what is mapped agrees with onnxruntime."""
    sys.path.insert(0, str(TESTS))
    import torch_models

    module, (x,) = torch_models.resnet18()
    path = tmp_path / "ts.onnx"
    torch.onnx.export(module, (x,), str(path), dynamo=False)
    doc = _pack(capsys, path, str(exported["resnet18"]["factory"]), tmp_path / "ts.vtc")
    prov = doc["provenance"]
    assert prov["host_vs_torch"]["passed"] is True, prov["host_vs_torch"]
    mapping = prov["torch_map"]
    assert mapping["how"] == "module boundaries"
    assert 0 < mapping["mapped"] < mapping["onnx_tensors"]
    unmapped = {u["module"] for u in mapping["unmapped"]}
    assert {"layer1.0.conv1", "layer1.0.relu"} <= unmapped  # folded BN; relu called twice


def test_reference_outputs_are_pytorchs(exported: dict, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The archive's outputs and layers are PyTorch's own values, not onnxruntime's."""
    import h5py

    sys.path.insert(0, str(TESTS))
    import torch_models

    files = exported["resnet18"]
    archive = tmp_path / "r.vtc"
    _pack(capsys, files["onnx"], str(files["factory"]), archive, "--seed", "3")
    with h5py.File(archive, "r") as f:
        x = f["cases/0/inputs/0"][()]
        stored = f["cases/0/outputs/0"][()]
    module, _ = torch_models.resnet18()
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(stored, expected)


def test_profile_torch_tables_and_modules_beside_the_device(
        exported: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = exported["resnet18"]
    program = str(files["factory"])
    code, out, err = run_cli(["profile", "--torch", program, "--warmup", "0", "--iterations",
                              "2", "-t", "0", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    rows = doc["rows"]
    convs = [r for r in rows if r["type"] == "aten.conv2d"]
    assert len(convs) == 20 and all(r["calls"] == 2 for r in rows)  # resnet18: 20 convolutions
    assert {r["module"] for r in convs} >= {"conv1", "layer3.1.conv2", "layer4.0.downsample.0"}
    summary = doc["summary"]
    assert summary["runs"] == 2 and summary["nodes"] == len(rows)
    assert summary["kernel_time"] == pytest.approx(sum(r["time"] for r in rows))

    code, out, err = run_cli(["profile", "--torch", program, "--warmup", "0", "--iterations",
                              "1", "--aggregate-by", "module", "--type", "aten.conv2d",
                              "--opr-name", "^conv2d_1[0-9]$", "-t", "0", "--json"], capsys)
    assert code == 0, err
    assert {r["name"] for r in json.loads(out)["rows"]} == {
        "layer3.0.conv1", "layer3.0.conv2", "layer3.0.downsample.0", "layer3.1.conv1",
        "layer3.1.conv2", "layer4.0.conv1", "layer4.0.conv2", "layer4.0.downsample.0",
        "layer4.1.conv1", "layer4.1.conv2"}

    archive, trace = tmp_path / "r.vtc", tmp_path / "prof.json"
    assert run_cli(["pack", files["onnx"], "-o", archive], capsys)[0] == 0
    code, _, err = run_cli(["run", archive, "--device", "local", "--iter", "2", "--profile",
                            trace], capsys)
    assert code == 0, err
    code, out, err = run_cli(["profile", "--torch", program, trace, "--model", archive,
                              "--warmup", "0", "--iterations", "1", "--json"], capsys)
    assert code == 0, err
    modules = {tuple(m["modules"]): m for m in json.loads(out)["modules"]}
    block = modules[("layer3.1.bn2", "layer3.1.conv2")]
    assert block["onnx_nodes"] == 1 and block["device"] > 0 and block["host"] > 0
    assert block["fx_nodes"] == 3  # conv2d, the batch norm and its getitem
    code, out, _ = run_cli(["profile", "--torch", program, trace, "--model", archive,
                            "--warmup", "0", "--iterations", "1"], capsys)
    assert "per PyTorch module: this host vs" in out and "layer3.1.bn2 + layer3.1.conv2" in out


@pytest.mark.parametrize("arch", list(ARCHS))
def test_profile_torch_counts_every_nodes_flops_and_bytes(
        arch: str, exported: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """`profile --torch` left FLOPs and bytes empty on every row: the aten ops were unknown to
    the ONNX counter, and PyTorch's 'float32' was no dtype it knew. The products are checked
    against PyTorch's own FLOP counter on the whole module, the rest against the conventions
    of verify.flops."""
    import math

    from torch.utils.flop_counter import FlopCounterMode

    import torch_models

    code, out, err = run_cli(["profile", "--torch", str(exported[arch]["factory"]),
                              "--warmup", "0", "--iterations", "1", "-t", "0", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    rows = doc["rows"]
    assert doc["summary"]["unknown_computation"] == 0
    assert all(r["bytes_read"] is not None and r["bytes_written"] is not None for r in rows)

    def elements(spec: dict) -> int:
        return math.prod(spec["shape"])

    products, biases = 0, 0
    for r in rows:
        out0 = elements(r["outputs"][0])
        if r["type"] in ("aten.conv2d", "aten.linear"):
            products += r["computation"]
            biases += out0 if len(r["inputs"]) == 3 else 0  # 1 per output element
        else:
            want = {"aten._native_batch_norm_legit_no_training": 2 * out0,
                    "aten.mean": elements(r["inputs"][0]),
                    "aten.max_pool2d": 9 * out0,  # resnet18's 3x3 kernel
                    "aten.view": 0, "<built-in function getitem>": 0}.get(r["type"], out0)
            assert r["computation"] == want, r  # element-wise: 1 per output element
        moved = sum(math.prod(t["shape"]) * 4 for t in r["inputs"] + r["outputs"])
        assert r["bytes_read"] + r["bytes_written"] == (0 if r["computation"] == 0 else moved)
    module, (x,) = getattr(torch_models, arch)()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(x)
    assert products - biases == counter.get_total_flops() > 0


def test_profile_torch_device_trace_needs_the_model(exported: dict, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["profile", "--torch", exported["resnet18"]["pt2"],
                            tmp_path / "prof.json"], capsys)
    assert code == 2
    assert err.strip() == ("error: --torch with a device TRACE needs --model (the exported .onnx "
                           "or its .vtc) to map its ONNX nodes onto PyTorch modules")
