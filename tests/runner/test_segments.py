"""Segmented capture on real dynamic-shape models: sizes planned from the case's concrete shapes
equal the sizes the run produces, every node runs once, a budget smaller than the largest
tensor still completes, and control flow (If/Loop/Scan bodies) is counted and reported."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from corpus import model_path
from verify.capture import plan_dump, subgraph_tensor_count
from verify.graph import saturation_floors, tensor_order
from verify.runner import runner as rt
from verify.shapes import tensor_sizes

LEVELS = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
_JOB = {"opt_level": "disable", "providers": ["CPUExecutionProvider"], "no_cpu_arena": True}


def graph_that_runs(model: Path, level: str, tmp_path: Path) -> Path:
    """The model at disable; above it, the optimized model onnxruntime writes (as a dump
    captures it)."""
    if level == "disable":
        return model
    so = ort.SessionOptions()
    so.graph_optimization_level = LEVELS[level]
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    return tmp_path / "optimized.onnx"


class CountingOrt:
    """onnxruntime itself, with every session's nodes counted each time it runs. Constant
    nodes are not counted: onnxruntime makes them initializers when it loads a model, and a
    segment reading one made earlier gets a copy of it (see the test below)."""

    def __init__(self) -> None:
        self.runs: collections.Counter[str] = collections.Counter()
        self.sessions = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(ort, name)

    def InferenceSession(self, model: str, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
        nodes = [n.name for n in onnx.load(model).graph.node if n.op_type != "Constant"]
        real = ort.InferenceSession(model, *args, **kwargs)
        counter = self
        counter.sessions += 1

        class Session:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def run(self, *a: Any, **k: Any) -> Any:
                counter.runs.update(nodes)
                return real.run(*a, **k)

            def run_with_ort_values(self, *a: Any, **k: Any) -> Any:
                counter.runs.update(nodes)
                return real.run_with_ort_values(*a, **k)

        return Session()


def _det_input(h: int = 320, w: int = 480) -> np.ndarray:
    return np.random.default_rng(0).random((1, 3, h, w), dtype=np.float32)


@pytest.mark.parametrize("level", list(LEVELS))
def test_planned_sizes_equal_the_real_sizes_on_pp_ocr_det(level: str, tmp_path: Path) -> None:
    """PP-OCRv4 det declares [N,3,H,W]: every size comes from the case's concrete 320x480, on
    the graph that runs (above disable: onnxruntime's NCHWc graph)."""
    path = graph_that_runs(model_path("ppocr_det"), level, tmp_path)
    model = onnx.load(path)
    x = _det_input()
    planned = tensor_sizes(model, [{"x": x.shape}])
    assert len(planned) == sum(len([o for o in n.output if o]) for n in model.graph.node)
    real = {name: int(value.nbytes) for _, name, value in rt.capture_segments(
        np, ort, str(path), list(planned), [{"x": x}], 1 << 30, _JOB, str(tmp_path), sizes={})}
    assert planned == real


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("name, feed, shape", [("ppocr_rec", "x", (2, 3, 48, 200)),
                                               ("yolov8n", "images", (1, 3, 320, 256))])
def test_sizes_behind_shape_arithmetic_are_planned_not_measured(
        name: str, feed: str, shape: tuple[int, ...], level: str, tmp_path: Path) -> None:
    """PP-OCRv4 rec computes Reshape targets as Concat(Slice(Shape(x)), [-1]) and YOLOv8n its
    anchor grids as Range(0, Cast(Gather(Shape(x)))): onnx's data propagation leaves those
    unknown, so they used to be measured by an extra profiled run on the device. Above
    disable, rec's optimized graph adds a ReorderInput from NHWC read by a Conv, one read
    through an NCHWc pool, LayerNormalization in an opset-12 graph and FusedMatMul. Every size
    is now planned, and equals what the run produces."""
    path = graph_that_runs(model_path(name), level, tmp_path)
    model = onnx.load(path)
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    planned = tensor_sizes(model, [{feed: shape}])
    assert None not in planned.values()
    stats: dict[str, Any] = {}
    real = {n: int(value.nbytes) for _, n, value in rt.capture_segments(
        np, ort, str(path), list(planned), [{feed: x}], None, _JOB, str(tmp_path),
        sizes=planned, stats=stats)}
    assert planned == real and stats["measured"] == 0



def test_sizes_of_a_graph_loaded_without_its_external_weights(tmp_path: Path) -> None:
    """YOLOv8n saved with every weight outside the model file (`size_threshold=0`, as large
    exports are) and loaded without that data, as a caller holding only the graph does: its
    shape constants have no values here, so the sizes that follow from them are unknown (None:
    measured on the device), never read from a file that is not there (a traceback before),
    and every size it does plan equals the one planned from the whole model."""
    shape = {"images": (1, 3, 320, 256)}
    whole = onnx.load(model_path("yolov8n"))
    full = tensor_sizes(whole, [shape])
    onnx.save_model(whole, tmp_path / "y.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="y.data", size_threshold=0)
    planned = tensor_sizes(onnx.load(tmp_path / "y.onnx", load_external_data=False), [shape])
    assert planned.keys() == full.keys() and None not in full.values()
    known = {k: v for k, v in planned.items() if v is not None}
    assert known == {k: full[k] for k in known}
    assert 0 < len(known) < len(planned)

@pytest.mark.parametrize("level", list(LEVELS))
def test_each_node_runs_once_and_outputs_are_bit_identical(level: str, tmp_path: Path) -> None:
    """A budget of 4 MB cuts det 320x480 into many segments; counted in onnxruntime's own
    sessions, every node of the graph that runs runs exactly once, and the final output equals
    a plain (unmarked) run's at that optimization level bit for bit."""
    source = model_path("ppocr_det")
    path = graph_that_runs(source, level, tmp_path)
    model = onnx.load(path)
    x = _det_input()
    counting = CountingOrt()
    names = [t.name for t in tensor_order(model)]
    stats: dict[str, Any] = {}
    got = {name: np.array(value) for _, name, value in rt.capture_segments(
        np, counting, str(path), names, [{"x": x}], 4 << 20, _JOB, str(tmp_path),
        sizes=tensor_sizes(model, [{"x": x.shape}]), stats=stats)}
    assert len(stats["segments"]) > 5
    assert counting.sessions == len(stats["segments"])
    assert counting.runs == collections.Counter(n.name for n in model.graph.node
                                                if n.op_type != "Constant")
    assert set(got) == set(names)
    so = ort.SessionOptions()
    so.graph_optimization_level = LEVELS[level]
    plain = ort.InferenceSession(str(source), so, providers=["CPUExecutionProvider"])
    [out] = plain.run(None, {"x": x})
    assert np.array_equal(got[model.graph.output[0].name], out)


def test_a_budget_below_the_largest_tensor_completes_and_stays_bounded(tmp_path: Path) -> None:
    """One byte of budget: every node is a segment of its own, and what is alive at once is
    the boundary tensors still to be read plus one node's outputs."""
    path = model_path("ppocr_det")
    model = onnx.load(path)
    x = _det_input()
    sizes = tensor_sizes(model, [{"x": x.shape}])
    stats: dict[str, Any] = {}
    live: list[int] = []
    held: dict[str, int] = {}
    last_read = {i: k for k, n in enumerate(model.graph.node) for i in n.input}
    index = {o: k for k, n in enumerate(model.graph.node) for o in n.output}
    count = 0
    for _, name, value in rt.capture_segments(np, ort, str(path), list(sizes), [{"x": x}], 1,
                                              _JOB, str(tmp_path), sizes=sizes, stats=stats):
        count += 1
        k = index[name]
        held = {t: b for t, b in held.items() if last_read.get(t, -1) >= k}
        held[name] = int(value.nbytes)
        live.append(sum(held.values()))
    assert count == len(sizes)
    assert len(stats["segments"]) == len(model.graph.node)
    largest = max(sizes.values())
    assert largest > 1
    # never more alive than the largest set of tensors a plain run must hold at once (the
    # boundary of a one-node cut), measured here with the real sizes
    assert max(live) <= 4 * largest


def _rss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) << 10 for line in fh if line.startswith("VmRSS"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_a_tensor_held_for_a_later_segment_does_not_keep_its_segment_s_other_outputs(
        tmp_path: Path) -> None:
    """Relu and Neg of a 64 MB x run as one segment; Neg's output is held for the Add two
    segments on, Relu's is only captured. While Sigmoid's segment runs, what is alive is Neg's
    and Sigmoid's outputs: within the 160 MB budget. An output taken from onnxruntime's output
    vector as an OrtValue kept the whole vector alive, Relu's output with it (192 MB)."""
    from onnx import TensorProto, helper

    n = 1 << 24
    vec = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [n]) for t in "xd"]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                               helper.make_node("Neg", ["x"], ["b"], name="neg"),
                               helper.make_node("Sigmoid", ["x"], ["c"], name="sigmoid"),
                               helper.make_node("Add", ["b", "c"], ["d"], name="add")],
                              "held", vec[:1], vec[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "held.onnx"
    onnx.save(model, path)
    x = np.linspace(-1.0, 1.0, n, dtype=np.float32)
    budget = 160 << 20
    sizes = dict.fromkeys("xabcd", x.nbytes)
    stats: dict[str, Any] = {}
    alive: dict[str, int] = {}
    base = _rss()
    for _, name, value in rt.capture_segments(np, ort, str(path), list("xabcd"), [{"x": x}],
                                              budget, _JOB, str(tmp_path), sizes=sizes,
                                              copy=False, stats=stats):
        alive[name] = _rss() - base
        if name == "d":
            assert np.allclose(value, -x + 1 / (1 + np.exp(-x)), rtol=0, atol=1e-6)
    assert stats["segments"] == [[0, 2], [2, 3], [3, 4]]
    assert alive["c"] < budget, {k: v >> 20 for k, v in alive.items()}


class NumpyWithoutDlpack:
    """numpy as before 1.22 (no `from_dlpack`), or one whose `from_dlpack` refuses onnxruntime's
    tensors or gives them another dtype: the runner views onnxruntime's buffers instead."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __getattr__(self, name: str) -> Any:
        if name != "from_dlpack":
            return getattr(np, name)
        if self.how == "absent":
            raise AttributeError(name)
        if self.how == "refuses":
            def refuse(value: Any) -> Any:
                raise BufferError("unsupported")
            return refuse
        return lambda value: np.from_dlpack(value).view(np.uint8)


@pytest.mark.parametrize("how", ["absent", "refuses", "other dtype"])
def test_without_dlpack_the_capture_views_the_buffers_and_gives_the_same_values(
        how: str, tmp_path: Path) -> None:
    path = model_path("ppocr_det")
    x = _det_input(64, 96)
    sizes = tensor_sizes(onnx.load(path), [{"x": x.shape}])
    got = [{name: np.array(value) for _, name, value in rt.capture_segments(
        numpy, ort, str(path), list(sizes), [{"x": x}], 1 << 20, _JOB, str(tmp_path),
        sizes=sizes, copy=False)} for numpy in (np, NumpyWithoutDlpack(how))]
    assert list(got[0]) == list(got[1]) == list(sizes)
    for name, value in got[0].items():
        assert value.dtype == got[1][name].dtype and np.array_equal(value, got[1][name]), name


def test_plan_dump_sizes_and_counts_if_bodies() -> None:
    """silero VAD computes 689 of its tensors inside If bodies: the plan counts them."""
    model = onnx.load(model_path("silero_vad"))
    inside = subgraph_tensor_count(model)
    assert inside > 600
    plan = plan_dump(model.SerializeToString(), None, None,
                     [{"input": (1, 576), "state": (2, 1, 128), "sr": ()}])
    assert plan.subgraph_tensors == inside
    assert set(plan.sizes) == {o for n in model.graph.node for o in n.output if o}


def test_saturation_floor_follows_if_and_identity_outputs() -> None:
    """silero VAD's output is a Sigmoid's, seen through a ReduceMean, an If (both branches) and
    an Identity: it keeps the saturating floor; its state output does not get one."""
    floors = saturation_floors(onnx.load(model_path("silero_vad")))
    assert floors["output"] == 1 / 16
    assert floors["stateN"] == 0.0
    half = onnx.load(model_path("silero_vad_half"))
    assert saturation_floors(half)[half.graph.output[0].name] == 1 / 16


@pytest.fixture(scope="module")
def vad_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from verify.cli import main

    folder = tmp_path_factory.mktemp("vad")
    rng = np.random.default_rng(0)
    np.save(folder / "input.npy", (rng.standard_normal((1, 576)) * 0.1).astype(np.float32))
    np.save(folder / "state.npy", np.zeros((2, 1, 128), np.float32))
    np.save(folder / "sr.npy", np.array(16000, np.int64))
    out = folder / "vad.vtc"
    assert main(["pack", str(model_path("silero_vad")), "-d", f"input:{folder / 'input.npy'}",
                 "-d", f"state:{folder / 'state.npy'}", "-d", f"sr:{folder / 'sr.npy'}",
                 "-o", str(out)]) == 0
    return out


def test_if_bodies_are_counted_and_reported_by_run_and_diff(
        vad_vtc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fixtures_devices import run_cli
    from verify.dump import open_dump

    inside = subgraph_tensor_count(onnx.load(model_path("silero_vad")))
    dump = tmp_path / "d"
    code, out, err = run_cli(["run", vad_vtc, "--iter", "1", "--warmup", "0", "--opt-level",
                              "disable", "--bin-io-dump", dump], capsys)
    assert code == 0, err
    said = f"{inside} tensors inside If/Loop/Scan bodies not captured"
    assert said in out + err
    assert open_dump(dump).manifest["subgraph_tensors"] == inside
    code, out, err = run_cli(["diff", dump, vad_vtc], capsys)
    assert code == 0, err
    assert f"{dump}: {inside} tensors inside If/Loop/Scan bodies were not captured" in out


def test_localize_on_silero_vad_names_the_injected_if_node(
        vad_vtc: Path, faulty_profile: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An If whose bodies hold LSTMs is one opaque node to localize: its fault is named, in the
    per-layer mode (the references fit), and the repro fails there and passes here."""
    import json

    from fixtures_devices import run_cli

    spec = faulty_profile("dev", "scale", "If_0", 1.01)
    code, out, err = run_cli(["localize", vad_vtc, "--device", spec, "--json", "-o", tmp_path],
                             capsys)
    assert code == 1, err
    doc = json.loads(out)
    assert (doc["verdict"], doc["subgraph"], doc["mode"]) == ("faulty here", ["If_0"], "dump")
    assert run_cli(["run", doc["repro"], "--device", spec, "--iter", "1"], capsys)[0] == 1
    assert run_cli(["run", doc["repro"], "--device", "local", "--iter", "1"], capsys)[0] == 0


def _runner_device(runner: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run options that pick `runner`: none for verify's own (python), a local device
    profile running the native runner's linux-x86_64 bundle for native."""
    if runner != "native":
        return []
    from fixtures_native import native_bin

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "nat.toml").write_text(
        f'transport = "local"\nrunner = ["{native_bin()}"]\n', encoding="utf-8")
    monkeypatch.setenv("VERIFY_DEVICES", str(profiles))
    return ["--device", "nat"]


@pytest.mark.parametrize("runner", ["python", "native"])
def test_ir3_light_model_dumps_at_all_and_disable_and_diffs_clean(
        runner: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """light_inception_v1 (IR 3, its initializers also graph inputs): onnxruntime's optimized
    graph keeps as graph inputs the initializers it folded away (Reshape's 'X__SHAPE'), which no
    node reads and nothing feeds; with the sizes withheld from the job (the host plans them all
    now), the capture measures them on the graph as one segment (the file itself would ask for
    those inputs). Both runners dump it at
    all and at disable, and the two dumps diff clean."""
    from corpus import light_path
    from fixtures_devices import run_cli

    model = light_path("inception_v1")
    optimized = onnx.load(graph_that_runs(model, "all", tmp_path))
    g = optimized.graph
    read = {n for node in g.node for n in node.input}
    inits = {i.name for i in g.initializer}
    dangling = [i.name for i in g.input if i.name not in read and i.name not in inits]
    assert optimized.ir_version == 3 and any(n.endswith("__SHAPE") for n in dangling)
    shapes = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim)
              for i in onnx.load(model).graph.input if i.name not in
              {t.name for t in onnx.load(model).graph.initializer}}
    sizes = tensor_sizes(optimized, [shapes])
    assert None not in sizes.values()  # all planned on the host, so withheld from the job:
    monkeypatch.setattr("verify.capture.tensor_sizes", lambda model, cases: {})  # measured

    device = _runner_device(runner, tmp_path, monkeypatch)
    vtc = tmp_path / "m.vtc"
    code, out, err = run_cli(["pack", model, "-o", vtc], capsys)
    assert code == 0, err
    dumps = {}
    for level in ("all", "disable"):
        dumps[level] = tmp_path / f"dump-{level}"
        code, out, err = run_cli(["run", vtc, *device, "--iter", "1", "--warmup", "0",
                                  "--opt-level", level, "--bin-io-dump", dumps[level]], capsys)
        assert code == 0, err
        assert "each node run once, in " in out + err
        assert "with outputs of a size the host could not derive (sized on the device)" \
            in out + err
    code, out, err = run_cli(["diff", dumps["all"], dumps["disable"]], capsys)
    assert code == 0, out + err
    assert "=== PASS" in out


