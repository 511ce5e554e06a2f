"""`verify run --profile` on a real device end (local, and the emulated ARM64 target) and
`verify profile` on the traces it writes: warmup left out, the profile_analyze options, the
table, JSON, and every bad-input path with its exit code and one-line message."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fixtures_profile import only_line, verify
from verify.cli import main
from verify.profile import load_profile

WARMUP, ITERS = 2, 3  # per case; the archive has two cases


def doc(capsys: pytest.CaptureFixture[str], *args: object) -> dict[str, Any]:
    code, out, err = verify(capsys, "profile", *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def local_trace(cnn_two_cases: Path, private_cache: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prof") / "local.json"
    code = main(["run", str(cnn_two_cases), "--device", "local", "--warmup", str(WARMUP),
                 "--iter", str(ITERS), "--profile", str(out), "--json"])
    assert code == 0 and out.is_file()
    return out


def _model_runs(trace: Path) -> list[dict[str, Any]]:
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])


# --- the trace `run --profile` writes ---------------------------------------------------------------
def test_trace_is_a_chrome_trace_that_records_its_warmup_runs(local_trace: Path) -> None:
    data = json.loads(local_trace.read_text())
    # Chrome's JSON Object Format: what Perfetto and chrome://tracing open
    assert set(data) == {"traceEvents", "displayTimeUnit", "otherData"}
    events = data["traceEvents"]
    assert events and all({"name", "ph", "ts", "pid", "tid"} <= set(e) for e in events)
    assert {e["ph"] for e in events} == {"X"} and all(e["dur"] >= 0 for e in events)
    assert len(_model_runs(local_trace)) == 2 * (WARMUP + ITERS)
    # case 0: runs 0-1 warm, 2-4 timed; case 1: runs 5-6 warm, 7-9 timed
    assert data["otherData"]["verify_warmup_runs"] == [0, 1, 5, 6]
    assert data["otherData"]["verify_timed_runs"] == 2 * ITERS


def test_analysis_covers_the_timed_runs_only(local_trace: Path) -> None:
    p = load_profile(local_trace)
    assert (p.runs, p.skipped_runs, p.warmup_source) == (2 * ITERS, 2 * WARMUP, "trace")
    timed = [r["dur"] / 1e6 for i, r in enumerate(_model_runs(local_trace))
             if i not in (0, 1, 5, 6)]
    assert p.run_times == pytest.approx(timed)
    assert {s.calls for s in p.nodes} == {2 * ITERS}  # every node once per timed run
    everything = load_profile(local_trace, skip_runs=0)
    assert (everything.runs, everything.skipped_runs) == (2 * (WARMUP + ITERS), 0)
    assert {s.calls for s in everything.nodes} == {2 * (WARMUP + ITERS)}


# --- the table --------------------------------------------------------------------------------------
def test_text_summary_first_then_the_top_three(capsys: pytest.CaptureFixture[str],
                                               local_trace: Path, cnn_two_cases: Path) -> None:
    code, out, err = verify(capsys, "profile", local_trace, "--model", cnn_two_cases)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("runs analyzed")
    assert "6 (dropped 4 warmup run(s), as `verify run` recorded)" in lines[0]
    assert out.index("total host time") < out.index("device self time")
    for header in ("cumulative", "operator info", "computation", "FLOP/s", "memory",
                   "bandwidth", "in shapes", "out shapes"):
        assert header in out
    assert re.findall(r"│ #(\d+) ", out) == ["0", "1", "2"]
    # which nodes are slowest depends on the machine's mood; the most FLOPs does not: the stem
    # conv (the only node reading the 1x3x224x224 image) heads the table by computation
    code, out, _ = verify(capsys, "profile", local_trace, "--model", cnn_two_cases,
                          "--order-by", "computation")
    first_row = out[out.index("│ #0 "):out.index("│ #1 ")]
    assert code == 0 and "{1,3,224,224}" in first_row and "Conv" in first_row
    code, out, _ = verify(capsys, "profile", local_trace, "-t", "5", "--aggregate-by", "type")
    assert code == 0 and "nodes," in out and len(re.findall(r"│ #\d+ ", out)) == 5


def test_json_rows_filters_and_ordering(capsys: pytest.CaptureFixture[str],
                                        local_trace: Path) -> None:
    full = doc(capsys, local_trace, "-t", "0")
    nodes = full["summary"]["nodes"]
    assert len(full["rows"]) == nodes
    times = [r["time"] for r in full["rows"]]
    assert times == sorted(times, reverse=True)
    assert full["rows"][-1]["cumulative_share"] == pytest.approx(100.0)

    convs = doc(capsys, local_trace, "-t", "0", "--type", "Conv")["rows"]
    assert convs and {r["type"] for r in convs} == {"Conv"}
    stem = doc(capsys, local_trace, "-t", "0", "--opr-name", "^stem/")["rows"]
    assert stem and all(r["name"].startswith("stem/") for r in stem)

    up = doc(capsys, local_trace, "-t", "0", "--order-by", "+memory")["rows"]
    known = [r["memory"] for r in up if r["memory"] is not None]
    assert known == sorted(known)
    down = doc(capsys, local_trace, "-t", "2", "--order-by", "FLOPS")["rows"]
    assert down[0]["flops"] >= down[1]["flops"]

    cut = sorted(times)[len(times) // 2]
    slow = doc(capsys, local_trace, "-t", "0", "--min-time", f"{cut * 1e6}us")["rows"]
    assert slow and all(r["time"] >= cut * (1 - 1e-9) for r in slow)
    fast = doc(capsys, local_trace, "-t", "0", "--max-time", str(cut))["rows"]
    assert fast and all(r["time"] <= cut * (1 + 1e-9) for r in fast)
    assert len(slow) + len(fast) >= nodes


def test_aggregate_by_type(capsys: pytest.CaptureFixture[str], local_trace: Path) -> None:
    full = doc(capsys, local_trace, "-t", "0")
    by_type: dict[str, float] = {}
    for r in full["rows"]:
        by_type[r["type"]] = by_type.get(r["type"], 0.0) + r["time"]
    summed = doc(capsys, local_trace, "-t", "0", "--aggregate-by", "type", "--aggregate", "sum")
    assert {r["name"]: r["time"] for r in summed["rows"]} == pytest.approx(by_type)
    assert summed["rows"][-1]["cumulative_share"] == pytest.approx(100.0)
    most = doc(capsys, local_trace, "-t", "0", "--aggregate-by", "type", "--aggregate", "max")
    longest_conv = max(r["time"] for r in full["rows"] if r["type"] == "Conv")
    assert {r["name"]: r["time"] for r in most["rows"]}["Conv"] == pytest.approx(longest_conv)


def test_print_only_and_skip_runs(capsys: pytest.CaptureFixture[str], local_trace: Path) -> None:
    summary = doc(capsys, local_trace, "--print-only", "summary")
    assert "rows" not in summary and summary["summary"]["runs"] == 2 * ITERS
    host = doc(capsys, local_trace, "--print-only", "host")
    assert host["summary"]["clock"] == "host" and len(host["rows"]) == 3
    code, out, _ = verify(capsys, "profile", local_trace, "--print-only", "summary")
    assert code == 0 and "total host time" in out and "self time" not in out
    code, out, _ = verify(capsys, "profile", local_trace, "--print-only", "device")
    assert code == 0 and "runs analyzed" not in out and "device self time" in out
    all_runs = doc(capsys, local_trace, "--skip-runs", "0", "--print-only", "summary")
    assert (all_runs["summary"]["runs"], all_runs["summary"]["skipped_runs"]) == (10, 0)


def test_a_raw_trace_and_an_op_type_of_the_wrong_case_say_what_to_do(
        capsys: pytest.CaptureFixture[str], local_trace: Path, tmp_path: Path) -> None:
    """onnxruntime's own trace (a bare event list, no warmup record) kept the slow first run
    without a word; `--type conv` (op types are case-sensitive) said only 'no node matches'."""
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps(json.loads(local_trace.read_text())["traceEvents"]))
    code, out, _ = verify(capsys, "profile", raw, "--print-only", "summary")
    assert code == 0 and ("(no warmup record: every run kept, the first and often slowest one "
                          "too; --skip-runs 1 drops it)") in out
    code, out, _ = verify(capsys, "profile", local_trace, "--print-only", "summary")
    assert code == 0 and "no warmup record" not in out  # verify run's trace records them
    code, out, _ = verify(capsys, "profile", local_trace, "--type", "conv")
    assert code == 0 and ("no node matches the filters: no op type 'conv' here (case-sensitive; "
                          "the trace's: ") in out and "Conv" in out
    code, out, _ = verify(capsys, "profile", local_trace, "--type", "Conv", "--opr-name", "^x$")
    assert code == 0 and out.rstrip().endswith("no node matches the filters")


def test_model_gives_the_counts_the_trace_alone_cannot(capsys: pytest.CaptureFixture[str],
                                                       local_trace: Path,
                                                       cnn_two_cases: Path) -> None:
    alone = doc(capsys, local_trace, "--print-only", "summary")["summary"]
    with_vtc = doc(capsys, local_trace, "--model", cnn_two_cases, "--print-only", "summary")
    with_onnx = doc(capsys, local_trace, "--model",
                    Path(__file__).resolve().parent.parent / "goldens/models/cnn.onnx",
                    "--print-only", "summary")
    assert alone["unknown_computation"] >= 1  # MaxPool needs its kernel_shape
    assert with_vtc["summary"]["unknown_computation"] == 0
    assert with_vtc["summary"]["computation"] > alone["computation"]
    assert with_onnx["summary"] == with_vtc["summary"]
    code, out, _ = verify(capsys, "profile", local_trace, "--print-only", "summary")
    assert code == 0 and "node(s) unknown; --model may tell)" in out


@pytest.mark.timeout(60)  # a pipe opened twice for reading blocks: fail, do not hang
def test_model_from_a_pipe_and_an_archive_read_without_its_layers(
        capsys: pytest.CaptureFixture[str], local_trace: Path, tmp_path: Path) -> None:
    import os
    import threading
    import tracemalloc

    from verify.profile import load_model_index

    repo = Path(__file__).resolve().parent.parent
    onnx_file = repo / "goldens/models/cnn.onnx"
    fifo = tmp_path / "model.pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(onnx_file.read_bytes()),
                              daemon=True)
    writer.start()
    try:
        piped = doc(capsys, local_trace, "--model", fifo, "--print-only", "summary")["summary"]
    finally:
        writer.join(timeout=30)
    assert piped == doc(capsys, local_trace, "--model", onnx_file,
                        "--print-only", "summary")["summary"]
    # an archive's per-layer references (most of this one) never enter memory
    vtc = repo / "goldens/testcases/cnn.vtc"
    tracemalloc.start()
    try:
        load_model_index(vtc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < vtc.stat().st_size / 2


# --- bad input: one line, exit 2 ---------------------------------------------------------------------
@pytest.mark.parametrize("content,message", [
    ("{not json", "not a JSON trace (Expecting property name enclosed in double quotes at "
                  "line 1 column 2)"),
    ('{"a": 1}', "not an ONNX Runtime profile (expected a JSON list of trace events, "
     "or an object with a 'traceEvents' list)"),
    ('[{"cat": "Session", "name": "model_run", "ts": 0, "dur": 5}]',
     "no node events; the session never ran while profiling was on"),
    ('{"traceEvents": [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 5}, '
     '{"cat": "Node", "name": "r_kernel_time", "ts": 1, "dur": 2, "args": {"op_name": "Relu"}}],'
     ' "otherData": {"verify_warmup_runs": [0]}}',
     "the profile holds warmup runs only; pass --skip-runs 0 to analyze them"),
])
def test_bad_trace_files(capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str,
                         message: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code, out, err = verify(capsys, "profile", bad)
    assert (code, out) == (2, "")
    assert only_line(err) == f"error: {bad}: {message}"


def test_a_model_that_shares_no_node_with_the_trace_is_refused(
        capsys: pytest.CaptureFixture[str], local_trace: Path) -> None:
    """The cnn's trace with another model (two_io): every row's FLOPs and bytes would come
    from the trace alone, under a header saying the model was used; now one line, exit 2."""
    other = Path(__file__).resolve().parent.parent / "goldens" / "models" / "two_io.onnx"
    code, out, err = verify(capsys, "profile", local_trace, "--model", other)
    assert (code, out) == (2, "")
    assert re.fullmatch(rf"error: --model {re.escape(str(other))}: none of the trace's \d+ "
                        r"nodes is in this model; give the model the trace was taken of",
                        only_line(err))


def test_an_archive_given_as_the_trace_says_how_to_profile_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    vtc = Path(__file__).resolve().parent.parent / "goldens" / "testcases" / "cnn.vtc"
    code, out, err = verify(capsys, "profile", vtc)
    assert (code, out) == (2, "")
    assert only_line(err) == (f"error: {vtc}: a testcase archive, not a trace: record one with "
                              f"`verify run {vtc} --profile prof.json`, then "
                              f"`verify profile prof.json --model {vtc}`")
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    code, out, err = verify(capsys, "profile", binary)
    assert (code, only_line(err)) == (2, f"error: {binary}: not a JSON trace (not UTF-8 text)")


@pytest.mark.parametrize("args,message", [
    (["--order-by", "speed"], "unknown --order-by column 'speed'; valid: time, calls, "
                              "computation, flops, memory, bandwidth, name, type, provider"),
    (["--aggregate", "median"], "unknown --aggregate 'median'; valid: sum, mean, max, min"),
    (["--aggregate-by", "name"], "unknown --aggregate-by 'name'; valid: type, module"),
    (["--aggregate-by", "module"], "--aggregate-by module needs a PyTorch profile (--torch "
                                   "PROGRAM)"),
    (["--print-only", "kern"], "unknown --print-only 'kern'; valid: summary, device, host"),
    (["--opr-name", "conv("], "--opr-name 'conv(' is not a valid regular expression: "
                              "missing ), unterminated subpattern at position 4"),
    (["--min-time", "fast"], "--min-time 'fast': expected a time such as 0.002, 2ms or 150us"),
    (["-t", "-1"], "--top must be 0 (all) or more, got -1"),
    (["--skip-runs", "10"], "cannot skip 10 warmup runs, the profile has 10"),
])
def test_bad_options(capsys: pytest.CaptureFixture[str], local_trace: Path, args: list[str],
                     message: str) -> None:
    code, out, err = verify(capsys, "profile", local_trace, *args)
    assert (code, out) == (2, "")
    line = only_line(err)
    assert line == f"error: {message}" or line == f"error: {local_trace}: {message}"


def test_missing_files(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                       local_trace: Path) -> None:
    code, _, err = verify(capsys, "profile", tmp_path / "nope.json")
    assert code == 2 and only_line(err) == f"error: {tmp_path / 'nope.json'}: no such file"
    code, _, err = verify(capsys, "profile", local_trace, "--model", tmp_path / "m.onnx")
    assert code == 2 and only_line(err) == f"error: {tmp_path / 'm.onnx'}: no such file"


# --- the emulated ARM64 target ----------------------------------------------------------------------
@pytest.mark.arm64
@pytest.mark.slow
def test_profile_from_the_emulated_arm64_target(capsys: pytest.CaptureFixture[str],
                                                cnn_two_cases: Path, private_cache: Path,
                                                tmp_path: Path) -> None:
    trace = tmp_path / "arm64.json"
    code, _, err = verify(capsys, "run", cnn_two_cases, "--device", "arm64", "--case", "0",
                          "--warmup", "1", "--iter", "2", "--profile", trace, "--json")
    assert code == 0, err
    data = json.loads(trace.read_text())
    assert data["otherData"]["verify_warmup_runs"] == [0]
    report = doc(capsys, trace, "--model", cnn_two_cases, "-t", "0")
    s = report["summary"]
    assert (s["runs"], s["skipped_runs"], s["warmup_source"]) == (2, 1, "trace")
    assert s["unknown_computation"] == 0 and s["run_time"] > s["kernel_time"] > 0
    convs = [r for r in report["rows"] if r["type"] in ("Conv", "FusedConv")]
    assert len(convs) == 10 and all(r["computation"] and r["flops"] for r in convs)
    code, out, _ = verify(capsys, "profile", trace, "--model", cnn_two_cases)
    assert code == 0 and out.startswith("runs analyzed") and "│ #2 " in out


def test_model_counts_the_nodes_the_nchwc_layout_pass_renamed(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """YOLOv8n at --opt-level all: onnxruntime's NCHWc pass runs MaxPool and Resize (as
    Upsample) under names made from their outputs ('..._output_0_nchwc'). With --model they
    are found and counted as at disable, where the nodes keep their names; no node is left
    unknown (the hint promised '--model may tell', and it did not)."""
    from corpus import model_path

    vtc = tmp_path / "y.vtc"
    code, _, err = verify(capsys, "pack", model_path("yolov8n"), "--shape",
                          "images:1x3x320x320", "-o", vtc)
    assert code == 0, err
    by_type = {}
    for level in ("all", "disable"):
        trace = tmp_path / f"{level}.json"
        code, _, err = verify(capsys, "run", vtc, "--iter", "1", "--warmup", "0",
                              "--opt-level", level, "--profile", trace)
        assert code == 0, err
        got = doc(capsys, trace, "--model", vtc, "--aggregate-by", "type", "-t", "0")
        assert got["summary"]["unknown_computation"] == 0, level
        by_type[level] = {r["type"]: r["computation"] for r in got["rows"]}
    assert by_type["all"]["MaxPool"] == by_type["disable"]["MaxPool"] > 0
    assert by_type["all"]["Upsample"] == 0  # nearest: a gather, as Resize at disable
    assert by_type["disable"]["Resize"] == 0


def test_model_counts_a_matmul_onnxruntime_fused_a_transpose_into(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """PP-OCRv4 rec's classifier head at --opt-level all runs as a FusedMatMul named
    'p2o.MatMul.24/MatmulTransposeFusion/' (transA, its weight pre-packed): it was N/A for
    computation and memory, 4.6% of the model's FLOPs. The model's MatMul of the name before
    '/' gives the weight, and the shapes give transA."""
    from corpus import model_path

    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).random((1, 3, 48, 320), dtype=np.float32))
    vtc, trace = tmp_path / "rec.vtc", tmp_path / "rec.json"
    code, _, err = verify(capsys, "pack", model_path("ppocr_rec"), "-d", f"x:{x}", "-o", vtc)
    assert code == 0, err
    code, _, err = verify(capsys, "run", vtc, "--iter", "1", "--warmup", "0", "--threads", "1",
                          "--opt-level", "all", "--profile", trace)
    assert code == 0, err
    got = doc(capsys, trace, "--model", vtc, "--type", "FusedMatMul", "-t", "0")
    [row] = [r for r in got["rows"] if r["name"].startswith("p2o.MatMul.24/")]
    # A {1,120,40} transposed times W {120,6625}: Y {1,40,6625}, K = 120
    assert row["computation"] == 2 * 40 * 6625 * 120
    assert row["memory"] == 4 * (120 * 40 + 120 * 6625 + 40 * 6625)
    assert got["summary"]["unknown_computation"] == 0


def test_a_node_run_with_two_shapes_says_so(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    """Two cases of different sizes: the row shows the most-called shape while its FLOPs are
    both shapes' per run; it now says there was another shape (text and JSON)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    w = nh.from_array(np.ones((4, 3), np.float32), "w")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["m", 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["m", 3])], initializer=[w])
    model = tmp_path / "mm.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), model)
    for m in (2, 6):
        np.save(tmp_path / f"x{m}.npy", np.ones((m, 4), np.float32))
    vtc, trace = tmp_path / "mm.vtc", tmp_path / "mm.json"
    code, _, err = verify(capsys, "pack", model, "-d", f"x:{tmp_path / 'x2.npy'}", "-d",
                          f"x:{tmp_path / 'x6.npy'}", "-o", vtc)
    assert code == 0, err
    code, _, err = verify(capsys, "run", vtc, "--iter", "1", "--warmup", "0", "--opt-level",
                          "disable", "--profile", trace)
    assert code == 0, err
    [row] = [r for r in doc(capsys, trace, "--model", vtc, "-t", "0")["rows"] if r["name"] == "mm"]
    assert row["shape_variants"] == 2
    code, out, _ = verify(capsys, "profile", trace, "--model", vtc, "-t", "0")
    assert code == 0 and "(+1 other" in out  # under the shape (the table may fold the rest)
