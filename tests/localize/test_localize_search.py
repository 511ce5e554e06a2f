"""localize's search itself (verify/localize/search.py), written against its mutation run's
survivors: the rounds it reports (purpose, pieces, nodes, the pieces that failed), the trim of a
failing range no part of which fails alone (both ends, O(log n) trips), the order in which
candidates are isolated under `--max-isolated`, and the archive's per-layer references read
without a host run and without holding more than a round asks for.
"""

from __future__ import annotations

import json
import math
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from fixtures_devices import run_cli
from fixtures_localize import REPO, chain_model
from verify.archive_reader import iter_layers, read_archive
from verify.compare import AllcloseRule, compare
from verify.localize import search
from verify.subgraph import node_graph

CNN = REPO / "goldens" / "models" / "cnn.onnx"


def _localize(archive: Path, device: str, capsys: pytest.CaptureFixture[str],
              *extra: str) -> dict:
    code, out, err = run_cli(["localize", archive, "--device", device, "--json", "--no-repro",
                              *extra], capsys)
    assert code == 1, err
    return json.loads(out)


def _rounds(doc: dict) -> list[tuple[str, int, int, list[str]]]:
    return [(r["purpose"], r["pieces"], r["nodes"], r["failing"]) for r in doc["rounds"]]


def test_faults_that_add_up_across_a_cut_are_trimmed_from_both_ends(
        chain_vtc: Path, faulty_profile, capsys: pytest.CaptureFixture[str]) -> None:
    """n075 and n076 (scaled by 1.00005), each 0.8x the tolerance alone, lie on both sides of
    the cut bisection makes in n072 .. n079: neither half fails, so the range is trimmed, its
    start moved in while it still fails, then its end. Every round is reported as it ran: what
    it was for, how many pieces and nodes, which pieces failed."""
    spec = faulty_profile("pair", "scale", ["n075", "n076"], 1.00005)
    t0 = time.perf_counter()
    doc = _localize(chain_vtc, spec, capsys, "--no-dump")
    elapsed = time.perf_counter() - t0
    assert (doc["verdict"], doc["subgraph"]) == ("failing subgraph", ["n075", "n076"])
    assert _rounds(doc) == [
        ("the whole model", 1, 128, []),
        ("bisect n000 .. n127 (128 nodes) in 2 parts", 2, 128, ["n064 .. n127"]),
        ("bisect n064 .. n127 (64 nodes) in 2 parts", 2, 64, ["n064 .. n095"]),
        ("bisect n064 .. n095 (32 nodes) in 2 parts", 2, 32, ["n064 .. n079"]),
        ("bisect n064 .. n079 (16 nodes) in 2 parts", 2, 16, ["n072 .. n079"]),
        ("bisect n072 .. n079 (8 nodes) in 2 parts", 2, 8, []),
        # the start: n076 .. n079 passed in the last round and is not run again
        ("trim to n074 .. n079 (6 nodes)", 1, 6, ["n074 .. n079"]),
        ("trim to n075 .. n079 (5 nodes)", 1, 5, ["n075 .. n079"]),
        # the end
        ("trim to n075 .. n076 (2 nodes)", 1, 2, ["n075 .. n076"]),
        ("trim to n075 (1 node)", 1, 1, []),
        ("errors on the path to the suspect", 1, 77, []),
    ]
    # what each trip sent (the whole model first, then ever smaller pieces) and took, in ms
    sent = [r["bytes_sent"] for r in doc["rounds"]]
    assert all(type(b) is int and b > 0 for b in sent)
    assert sent[0] >= len(read_archive(chain_vtc).model_bytes)
    assert sent[1:10] == sorted(set(sent[1:10]), reverse=True)
    assert all(type(r["seconds"]) is float and r["seconds"] >= 0
               and r["seconds"] == round(r["seconds"], 3) for r in doc["rounds"])
    assert sum(r["seconds"] for r in doc["rounds"]) <= elapsed + 0.01  # each trip's own time


