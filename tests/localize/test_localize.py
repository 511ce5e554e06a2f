"""`verify localize` against devices whose runtime is wrong on purpose (tests/faulty_runner.py):
it must name exactly the injected node, write a repro that fails there and passes locally, stay
logarithmic in device round trips when bisecting, and say "no faulty node" on benign noise.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import onnx
import pytest

from fixtures_devices import run_cli
from fixtures_localize import CHAIN_LENGTH

# (archive fixture, fault, node, value): a Conv's output scaled, Relu -> LeakyRelu, a MatMul
# weight perturbed slightly, a bias added to a BatchNormalization, a branch of a Concat, a
# multi-output node (Split's first output), a Conv on the residual skip path.
FAULTS = [
    ("cnn_vtc", "scale", "block2/conv1", 1.01),
    ("cnn_vtc", "leaky", "block1/relu1", None),
    ("cnn_vtc", "bias", "block3/bn2", 0.01),
    ("residual_vtc", "weight", "head/matmul", 1.001),
    ("residual_vtc", "bias", "res1/bn2", 0.01),
    ("residual_vtc", "scale", "br1/conv", 1.01),
    ("residual_vtc", "scale", "split", 1.01),
    ("residual_vtc", "leaky", "br0/relu", 0.1),
]


def _localize(archive: Path, device: str, capsys: pytest.CaptureFixture[str],
              *extra: str) -> tuple[int, dict]:
    code, out, err = run_cli(["localize", archive, "--device", device, "--json", *extra], capsys)
    assert code in (0, 1), err
    return code, json.loads(out, parse_constant=_strict)


def _strict(word: str) -> None:
    raise AssertionError(f"not strict JSON: {word}")


@pytest.mark.parametrize("mode", ["dump", "bisect"])
@pytest.mark.parametrize("fixture, fault, node, value", FAULTS,
                         ids=[f"{f[0][:-4]}-{f[1]}-{f[2]}" for f in FAULTS])
def test_names_exactly_the_injected_node(fixture: str, fault: str, node: str, value: float | None,
                                         mode: str, request: pytest.FixtureRequest,
                                         faulty_profile, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    archive = request.getfixturevalue(fixture)
    spec = faulty_profile("faulty", fault, node, value)
    extra = ["--no-dump"] if mode == "bisect" else []
    code, doc = _localize(archive, spec, capsys, "-o", tmp_path, *extra)
    assert code == 1
    assert doc["mode"] == mode
    assert doc["verdict"] == "faulty here"
    assert doc["suspect"]["name"] == node
    assert doc["subgraph"] == [node]
    assert doc["suspect"]["own_error"] > 1
    assert doc["suspect"]["inherited_error"] <= 1
    repro = Path(doc["repro"])
    assert repro.parent == tmp_path and repro.is_file()
    if mode == "dump":
        faulty = [c["name"] for c in doc["candidates"] if c["verdict"] == "faulty here"]
        assert faulty == [node]
        assert doc["round_trips"] == 2
        # the per-layer round lists what it found over tolerance (it listed nothing)
        per_layer = [r for r in doc["rounds"] if r["purpose"].startswith("per-layer run")]
        assert per_layer and any(per_layer[0]["failing"])
    else:  # the final outputs are checked as `run` checks them, classifier agreement included
        assert doc["outputs"] and all(o["topk"] is not None for o in doc["outputs"])
    assert not list(tmp_path.glob(".*.part"))


def test_report_shows_path_suspect_and_verdicts(cnn_vtc: Path, faulty_profile, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    spec = faulty_profile("phone", "scale", "block2/conv1", 1.01)
    code, out, err = run_cli(["localize", cnn_vtc, "--device", spec, "-o", tmp_path], capsys)
    assert code == 1, err
    lines = out.splitlines()
    assert "=== FAULTY NODE: block2/conv1 (Conv) — faulty here" in lines
    assert ("  node        block2/conv1  op Conv  kernel_shape=[3, 3], pads=[1, 1, 1, 1], "
            "strides=[2, 2]") in lines
    assert "  input       block1/relu:0  (1,8,56,56)" in lines
    assert "  initializer block2/conv1/W  (16,8,3,3)" in lines
    own = next(ln for ln in lines if ln.startswith("  own error   OVER max_abs="))
    assert " at block2/conv1:0, fed the reference inputs  [" in own  # the tensor it was taken at
    assert any(ln.startswith("  full run    ") and ln.endswith(" at block2/conv1:0") for ln in lines)
    assert any(ln.startswith("  inherited   0.0") for ln in lines)
    # the path from the input to the suspect, each step within tolerance, ending at its input
    path = lines[lines.index("path from the inputs to the suspect (error in the full run):") + 1:]
    assert path[0].split()[0:3] == ["data", "graph", "input"]
    assert path[1].split()[:2] == ["stem/conv:0", "stem/conv"]
    assert path[2].startswith("  … 5 more steps within tolerance (worst 0.0")
    steps = [ln.split()[0] for ln in path[3:8]]
    assert steps == ["block1/relu1:0", "block1/conv2:0", "block1/bn2:0", "block1/add:0",
                     "block1/relu:0"]
    assert all(" ok " in ln for ln in path[3:8])
    # (9: the ReLUs after the fault carry its error and are not blamed for it)
    assert "  … 9 more propagated (--json lists them)" in lines
    # downstream nodes re-run in isolation are told apart: they only inherited the error
    assert any(ln.split()[:2] == ["block2/bn1", "BatchNormalization"] and
               ln.endswith("propagated") for ln in lines)
    assert f"wrote repro: {tmp_path / 'cnn.repro-block2_conv1.vtc'}" in lines
    # the reference is the ground truth's own settings (optimizations off), not the replay again
    at = lines.index(f"wrote repro: {tmp_path / 'cnn.repro-block2_conv1.vtc'}")
    assert lines[at + 2] == (f"  reference: verify run {tmp_path / 'cnn.repro-block2_conv1.vtc'} "
                             "--device local --opt-level disable")
    assert lines[-1].startswith("device round trips: 2 (per-layer run of 37 tensors; ")


def test_repro_fails_on_the_device_and_passes_locally(residual_vtc: Path, faulty_profile,
                                                      tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    spec = faulty_profile("board", "scale", "br1/conv", 1.01)
    code, doc = _localize(residual_vtc, spec, capsys, "-o", tmp_path)
    repro = tmp_path / "residual.repro-br1_conv.vtc"
    assert code == 1 and doc["repro"] == str(repro)
    code, out, err = run_cli(["run", repro, "--device", spec, "--iter", "1"], capsys)
    assert code == 1, err
    assert "=== FAIL: 1 output(s) over tolerance" in out
    code, out, err = run_cli(["run", repro, "--device", "local", "--iter", "1"], capsys)
    assert code == 0, err
    code, out, _ = run_cli(["inspect", repro, "--json"], capsys)
    info = json.loads(out)
    origin = info["provenance"]["repro_of"]
    assert origin["archive"] == str(residual_vtc) and origin["nodes"] == ["br1/conv"]
    assert origin["device"] == spec and origin["verdict"] == "faulty here"
    code, out, _ = run_cli(["inspect", repro], capsys)   # the text says it too
    assert f"repro of: {residual_vtc} case 0, node(s) br1/conv" in out
    assert (f"faulty here on device {spec} at --opt-level {origin['opt_level']}: reproduce with "
            f"`verify run {repro} --device {spec} --opt-level {origin['opt_level']}`") in out
    # it is an ordinary ONNX model once exported: one node, its name kept, weights inside
    code, out, err = run_cli(["export", repro, "-o", tmp_path / "r.onnx"], capsys)
    assert code == 0, err
    assert out == f"wrote model: {tmp_path / 'r.onnx'}\n"
    model = onnx.load(tmp_path / "r.onnx")
    onnx.checker.check_model(model)
    assert [n.name for n in model.graph.node] == ["br1/conv"]
    assert [i.name for i in model.graph.input] == ["split:1"]
    assert {t.name for t in model.graph.initializer} == {"br1/conv/W", "br1/conv/B"}


@pytest.mark.parametrize("fanout", [2, 4])
def test_bisection_round_trips_are_logarithmic(chain_vtc: Path, faulty_profile, fanout: int,
                                               capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    node = "n076"  # a MatMul
    spec = faulty_profile("chain", "weight", node, 1.001)
    code, doc = _localize(chain_vtc, spec, capsys, "--no-dump", "--fanout", str(fanout),
                          "-o", tmp_path)
    assert code == 1 and doc["suspect"]["name"] == node and doc["nodes"] == CHAIN_LENGTH
    bisect_rounds = [r for r in doc["rounds"] if r["purpose"].startswith("bisect ")]
    # a chain cuts on one tensor anywhere: each round keeps 1/fanout of the range
    assert len(bisect_rounds) == math.ceil(math.log(CHAIN_LENGTH, fanout))
    # + the full run that shows the failure + one run measuring the path to the suspect
    assert doc["round_trips"] == len(bisect_rounds) + 2
    assert [r["purpose"] for r in doc["rounds"]][0] == "the whole model"
    assert all(r["failing"] for r in bisect_rounds)
    assert bisect_rounds[-1]["failing"] == [node]


def test_per_layer_run_in_several_chunks_finds_the_same_node(cnn_vtc: Path, faulty_profile,
                                                            tmp_path: Path) -> None:
    """A budget below the model's activations splits the per-layer run into several round
    trips; the search sees the same tensors and reaches the same verdict as in one trip."""
    from verify.localize import FAULTY, LocalizeRequest, localize
    from verify.options import ArchiveSelection, DeviceTarget

    spec = faulty_profile("chunky", "scale", "block2/conv1", 1.01)
    results = {budget: localize(LocalizeRequest(ArchiveSelection(cnn_vtc), DeviceTarget(spec),
                                                mode="dump", budget_bytes=budget,
                                                write_repro=False))
               for budget in (512 << 20, 1 << 20)}
    trips = {budget: [r.purpose for r in res.rounds if r.purpose.startswith("per-layer run of ")]
             for budget, res in results.items()}
    assert trips[512 << 20] == ["per-layer run of 37 tensors"]
    assert len(trips[1 << 20]) >= 3
    assert sum(int(p.split()[3]) for p in trips[1 << 20]) == 37
    one, several = results[512 << 20], results[1 << 20]
    for res in (one, several):
        assert (res.mode, res.verdict, res.suspect.name) == ("dump", FAULTY, "block2/conv1")
    assert [(c.name, c.verdict) for c in several.candidates] == \
        [(c.name, c.verdict) for c in one.candidates]
    assert several.first_divergent.tensor == one.first_divergent.tensor
    assert [s.tensor for s in several.path] == [s.tensor for s in one.path]


def test_bisection_cuts_do_not_split_branches(residual_vtc: Path, faulty_profile,
                                              tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = faulty_profile("res", "scale", "res1/conv2", 1.01)
    code, doc = _localize(residual_vtc, spec, capsys, "--no-dump", "-o", tmp_path)
    assert code == 1 and doc["suspect"]["name"] == "res1/conv2"
    # the first cut of 23 nodes lands on a single-tensor cut (after res2/relu), not mid-branch
    first = [r for r in doc["rounds"] if r["purpose"].startswith("bisect ")][0]
    assert first["purpose"] == "bisect stem/conv .. head/softmax (23 nodes) in 2 parts"
    assert first["failing"] == ["stem/conv .. res1/relu"]


@pytest.mark.parametrize("archive", ["cnn_vtc", "residual_vtc"])
@pytest.mark.parametrize("extra", [[], ["--no-dump"], ["--opt-level", "disable"],
                                   ["--threads", "2"]], ids=["dump", "bisect", "opt-off", "2thr"])
def test_benign_noise_is_no_faulty_node(archive: str, extra: list[str], tmp_path: Path,
                                        request: pytest.FixtureRequest, device_env,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    vtc = request.getfixturevalue(archive)
    folder = tmp_path / "out"
    folder.mkdir()
    code, out, err = run_cli(["localize", vtc, "--device", "local", "-o", folder, *extra],
                             capsys)
    assert code == 0, err
    assert "=== no faulty node: every tensor compared is within tolerance" in out
    # bisection says it compared the outputs only (a layer-only fault is unseen there)
    assert ("(the outputs only: bisection" in out) == ("--no-dump" in extra)
    assert list(folder.iterdir()) == []


def test_json_document_when_clean(residual_vtc: Path, device_env,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _localize(residual_vtc, "local", capsys)
    assert code == 0
    assert doc["verdict"] == "no faulty node" and doc["found"] is False
    assert doc["suspect"] is None and doc["repro"] is None
    # the per-layer run, then a plain run (marking outputs blocks fusions)
    assert doc["round_trips"] == 2 and doc["mode"] == "dump"
    assert [r["purpose"] for r in doc["rounds"]] == ["per-layer run of 24 tensors",
                                                     "the whole model"]
    assert [d["name"] for d in doc["outputs"]] == ["prob"] and doc["outputs"][0]["passed"]


def test_no_repro_flag(residual_vtc: Path, faulty_profile, tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    spec = faulty_profile("f", "bias", "res1/bn2", 0.01)
    folder = tmp_path / "out"
    folder.mkdir()
    code, doc = _localize(residual_vtc, spec, capsys, "--no-repro", "-o", folder)
    assert code == 1 and doc["repro"] is None and list(folder.iterdir()) == []


# --- errors: exit 2 for bad input, 3 for device trouble --------------------------------------
def test_missing_archive_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["localize", tmp_path / "nope.vtc"], capsys)
    assert (code, out, err) == (2, "", f"error: {tmp_path / 'nope.vtc'}: no such file\n")


def test_case_out_of_range_exits_2(residual_vtc: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["localize", residual_vtc, "--case", "3"], capsys)
    assert code == 2
    assert err == (f"error: {residual_vtc}: --case 3 out of range (the archive holds 1 case(s), "
                   "0..0)\n")


def test_unknown_device_exits_2(residual_vtc: Path, device_env,
                                capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["localize", residual_vtc, "--device", "nosuch"], capsys)
    assert code == 2 and err.startswith("error: unknown device 'nosuch': no profile nosuch.toml")


def test_runner_crash_exits_3(residual_vtc: Path, device_env,
                              capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("broken", {"transport": "local",
                                        "runner": ["python3", "-c", "import sys; sys.exit(7)"]})
    code, out, err = run_cli(["localize", residual_vtc, "--device", "broken"], capsys)
    assert code == 3 and out == ""
    assert err.startswith("error: broken: the runner exited with status 7 without writing a "
                          "result")


@pytest.mark.parametrize("extra", [[], ["--no-dump"]], ids=["dump", "bisect"])
def test_a_runner_that_returns_no_outputs_is_a_device_error_not_a_clean_result(
        residual_vtc: Path, device_env, capsys: pytest.CaptureFixture[str],
        extra: list[str]) -> None:
    runner = Path(__file__).resolve().parents[1] / "nan_runner.py"
    device_env.write_profile("mute", {"transport": "local",
                                      "runner": [sys.executable, str(runner), "--drop"]})
    code, out, err = run_cli(["localize", residual_vtc, "--device", "mute", *extra], capsys)
    assert code == 3 and out == ""
    assert err.startswith("error: mute: the runner returned no value for output(s) ")


def test_unreachable_device_exits_3(residual_vtc: Path, device_env,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    from fixtures_ssh import free_port

    port = free_port()
    code, out, err = run_cli(["localize", residual_vtc, "--device", f"ssh:me@127.0.0.1:{port}"],
                             capsys)
    assert code == 3 and out == ""
    assert err == (f"error: ssh:me@127.0.0.1:{port}: connection refused by 127.0.0.1 port "
                   f"{port}; is sshd running there?\n")


def test_export_errors(residual_vtc: Path, tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    # a missing folder is made, as pack and run make theirs (it was an error here alone)
    code, _, err = run_cli(["export", residual_vtc, "-o", tmp_path / "no" / "m.onnx"], capsys)
    assert (code, err) == (0, "") and (tmp_path / "no" / "m.onnx").is_file()
    code, _, err = run_cli(["export", residual_vtc, "-o", residual_vtc], capsys)
    assert (code, err) == (2, f"error: {residual_vtc}: would overwrite the archive itself; "
                              "pass -o model.onnx\n")
    code, out, err = run_cli(["export", residual_vtc, "-o", tmp_path / "m.onnx", "--data",
                              tmp_path / "data"], capsys)
    assert code == 0, err
    from onnx import numpy_helper

    from verify.archive_reader import read_archive

    tc = read_archive(residual_vtc)
    pb = onnx.TensorProto()
    pb.ParseFromString((tmp_path / "data" / "test_data_set_0" / "input_0.pb").read_bytes())
    assert pb.name == "x" and (numpy_helper.to_array(pb) == tc.cases[0].inputs["x"]).all()
    assert (tmp_path / "m.onnx").read_bytes() == tc.model_bytes


@pytest.mark.parametrize("mode", ["dump", "bisect"])
def test_faults_that_only_add_up_give_the_smallest_failing_subgraph(
        chain_vtc: Path, faulty_profile, mode: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # each node's output off by 5e-5 relative: 0.8x the tolerance alone, over it together
    spec = faulty_profile("pair", "scale", ["n076", "n077"], 1.00005)
    extra = ["--no-dump"] if mode == "bisect" else []
    code, doc = _localize(chain_vtc, spec, capsys, "-o", tmp_path, *extra)
    assert code == 1
    assert doc["verdict"] == "failing subgraph"
    assert doc["subgraph"] == ["n076", "n077"]
    repro = tmp_path / "chain.repro-n076-n077.vtc"
    assert doc["repro"] == str(repro)
    if mode == "dump":
        assert {c["name"]: c["verdict"] for c in doc["candidates"]}["n077"] == "propagated"
    code, out, err = run_cli(["run", repro, "--device", spec, "--iter", "1"], capsys)
    assert code == 1, out
    code, out, err = run_cli(["run", repro, "--device", "local", "--iter", "1"], capsys)
    assert code == 0, out


@pytest.mark.parametrize("mode", ["dump", "bisect"])
@pytest.mark.parametrize("model, fault, node, value", [
    ("two_io", "scale", "branch/mul", 1.01),      # two inputs; an output that is also read on
    ("int_bool", "bias", "embed/sum", 0.01),      # integer inputs and outputs, bool masks
    ("cnn_nhwc", "leaky", "block2/relu", 0.1),    # a Transpose in front, NHWC input
])
def test_other_sample_models(model: str, fault: str, node: str, value: float, mode: str,
                             faulty_profile, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    from fixtures_localize import REPO

    vtc = tmp_path / f"{model}.vtc"
    code, _, err = run_cli(["pack", REPO / "goldens" / "models" / f"{model}.onnx", "-o", vtc],
                           capsys)
    assert code == 0, err
    spec = faulty_profile("dev", fault, node, value)
    code, doc = _localize(vtc, spec, capsys, *(["--no-dump"] if mode == "bisect" else []))
    assert code == 1
    assert (doc["verdict"], doc["subgraph"]) == ("faulty here", [node])
    code, _, _ = run_cli(["run", doc["repro"], "--device", "local", "--iter", "1"], capsys)
    assert code == 0


def test_picks_the_first_failing_case(faulty_profile, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from fixtures_localize import REPO

    # case 0 has only positive inputs: Relu -> LeakyRelu changes nothing there; case 1 does
    rng = np.random.default_rng(5)
    for name, case in (("a0", 0), ("b0", 0), ("a1", 1), ("b1", 1)):
        data = rng.uniform(0.1, 1, (1, 16)) if case == 0 else rng.normal(0, 1, (1, 16))
        np.save(tmp_path / f"{name}.npy", data.astype(np.float32))
    vtc = tmp_path / "two.vtc"
    code, _, err = run_cli(["pack", REPO / "goldens" / "models" / "two_io.onnx", "-o", vtc,
                            "-d", f"a:{tmp_path / 'a0.npy'}", "-d", f"b:{tmp_path / 'b0.npy'}",
                            "-d", f"a:{tmp_path / 'a1.npy'}", "-d", f"b:{tmp_path / 'b1.npy'}"],
                           capsys)
    assert code == 0, err
    spec = faulty_profile("dev", "leaky", "sum/relu", 0.1)
    code, doc = _localize(vtc, spec, capsys, "--no-dump")
    assert code == 1 and doc["case"] == 1 and doc["suspect"]["name"] == "sum/relu"
    assert doc["notes"][0] == "case 1 is the first of 2 whose outputs fail"
    assert doc["rounds"][0]["purpose"] == "the whole model, 2 cases"
    assert doc["rounds"][0]["pieces"] == 1  # one model run once per case: one piece
    assert not doc["rounds"][1]["purpose"].startswith("the whole model")
    code, doc = _localize(vtc, spec, capsys, "--case", "0")
    assert code == 0 and doc["case"] == 0 and doc["verdict"] == "no faulty node"


def test_a_device_lost_in_the_last_round_keeps_the_node_found(
        chain_vtc: Path, device_env, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bisection found n076, then the round measuring the full run's errors on the path to it
    (every path tensor marked, n001:0 among them) lost the device: exit 3, the node and its
    repro thrown away. That round only adds to what was found: a note says it failed."""
    from fixtures_localize import FAULTY_RUNNER

    device_env.write_profile("lastround", {"transport": "local", "runner": [
        sys.executable, str(FAULTY_RUNNER), "--fault", "scale", "--node", "n076", "--value",
        "1.01", "--die-on-output", "n001:0"]})
    code, doc = _localize(chain_vtc, "lastround", capsys, "--no-dump", "-o", tmp_path)
    assert code == 1 and (doc["verdict"], doc["suspect"]["name"]) == ("faulty here", "n076")
    assert Path(doc["repro"]).is_file()
    assert any(n.startswith("the full run's errors on the path to the suspect were not "
                            "measured: the device failed in that last round (")
               for n in doc["notes"]), doc["notes"]


