"""The two runners cut a capture alike: a graph stored out of topological order, the default
budget raised to half a plain run's live bytes, and a budget beyond int64 (found by a review:
the native runner failed the first, kept 16 MiB for the second and took 16 MiB for the third)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from fixtures_devices import run_cli
from test_segments import _runner_device

from verify.dump import open_dump

RUNNERS = ["python", "native"]


def _save(nodes: list, shape: list[int], path: Path) -> Path:
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("X", T.FLOAT, shape)],
                     [h.make_tensor_value_info("Y", T.FLOAT, shape)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def _pack(tmp_path: Path, model: Path, shape: tuple[int, ...], capsys) -> Path:
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal(shape, dtype=np.float32))
    vtc = tmp_path / "m.vtc"
    code, out, err = run_cli(["pack", model, "-d", f"X:{x}", "-o", vtc], capsys)
    assert code == 0, out + err
    return vtc


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_graph_stored_out_of_order_is_captured_in_segments(
        runner: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Neg reads what Relu makes but is stored first: onnxruntime sorts a whole model itself,
    but a segment of Neg alone read a value no earlier segment made ("Node input 'b' is not a
    graph input ...", exit 2, on the native runner)."""
    device = _runner_device(runner, tmp_path, monkeypatch)
    model = _save([h.make_node("Neg", ["b"], ["Y"], name="second"),
                   h.make_node("Relu", ["X"], ["b"], name="first")], [2, 3],
                  tmp_path / "unsorted.onnx")
    vtc = _pack(tmp_path, model, (2, 3), capsys)
    code, out, err = run_cli(["run", vtc, *device, "--iter", "1", "--opt-level", "disable",
                              "--dump-budget-mb", "0.00001", "--bin-io-dump", tmp_path / "d"],
                             capsys)
    assert code == 0, out + err
    dump = open_dump(tmp_path / "d")
    assert [e.name for e in dump.entries(0)] == ["X", "b", "Y"]
    assert dump.manifest["segments"] == 2
    values = {e.name: np.asarray(dump.load(e)) for e in dump.entries(0)}
    assert np.array_equal(values["Y"], -np.maximum(values["X"], 0))
    code, out, err = run_cli(["diff", tmp_path / "d", vtc], capsys)
    assert code == 0, out + err


def test_both_runners_choose_one_budget_and_take_a_huge_one_as_no_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 16 MiB branches live at once: the default budget (16 MiB here) is raised to half
    what a plain run holds, 48 MiB / 2, by both runners; a budget past int64 is one segment."""
    shape = [1, 64, 256, 256]
    model = _save([h.make_node("Relu", ["X"], ["a"], name="relu"),
                   h.make_node("Neg", ["X"], ["n"], name="neg"),
                   h.make_node("Add", ["a", "n"], ["s"], name="add"),
                   h.make_node("Sigmoid", ["s"], ["Y"], name="sig")], shape,
                  tmp_path / "wide.onnx")
    vtc = _pack(tmp_path, model, tuple(shape), capsys)
    got = {}
    for runner in RUNNERS:
        device = _runner_device(runner, tmp_path, monkeypatch)
        for label, extra in (("default", []), ("huge", ["--dump-budget-mb=1e30"])):
            out_dir = tmp_path / f"{runner}-{label}"
            code, out, err = run_cli(["run", vtc, *device, "--iter", "1", "--opt-level",
                                      "disable", *extra, "--bin-io-dump", out_dir], capsys)
            assert code == 0, out + err
            m = json.loads((out_dir / "manifest.json").read_text())
            got[runner, label] = (m["options"]["budget_bytes"], m["segments"])
    mib = 1 << 20
    assert got["python", "default"] == got["native", "default"]
    assert got["python", "default"][0] == 24 * mib  # three 16 MiB outputs at the Add, halved
    assert got["python", "huge"][1] == got["native", "huge"][1] == 1
    assert got["python", "huge"][0] == got["native", "huge"][0] >= 1 << 62


def test_both_runners_write_nan_and_infinities_in_summaries_alike(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """log(0), log(-1): the native runner wrote them as null ('-' in the text io-dump, NaN not
    told from -inf), the Python runner as JSON's missing NaN/-Infinity tokens; both write the
    strings the manifest has now, and the two text io-dumps agree line for line."""
    model = _save([h.make_node("Log", ["X"], ["Y"], name="log")], [2, 3], tmp_path / "log.onnx")
    x = tmp_path / "x.npy"
    np.save(x, np.array([[0, -1, 2], [300, -0.0, 1e-40]], np.float32))
    vtc = tmp_path / "log.vtc"
    assert run_cli(["pack", model, "-d", f"X:{x}", "-o", vtc], capsys)[0] == 0
    texts = {}
    for runner in RUNNERS:
        device = _runner_device(runner, tmp_path, monkeypatch) if runner == "native" else []
        out_file = tmp_path / f"{runner}.txt"
        code, out, err = run_cli(["run", vtc, *device, "--iter", "1", "--opt-level", "disable",
                                  "--io-dump", out_file], capsys)
        assert code in (0, 1), out + err
        texts[runner] = [ln for ln in out_file.read_text().splitlines() if "first" in ln]
    assert texts["python"] == texts["native"]
    assert any(ln.split()[1:3] == ["-inf", "nan"] for ln in texts["python"])


def test_a_disk_error_in_the_python_runner_is_its_reason_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's tofile on a full disk says "N requested and M written" (errno lost): the result
    said `OSError: 2764800 requested and 1310688 written`, with the trace; now the reason."""
    from verify.runner import runner as rt

    for exc, text in ((OSError("2764800 requested and 1310688 written"),
                       "No space left on device? (a short write: 1310688 of 2764800 bytes "
                       "written)"),
                      (OSError(28, "No space left on device", "/w/d/c0.npys"),
                       "No space left on device: /w/d/c0.npys")):
        def fail(job: object, workdir: str, exc: Exception = exc) -> None:
            raise exc

        monkeypatch.setattr(rt, "run_job", fail)
        rt.execute_job({"result": "result.json"}, str(tmp_path))
        result = json.loads((tmp_path / "result.json").read_text())
        assert result["status"] == "error" and result["error"]["kind"] == "runtime"
        assert result["error"]["message"] == text and not result["error"].get("traceback")