def test_the_status_line_names_each_round_as_it_starts(chain_vtc: Path, faulty_profile) -> None:
    """On a terminal the status line says which round is running and what for, and the device
    session's own lines (connecting to the device, once for every round) are shown too."""
    from verify.localize import LocalizeRequest, localize
    from verify.options import ArchiveSelection, DeviceTarget

    spec = faulty_profile("pair", "scale", ["n075", "n076"], 1.00005)
    lines: list[str] = []
    res = localize(LocalizeRequest(ArchiveSelection(chain_vtc), DeviceTarget(spec),
                                   mode="bisect", write_repro=False), status=lines.append)
    rounds = [ln for ln in lines if ln.startswith("round ")]
    assert rounds == [f"round {i}: {r.purpose}" for i, r in enumerate(res.rounds, 1)]
    assert rounds[0] == "round 1: the whole model" and len(rounds) == 11
    assert lines[:2] == ["round 1: the whole model", f"connecting to {spec}"]
    assert lines.count(f"connecting to {spec}") == 1


@pytest.mark.parametrize("size", range(2, 41))
def test_the_trim_finds_every_boundary_in_logarithmic_trips(size: int) -> None:
    """`_edge` between a failing and a passing position, either side: the last failing position
    next to the first passing one, in at most ceil(log2(size)) trips (a search that never
    narrows would run device trips for ever: the predicate stops it after the bound)."""
    bound = math.ceil(math.log2(size))
    for lo_fails in (True, False):
        for edge in range(1, size):   # positions < edge fail (lo_fails) or pass
            calls: list[int] = []

            def fails_at(mid: int) -> tuple | None:
                assert 0 < mid < size and len(calls) < bound, (size, edge, calls, mid)
                calls.append(mid)
                return ("found", mid) if (mid < edge) == lo_fails else None

            if lo_fails:
                got = search._edge(0, size, fails_at, ())
                want = edge - 1
            else:
                got = search._edge(size, 0, fails_at, ())
                want = edge
            assert got[0] == want, (size, edge, lo_fails, calls)
            assert got[1] == (("found", want) if want in calls else ()), (size, edge, calls)


def test_max_isolated_takes_the_largest_jump_and_the_round_names_the_faulty_node(
        cnn_vtc: Path, faulty_profile, capsys: pytest.CaptureFixture[str]) -> None:
    """cnn with block2/conv1's output off by 1%: every node after it fails in the per-layer run.
    `--max-isolated 2` isolates the node whose inputs are within tolerance and, of the nodes
    that inherited the error, the one where it grows most (block3/se/fc1); the isolation round
    lists only the node that fails on its own."""
    spec = faulty_profile("f", "scale", "block2/conv1", 1.01)
    doc = _localize(cnn_vtc, spec, capsys, "--max-isolated", "2")
    assert [(c["name"], c["verdict"]) for c in doc["candidates"]] == [
        ("block2/conv1", "faulty here"), ("block3/se/fc1", "propagated")]
    assert _rounds(doc)[1] == ("2 suspect node(s) in isolation", 2, 2, ["block2/conv1"])


def _diff(template, name: str, units: float):
    return replace(template, name=name, passed=units <= 1, tol_units=units)


def test_candidates_rank_own_errors_first_then_by_the_jump() -> None:
    """On a chain: n002 makes 1.8 units from an input 0.9 (within tolerance), n006 1.2 units from
    0.0005; n003 grows an inherited 1.8 to 9, n004 9 to 9.5. Nodes whose inputs pass come first,
    the larger jump (own / inherited, inherited at least 1e-3) first in each group:
    n006 (1200x), n002 (2x), then n003 (5x), n004. With `--max-isolated N` this order decides
    which nodes are run in isolation and reported."""
    ng = node_graph(chain_model(10))
    a = np.ones(4, np.float32)
    template = compare("t", a, a, AllcloseRule(atol=1e-3, rtol=0.0))
    units = {"n000:0": 0.0, "n001:0": 0.9, "n002:0": 1.8, "n003:0": 9.0, "n004:0": 9.5,
             "n005:0": 0.0005, "n006:0": 1.2, "n007:0": 0.5}
    cumulative = {t: _diff(template, t, u) for t, u in units.items()}
    assert [ng.labels[i] for i in search.rank_candidates(ng, cumulative)] == \
        ["n006", "n002", "n003", "n004"]


