"""`verify run ARCHIVE --device SPEC` end to end on every kind of device, through the CLI.

Devices: this machine (`local`), a real sshd on loopback, a real adb server with the device end
of tests/adb_device.py, the emulated ARM64 userland directly (`arm64`) and through the adb
device end (the "ARM phone over adb" path), and a second runner program (tests/alt_runner.py)
that follows docs/runner-contract.md. Profiles are written by the tests into $VERIFY_DEVICES.
"""

from __future__ import annotations

import io
import platform
import secrets
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures_devices import ALT_RUNNER, REPO, DeviceEnv, run_cli, run_json

from verify.archive_reader import read_archive
from verify.devices import load_profile
from verify.runner_files import runner_file


def _npy_size(value: np.ndarray) -> int:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(value), allow_pickle=False)
    return len(buf.getvalue())


@pytest.fixture(params=["local", "ssh", "adb"])
def device(request: pytest.FixtureRequest, device_env: DeviceEnv,
           tmp_path: Path) -> tuple[str, Path]:
    """(spec, the device's jobs folder on this machine) for each transport."""
    if request.param == "local":
        return "local", device_env.local_jobs()
    if request.param == "ssh":
        base = tmp_path / "board"
        return device_env.ssh_profile("board-test", request.getfixturevalue("sshd_server"),
                                      base), base / "jobs"
    server, dev = request.getfixturevalue("adb_server"), request.getfixturevalue("adb_device")
    base = dev.sandbox / f"run-{secrets.token_hex(4)}" / "verify"
    return device_env.adb_profile("phone-test", server, dev, base), base / "jobs"


