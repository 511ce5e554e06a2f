"""The CLI's small promises: help that matches the arguments, `python -m verify`, every --json
document headed by its format and version, shell completion of device names, .webp images."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from helpers_cli import verify

from verify.cli import JSON_KINDS, JSON_VERSION, cli
from verify.cli.groups import complete_device

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "goldens" / "models" / "cnn.onnx"
IMAGE = REPO / "goldens" / "images" / "sample.png"


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_top_level_help_shows_diff_as_actual_then_reference(capsys) -> None:
    diff = cli.get_command(click.Context(cli), "diff")
    assert diff is not None and [p.name for p in diff.params[:2]] == ["actual", "reference"]
    code, out, _ = verify(capsys, "--help")
    assert code == 0
    assert "verify diff phone/ cpu/ ACTUAL REFERENCE: first divergent layer" in flat(out)
    assert "verify diff cpu/ phone/" not in flat(out)


def test_pack_help_names_rand_with_a_range(capsys) -> None:
    code, out, _ = verify(capsys, "pack", "--help")
    assert code == 0 and "NAME:rand(L,H)" in flat(out) and "NAME:rand (" in flat(out)


def test_python_dash_m_verify_is_the_verify_command(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "verify", *args], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("verify ")
    missing = run("inspect", "missing.vtc")
    assert missing.returncode == 2 and missing.stderr.startswith("error: missing.vtc")


def test_a_webp_image_packs_to_the_same_input_as_the_png(tmp_path: Path, capsys) -> None:
    from PIL import Image

    from verify.archive_reader import read_archive

    webp = tmp_path / "sample.webp"
    Image.open(IMAGE).save(webp, lossless=True)
    arrays = []
    for image in (IMAGE, webp):
        out = tmp_path / f"{image.suffix[1:]}.vtc"
        code, _, err = verify(capsys, "pack", MODEL, "-d", image, "--scale", "0.00392",
                              "-o", out)
        assert code == 0, err
        arrays.append(read_archive(out).cases[0].inputs["data"])
    assert arrays[0].shape == (1, 3, 224, 224) and (arrays[0] == arrays[1]).all()


def test_every_json_document_starts_with_its_format_and_version(tmp_path: Path,
                                                                 capsys) -> None:
    vtc, dump = tmp_path / "cnn.vtc", tmp_path / "dump"
    commands = {
        "pack": ["pack", MODEL, "-d", IMAGE, "--scale", "0.00392", "-o", vtc],
        "inspect": ["inspect", vtc],
        "inspect-model": ["inspect", MODEL],
        "run": ["run", vtc, "--iter", "1", "--bin-io-dump", dump],
        "diff": ["diff", dump, vtc],
        "diff-case": ["diff", dump, vtc, "--case", "0"],
        "inspect-dump": ["inspect", dump],
        "export": ["export", vtc, "-o", tmp_path / "cnn.onnx"],
        "devices-list": ["devices", "list"],
        "ci-list": ["ci", REPO / "goldens" / "suites" / "sample.toml", "--list"],
    }
    for kind, args in commands.items():
        code, out, err = verify(capsys, *args, "--json")
        assert code == 0, (kind, err)
        doc = json.loads(out)
        assert list(doc)[:2] == ["format", "version"], kind
        assert (doc["format"], doc["version"]) == (f"verify-{kind}", JSON_VERSION), kind


def test_every_json_call_names_a_documented_kind() -> None:
    # the commands not run above (localize, profile, bench, devices check/clean, ci) too
    readme = (REPO / "README.md").read_text()
    seen = set()
    for path in (REPO / "verify" / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "emit_json":
                assert len(node.args) == 2 and isinstance(node.args[1], ast.Constant), \
                    f"{path.name}:{node.lineno}: emit_json(document, KIND)"
                seen.add(node.args[1].value)
    assert seen == set(JSON_KINDS)
    for kind in JSON_KINDS:
        assert f"`verify-{kind}`" in readme, kind


def _complete(args: str, env: dict[str, str], cwd: Path) -> list[str]:
    words = f"verify {args}"
    proc = subprocess.run(
        [sys.executable, "-c", "from verify.cli import cli; cli(prog_name='verify')"],
        env={**os.environ, **env, "_VERIFY_COMPLETE": "bash_complete", "COMP_WORDS": words,
             "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))},
        capture_output=True, text=True, timeout=60, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return [line.split(",", 1)[1] for line in proc.stdout.splitlines()]


def test_shell_completion_completes_device_profile_names(tmp_path: Path, monkeypatch) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "myboard.toml").write_text('transport = "ssh"\naddress = "me@board"\n')
    (profiles / "myphone.toml").write_text('transport = "adb"\naddress = "R58M"\n')
    env = {"VERIFY_DEVICES": str(profiles)}
    assert _complete("run x.vtc --device my", env, tmp_path) == ["myboard", "myphone"]
    over_ssh = _complete("run x.vtc --device ssh:", env, tmp_path)
    assert "ssh:myboard" in over_ssh and "ssh:myphone" not in over_ssh   # ssh profiles only
    assert _complete("devices check myp", env, tmp_path) == ["myphone"]
    # the built-in transports are offered beside the profiles
    monkeypatch.setenv("VERIFY_DEVICES", str(profiles))
    offered = [c.value for c in complete_device(None, None, "")]  # type: ignore[arg-type]
    assert {"myboard", "myphone", "local", "cuda", "ssh:", "adb:"} <= set(offered)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_are_documented_and_generated(shell: str, tmp_path: Path) -> None:
    assert f"_VERIFY_COMPLETE={shell}_source verify" in (REPO / "README.md").read_text()
    proc = subprocess.run(
        [sys.executable, "-c", "from verify.cli import cli; cli(prog_name='verify')"],
        env={**os.environ, "_VERIFY_COMPLETE": f"{shell}_source"}, capture_output=True,
        text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and "_VERIFY_COMPLETE" in proc.stdout, proc.stderr


def _io_model(path: Path, x_type: "onnx.TypeProto", y_type: "onnx.TypeProto", node) -> Path:
    import onnx
    from onnx import helper

    graph = helper.make_graph([node], "io", [helper.make_value_info("x", x_type)],
                              [helper.make_value_info("y", y_type)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("ai.onnx.ml", 1)]),
              path)
    return path


def test_string_and_non_tensor_io_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    """bfloat16 in or out (onnxruntime's 'Numpy_type 256 can't be converted to MLDataType'
    was the message), a model taking strings (given as its own hint said, -d x:FILE.json), one giving strings
    (Cast to string) and an sklearn-onnx classifier's ZipMap output (a sequence of maps): each
    was an internal error (exit 4, a traceback from hashing an object array); now one line,
    exit 2, naming the tensor, and no archive."""
    from onnx import TensorProto, helper

    floats, strings = (helper.make_tensor_type_proto(t, [3])
                       for t in (TensorProto.FLOAT, TensorProto.STRING))
    labels = helper.make_sequence_type_proto(helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    (tmp_path / "x.json").write_text('["a", "b", "c"]')
    cases = [
        (_io_model(tmp_path / "takes.onnx", strings, strings,
                   helper.make_node("Identity", ["x"], ["y"])), ["-d", f"x:{tmp_path / 'x.json'}"],
         "error: input 'x' takes strings; verify feeds numeric and bool tensors only (a .npy "
         "file holds strings only through pickle)"),
        (_io_model(tmp_path / "gives.onnx", floats, strings,
                   helper.make_node("Cast", ["x"], ["y"], to=TensorProto.STRING)), [],
         f"error: {tmp_path / 'gives.onnx'}: output 'y' is a string tensor; verify carries "
         "numeric and bool tensors only (a .npy file holds strings only through pickle)"),
        (_io_model(tmp_path / "zipmap.onnx", floats, labels,
                   helper.make_node("ZipMap", ["x"], ["y"], domain="ai.onnx.ml",
                                    classlabels_int64s=[0, 1, 2])), [],
         f"error: {tmp_path / 'zipmap.onnx'}: output 'y' is seq(map(int64,tensor(float))), not "
         "a tensor; verify compares tensor outputs only (an sklearn-onnx classifier: convert it "
         "with options={'zipmap': False})"),
    ]
    bf16 = helper.make_tensor_type_proto(TensorProto.BFLOAT16, [3])
    numpy_less = ("is bfloat16, which onnxruntime's Python API neither takes from numpy nor "
                  "gives back: verify cannot feed or check it; cast at the model's edge (a Cast "
                  "from or to float32) to test the rest")
    cases += [
        (_io_model(tmp_path / "bf_in.onnx", bf16, floats,
                   helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)), [],
         f"error: {tmp_path / 'bf_in.onnx'}: input 'x' {numpy_less}"),
        (_io_model(tmp_path / "bf_out.onnx", floats, bf16,
                   helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16)), [],
         f"error: {tmp_path / 'bf_out.onnx'}: output 'y' {numpy_less}"),
    ]
    for model, data, line in cases:
        out = tmp_path / (model.stem + ".vtc")
        code, _, err = verify(capsys, "pack", model, *data, "-o", out)
        assert (code, err.strip()) == (2, line)
        assert not out.exists()


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"],
                                  ["inspect", "goldens/testcases/cnn.vtc"],
                                  ["inspect", "goldens/testcases/cnn.vtc", "--json"]])
def test_a_reader_that_goes_away_is_exit_141_and_quiet(args: list[str]) -> None:
    """`verify inspect x.vtc | head -1`: stdout's reader is gone before verify writes. The
    exit was 1 (click's and rich's handling of EPIPE), which here means "a check failed";
    now 141, as a shell reports a command SIGPIPE stopped, and nothing on stderr."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first write
    try:
        proc = subprocess.run([sys.executable, "-m", "verify", *args], stdout=write,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                              cwd=Path(__file__).resolve().parents[2], timeout=120)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_a_reader_that_goes_away_midway_through_a_long_report_is_exit_141(
        tmp_path: Path) -> None:
    """`verify diff ... --json | head -c 100`: a write over 64 KiB that the reader leaves
    midway loses the rest without an error in Python, and diff exited with its verdict (0)
    as if all of it had been read."""
    import onnx
    from onnx import TensorProto, helper

    from verify.cli import main

    nodes, prev = [], "x"
    for i in range(300):
        nodes.append(helper.make_node("Relu", [prev], [f"t{i}"], name=f"r{i}"))
        prev = f"t{i}"
    model = helper.make_model(helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4])]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "chain.onnx")
    archive = tmp_path / "chain.vtc"
    assert main(["pack", str(tmp_path / "chain.onnx"), "--layers", "-o", str(archive)]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "verify", "diff", archive, archive, "--json",
                             "--top", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout.read(100).startswith(b"{")  # the document is longer than the pipe
    proc.stdout.close()
    err = proc.stderr.read()
    assert (proc.wait(timeout=120), err) == (141, b"")


def test_pack_and_inspect_count_nan_and_inf_in_the_ground_truth(tmp_path: Path, capsys) -> None:
    """log(x) over [-1, 0, 1, 2] is NaN, -Inf, 0, 0.69; over negatives all NaN. pack and
    inspect showed the finite values' range alone, so a ground truth of NaN looked fine."""
    import numpy as np
    from onnx import TensorProto, helper

    floats = helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 4])
    model = _io_model(tmp_path / "log.onnx", floats, floats, helper.make_node("Log", ["x"], ["y"]))
    for values, line, counts in (
            ([-1, 0, 1, 2], "  case 0: y float32(1,4) range [0, 0.6931]; 1 NaN, 1 Inf", (1, 1)),
            ([-1, -2, -3, -4], "  case 0: y float32(1,4)  4 NaN (no finite value)", (4, 0))):
        np.save(tmp_path / "x.npy", np.array([values], np.float32))
        out_file = tmp_path / "log.vtc"
        code, out, err = verify(capsys, "pack", model, "-d", f"x:{tmp_path / 'x.npy'}", "-o",
                                out_file)
        assert code == 0, err
        assert line in out.splitlines()
        doc = json.loads(verify(capsys, "inspect", out_file, "--json")[1])
        y = doc["cases"][0]["outputs"]["y"]
        assert (y["nan"], y["inf"]) == counts
        text = verify(capsys, "inspect", out_file)[1]
        assert any(ln.startswith("  output y: float32(1,4)") and
                   f"{counts[0]} NaN" in ln for ln in text.splitlines())