def test_a_nan_passed_on_is_no_jump_and_where_it_starts_ranks_first() -> None:
    """n002 turns finite values into NaN (+inf tolerance units) and n003, n004 pass it on: inf
    from inf is no jump (1x), not inf/inf = NaN, which no sort can place (it left them ahead of
    n007, which grows an inherited 1.2 units to 6, 5x). Own errors first, larger jump first."""
    ng = node_graph(chain_model(10))
    a = np.ones(4, np.float32)
    template = compare("t", a, a, AllcloseRule(atol=1e-3, rtol=0.0))
    inf = float("inf")
    units = {"n000:0": 0.0, "n001:0": 0.5, "n002:0": inf, "n003:0": inf, "n004:0": inf,
             "n005:0": 0.0005, "n006:0": 1.2, "n007:0": 6.0}
    cumulative = {t: _diff(template, t, u) for t, u in units.items()}
    assert [ng.labels[i] for i in search.rank_candidates(ng, cumulative)] == \
        ["n002", "n006", "n007", "n003", "n004"]


@pytest.fixture(scope="module")
def cnn_layers_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from verify.cli import main

    vtc = tmp_path_factory.mktemp("cnn-layers") / "cnn.vtc"
    assert main(["pack", str(CNN), "--layers", "-o", str(vtc)]) == 0
    return vtc


