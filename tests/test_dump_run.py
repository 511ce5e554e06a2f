"""`verify run --bin-io-dump / --io-dump` on the local device: what the dump holds, that it is
what the device computed, and the dump options' errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fixtures_dump import CNN, make_dump, pack
from fixtures_dump import cnn_dumps, dump_factory  # noqa: F401 (fixtures)
from helpers_cli import verify
from verify.cli import main
from verify.dump import open_dump
from verify.runner.runner import OPT_LEVELS

LEVELS = list(OPT_LEVELS)  # every level run offers, layout included


@pytest.fixture(scope="module")
def cnn_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack(CNN, tmp_path_factory.mktemp("dumprun") / "cnn.vtc")


@pytest.mark.parametrize("level", LEVELS)
def test_dump_final_outputs_are_bit_identical_to_the_plain_run(
        cnn_vtc: Path, tmp_path: Path, level: str) -> None:
    plain = tmp_path / "plain"
    assert main(["run", str(cnn_vtc), "--iter", "1", "--opt-level", level,
                 "--bin-out-dump", str(plain), "--json"]) == 0
    dump = make_dump(cnn_vtc, tmp_path / "dump", level)
    d = open_dump(dump)
    entry = next(e for e in d.entries(0) if e.name == "prob")
    plain_prob = np.load(plain / "case0-out0.npy", allow_pickle=False)
    assert np.array_equal(np.asarray(d.load(entry)), plain_prob)
    assert d.manifest["graph"] == ("model" if level == "disable" else "optimized")
    assert d.manifest["options"]["opt_level"] == level


def test_dump_manifest_lists_tensors_in_order_in_one_pack_per_case(
        cnn_dumps: dict[str, Path]) -> None:
    d = open_dump(cnn_dumps["disable"])
    entries = d.entries(0)
    order = [t.name for t in __import__("verify.graph", fromlist=["x"]).tensor_order(onnx.load(CNN))]
    assert [e.name for e in entries] == order
    assert {e.file for e in entries} == {"c0.npys"}
    files = sorted(p.name for p in cnn_dumps["disable"].iterdir())
    assert files == ["c0.npys", "manifest.json"]
    # the images in capture order, each at a multiple of 64, any numpy reading one back
    offsets = [e.offset for e in entries]
    assert offsets[0] == 0 and offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert all(o is not None and o % 64 == 0 for o in offsets)
    with open(cnn_dumps["disable"] / "c0.npys", "rb") as fh:
        for e in entries:
            fh.seek(e.offset or 0)
            assert np.load(fh).tobytes() == np.asarray(d.load(e)).tobytes()
    first = entries[1]
    assert (first.name, first.node, first.op) == ("stem/conv:0", "stem/conv", "Conv")
    assert first.stats == {}  # a dump for diff: the summaries are --io-dump's (below)
    m = d.manifest
    assert m["complete"] is True and m["format"] == "verify-dump"
    assert m["device"]["onnxruntime"] and m["providers"] == ["CPUExecutionProvider"]
    assert m["fused_away"] == [] and m["optimized_only"] == []


def test_dump_at_opt_all_records_fused_away_and_optimized_only(cnn_dumps: dict[str, Path]) -> None:
    m = open_dump(cnn_dumps["all"]).manifest
    fused = {f["name"] for f in m["fused_away"]}
    assert {"stem/conv:0", "stem/bn:0", "block1/conv1:0"} <= fused
    assert m["optimized_only"] and all(t.startswith("reorder_token") for t in m["optimized_only"])
    assert m["fused_into"]["stem/relu:0"] == ["stem/conv:0", "stem/bn:0"]
    origins = {e["name"]: e["origin"] for e in m["cases"][0]["tensors"]}
    assert origins["stem/relu:0"] == "model" and origins[m["optimized_only"][0]] == "optimized"


def test_io_dump_text_is_stable(cnn_vtc: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    texts = []
    for k in range(2):
        code, _, err = verify(capsys, "run", cnn_vtc, "--iter", "1", "--opt-level", "disable",
                               "--io-dump", tmp_path / f"io{k}.txt")
        assert code == 0, err
        texts.append((tmp_path / f"io{k}.txt").read_text())
    assert texts[0] == texts[1]
    lines = texts[0].splitlines()
    assert lines[1] == "=== case 0: 38 tensors"
    assert lines[2] == "[00000] data"
    block = lines[8:14]
    assert block[0] == "[00001] stem/conv:0"
    assert block[1] == "  node stem/conv  op Conv"
    assert block[2] == "  shape (1,8,112,112)  dtype float32"
    assert block[3].startswith("  first ") and len(block[3].split()) == 9
    assert block[4].startswith("  min ") and " max " in block[4] and " std " in block[4]
    assert block[5] == "  nan 0  inf 0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["io0.txt", "io1.txt"]


def test_dump_filter_and_stats_only(cnn_vtc: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "se"
    code, _, err = verify(capsys, "run", cnn_vtc, "--iter", "1", "--bin-io-dump", out,
                           "--opt-level", "disable", "--dump-filter", "block3/se/")
    assert code == 0, err
    names = [e.name for e in open_dump(out).entries(0)]
    assert names == ["data",  # the graph input, kept whatever the filter
                     "block3/se/pool:0", "block3/se/fc1:0", "block3/se/relu:0",
                     "block3/se/fc2:0", "block3/se/sigmoid:0", "block3/se/scale:0"]
    stats = tmp_path / "stats"
    code, _, err = verify(capsys, "run", cnn_vtc, "--iter", "1", "--bin-io-dump", stats,
                           "--dump-stats-only", "--dump-budget-mb", "0.5")
    assert code == 0, err
    assert sorted(p.name for p in stats.iterdir()) == ["manifest.json"]
    d = open_dump(stats)
    assert all(e.file is None and e.stats["max"] is not None for e in d.entries(0))
    assert d.manifest["options"]["budget_bytes"] == 1 << 19


# verify's own runner, with its segment planner recording each segment it cuts (the node span
# and the budget it was given) in the file named by its first argument.
_PLAN_RECORDING_RUNNER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("device_runner", {runner!r})
rt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rt)
log = sys.argv.pop(1)
plan = rt.next_segment

def next_segment(nodes, first, sizes, captured, last_read, budget, held):
    last = plan(nodes, first, sizes, captured, last_read, budget, held)
    with open(log, "a") as fh:
        fh.write(json.dumps({{"budget": budget, "first": first, "last": last,
                              "nodes": [n.name for n in nodes]}}) + "\\n")
    return last

rt.next_segment = next_segment
sys.exit(rt.main(sys.argv))
"""