def test_inspect_tells_an_archive_from_a_model_by_its_content(tmp_path: Path, capsys) -> None:
    """run reads a file's content; inspect went by the suffix, so an archive named .onnx was
    read as a model (an ONNX parse error) and a model named .pb as an archive."""
    import shutil

    repo = Path(__file__).resolve().parents[2]
    shutil.copy(repo / "goldens" / "testcases" / "cnn.vtc", tmp_path / "cnn.onnx")
    shutil.copy(repo / "goldens" / "models" / "cnn.onnx", tmp_path / "cnn.pb")
    code, out, err = verify(capsys, "inspect", tmp_path / "cnn.onnx", "--json")
    assert code == 0, err
    assert json.loads(out)["format_version"] == 2
    code, out, err = verify(capsys, "inspect", tmp_path / "cnn.pb", "--json")
    assert code == 0, err
    assert json.loads(out)["model_file"] == str(tmp_path / "cnn.pb")


@pytest.mark.parametrize("args, line", [
    (["run"], "error: Missing argument 'ARCHIVE' (see `verify run --help`)"),
    (["frobnicate"], "error: No such command 'frobnicate' (see `verify --help`)"),
    (["run", "x.vtc", "--iter", "x"], "error: Invalid value for '--iter': 'x' is not a valid "
                                      "integer range (see `verify run --help`)"),
])
def test_a_usage_error_is_one_line_naming_the_help_to_read(args: list[str], line: str,
                                                           capsys) -> None:
    """click printed three lines (usage, a 'Try' line, the error); every other error is one."""
    code, out, err = verify(capsys, *args)
    assert (code, out, err) == (2, "", line + "\n")


