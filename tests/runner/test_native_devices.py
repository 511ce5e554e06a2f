"""verify's commands through the native runner (runner/native/) on every transport: this
machine (the x86-64 bundle), the emulated ARM64 root with no Python (the shipped arm64-native
profile, qemu-user), a real sshd on loopback and an adb server with a device end (both running
the pushed aarch64 bundle under qemu in that root). `devices check`, run, dumps, diff against
the Python runner's dump, localize and profile.

The adb device end runs commands with /bin/sh on this x86-64 machine, which has no binfmt_misc
entry for aarch64 (registering one needs the host kernel's privileges), so its profile names
qemu in the runner argv, as tests of the Python arm64 root over adb do; the binary, the library
and the minimal root are the ones a board would run.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fixtures_devices import DeviceEnv, run_cli, run_json
from helpers_dump import get_tensor
from fixtures_native import arm64_native, bundle, minimal_root, native_bin, validate  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def qemu_prefix() -> list[str]:
    return ["qemu-aarch64-static", "-L", str(minimal_root()), "-cpu", "neoverse-n1"]


def pushed_runner(target: str = "linux-aarch64") -> dict[str, Any]:
    b = bundle(target)
    return {"runner": [*qemu_prefix(), "{base_dir}/bin/verify-runner"],
            "env": {"LD_LIBRARY_PATH": "{base_dir}/lib"},
            "push": [{"src": str(b / "bin" / "verify-runner"), "dest": "bin/verify-runner"},
                     {"src": str(b / "lib" / "libonnxruntime.so.1"),
                      "dest": "lib/libonnxruntime.so.1"}]}


def check_native(info: dict[str, Any], arch: str) -> None:
    assert (info["arch"], info["python"], info["numpy"]) == (arch, None, None)
    assert info["onnxruntime"] == "1.30.0" and "CPUExecutionProvider" in info["providers"]
    assert info["runner"].startswith("verify-runner (native C++")


def run_dump_and_diff(spec: str, vtc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                      opt: str = "all") -> dict[str, Any]:
    """A run with --bin-io-dump on `spec` and on local (the Python runner); their diff."""
    native, python = tmp_path / f"{spec.replace(':', '_')}-dump", tmp_path / "py-dump"
    code, out, err = run_cli(["run", vtc, "--device", spec, "--iter", "1", "--opt-level", opt,
                              "--bin-io-dump", native], capsys)
    assert code == 0, err
    assert "each node run once, in " in err + out  # segments, as the Python runner
    device_line = next(line for line in out.splitlines() if line.startswith(f"device {spec}"))
    assert "python" not in device_line and "onnxruntime 1.30.0" in device_line  # no Python there
    check = run_json(["run", vtc, "--device", "local", "--iter", "1", "--opt-level", opt,
                      "--bin-io-dump", python], capsys)
    assert check["passed"] is True
    code, out, err = run_cli(["diff", native, python, "--json"], capsys)
    assert code == 0, out + err
    return json.loads(out)


def test_local_native_runner_commands(device_env: DeviceEnv, small_vtc: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("nat", {"transport": "local", "runner": [str(native_bin())]})
    check_native(run_json(["devices", "check", "nat"], capsys), "x86_64")
    doc = run_json(["run", small_vtc, "--device", "nat", "--iter", "3"], capsys)
    assert doc["passed"] is True and doc["device"]["python"] is None
    assert doc["transfers"]["files_put"] == 4  # model, 2 inputs, job: no runner.py
    for opt in ("disable", "all"):
        diff = run_dump_and_diff("nat", small_vtc, tmp_path / opt, capsys, opt)
        assert diff["passed"] is True
        validate(json.loads((tmp_path / opt / "nat-dump" / "manifest.json").read_text()),
                 "dump_manifest")
    # What the host writes and reads, against the contract's schema: a kept work folder.
    code, out, err = run_cli(["run", small_vtc, "--device", "nat", "--iter", "1", "--keep",
                              "--bin-io-dump", tmp_path / "kept-dump"], capsys)
    assert code == 0, err
    jobs = [json.loads(p.read_text()) for p in device_env.local_jobs().rglob("*.json")
            if json.loads(p.read_text()).get("contract") == "verify-runner"]
    kinds = {"job" if "model" in d else "result" for d in jobs}
    assert kinds == {"job", "result"} and any("dump" in d for d in jobs)
    for doc in jobs:
        validate(doc, "job" if "model" in doc else "result")


@pytest.mark.parametrize("opt", ["disable", "all"])
def test_native_dump_of_a_real_model_diffs_clean(opt: str, device_env: DeviceEnv, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """YOLOv8n (a real third-party model): the native runner's per-layer dump against the
    Python runner's, at the same opt level; its final outputs bit-identical to its plain run."""
    from corpus import model_path

    vtc = tmp_path / "yolo.vtc"
    code, out, err = run_cli(["pack", model_path("yolov8n"), "--shape", "images:1x3x160x160",
                              "-o", vtc], capsys)
    assert code == 0, err
    device_env.write_profile("nat", {"transport": "local", "runner": [str(native_bin())]})
    diff = run_dump_and_diff("nat", vtc, tmp_path, capsys, opt)
    assert diff["passed"] is True
    code, out, err = run_cli(["run", vtc, "--device", "nat", "--iter", "1", "--opt-level",
                              opt, "--keep", "--json"], capsys)
    assert code == 0, err
    kept = [p for p in device_env.local_jobs().iterdir() if (p / "result.json").exists()]
    assert len(kept) == 1
    result = json.loads((kept[0] / "result.json").read_text())
    assert "dump" not in result and result["device"]["python"] is None  # the plain run
    plain = np.load(kept[0] / result["cases"][0]["outputs"]["output0"])
    dump = tmp_path / "nat-dump"
    tensors = json.loads((dump / "manifest.json").read_text())["cases"][0]["tensors"]
    (rec,) = [t for t in tensors if t["name"] == "output0"]
    assert get_tensor(dump, rec).tobytes() == plain.tobytes()  # bit-identical