def test_run_end_to_end_and_the_second_run_pushes_only_the_job(
        device: tuple[str, Path], small_vtc: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    spec, jobs = device
    argv = ["run", small_vtc, "--device", spec, "--iter", "3", "--warmup", "1"]
    first = run_json([*argv, "--bin-out-dump", tmp_path / "out"], capsys)
    assert first["passed"] is True
    assert first["device"]["spec"] == spec  # as typed: ssh:NAME, not NAME
    assert first["device"]["arch"] == platform.machine()
    assert [len(c["iter_ms"]) for c in first["cases"]] == [3]
    assert all(d["passed"] for d in first["cases"][0]["check"])
    tc = read_archive(small_vtc)
    dumped = np.load(tmp_path / "out" / "case0-out0.npy", allow_pickle=False)
    assert np.array_equal(dumped, next(iter(tc.cases[0].outputs.values())))

    cached_bytes = (runner_file().stat().st_size + len(tc.model_bytes)
                    + sum(_npy_size(v) for v in tc.cases[0].inputs.values()))
    t1 = first["transfers"]
    assert (t1["files_put"], t1["files_cached"]) == (5, 0)  # runner, model, 2 inputs, job

    second = run_json(argv, capsys)
    t2 = second["transfers"]
    assert (t2["files_put"], t2["files_cached"]) == (1, 4)
    assert t2["bytes_put"] == t1["bytes_put"] - cached_bytes  # the job file, nothing else
    assert second["passed"] is True
    assert list(jobs.iterdir()) == []  # work directories removed after each run


def test_run_text_output_names_the_device_and_transfers(
        device_env: DeviceEnv, sshd_server, small_vtc: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    spec = device_env.ssh_profile("board-text", sshd_server, tmp_path / "base")
    code, out, err = run_cli(["run", small_vtc, "--device", spec, "--iter", "2"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"device ssh:board-text: {platform.machine()} ")
    assert lines[1].startswith("transfers: 5 file(s) pushed (") and lines[1].endswith(", 0 already cached")
    assert lines[-1] == "=== PASS: all outputs within tolerance in 1 case(s)"


def test_alt_runner_locally_through_a_profile(device_env: DeviceEnv, small_vtc: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("alt", {"transport": "local",
                                     "runner": [sys.executable, str(ALT_RUNNER)]})
    doc = run_json(["run", small_vtc, "--device", "alt", "--iter", "2"], capsys)
    assert doc["passed"] is True
    assert doc["device"]["runner"].startswith("alt_runner (onnx.reference")
    assert doc["device"]["onnxruntime"] is None
    assert doc["transfers"]["files_put"] == 4  # model, 2 inputs, job: no runner.py
    info = run_json(["devices", "check", "alt"], capsys)
    assert info["runner"].startswith("alt_runner") and info["providers"] == ["CPUExecutionProvider"]


def test_alt_runner_pushed_to_an_ssh_device(device_env: DeviceEnv, sshd_server, small_vtc: Path,
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A native-runner profile: the runner is a pushed file (cached, linked under base_dir)."""
    base = tmp_path / "board"
    spec = device_env.ssh_profile(
        "alt-board", sshd_server, base, runner=[sys.executable, "{base_dir}/bin/alt_runner.py"],
        push=[{"src": str(ALT_RUNNER), "dest": "bin/alt_runner.py"}])
    doc = run_json(["run", small_vtc, "--device", spec, "--iter", "2"], capsys)
    assert doc["passed"] is True
    assert doc["device"]["runner"].startswith("alt_runner")
    assert (base / "bin" / "alt_runner.py").resolve().read_bytes() == ALT_RUNNER.read_bytes()
    again = run_json(["run", small_vtc, "--device", spec, "--iter", "1"], capsys)
    assert again["transfers"]["files_put"] == 1  # the pushed runner is cached too


def test_alt_runner_refuses_a_provider_it_lacks(device_env: DeviceEnv, small_vtc: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("alt", {"transport": "local",
                                     "runner": [sys.executable, str(ALT_RUNNER)]})
    code, out, err = run_cli(["run", small_vtc, "--device", "alt", "--provider",
                              "CUDAExecutionProvider"], capsys)
    assert (code, out) == (3, "")
    assert err == ("error: alt: CUDAExecutionProvider is not available to alt_runner "
                   "(available: CPUExecutionProvider)\n")


def test_cuda_without_onnxruntime_gpu_says_which_package(
        device_env: DeviceEnv, small_vtc: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import onnxruntime

    available = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" in available:
        pytest.skip("this machine has the CUDA provider")
    for spec in ("cuda", "cuda:1"):
        code, out, err = run_cli(["run", small_vtc, "--device", spec], capsys)
        assert (code, out) == (3, "")
        assert err == (f"error: {spec}: CUDAExecutionProvider is not available on this device "
                       f"(available: {', '.join(available)}); it comes with the "
                       "onnxruntime-gpu package\n")


@pytest.mark.gpu
def test_cuda_runs_on_the_gpu(device_env: DeviceEnv, small_vtc: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("no CUDA provider here (needs a GPU and onnxruntime-gpu)")
    doc = run_json(["run", small_vtc, "--device", "cuda", "--iter", "3"], capsys)
    assert doc["passed"] is True
    assert doc["options"]["providers"][0] == "CUDAExecutionProvider"


# --- the emulated ARM64 target ---------------------------------------------------------------
@pytest.fixture(scope="module")
def arm64_python() -> list[str]:
    return list(load_profile(REPO / "devices" / "arm64.toml").python)


@pytest.mark.arm64
@pytest.mark.slow
def test_arm64_directly(arm64_python: list[str], device_env: DeviceEnv, small_vtc: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(["run", small_vtc, "--device", "arm64", "--iter", "2"], capsys)
    assert doc["passed"] is True
    assert doc["device"]["arch"] == "aarch64"
    assert doc["device"]["spec"] == "arm64"
    assert list(device_env.local_jobs().iterdir()) == []


@pytest.mark.arm64
@pytest.mark.slow
def test_arm64_phone_over_adb(arm64_python: list[str], device_env: DeviceEnv, adb_server,
                              adb_device, small_vtc: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """The real "ARM phone over adb" path: adb transport, an aarch64 Python on the device."""
    base = adb_device.sandbox / f"arm-{secrets.token_hex(4)}" / "verify"
    spec = device_env.adb_profile("armphone", adb_server, adb_device, base, python=arm64_python,
                                  env={"OMP_NUM_THREADS": "1"})
    doc = run_json(["run", small_vtc, "--device", spec, "--iter", "2", "--opt-level",
                    "disable"], capsys)
    assert doc["passed"] is True
    assert (doc["device"]["arch"], doc["device"]["spec"]) == ("aarch64", "adb:armphone")
    assert list((base / "jobs").iterdir()) == []