def test_text_lines_are_not_broken_in_a_pipe_and_tables_take_columns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Output read by a pipe (CI logs, grep): a line of text longer than the table width stays
    one line; $COLUMNS sets the tables' width there (rich alone ignores it off a terminal)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    long = "p" * 200  # a producer name: the model line is then ~300 characters
    m = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"], name="r")], "g",
                                  [h.make_tensor_value_info("x", T.FLOAT, [1, 2])],
                                  [h.make_tensor_value_info("y", T.FLOAT, [1, 2])]),
                     producer_name=long)
    model = tmp_path / "m.onnx"
    onnx.save(m, model)
    code, out, _ = verify(capsys, "inspect", str(model))
    assert code == 0 and any(ln.startswith("model: ") and ln.endswith(long)
                             for ln in out.splitlines())
    monkeypatch.setenv("COLUMNS", "30")
    code, narrow, _ = verify(capsys, "inspect", str(model))
    assert code == 0 and any(ln.startswith("model: ") and ln.endswith(long)
                             for ln in narrow.splitlines())
    table = [ln for ln in narrow.splitlines() if "│" in ln or "┃" in ln]
    assert table and max(len(ln) for ln in table) <= 30


def test_inspect_shows_a_dump_folder_after_reading_it_back(tmp_path: Path, capsys) -> None:
    """A --bin-io-dump folder: where and how it was captured, its cases and tensors, every
    tensor read back against the manifest; a damaged one is one line, exit 2; a text io-dump
    is named for what it is."""
    vtc, dump = tmp_path / "cnn.vtc", tmp_path / "dump"
    assert verify(capsys, "pack", MODEL, "-o", vtc)[0] == 0
    assert verify(capsys, "run", vtc, "--iter", "1", "--opt-level", "disable", "--bin-io-dump",
                  dump, "--io-dump", tmp_path / "io.txt")[0] == 0
    code, out, err = verify(capsys, "inspect", dump)
    lines = out.splitlines()
    assert (code, err) == (0, "") and lines[0].startswith(f"{dump}: a verify dump (format 2)")
    assert any(ln.startswith("run: opt-level disable; captured the model graph at disable")
               for ln in lines)
    doc = json.loads(verify(capsys, "inspect", dump, "--json")[1])
    (case,) = doc["case_counts"]
    assert case["tensor_count"] > 10 and case["tensor_bytes"] > 0
    assert doc["verified"] == case["tensor_count"] and doc["options"]["opt_level"] == "disable"
    assert lines[-1] == (f"verified: {case['tensor_count']} tensor(s) read back, matching the "
                         "manifest (dtype, shape, length)")
    pack_file = dump / "c0.npys"
    pack_file.write_bytes(pack_file.read_bytes()[:-100])  # the last tensor cut short
    code, out, err = verify(capsys, "inspect", dump)
    assert code == 2 and out == "" and "c0.npys" in err and len(err.splitlines()) == 1
    code, _, err = verify(capsys, "inspect", tmp_path / "io.txt")
    assert code == 2 and "a text io-dump (--io-dump)" in err