def test_each_case_s_repro_is_kept(faulty_profile, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The repro's name left the case out: localizing case 1 after case 0 overwrote case 0's
    repro, though each holds its own case's boundary values."""
    import numpy as np

    from fixtures_localize import REPO

    rng = np.random.default_rng(6)
    data = []
    for case in (0, 1):
        for name in ("a", "b"):
            np.save(tmp_path / f"{name}{case}.npy", rng.normal(0, 1, (1, 16)).astype(np.float32))
            data += ["-d", f"{name}:{tmp_path / f'{name}{case}.npy'}"]
    vtc = tmp_path / "two.vtc"
    code, _, err = run_cli(["pack", REPO / "goldens" / "models" / "two_io.onnx", "-o", vtc,
                            *data], capsys)
    assert code == 0, err
    spec = faulty_profile("dev", "leaky", "sum/relu", 0.1)
    repros = []
    for case in ("0", "1"):
        code, doc = _localize(vtc, spec, capsys, "--case", case, "-o", tmp_path / "out")
        assert code == 1 and doc["suspect"]["name"] == "sum/relu"
        repros.append(Path(doc["repro"]))
    assert [p.name for p in repros] == ["two.repro-sum_relu.case0.vtc",
                                        "two.repro-sum_relu.case1.vtc"]
    for case, repro in enumerate(repros):  # each with its own case's values
        code, out, _ = run_cli(["inspect", repro, "--json"], capsys)
        assert code == 0 and json.loads(out)["provenance"]["repro_of"]["case"] == case


def test_a_fault_hidden_by_marked_outputs_is_bisected(chain_vtc: Path, faulty_profile,
                                                     tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # like a fused-kernel bug: wrong only while n076's output is not fetched
    spec = faulty_profile("fusion", "scale", "n076", 1.01, fused=True)
    code, doc = _localize(chain_vtc, spec, capsys, "-o", tmp_path)
    assert code == 1
    assert doc["mode"] == "bisect" and doc["notes"][0].startswith(
        "every layer is within tolerance when marked as an output but the plain run is not")
    # alone n076 is fine (its output is then fetched): the smallest failing piece is n076 and
    # the node reading it
    assert (doc["verdict"], doc["subgraph"]) == ("failing subgraph", ["n076", "n077"])
    assert [r["purpose"] for r in doc["rounds"]][:2] == ["per-layer run of 128 tensors",
                                                         "the whole model"]
    # the full run's error, where it was measured, is taken where the subgraph's own error
    # was (its output), never at what its first node makes (n076:0, within tolerance)
    own = {d["name"] for d in doc["suspect"]["own"]}
    assert own == {"n077:0"} and {d["name"] for d in doc["suspect"]["cumulative"]} <= own
    # the report's header says both (it named bisection alone, as if the per-layer run had
    # not happened)
    code, out, _ = run_cli(["localize", chain_vtc, "--device", spec, "-o", tmp_path / "t"],
                           capsys)
    assert code == 1 and ("nodes, per-layer comparison (every layer within tolerance), then "
                          "bisection with unmarked subgraphs fed reference inputs") in out
    # a subgraph's node, input and inherited lines are its first node's, and say so
    assert "\n  first node  n076  op " in out and "(worst input of the first node in the full " \
        "run)" in out


@pytest.mark.parametrize("fault, node, mode", [
    ("scale", "mul", "dump"), ("scale", "mul", "bisect"), ("bias", "if", "dump"),
    ("bias", "if", "bisect")])   # bisection feeds the If piece a 0-d condition
def test_control_flow_reading_the_outer_scope(if_vtc: Path, faulty_profile, fault: str,
                                              node: str, mode: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = faulty_profile("dev", fault, node, 0.5 if fault == "bias" else 1.01)
    code, doc = _localize(if_vtc, spec, capsys, "-o", tmp_path,
                          *(["--no-dump"] if mode == "bisect" else []))
    assert code == 1 and (doc["verdict"], doc["subgraph"]) == ("faulty here", [node])
    # an If named: the search did not look inside its bodies, and says so
    assert any("control-flow node (If)" in n for n in doc["notes"]) == (node == "if")
    code, _, _ = run_cli(["run", doc["repro"], "--device", "local", "--iter", "1"], capsys)
    assert code == 0


def test_command_line_tolerances_judge_and_travel_with_the_repro(
        residual_vtc: Path, faulty_profile, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    spec = faulty_profile("dev", "scale", "res1/conv1", 1.01)
    code, doc = _localize(residual_vtc, spec, capsys, "-o", tmp_path, "--atol", "1e-4",
                          "--rtol", "0", "--tol", "prob:exact")
    assert code == 1 and doc["suspect"]["name"] == "res1/conv1"
    assert doc["suspect"]["own"][0]["rule"] == "allclose atol=0.0001 rtol=0"
    code, out, _ = run_cli(["inspect", doc["repro"], "--json"], capsys)
    assert json.loads(out)["tolerances"] == {"atol": 1e-4, "rtol": 0.0, "specs": ["prob:exact"]}
    # a tolerance loose enough to accept the fault: nothing to find
    code, doc = _localize(residual_vtc, spec, capsys, "--atol", "10", "--rtol", "0")
    assert code == 0 and doc["verdict"] == "no faulty node"


@pytest.mark.parametrize("mode", ["dump", "bisect"])
def test_device_lost_mid_search_exits_3_without_a_repro(residual_vtc: Path, device_env,
                                                       mode: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from fixtures_localize import FAULTY_RUNNER

    device_env.write_profile("flaky", {"transport": "local", "runner": [
        sys.executable, str(FAULTY_RUNNER), "--fault", "scale", "--node", "br1/conv",
        "--die-on-pieces"]})
    folder = tmp_path / "out"
    code, out, err = run_cli(["localize", residual_vtc, "--device", "flaky", "-o", folder,
                              *(["--no-dump"] if mode == "bisect" else [])], capsys)
    assert (code, out) == (3, "")
    # which round of the search it ended in (its progress shows on a terminal only)
    where = ("5 suspect node(s) in isolation" if mode == "dump" else
             "bisect stem/conv .. head/softmax (23 nodes) in 2 parts")
    assert err == ("error: flaky: the runner exited with status 9 without writing a result: "
                   f"faulty_runner: device lost (in round 2 of the search: {where})\n")
    assert not folder.exists() or list(folder.iterdir()) == []


def test_a_scalar_input_of_the_faulty_node_reads_as_a_scalar() -> None:
    from verify.cli.localize_cmd import input_shape

    assert (input_shape([]), input_shape(None), input_shape([1, 8])) == \
        ("() scalar", "(?)", "(1,8)")


def test_a_node_over_tolerance_while_the_outputs_pass_is_noted() -> None:
    """localize judges every layer, run the outputs only: a node found over a tight tolerance
    whose outputs still pass exits 1 where run exits 0, so the report says why."""
    import numpy as np

    from verify.compare import AllcloseRule, compare
    from verify.localize.search import outputs_pass_note

    r = np.ones(4, np.float32)
    ok = compare("y", r + np.float32(1e-7), r, AllcloseRule(atol=1e-6))
    bad = compare("y", r + np.float32(1e-3), r, AllcloseRule(atol=1e-6))
    assert outputs_pass_note([ok]) == ("every output is within tolerance (verify run would "
                                       "pass): the node found is over it in the layers only",)
    assert outputs_pass_note([ok, bad]) == () and outputs_pass_note([]) == ()