def test_native_runner_reads_external_data(device_env: DeviceEnv, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A model keeping its weights in external data (pack --keep-external-data): the native
    runner points onnxruntime at the linked files for the run and for each dump segment, and
    its dumps at disable and all diff clean against the Python runner's."""
    from corpus_made import external_model

    vtc = tmp_path / "ro.vtc"
    code, out, err = run_cli(["pack", external_model(), "--shape", "x:1x3x224x224",
                              "--keep-external-data", "-o", vtc], capsys)
    assert code == 0, err
    device_env.write_profile("nat", {"transport": "local", "runner": [str(native_bin())]})
    doc = run_json(["run", vtc, "--device", "nat", "--iter", "1"], capsys)
    assert doc["passed"] is True and doc["device"]["python"] is None
    for opt in ("disable", "all"):
        diff = run_dump_and_diff("nat", vtc, tmp_path / opt, capsys, opt)
        assert diff["passed"] is True and len(diff["cases"][0]["rows"]) > 20


@pytest.mark.arm64
def test_arm64_root_without_python(arm64_native: str, small_vtc: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert not list(minimal_root().rglob("python3*")) and not list(minimal_root().rglob("numpy"))
    check_native(run_json(["devices", "check", arm64_native], capsys), "aarch64")
    diff = run_dump_and_diff(arm64_native, small_vtc, tmp_path, capsys)
    assert diff["passed"] is True
    trace = tmp_path / "trace.json"
    doc = run_json(["run", small_vtc, "--device", arm64_native, "--iter", "2", "--profile",
                    trace], capsys)
    assert doc["passed"] is True
    prof = run_json(["profile", trace], capsys)
    assert (prof["summary"]["runs"], prof["summary"]["skipped_runs"]) == (2, 1)


@pytest.mark.arm64
def test_localize_through_the_native_runner(arm64_native: str, residual_vtc: Path,
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A healthy device: per-layer capture through the native runner under emulated aarch64
    finds no faulty node (aarch64's last-bit noise is within the default tolerance)."""
    code, out, err = run_cli(["localize", residual_vtc, "--device", arm64_native, "-o",
                              tmp_path, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["suspect"] is None and doc["device"]["python"] is None


@pytest.mark.arm64
def test_ssh_board_without_python(device_env: DeviceEnv, arm64_native: str, sshd_server,
                                  small_vtc: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "board"
    spec = device_env.ssh_profile("nboard", sshd_server, base, **pushed_runner())
    check_native(run_json(["devices", "check", spec], capsys), "aarch64")
    diff = run_dump_and_diff(spec, small_vtc, tmp_path, capsys)
    assert diff["passed"] is True
    again = run_json(["run", small_vtc, "--device", spec, "--iter", "1"], capsys)
    assert again["transfers"]["files_put"] == 1  # runner and library cached on the board


@pytest.mark.arm64
def test_adb_device_without_python(device_env: DeviceEnv, arm64_native: str, adb_server,
                                   adb_device, small_vtc: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    base = adb_device.sandbox / f"nat-{secrets.token_hex(4)}" / "verify"
    spec = device_env.adb_profile("nphone", adb_server, adb_device, base, **pushed_runner())
    check_native(run_json(["devices", "check", spec], capsys), "aarch64")
    doc = run_json(["run", small_vtc, "--device", spec, "--iter", "2"], capsys)
    assert doc["passed"] is True and doc["device"]["python"] is None


@pytest.mark.parametrize("kind", ["python", "native"])
def test_device_commands_over_both_runners(kind: str, device_env: DeviceEnv, small_vtc: Path,
                                           residual_vtc: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The same commands, the same answers, whichever runner the profile names."""
    profile: dict[str, Any] = {"transport": "local"}
    if kind == "native":
        profile["runner"] = [str(native_bin())]
    device_env.write_profile("dev", profile)
    code, out, err = run_cli(["devices", "check", "dev"], capsys)
    assert code == 0, err
    assert ("runner       verify-runner (native C++" in out) == (kind == "native")
    assert ("python       not needed (native runner)" in out) == (kind == "native")
    doc = run_json(["run", small_vtc, "--device", "dev", "--iter", "2"], capsys)
    assert doc["passed"] is True
    code, out, err = run_cli(["run", small_vtc, "--device", "dev", "--provider",
                              "QNNExecutionProvider"], capsys)
    assert (code, out) == (3, "")
    assert err.startswith("error: dev: QNNExecutionProvider is not available on this device")
    code, out, err = run_cli(["localize", residual_vtc, "--device", "dev", "-o",
                              tmp_path / "loc", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["suspect"] is None
    trace = tmp_path / "trace.json"
    assert run_json(["run", small_vtc, "--device", "dev", "--iter", "3", "--profile", trace],
                    capsys)["passed"] is True
    summary = run_json(["profile", trace], capsys)["summary"]
    assert (summary["runs"], summary["skipped_runs"]) == (3, 1)