def test_archive_references_need_no_host_run_and_hold_only_what_a_round_asks_for(
        cnn_layers_vtc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cnn packed with --layers: its per-layer references come from the archive, never from a
    host run (which could differ from what was packed), and over the memory budget only the
    tensors a round asks for are kept (cnn's activations are ~2.9 MB)."""
    vtc = cnn_layers_vtc
    stored = dict(iter_layers(vtc, 0))
    tc = read_archive(vtc)

    def no_host_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a host run for references the archive holds")

    monkeypatch.setattr(search, "HostCapture", no_host_run)
    names = list(stored)
    with search.References(tc.model_bytes, tc.cases[0].inputs, vtc, fetch_all=True) as refs:
        got = refs.get(names)
    assert list(got) == names
    assert all(np.array_equal(got[n], stored[n]) for n in names)

    sizes = {n: v.nbytes for n, v in stored.items()}
    small = min(names, key=sizes.__getitem__)
    del stored, got
    tracemalloc.start()
    try:
        with search.References(tc.model_bytes, tc.cases[0].inputs, vtc) as refs:
            before = tracemalloc.get_traced_memory()[0]
            one = refs.get([small])
            held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert list(one) == [small]
    assert held < 256 << 10, held


def test_host_references_one_run_when_all_fits_else_only_what_is_new(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without per-layer references in the archive, a host run computes them: when everything
    fits the budget the first request computes every tensor once and later rounds need no host
    run; otherwise each request computes only the tensors not already held, and nothing more
    stays in memory (cnn's activations are ~2.9 MB). The model, parsed by localize already, is
    not parsed again."""
    from verify import capture
    from verify.graph import parse_model, tensor_order

    model_bytes = CNN.read_bytes()
    model = parse_model(model_bytes, "cnn")
    names = [t.name for t in tensor_order(model)][1:]
    feeds = {"data": np.random.default_rng(0).random((1, 3, 224, 224), np.float32)}
    runs: list[list[str] | None] = []
    layers = capture.HostCapture.layers

    def counted(self, feeds, names=None):  # type: ignore[no-untyped-def]
        runs.append(None if names is None else list(names))
        return layers(self, feeds, names)

    def no_parse(*args: object) -> None:
        raise AssertionError("the model parsed again")

    monkeypatch.setattr(capture.HostCapture, "layers", counted)
    monkeypatch.setattr(capture, "parse_model", no_parse)
    with search.References(model_bytes, feeds, fetch_all=True, model=model) as refs:
        first = refs.get([names[3]])
        later = refs.get([names[10], names[-1]])
    assert runs == [None]
    whole = dict(capture.HostCapture(model_bytes, model=model).layers(feeds))
    for got in (first, later):
        assert all(np.array_equal(v, whole[n]) for n, v in got.items())
    assert list(first) == [names[3]] and list(later) == [names[10], names[-1]]

    runs.clear()
    sizes = {n: v.nbytes for n, v in whole.items()}
    small = sorted(names, key=sizes.__getitem__)[:2]
    del whole, first, later
    tracemalloc.start()
    try:
        with search.References(model_bytes, feeds, model=model) as refs:
            before = tracemalloc.get_traced_memory()[0]
            refs.get([small[0]])
            refs.get([small[0], small[1]])
            held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert runs == [[small[0]], [small[1]]]
    assert held < 256 << 10, held


def test_a_fault_in_the_first_node_inherited_nothing(
        cnn_vtc: Path, faulty_profile, capsys: pytest.CaptureFixture[str]) -> None:
    """stem/conv reads only the graph input: its inherited error is 0, not a made-up figure."""
    spec = faulty_profile("f", "scale", "stem/conv", 1.01)
    doc = _localize(cnn_vtc, spec, capsys)
    assert (doc["verdict"], doc["subgraph"]) == ("faulty here", ["stem/conv"])
    assert doc["suspect"]["inherited"] == [] and doc["suspect"]["inherited_error"] == 0.0
    assert doc["suspect"]["own_error"] > 1


def test_tensors_the_archive_lacks_come_from_a_host_run(cnn_layers_vtc: Path,
                                                       tmp_path: Path) -> None:
    """An archive packed with `--reference torch --layers` holds only the tensors PyTorch has a
    value for (torchpack.layer_items): here every other one of cnn's. The rest come from a host
    run, whether everything is fetched at once or only what is asked for."""
    from verify.testcase import write_archive
    from verify.torchpack import layer_items

    tc = read_archive(cnn_layers_vtc)
    stored = dict(iter_layers(cnn_layers_vtc, 0))
    names = list(stored)
    kept = {n: v for i, (n, v) in enumerate(stored.items()) if i % 2}
    partial = tmp_path / "partial.vtc"
    write_archive(partial, tc, [layer_items([t.name for t in tc.tensor_order], kept)])
    assert len(dict(iter_layers(partial, 0))) == len(kept) < len(names)
    for fetch_all in (False, True):
        with search.References(tc.model_bytes, tc.cases[0].inputs, partial,
                               fetch_all=fetch_all) as refs:
            got = refs.get(names)
        assert list(got) == names, fetch_all
        assert all(np.allclose(got[n], stored[n], rtol=1e-5, atol=1e-6) for n in names)


def test_a_model_with_external_data_is_searched_with_its_weights(
        tmp_path: Path, device_env, capsys: pytest.CaptureFixture[str]) -> None:
    """An archive packed with --keep-external-data: the host references and every device round
    need the weights file beside the model. The per-layer run and the plain run on the local
    device both pass: no faulty node, exit 0 (without the weights: an error)."""
    onnx_path = tmp_path / "src" / "chain.onnx"
    onnx_path.parent.mkdir()
    onnx.save(chain_model(16), onnx_path, save_as_external_data=True,
              all_tensors_to_one_file=True, location="chain.bin", size_threshold=0)
    vtc = tmp_path / "chain.vtc"
    code, _, err = run_cli(["pack", onnx_path, "--keep-external-data", "-o", vtc], capsys)
    assert code == 0, err
    code, out, err = run_cli(["localize", vtc, "--device", "local", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["verdict"], doc["mode"], doc["reference_source"]) == ("no faulty node", "dump",
                                                                      "host")
    assert [r["purpose"] for r in doc["rounds"]] == ["per-layer run of 16 tensors",
                                                     "the whole model"]


def test_a_piece_whose_outputs_the_runner_loses_is_a_device_error(
        chain_vtc: Path, device_env, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole model comes back (and fails), then the runner returns nothing for the first
    bisection round's pieces: exit 3 naming the device and the outputs, not a traceback."""
    import sys

    from fixtures_localize import FAULTY_RUNNER

    device_env.write_profile("lossy", {"transport": "local", "runner": [
        sys.executable, str(FAULTY_RUNNER), "--fault", "weight", "--node", "n076",
        "--drop-piece-outputs"]})
    code, out, err = run_cli(["localize", chain_vtc, "--device", "lossy", "--no-dump"], capsys)
    assert (code, out) == (3, "")
    assert err == ("error: lossy: the runner returned no value for output(s) 'n063:0', "
                   "'n127:0'\n")


def _pack_graph(tmp_path: Path, name: str, nodes: list, data: str,
                capsys: pytest.CaptureFixture[str], inits: list | None = None) -> Path:
    """`nodes` as an opset-17 model with one float input `a` [1, 4] and one output `out`,
    packed with `-d a:<data>`."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("a", f, [1, 4])],
                              [helper.make_tensor_value_info("out", f, [1, 4])], inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / f"{name}.onnx")
    vtc = tmp_path / f"{name}.vtc"
    code, _, err = run_cli(["pack", tmp_path / f"{name}.onnx", "-d", f"a:{data}", "-o", vtc],
                           capsys)
    assert code == 0, err
    return vtc


def test_the_path_walks_back_along_the_larger_error_to_a_node_of_constants(
        tmp_path: Path, faulty_profile, capsys: pytest.CaptureFixture[str]) -> None:
    """add = a + Range(0, 4, 1), the Range made from initializers alone (positions, say). The
    path to the faulty add walks back along its input with the larger known error (the Range's
    output, measured, not the graph input) and ends at the Range, which reads nothing."""
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(v, np.float32), n)
             for n, v in (("start", 0), ("limit", 4), ("delta", 1))]
    vtc = _pack_graph(tmp_path, "positions", [
        helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range"),
        helper.make_node("Add", ["a", "r"], ["y"], name="add"),
        helper.make_node("Relu", ["y"], ["out"], name="relu")], "[[1,2,3,4]]", capsys, inits)
    doc = _localize(vtc, faulty_profile("f", "scale", "add", 1.01), capsys)
    assert (doc["verdict"], doc["subgraph"]) == ("faulty here", ["add"])
    assert [(s["tensor"], s["node"]) for s in doc["path"]] == [("r", "range")]


def test_a_bisected_suspects_path_has_the_full_run_error_of_every_step(
        tmp_path: Path, faulty_profile, capsys: pytest.CaptureFixture[str]) -> None:
    """add = relu_m(neg_m(a)) + relu_n(neg_n(a)), bisected: the run measuring the path to the
    suspect measures the path the report shows (along add's first input), so every step after
    the graph input carries its error in the full run."""
    from onnx import helper

    vtc = _pack_graph(tmp_path, "two_paths", [
        helper.make_node("Neg", ["a"], ["m0"], name="neg_m"),
        helper.make_node("Relu", ["m0"], ["m"], name="relu_m"),
        helper.make_node("Neg", ["a"], ["n0"], name="neg_n"),
        helper.make_node("Relu", ["n0"], ["n"], name="relu_n"),
        helper.make_node("Add", ["m", "n"], ["y"], name="add"),
        helper.make_node("Relu", ["y"], ["out"], name="relu")], "[[-1,-2,3,-4]]", capsys)
    doc = _localize(vtc, faulty_profile("f", "scale", "add", 1.01), capsys, "--no-dump")
    assert (doc["verdict"], doc["subgraph"]) == ("faulty here", ["add"])
    path = [(s["tensor"], s["node"], s["diff"] is not None) for s in doc["path"]]
    assert path == [("a", "", False), ("m0", "neg_m", True), ("m", "relu_m", True)]