def test_dump_budget_is_recorded_and_bounds_the_segments(cnn_vtc: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    import sys

    from verify.runner_files import RUNNER_SOURCE

    log, wrapper = tmp_path / "plans.jsonl", tmp_path / "recording_runner.py"
    wrapper.write_text(_PLAN_RECORDING_RUNNER.format(runner=str(RUNNER_SOURCE)))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "rec.toml").write_text(
        f'transport = "local"\nrunner = {json.dumps([sys.executable, str(wrapper), str(log)])}\n')
    monkeypatch.setenv("VERIFY_DEVICES", str(tmp_path / "profiles"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = onnx.load(CNN)
    segments, dumps, notes = {}, {}, {}
    for mb in ("0.5", "64"):
        log.unlink(missing_ok=True)
        dumps[mb] = tmp_path / f"d{mb}"
        code, out, err = verify(capsys, "run", cnn_vtc, "--device", "rec", "--iter", "1",
                                "--warmup", "0", "--opt-level", "disable",
                                "--bin-io-dump", dumps[mb], "--dump-budget-mb", mb)
        assert code == 0, err
        notes[mb] = out + err
        budget = int(float(mb) * (1 << 20))
        assert open_dump(dumps[mb]).manifest["options"]["budget_bytes"] == budget
        plans = [json.loads(line) for line in log.read_text().splitlines()]
        assert {p["budget"] for p in plans} == {budget}
        spans = [(p["first"], p["last"]) for p in plans]
        nodes = plans[0]["nodes"]
        assert nodes == [n.name for n in model.graph.node]
        # the segments cover every node once, in order
        assert [i for a, b in spans for i in range(a, b)] == list(range(len(nodes)))
        # live bytes, recomputed here from the graph and the sizes the dump really has: the
        # boundary tensors held when a segment starts plus every tensor it computes
        d = open_dump(dumps[mb])
        real = {e.name: int(np.prod(e.shape)) * np.dtype(e.dtype).itemsize for e in d.entries(0)}
        made = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
        last_read = {i: k for k, n in enumerate(model.graph.node) for i in n.input}
        for a, b in spans:
            held = [t for t, k in made.items() if k < a and last_read.get(t, -1) >= a]
            marked = [o for n in model.graph.node[a:b] for o in n.output]
            live = sum(real[t] for t in held + marked)
            assert b - a == 1 or live <= budget, (a, b, live)
        segments[mb] = spans
        # the note's "at most" says when a node's output is over the budget (it ran alone)
        largest = max(real[e.name] for e in d.entries(0) if e.op != "<input>")
        over = f"(the largest tensor, {largest / 2**20:.3g} MB, is over it: a node with larger "
        assert (over in notes[mb]) == (largest > budget), notes[mb]
    assert len(segments["64"]) == 1
    assert len(segments["0.5"]) > 2
    # the segmenting changes how the values were fetched, never the values
    small, large = open_dump(dumps["0.5"]), open_dump(dumps["64"])
    assert [e.name for e in small.entries(0)] == [e.name for e in large.entries(0)]
    for a, b in zip(small.entries(0), large.entries(0), strict=True):
        assert np.array_equal(small.load(a), large.load(b)), a.name


@pytest.mark.parametrize("args, message", [
    (["--dump-filter", "("], "error: --dump-filter '(': not a regular expression: "
                             "missing ), unterminated subpattern at position 0"),
    (["--dump-filter", "^nothing-matches$"],
     "error: --dump-filter '^nothing-matches$' matches no tensor or node name"),
    # as typed, ready to paste back (its repr doubled every backslash)
    (["--dump-filter", r"conv\.99$"],
     "error: --dump-filter 'conv\\.99$' matches no tensor or node name"),
    (["--dump-budget-mb", "0"], "error: --dump-budget-mb must be a number > 0, got 0"),
    (["--dump-budget-mb", "inf"], "error: --dump-budget-mb must be a number > 0, got inf"),
    (["--dump-budget-mb", "nan"], "error: --dump-budget-mb must be a number > 0, got nan"),
])
def test_dump_option_errors(cnn_vtc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            args: list[str], message: str) -> None:
    code, _, err = verify(capsys, "run", cnn_vtc, "--iter", "1", "--bin-io-dump",
                           tmp_path / "d", *args)
    assert code == 2
    assert err.strip().splitlines()[-1] == message
    assert not (tmp_path / "d").exists()  # nothing made is left behind, no staging either


def test_io_dump_into_a_folder_is_refused(cnn_vtc: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = verify(capsys, "run", cnn_vtc, "--io-dump", tmp_path)
    assert (code, err.strip()) == (2, f"error: --io-dump {tmp_path}: is a folder; give a file "
                                      "name (the text dump), and --bin-io-dump DIR for a dump "
                                      "folder")


def test_dump_options_need_a_dump(cnn_vtc: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = verify(capsys, "run", cnn_vtc, "--dump-stats-only")
    assert (code, err.strip()) == (2, "error: --dump-filter, --dump-budget-mb and "
                                      "--dump-stats-only need --bin-io-dump DIR or --io-dump FILE")


def test_dump_refuses_a_folder_that_is_not_a_dump(cnn_vtc: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = verify(capsys, "run", cnn_vtc, "--bin-io-dump", tmp_path)
    assert code == 2
    assert err.strip() == (f"error: {tmp_path}: folder is not empty and not a verify dump "
                           "(holds notes.txt); give an empty or new folder")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_dump_refuses_a_folder_holding_a_users_hidden_files(
        cnn_vtc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = make_dump(cnn_vtc, tmp_path / "d", "disable")
    (out / ".env").write_text("SECRET=1")
    code, _, err = verify(capsys, "run", cnn_vtc, "--bin-io-dump", out)
    assert code == 2 and "(holds .env)" in err
    assert (out / ".env").read_text() == "SECRET=1" and open_dump(out).n_cases == 1


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("args, exit_code", [
    (["--dump-filter", "^nothing-matches$"], 2),  # found out once the model is read
    (["--device", "ssh:nobody@127.0.0.1:1"], 3),  # refused: after the folder was prepared
])
def test_a_failed_rerun_leaves_the_previous_dump_whole(
        cnn_vtc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        args: list[str], exit_code: int) -> None:
    out = make_dump(cnn_vtc, tmp_path / "d", "disable")
    before = _files(out)
    code, _, err = verify(capsys, "run", cnn_vtc, "--opt-level", "all", "--bin-io-dump", out,
                          *args)
    assert code == exit_code, err
    assert _files(out) == before  # no staging folder left either
    assert open_dump(out).n_cases == 1


def test_a_killed_runs_staging_folder_goes_with_the_next_dump(
        cnn_vtc: Path, tmp_path: Path) -> None:
    out = make_dump(cnn_vtc, tmp_path / "d", "disable")
    killed = out / ".verify-staging-abc123"  # its run died: nothing holds the folder's lock
    killed.mkdir()
    (killed / "c0.npys").write_bytes(b"partial")
    make_dump(cnn_vtc, out, "disable")
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    assert open_dump(out).n_cases == 1  # the new dump, complete


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_a_folder_another_run_is_writing_into_is_refused(
        cnn_vtc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl
    import os

    out = make_dump(cnn_vtc, tmp_path / "d", "disable")
    before = _files(out)
    fd = os.open(out, os.O_RDONLY)  # as a run in progress holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        code, _, err = verify(capsys, "run", cnn_vtc, "--iter", "1", "--bin-io-dump", out)
    finally:
        os.close(fd)
    assert (code, err.strip()) == (2, f"error: {out}: another verify run is writing a dump "
                                      "into this folder; wait for it, or give another folder")
    assert _files(out) == before
    make_dump(cnn_vtc, out, "disable")  # once it is done


def test_a_commit_that_fails_puts_the_earlier_dump_back(
        cnn_vtc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from verify import dump_dir

    out = make_dump(cnn_vtc, tmp_path / "d", "disable")
    before = _files(out)

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dump_dir, "write_manifest", full)  # the swap's very last step
    code, _, err = verify(capsys, "run", cnn_vtc, "--iter", "1", "--opt-level", "all",
                          "--bin-io-dump", out)
    assert code == 2 and "No space left on device" in err
    assert _files(out) == before


def test_an_io_dump_that_cannot_be_written_leaves_the_earlier_dump(
        cnn_vtc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = make_dump(cnn_vtc, tmp_path / "d", "disable")
    before = _files(out)
    (tmp_path / "blocker").write_text("a file where a folder would be")
    code, _, err = verify(capsys, "run", cnn_vtc, "--iter", "1", "--opt-level", "all",
                          "--bin-io-dump", out, "--io-dump", tmp_path / "blocker" / "io.txt")
    assert code == 2, err
    assert _files(out) == before  # the text dump is written before the swap


def test_a_budget_below_one_byte_is_one_tensor_a_segment(
        cnn_vtc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = verify(capsys, "run", cnn_vtc, "--iter", "1", "--opt-level", "disable",
                            "--dump-budget-mb", "1e-9", "--bin-io-dump", tmp_path / "d")
    assert code == 0, err
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["options"]["budget_bytes"] == 1  # not the default's 16 MB
    nodes = len(onnx.load(CNN).graph.node)
    assert manifest["segments"] == nodes  # every node a segment of its own


def test_awkward_tensor_names_round_trip(tmp_path: Path,
                                         dump_factory: Callable[..., Path]) -> None:
    names = ["../../escape", "a/b c", "ünï cødé ✓", "..", "x:0"]
    nodes = []
    prev = "in"
    for i, n in enumerate(names):
        nodes.append(helper.make_node("Relu" if i % 2 else "Neg", [prev], [n], name=f"n/{i}"))
        prev = n
    nodes.append(helper.make_node("Identity", [prev], ["out"], name="id"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("in", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    dump = dump_factory(model.SerializeToString(), "disable")
    d = open_dump(dump)
    assert [e.name for e in d.entries(0)] == ["in", *names, "out"]
    assert sorted(p.name for p in dump.iterdir()) == ["c0.npys", "manifest.json"]
    assert len({e.offset for e in d.entries(0)}) == 7
    x = np.asarray(d.load(d.entries(0)[0]))
    assert np.array_equal(np.asarray(d.load(d.entries(0)[3])), -np.maximum(-x, 0))  # Neg(Relu(Neg))
    assert json.loads((dump / "manifest.json").read_text())["cases"][0]["tensors"][3]["name"] \
        == "ünï cødé ✓"


def test_a_new_dump_replaces_an_old_one_in_the_same_folder(cnn_vtc: Path, tmp_path: Path) -> None:
    out = tmp_path / "d"
    make_dump(cnn_vtc, out, "disable")
    (out / "c0_t00099.npy").write_bytes(b"stale")  # a format-1 file: the old dump's too
    (out / "c1.npys").write_bytes(b"stale")
    make_dump(cnn_vtc, out, "disable", "--dump-filter", "^prob$")
    assert sorted(p.name for p in out.iterdir()) == ["c0.npys", "manifest.json"]
    assert [e.name for e in open_dump(out).entries(0)] == ["data", "prob"]


def test_dynamic_integer_and_multi_case_models_dump_and_diff(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    models = CNN.parent
    # dynamic dims (N resolved from the fed shape), 3 cases of different batch sizes
    dyn = tmp_path / "dyn.vtc"
    assert main(["pack", str(models / "dynamic.onnx"), "-o", str(dyn), "--layers", "--json",
                 "-d", "x:[[1,2,3,4]]", "-d", "x:[[1,2,3,4],[5,6,7,8]]",
                 "-d", "x:[[0,0,0,1],[1,0,0,0],[2,2,2,2]]"]) == 0
    out = make_dump(dyn, tmp_path / "dyn", "all", "--dump-budget-mb", "0.0001")
    d = open_dump(out)
    assert d.n_cases == 3 and [e.shape[0] for e in d.entries(2)] == [3, 3, 3]
    capsys.readouterr()
    for case in range(3):
        code, _, err = verify(capsys, "diff", out, dyn, "--case", case)
        assert code == 0, err
    # a run of one case holds that case, under the archive's number
    one = make_dump(dyn, tmp_path / "dyn2", "disable", "--case", "2")
    assert open_dump(one).case_numbers == [2]
    capsys.readouterr()
    code, _, err = verify(capsys, "diff", one, dyn, "--case", "2")
    assert code == 0, err
    code, _, err = verify(capsys, "diff", one, dyn, "--case", "0")
    assert (code, err.strip()) == (2, f"error: {one}: no case 0 (the dump holds case(s) 2)")
    # integers and bools: exact rule, bool stats
    ib = tmp_path / "ib.vtc"
    assert main(["pack", str(models / "int_bool.onnx"), "-o", str(ib), "--layers", "--json"]) == 0
    out = make_dump(ib, tmp_path / "ib", "disable", "--io-dump", str(tmp_path / "ib.txt"))
    dumped = open_dump(out)
    entries = {e.op: e for e in dumped.entries(0)}
    greater = entries["Greater"]
    value = dumped.load(greater)
    assert greater.dtype == "bool" and value.dtype == np.bool_
    assert (type(greater.stats["min"]), type(greater.stats["max"])) == (bool, bool)
    assert (greater.stats["min"], greater.stats["max"]) == (bool(value.min()), bool(value.max()))
    capsys.readouterr()
    code, stdout, err = verify(capsys, "diff", out, ib, "--case", "0", "--json")
    doc = json.loads(stdout)
    assert code == 0, err
    rules = {r["op"]: r["diff"]["rule"] for r in doc["rows"]}
    assert rules["ArgMax"] == rules["Greater"] == rules["Mod"] == "exact"
    assert rules["Where"] == "magnitude k=2^-14"


def test_a_runner_without_layer_capture_is_a_device_error(
        tmp_path: Path, cnn_vtc: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A runner that follows the contract but ignores the 'dump' key (tests/alt_runner.py)."""
    import sys

    alt = Path(__file__).resolve().parent / "alt_runner.py"
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "alt.toml").write_text(
        f'transport = "local"\nrunner = [{json.dumps(sys.executable)}, {json.dumps(str(alt))}]\n')
    monkeypatch.setenv("VERIFY_DEVICES", str(tmp_path / "profiles"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, _, err = verify(capsys, "run", cnn_vtc, "--device", "alt", "--iter", "1",
                           "--opt-level", "disable", "--bin-io-dump", tmp_path / "d")
    assert code == 3
    assert err.strip().splitlines()[-1] == (
        "error: alt: the device's runner does not capture layers (its result has no 'dump'); "
        "use verify's own runner.py for dumps")
    assert not (tmp_path / "d").exists()  # no dump folder that could pass for one
    code, _, err = verify(capsys, "run", cnn_vtc, "--device", "alt", "--iter", "1",
                           "--opt-level", "all", "--bin-io-dump", tmp_path / "d")
    assert code == 3
    assert err.strip().splitlines()[-1] == (
        "error: alt: the device's runner wrote no optimized model (optimized_model_path), so "
        "the graph that ran cannot be dumped; use verify's own runner.py, or --opt-level disable")
    assert not (tmp_path / "d").exists()
    mine = tmp_path / "mine"  # a folder the user made is left, empty as it was given
    mine.mkdir()
    code, _, _ = verify(capsys, "run", cnn_vtc, "--device", "alt", "--iter", "1",
                        "--opt-level", "disable", "--bin-io-dump", mine)
    assert code == 3 and mine.is_dir() and list(mine.iterdir()) == []


def test_scalar_inputs_stay_scalar(tmp_path: Path, dump_factory: Callable[..., Path]) -> None:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["y"], name="mul"),
         helper.make_node("Neg", ["y"], ["z"], name="neg")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    d = open_dump(dump_factory(model.SerializeToString(), "disable"))
    shapes = {e.name: e.shape for e in d.entries(0)}
    assert shapes == {"x": (3,), "s": (), "y": (3,), "z": (3,)}
