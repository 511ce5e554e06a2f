"""What the archive reader gives back is what pack wrote: tensors in the model's order past ten
of them, whether per-layer references are present, each case's source (holes found by
mutation testing of verify/testcase.py, docs/mutation.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
from fixtures_dump import pack
from onnx import TensorProto, helper

from verify import schema
from verify.archive_reader import read_archive
from verify.errors import ArchiveError
from verify.testcase import write_archive

N = 12  # more than ten: "10" sorts before "2" as text


def _twelve_outputs() -> bytes:
    names = [f"t{k}" for k in range(N)]
    nodes = [helper.make_node("Mul", ["x", "x"] if k == 0 else [names[k - 1], "x"], [names[k]],
                              name=f"mul{k}") for k in range(N)]
    graph = helper.make_graph(nodes, "twelve",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3])
                               for n in names])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_outputs_and_layers_come_back_in_the_models_order(tmp_path: Path) -> None:
    archive = pack(_twelve_outputs(), tmp_path / "twelve.vtc", "-d", "x:[1.5,2,0.5]")
    tc = read_archive(archive)
    [case] = tc.cases
    assert list(case.outputs) == [f"t{k}" for k in range(N)]
    x = np.array([1.5, 2, 0.5], np.float32)
    for k in range(N):  # each value under its own name: t_k = x^(k+2)
        np.testing.assert_allclose(case.outputs[f"t{k}"], x ** (k + 2), rtol=1e-6)
    assert tc.has_layers is False and tc.format_version == schema.FORMAT_VERSION
    assert case.source == "x:[1.5,2,0.5]"


def test_per_layer_references_and_a_missing_source(tmp_path: Path) -> None:
    archive = pack(_twelve_outputs(), tmp_path / "layers.vtc", "--layers")
    assert read_archive(archive).has_layers is True
    assert read_archive(archive).cases[0].source == "random (case 0)"
    tc = read_archive(archive)
    bare = tmp_path / "bare.vtc"
    write_archive(bare, replace(tc, cases=(replace(tc.cases[0], source=""),)))
    assert read_archive(bare).cases[0].source == ""


@pytest.mark.parametrize("version, message", [
    (None, "corrupt archive: no format version"),   # the attribute missing
    (0, "invalid archive format version 0"),
    (-2, "invalid archive format version -2"),
])
def test_an_archive_without_a_valid_format_version_is_refused(tmp_path: Path, version: int | None,
                                                              message: str) -> None:
    archive = pack(_twelve_outputs(), tmp_path / "v.vtc")
    with h5py.File(archive, "r+") as f:
        if version is None:
            del f.attrs[schema.ATTR_VERSION]
        else:
            f.attrs[schema.ATTR_VERSION] = version
    with pytest.raises(ArchiveError) as e:
        read_archive(archive)
    assert str(e.value) == f"{archive}: {message}"
