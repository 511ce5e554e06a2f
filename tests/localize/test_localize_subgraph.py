"""Cutting graphs for localize (verify/subgraph.py): pieces side by side in one model keep node
names, rename only what another piece makes, carry their initializers (Constant nodes folded),
handle multi-output nodes and branches; the two reference sources and modes of localize; the
replay command it prints.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fixtures_devices import run_cli
from fixtures_localize import residual_model
from verify.capture import host_layers
from verify.subgraph import Segment, build_batch, node_graph, sanitize, split_points


@pytest.fixture(scope="module")
def graph_and_refs():
    model = residual_model()
    x = np.random.default_rng(3).random((1, 3, 12, 12), dtype=np.float32)
    refs = dict(host_layers(model.SerializeToString(), {"x": x}))
    return node_graph(model), refs


def _run(model: onnx.ModelProto, feeds: dict) -> dict:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def test_constant_nodes_fold_and_cuts_follow_branches(graph_and_refs) -> None:
    ng, _ = graph_and_refs
    assert "head/bias_const" not in ng.labels and "head/bias_value" in ng.initializers
    assert len(ng) == 23
    widths = [ng.cut_width(p) for p in range(len(ng) + 1)]
    # inside the residual block the skip tensor is live too; inside the split, three tensors
    assert widths[ng.index_of("res1/conv1")] == 1 and widths[ng.index_of("res1/bn1")] == 2
    assert widths[ng.index_of("split")] == 1 and widths[ng.index_of("br0/relu")] == 3
    assert split_points(ng, 0, 23, 2) == [ng.index_of("split")]


def test_pieces_side_by_side_reproduce_the_reference(graph_and_refs) -> None:
    ng, refs = graph_and_refs
    segments = [Segment(0, 10), Segment(10, 16), Segment(16, 23)]
    batch = build_batch(ng, segments, refs)
    onnx.checker.check_model(batch.model)
    assert [n.name for n in batch.model.graph.node] == list(ng.labels)
    first, branches, head = batch.pieces
    assert first.inputs == {"x": "x"}
    # the branch piece reads res1/relu:0, which the first piece makes: fed under a new name
    assert branches.inputs == {"res1/relu:0::ref": "res1/relu:0"}
    assert branches.outputs == ("concat:0",)
    assert head.inputs == {"concat:0::ref": "concat:0", "res1/relu:0::ref": "res1/relu:0"}
    assert first.outputs == ("res1/relu:0",) and head.outputs == ("prob",)
    outs = _run(batch.model, batch.feeds(refs))
    for name in ("res1/relu:0", "concat:0", "prob"):
        np.testing.assert_array_equal(outs[name], refs[name])


def test_isolated_nodes_multi_output_and_initializers(graph_and_refs) -> None:
    ng, refs = graph_and_refs
    picks = [ng.index_of(n) for n in ("split", "head/add", "br1/conv")]
    batch = build_batch(ng, [Segment(i, i + 1) for i in picks], refs)
    by_node = {ng.labels[p.segment.lo]: p for p in batch.pieces}
    assert by_node["split"].outputs == ("split:0", "split:1")
    inits = {t.name for t in batch.model.graph.initializer}
    assert {"split/sizes", "head/bias_value", "br1/conv/W", "br1/conv/B"} <= inits
    assert by_node["br1/conv"].inputs == {"split:1::ref": "split:1"}
    outs = _run(batch.model, batch.feeds(refs))
    for name in ("split:0", "split:1", "head/add:0", "br1/conv:0"):
        np.testing.assert_array_equal(outs[name], refs[name])


def test_sanitize_node_names_for_files() -> None:
    assert sanitize("block2/conv1") == "block2_conv1"
    assert sanitize("../../etc/passwd") == "etc_passwd"
    assert sanitize("") == "node" and sanitize("..") == "node"
    assert sanitize("ü" * 5 + "x") == "x"
    assert len(sanitize("a" * 300)) == 60


def _found_in_1mb(vtc: Path, spec: str, capsys: pytest.CaptureFixture[str]) -> dict:
    code, out, err = run_cli(["localize", vtc, "--device", spec, "--json", "--budget", "1",
                              "--no-repro"], capsys)
    assert code == 1, err
    return json.loads(out)


def test_layers_in_the_archive_are_the_reference(tmp_path: Path, faulty_profile,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    onnx.save(residual_model(), tmp_path / "res.onnx")
    vtc = tmp_path / "res.vtc"
    code, _, err = run_cli(["pack", tmp_path / "res.onnx", "--layers", "-o", vtc], capsys)
    assert code == 0, err
    doc = _found_in_1mb(vtc, faulty_profile("f", "bias", "res1/bn2", 0.01), capsys)
    assert doc["suspect"]["name"] == "res1/bn2"
    assert (doc["mode"], doc["reference_source"]) == ("dump", "archive")


def test_a_model_over_the_budget_is_bisected(cnn_vtc: Path, faulty_profile,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # cnn.onnx's activations (~2.9 MB) do not fit 1 MB: no per-layer dump, bisection instead
    doc = _found_in_1mb(cnn_vtc, faulty_profile("f", "scale", "block3/se/fc2", 1.01), capsys)
    assert doc["suspect"]["name"] == "block3/se/fc2"
    assert (doc["mode"], doc["reference_source"]) == ("bisect", "host")
    # the note names the option as it is spelled
    assert any(n.startswith("bisection, not a per-layer run") and n.endswith("over --budget 1")
               for n in doc["notes"]), doc["notes"]


def test_archive_layers_over_the_budget_serve_bisection(tmp_path: Path, faulty_profile,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from fixtures_localize import REPO

    vtc = tmp_path / "cnn.vtc"
    code, _, err = run_cli(["pack", REPO / "goldens" / "models" / "cnn.onnx", "--layers",
                            "-o", vtc], capsys)
    assert code == 0, err
    doc = _found_in_1mb(vtc, faulty_profile("f", "leaky", "block3/relu1", 0.1), capsys)
    assert doc["suspect"]["name"] == "block3/relu1"
    assert (doc["mode"], doc["reference_source"]) == ("bisect", "archive")


def test_a_subgraph_repro_name_takes_each_node_name_on_its_own() -> None:
    """YOLOv8n's '/model.6/m.0/cv1/act/Sigmoid' .. '/model.6/m.0/cv1/act/Mul': the second
    kept its leading '/' as '_' ('...Sigmoid-_model.6...')."""
    from verify.localize.repro import repro_label, repro_path

    label = repro_label("/model.6/m.0/cv1/act/Sigmoid", "/model.6/m.0/cv1/act/Mul")
    assert label == "model.6_m.0_cv1_act_Sigmoid-model.6_m.0_cv1_act_Mul"
    assert repro_path(Path("/tmp/yolo.vtc"), label).name == f"yolo.repro-{label}.vtc"
    assert repro_label("/a/b") == "/a/b"  # one node: repro_path makes it safe


def test_the_replay_command_runs_with_the_session_settings_the_search_used(
        residual_vtc: Path, device_env, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A profile whose providers this machine lacks, searched with --provider and --threads:
    the replay line (and `inspect`'s reproduce line) left both out, so the command it printed
    failed on the provider (exit 3) instead of reproducing the fault."""
    import sys

    from fixtures_localize import FAULTY_RUNNER

    device_env.write_profile("gpu", {
        "transport": "local", "providers": ["NoSuchExecutionProvider", "CPUExecutionProvider"],
        "runner": [sys.executable, str(FAULTY_RUNNER), "--fault", "scale", "--node",
                   "br1/conv"]})
    flags = ["--provider", "CPUExecutionProvider", "--threads", "1"]
    code, out, err = run_cli(["localize", residual_vtc, "--device", "gpu", "-o", tmp_path,
                              *flags], capsys)
    assert code == 1, err
    repro = tmp_path / "residual.repro-br1_conv.vtc"
    replay = ["verify", "run", str(repro), "--device", "gpu", "--opt-level", "all", *flags]
    lines = out.splitlines()
    assert lines[0].endswith("; opt-level all; providers CPUExecutionProvider; threads 1")
    assert f"  replay:    {' '.join(replay)}" in lines
    code, out, err = run_cli([*replay[1:], "--iter", "1"], capsys)
    assert code == 1 and "=== FAIL: 1 output(s) over tolerance" in out, err
    code, out, _ = run_cli(["inspect", repro], capsys)
    assert f"reproduce with `{' '.join(replay)}`" in out
    code, out, _ = run_cli(["localize", residual_vtc, "--device", "gpu", "--no-repro",
                            "--json", *flags], capsys)
    doc = json.loads(out)
    assert (doc["providers"], doc["threads"]) == (["CPUExecutionProvider"], 1)