def _constant_weight_model(path: Path) -> np.ndarray:
    """x -> Relu -> MatMul by a Constant node's (288, 2) weight -> y; returns the weight."""
    from onnx import helper, numpy_helper

    w = np.random.default_rng(3).standard_normal((288, 2)).astype(np.float32)
    _save_graph(path, [
        helper.make_node("Constant", [], ["w"], name="weight", value=numpy_helper.from_array(w)),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="head")], [1, 288], [1, 2])
    return w


def _save_graph(path: Path, nodes: list[Any], x: list[int], y: list[int]) -> None:
    """A float model of `nodes` from input x to output y (opset 13, IR 8) saved at `path`."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def test_a_constant_node_read_by_a_later_segment_is_copied_not_fed(tmp_path: Path) -> None:
    """A budget of one byte puts the Constant weight and the MatMul reading it in segments of
    their own. The weight reaches MatMul as onnxruntime's plain run gives it, an initializer
    (pre-packed), so the product is the plain run's bit for bit: fed across the boundary as an
    input, it differed in the last bits (PP-OCR cls's classifier head, 1 ulp)."""
    path = tmp_path / "m.onnx"
    w = _constant_weight_model(path)
    x = np.random.default_rng(4).standard_normal((1, 288)).astype(np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    [plain] = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    stats: dict[str, Any] = {}
    got = {name: np.array(value) for _, name, value in rt.capture_segments(
        np, ort, str(path), ["x", "w", "r", "y"], [{"x": x}], 1, _JOB, str(tmp_path),
        sizes={"w": w.nbytes, "r": x.nbytes, "y": plain.nbytes}, stats=stats)}
    assert stats["segments"] == [[0, 1], [1, 2], [2, 3]]
    assert np.array_equal(got["w"], w)
    assert np.array_equal(got["y"], plain), np.abs(got["y"] - plain).max()


@pytest.mark.parametrize("runner", ["python", "native"])
def test_dumps_at_any_budget_diff_exact_on_pp_ocr_cls(
        runner: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PP-OCR cls at disable, dumped in one segment and in many (a 1 KB budget), by either
    runner: every tensor the same bit for bit (`--tol '*:exact'`), the classifier head's
    MatMul on its Constant weight included."""
    from fixtures_devices import run_cli

    from verify.dump import open_dump

    device = _runner_device(runner, tmp_path, monkeypatch)
    data = tmp_path / "x.npz"
    np.savez(data, x=np.random.default_rng(5).random((1, 3, 48, 192), dtype=np.float32))
    vtc = tmp_path / "cls.vtc"
    code, out, err = run_cli(["pack", model_path("ppocr_cls"), "-d", data, "-o", vtc], capsys)
    assert code == 0, err
    dumps = {}
    for budget in ("64", "0.001"):
        dumps[budget] = tmp_path / f"dump-{budget}"
        code, out, err = run_cli(["run", vtc, *device, "--iter", "1", "--warmup", "0",
                                  "--opt-level", "disable", "--bin-io-dump", dumps[budget],
                                  "--dump-budget-mb", budget], capsys)
        assert code == 0, err
        # under a 1 KB budget nodes with larger outputs run alone, and the note says so
        assert ("is over it: a node with larger outputs ran alone" in out + err) == (
            budget == "0.001")
    spans = {b: open_dump(d).manifest["segments"] for b, d in dumps.items()}
    assert spans["64"] == 1 and spans["0.001"] > 10
    code, out, err = run_cli(["diff", dumps["64"], dumps["0.001"], "--tol", "*:exact"], capsys)
    assert code == 0, out + err
    assert "=== PASS" in out


def _cast_through(path: Path, elem: int) -> None:
    """x -> Cast to `elem` -> Cast back -> + Relu(x) -> y: a tensor of that type in between."""
    from onnx import TensorProto, helper

    _save_graph(path, [
        helper.make_node("Cast", ["x"], ["b"], to=elem, name="to"),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Cast", ["b"], ["c"], to=TensorProto.FLOAT, name="back"),
        helper.make_node("Add", ["c", "r"], ["y"], name="add")], [1, 8], [1, 8])


@pytest.mark.parametrize("runner", ["python", "native"])
@pytest.mark.parametrize("elem", ["bfloat16", "string"])
def test_a_tensor_without_npy_form_crosses_segments_and_is_reported_not_captured(
        runner: str, elem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bfloat16 or string tensor between two Casts: numpy has no form for it. Every segment
    cut still runs (it crosses the boundary as onnxruntime's own value), the dump records it
    as not captured (manifest and note) instead of failing as a device error, and pack
    --layers, diff against archives with and without layers, and localize all work on it
    (they exited 4 with a traceback)."""
    from onnx import TensorProto

    from fixtures_devices import run_cli
    from verify.dump import open_dump

    device = _runner_device(runner, tmp_path, monkeypatch)
    model = tmp_path / "m.onnx"
    _cast_through(model, getattr(TensorProto, elem.upper()))
    vtc, layers = tmp_path / "m.vtc", tmp_path / "layers.vtc"
    for args in ([model, "-o", vtc], [model, "--layers", "-o", layers]):
        code, out, err = run_cli(["pack", *args], capsys)
        assert code == 0, out + err
        # pack --layers says which layers it could not store (it said nothing)
        assert ("note: 1 tensor(s) not captured, their type having no .npy form (bfloat16, "
                "float8, string) or being no tensor (a sequence): 'b': no per-layer reference "
                "stored" in out) == (
                    "--layers" in args)
    dump = tmp_path / "d"
    code, out, err = run_cli(["run", vtc, *device, "--iter", "1", "--warmup", "0",
                              "--opt-level", "disable", "--bin-io-dump", dump,
                              "--dump-budget-mb", "0.00001"], capsys)
    assert code == 0, out + err
    assert ("1 tensor(s) not captured, their type having no .npy form (bfloat16, float8, "
            "string) or being no tensor (a sequence): 'b'") in out + err
    d = open_dump(dump)
    assert d.not_captured == ["b"] and d.manifest["segments"] == 4
    assert [e.name for e in d.entries(0)] == ["x", "r", "c", "y"]
    for reference in (vtc, layers):
        code, out, err = run_cli(["diff", dump, reference, "--tol", "*:exact",
                                  "--show-missing"], capsys)
        assert code == 0, out + err
        assert "=== PASS: 4 tensors within tolerance" in out
        # not listed as missing from the capture: the note says it was not captured (against
        # the archive without layers, whose host run computes it, it was "only in reference")
        assert "only in" not in out and "'b'" in out
    passes: list[int] = []
    real_capture = rt.capture_segments

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return real_capture(*args, **kwargs)

    monkeypatch.setattr("verify.capture._rt.capture_segments", counted)
    code, out, err = run_cli(["diff", vtc, vtc], capsys)
    assert code == 0, out + err
    assert "'b': not compared" in out
    # one capture pass per side: the value-less tensor goes by in the stream, so nothing after
    # it is computed again on its own (it was: 10 passes for this 4-node model)
    assert len(passes) == 2
    code, out, err = run_cli(["localize", vtc, *device], capsys)
    assert code == 0, out + err
    assert "no faulty node" in out


def test_the_dump_note_names_an_over_budget_tensor_only_when_a_node_made_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 3.8 MB input reduced to one value, under a 1 MB budget: the input is no node's
    output, so nothing ran alone for it, and the note does not say so."""
    from onnx import helper

    from fixtures_devices import run_cli

    _save_graph(tmp_path / "big_in.onnx", [
        helper.make_node("ReduceMean", ["x"], ["m"], keepdims=1),
        helper.make_node("Relu", ["m"], ["y"])], [1, 1_000_000], [1, 1])
    assert run_cli(["pack", tmp_path / "big_in.onnx", "-o", tmp_path / "b.vtc"], capsys)[0] == 0
    code, out, err = run_cli(["run", tmp_path / "b.vtc", "--iter", "1", "--opt-level", "disable",
                              "--bin-io-dump", tmp_path / "d", "--dump-budget-mb", "1"], capsys)
    assert code == 0, err
    note = next(line for line in (out + err).splitlines() if "note: layer dump" in line)
    assert "1 segment(s) of at most 1 MB of live tensors," in note
    assert "is over it" not in note


@pytest.mark.parametrize("runner", ["python", "native"])
def test_a_dump_for_diff_has_no_summaries_and_io_dump_has_those_of_the_tensors_written(
        runner: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--bin-io-dump alone: the tensors, no summary computed (the manifest's stats are {}: only
    --io-dump's text reads them, and on PP-OCRv4 det they were a third of the capture's CPU).
    With --io-dump too, the device computes them and the manifest holds them: those of the
    tensors in the pack. The two dumps hold the same tensors."""
    from fixtures_devices import run_cli
    from fixtures_dump import CNN, pack
    from verify.dump import open_dump

    device = _runner_device(runner, tmp_path, monkeypatch)
    vtc = pack(CNN, tmp_path / "cnn.vtc")
    run = ["run", vtc, *device, "--iter", "1", "--warmup", "0", "--opt-level", "disable"]
    code, out, err = run_cli([*run, "--bin-io-dump", tmp_path / "bare"], capsys)
    assert code == 0, out + err
    code, out, err = run_cli([*run, "--bin-io-dump", tmp_path / "full", "--io-dump",
                              tmp_path / "io.txt"], capsys)
    assert code == 0, out + err
    bare, full = open_dump(tmp_path / "bare"), open_dump(tmp_path / "full")
    assert all(e.stats == {} for e in bare.entries(0))
    assert [e.name for e in bare.entries(0)] == [e.name for e in full.entries(0)]
    for b, f in zip(bare.entries(0), full.entries(0)):
        value = np.asarray(full.load(f), np.float64)
        assert np.array_equal(np.asarray(bare.load(b)), np.asarray(full.load(f)))
        s = f.stats
        assert (s["min"], s["max"], s["nan"], s["inf"]) == (value.min(), value.max(), 0, 0)
        assert s["mean"] == pytest.approx(value.mean(), rel=1e-9, abs=1e-12)
        assert s["std"] == pytest.approx(value.std(), rel=1e-9, abs=1e-12)
        assert s["first"] == value.reshape(-1)[:8].tolist()
    assert "  min " in (tmp_path / "io.txt").read_text()
