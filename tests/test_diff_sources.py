"""The captures `verify diff` opens (verify/diff_sources.py), written against its mutation run's
survivors: what a side built from an archive carries into the report beside the values (its
label, its nodes, its model's sha256, the PyTorch module of the first divergent tensor), with
per-layer references or computed on this host; an archive whose provenance has no model sha256;
a layer with no elements; an archive whose model is not ONNX, or keeps its weights in external
data; and the host loader's single pass.

The model is a small MLP named as torch.onnx's TorchScript exporter names nodes
(`/fc2/MatMul`: module fc2), so an archive of it attributes a tensor to a module without
PyTorch; "altered" is a copy with fc2's weights scaled (another model file, every name shared).
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixtures_dump import make_dump, pack
from helpers_archive import reseal, set_record
from helpers_cli import only_line, verify
from verify import schema
from verify.digest import sha256_hex

FIRST = "/fc2/MatMul_output_0"  # the first tensor the altered model changes


def _mlp(scale: float = 1.0) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w1 = rng.normal(0, 0.5, (8, 8)).astype(np.float32)
    w2 = (rng.normal(0, 0.5, (8, 4)) * scale).astype(np.float32)
    ints = [numpy_helper.from_array(np.array([v], np.int64), n)
            for n, v in (("zero", 0), ("one", 1))]
    nodes = [
        helper.make_node("MatMul", ["x", "fc1.weight"], ["/fc1/MatMul_output_0"],
                         name="/fc1/MatMul"),
        helper.make_node("Relu", ["/fc1/MatMul_output_0"], ["/act/Relu_output_0"],
                         name="/act/Relu"),
        # a tensor of no elements ([1, 0]) on the way to the output
        helper.make_node("Slice", ["x", "zero", "zero", "one"], ["/cut/Slice_output_0"],
                         name="/cut/Slice"),
        helper.make_node("Concat", ["/act/Relu_output_0", "/cut/Slice_output_0"],
                         ["/cat/Concat_output_0"], name="/cat/Concat", axis=1),
        helper.make_node("MatMul", ["/cat/Concat_output_0", "fc2.weight"], [FIRST],
                         name="/fc2/MatMul"),
        helper.make_node("Softmax", [FIRST], ["y"], name="/head/Softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(w1, "fc1.weight"), numpy_helper.from_array(w2, "fc2.weight"),
         *ints])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Archives of the MLP and of the altered copy, with per-layer references and without,
    and a dump of the MLP run on the local device (optimizations off)."""
    root = tmp_path_factory.mktemp("mlp")
    made: dict[str, Path] = {}
    for name, scale in (("mlp", 1.0), ("altered", 1.5)):
        model = _mlp(scale).SerializeToString()
        made[f"{name}_layers"] = pack(model, root / f"{name}_layers.vtc", "--layers")
        made[name] = pack(model, root / f"{name}.vtc")
    made["dump"] = make_dump(made["mlp"], root / "dump", "disable")
    return made


def _provenance(archive: Path) -> dict:
    from verify.archive_reader import read_archive

    return dict(read_archive(archive).provenance)


def _sha(archive: Path) -> str:
    return str(_provenance(archive)["model_sha256"])


def _diff(capsys: pytest.CaptureFixture[str], actual: Path, reference: Path,
          code: int = 1) -> dict:
    got, out, err = verify(capsys, "diff", actual, reference, "--json")
    assert got == code, err
    (report,) = json.loads(out)["cases"]
    return report