def test_an_error_or_an_interrupt_keeps_its_code_when_the_reader_has_gone(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`verify inspect missing.vtc | true`: an error that wrote nothing to stdout was exit 141,
    not 2, once the reader had gone; Ctrl-C to `verify ci ... | tee log` (tee stopped too)
    said 'interrupted' and exited 141, not 130. Only a verdict (0, 1) gives way to 141."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "verify", "inspect", "missing.vtc"],
                              stdout=write, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                              text=True, cwd=Path(__file__).resolve().parents[2], timeout=120)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (2, "error: missing.vtc: no such file\n")

    from verify import cli
    from verify.cli import interrupts

    monkeypatch.setattr(cli, "_stdout_gone", lambda: True)  # stdout's reader was stopped too
    monkeypatch.setitem(interrupts._term, "state", "")

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.LazyGroup, "invoke", interrupted)
    assert cli._main(["inspect", "x.vtc"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_a_closed_stdout_is_no_traceback() -> None:
    """`verify --version >&-`: sys.stdout is None; the check for a reader that left raised
    AttributeError at the end of every command."""
    proc = subprocess.run([sys.executable, "-m", "verify", "--version"], stdout=None,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=120,
                          preexec_fn=lambda: os.close(1))
    assert (proc.returncode, proc.stderr) == (0, "")