def test_the_first_divergent_tensor_is_named_in_pytorch_terms_from_either_archive_side(
        mlp: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The reference archive's model names the module (fc2); against a dump the actual side's
    archive does, its model parsed only then."""
    for actual, reference in ((mlp["altered_layers"], mlp["mlp_layers"]),
                              (mlp["altered_layers"], mlp["dump"]),
                              (mlp["dump"], mlp["altered"])):
        report = _diff(capsys, actual, reference)
        assert report["first_divergent"]["name"] == FIRST
        assert report["attribution"] == {"origin": {"modules": ["fc2"], "source": ""},
                                         "where": None}, (actual, reference)


def test_where_the_pytorch_reference_already_differed_is_read_from_the_provenance(
        mlp: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An archive packed against PyTorch records the tensors where onnxruntime on the packing
    host already differed: the first divergent tensor among them reads "host", else "device"."""
    for failing, where in (([FIRST], "host"), (["y"], "device")):
        archive = tmp_path / f"{where}.vtc"
        archive.write_bytes(mlp["mlp_layers"].read_bytes())
        provenance = {**_provenance(archive), schema.PROV_HOST_CHECK: {"failing": failing}}
        set_record(archive, schema.ATTR_PROVENANCE, json.dumps(provenance))
        report = _diff(capsys, mlp["altered_layers"], archive)
        assert report["attribution"]["where"] == where


def test_an_archive_side_keeps_its_label_nodes_and_model_sha256_with_or_without_layers(
        mlp: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Another model file's archive, per-layer or computed here, on either side: the report
    names it, lists its nodes, and notes the two model files by their sha256."""
    mine, other = _sha(mlp["mlp"])[:12], _sha(mlp["altered"])[:12]
    for actual, reference in ((mlp["altered_layers"], mlp["mlp"]),
                              (mlp["altered"], mlp["mlp_layers"]),
                              (mlp["altered"], mlp["dump"]),
                              (mlp["dump"], mlp["altered_layers"])):
        report = _diff(capsys, actual, reference)
        assert (report["actual"], report["reference"]) == (str(actual), str(reference))
        assert [r["node"] for r in report["rows"]] == [
            "", "/fc1/MatMul", "/act/Relu", "/cut/Slice", "/cat/Concat", "/fc2/MatMul",
            "/head/Softmax"]
        shas = (other, mine) if actual.name.startswith("altered") else (mine, other)
        assert ("the two captures come from different model files (sha256 "
                f"{shas[0]} vs {shas[1]})") in report["notes"], (actual, reference)


def test_an_archive_without_a_model_sha256_is_not_taken_for_another_model(
        mlp: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An archive whose provenance records no model sha256 (packed by an older verify, or
    edited) against a dump of its own model: nothing is said about different model files."""
    for name in ("mlp_layers", "mlp"):
        archive = tmp_path / f"{name}.vtc"
        archive.write_bytes(mlp[name].read_bytes())
        provenance = _provenance(archive)
        del provenance["model_sha256"]
        set_record(archive, schema.ATTR_PROVENANCE, json.dumps(provenance))
        for actual, reference in ((archive, mlp["dump"]), (mlp["dump"], archive)):
            report = _diff(capsys, actual, reference, code=0)
            assert len(report["notes"]) == (0 if name == "mlp_layers" else 1)  # computed here
            assert not any("different model" in n for n in report["notes"])


def test_a_layer_with_no_elements_is_compared(mlp: dict[str, Path],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A [1, 0] slice stored with the per-layer references, on either side."""
    for actual, reference in ((mlp["dump"], mlp["mlp_layers"]),
                              (mlp["mlp_layers"], mlp["dump"])):
        report = _diff(capsys, actual, reference, code=0)
        (row,) = [r for r in report["rows"] if r["name"] == "/cut/Slice_output_0"]
        assert row["diff"]["reference_shape"] == row["diff"]["actual_shape"] == [1, 0]
        assert row["diff"]["passed"] and report["passed"]


def _with_model(archive: Path, out: Path, data: bytes) -> Path:
    """A copy of `archive` holding `data` as its model, with the model's sha256 and the
    archive's checksum made to match (what a broken packer would write)."""
    out.write_bytes(archive.read_bytes())
    with h5py.File(out, "r+") as f:
        del f[schema.MODEL]
        model = f.create_dataset(schema.MODEL, data=np.frombuffer(data, np.uint8))
        model.attrs[schema.ATTR_SHA256] = np.bytes_(sha256_hex(data).encode())
    reseal(out)
    return out


def test_an_archive_whose_model_is_not_onnx_is_one_line_naming_it(
        mlp: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """On the reference side (its floors), on an actual side computed here, and on an actual
    side with per-layer references, whose model is read only to name the first divergent
    tensor's PyTorch module."""
    garbage = b"not an onnx model at all"
    for source, actual, reference in (("mlp_layers", mlp["dump"], None),
                                      ("mlp", None, mlp["dump"]),
                                      ("altered_layers", None, mlp["dump"])):
        bad = _with_model(mlp[source], tmp_path / f"{source}.vtc", garbage)
        code, _, err = verify(capsys, "diff", actual or bad, reference or bad)
        assert code == 2 and only_line(err).startswith(f"error: {bad}: not an ONNX model"), err


def test_an_archive_keeping_its_weights_in_external_data_is_read_with_them(
        mlp: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The altered MLP saved with its weights in a .data file beside it and packed with
    --keep-external-data (the 8-byte Slice bounds stay inline: onnxruntime reads them while
    loading): computed here, and (per-layer) parsed to name the module."""
    model = _mlp(1.5)
    onnx.save_model(model, str(tmp_path / "ext.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="ext.data", size_threshold=64)
    for extra in ((), ("--layers",)):
        archive = pack(tmp_path / "ext.onnx", tmp_path / f"ext{len(extra)}.vtc",
                       "--keep-external-data", *extra)
        report = _diff(capsys, archive, mlp["dump"])
        assert report["first_divergent"]["name"] == FIRST
        assert report["attribution"]["origin"]["modules"] == ["fc2"]


class _Host:
    """A host capture that yields `order` in one pass and counts its passes."""

    def __init__(self, order: list[str]) -> None:
        self.order = order
        self.passes: list[list[str] | None] = []

    def layers(self, feeds: dict, names: list[str] | None = None, *,
               with_missing: bool = False):
        self.passes.append(names)
        return ((n, np.full(1, i)) for i, n in enumerate(self.order) if not names or n in names)


def test_the_host_loader_computes_a_name_it_went_by_on_its_own_and_goes_on_with_the_pass() -> None:
    """A name asked again after the pass went by it costs one more pass of its own; the pass
    itself goes on from where it was, so the names after it still cost nothing more."""
    from verify.diff_sources import streamed

    host = _Host(["a", "b", "c", "d"])
    load = streamed(host, {})
    assert [int(load(n)[0]) for n in ("a", "b", "a", "c", "d")] == [0, 1, 0, 2, 3]
    assert host.passes == [None, ["a"]]


def _if_model() -> onnx.ModelProto:
    """An If whose bodies compute one tensor between them (the else branch returns an
    initializer of its own)."""
    def value(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])

    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then/relu")],
                             "then", [], [value("t")])
    other = helper.make_graph([], "else", [], [value("e")],
                              [numpy_helper.from_array(np.zeros((1, 4), np.float32), "e")])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["b"], name="branch", then_branch=then,
                              else_branch=other),
             helper.make_node("Neg", ["b"], ["y"], name="neg")]
    graph = helper.make_graph(nodes, "if", [value("x")], [value("y")],
                              [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_dump_that_left_one_tensor_inside_a_body_out_says_so_in_full(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = pack(_if_model().SerializeToString(), tmp_path / "if.vtc", "--layers")
    dump = make_dump(archive, tmp_path / "dump", "disable")
    report = _diff(capsys, dump, archive, code=0)
    assert report["notes"] == [
        f"{dump}: 1 tensor inside If/Loop/Scan bodies were not captured (onnxruntime can mark "
        "only the top-level graph's tensors); their nodes are compared by their outputs"]
