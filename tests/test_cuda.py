"""verify's CUDA path, on this machine with no GPU and, marked `gpu`, on one with a GPU.

Without a GPU two real situations are tested:
- the host's onnxruntime is the CPU build: `--device cuda` names the onnxruntime-gpu package;
- a real CUDA build of onnxruntime (the onnxruntime-gpu wheel, unpacked by
  `scripts/setup.sh --test` into verify's cache) on a machine without the CUDA and cuDNN
  libraries. onnxruntime then lists CUDAExecutionProvider, fails to load it, logs an error and
  runs on the CPU: verify must refuse (exit 3, the missing library named), never run on the
  CPU under the name "cuda" — locally and over ssh.

The `gpu` tests run the whole CUDA path where a CUDA provider can be created (a GPU machine
with onnxruntime-gpu) and skip cleanly elsewhere.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from fixtures_devices import REPO, DeviceEnv, run_cli, run_json

from verify.runner import runner

GOLDEN = REPO / "goldens" / "testcases" / "cnn.vtc"
ORT_GPU_VERSION = "1.31.1"  # scripts/setup.sh installs this version


def _cuda_build_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return Path(cache) / "verify" / f"onnxruntime-gpu-{ORT_GPU_VERSION}-{tag}"


@pytest.fixture(scope="module")
def cuda_build() -> Path:
    """The unpacked onnxruntime-gpu wheel (a CUDA build of onnxruntime, no CUDA libraries)."""
    path = _cuda_build_dir()
    if not (path / ".complete").is_file():
        pytest.fail(f"{path} is missing: run bash scripts/setup.sh --test")
    return path


def _cuda_usable() -> bool:
    """Whether this machine's onnxruntime can make a CUDA session (a GPU and its libraries)."""
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return False
    return runner.probe_providers(["CUDAExecutionProvider"])["CUDAExecutionProvider"] is None


def _no_cuda_build_here() -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine's onnxruntime is a CUDA build")


# --- the CPU build of onnxruntime ------------------------------------------------------------
def test_devices_check_cuda_names_the_package(device_env: DeviceEnv,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import onnxruntime

    _no_cuda_build_here()
    code, out, err = run_cli(["devices", "check", "cuda"], capsys)
    assert code == 3
    assert out.startswith("device cuda: reachable\n")
    listed = ", ".join(onnxruntime.get_available_providers())
    assert err == (f"error: cuda: CUDAExecutionProvider is not available on this device "
                   f"(available: {listed}); it comes with the onnxruntime-gpu package\n")


def test_devices_check_json_carries_the_probe(device_env: DeviceEnv,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _no_cuda_build_here()
    code, out, _ = run_cli(["devices", "check", "cuda:1", "--json"], capsys)
    assert code == 3
    doc = json.loads(out)
    assert doc["probe"]["CPUExecutionProvider"] is None
    assert doc["probe"]["CUDAExecutionProvider"].startswith(
        "CUDAExecutionProvider is not available on this device")
    code, out, _ = run_cli(["devices", "check", "local", "--json"], capsys)
    assert code == 0 and json.loads(out)["probe"] == {"CPUExecutionProvider": None}


# --- a CUDA build of onnxruntime without the CUDA libraries -----------------------------------
def _gpuless_reason() -> str:
    return (f"CUDAExecutionProvider could not be created by onnxruntime {ORT_GPU_VERSION} "
            "(libonnxruntime_providers_cuda.so: libcublasLt.so.13: cannot open shared object "
            "file: No such file or directory; it requires cuDNN 9.* and CUDA 13.*); the session "
            "fell back to CPUExecutionProvider, so nothing would run on it")


def _gpuless_profile(device_env: DeviceEnv, cuda_build: Path, name: str = "gpuless") -> str:
    device_env.write_profile(name, {"transport": "cuda", "env": {"PYTHONPATH": str(cuda_build)}})
    return name


def test_a_cuda_build_without_cuda_libraries_is_not_ready(
        device_env: DeviceEnv, cuda_build: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _gpuless_profile(device_env, cuda_build)
    code, out, err = run_cli(["devices", "check", spec], capsys)
    assert code == 3
    assert "providers    TensorrtExecutionProvider, CUDAExecutionProvider, CPUExecutionProvider" \
        in out
    assert err == f"error: {spec}: {_gpuless_reason()}\n"


@pytest.mark.parametrize("extra", [[], ["--bin-io-dump", "{tmp}/dump"], ["--profile", "{tmp}/p.json"]])
def test_a_cuda_build_without_cuda_libraries_never_runs_on_the_cpu_as_cuda(
        device_env: DeviceEnv, cuda_build: Path, tmp_path: Path, extra: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    spec = _gpuless_profile(device_env, cuda_build)
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    argv = ["run", GOLDEN, "--device", spec, "--iter", "2",
            *[a.format(tmp=outputs) for a in extra]]
    code, out, err = run_cli(argv, capsys)
    assert (code, out) == (3, "")
    assert err == f"error: {spec}: {_gpuless_reason()}\n"
    assert list(outputs.iterdir()) == []  # no dump folder, no trace


def test_a_cuda_profile_over_ssh_is_probed_on_the_board(
        device_env: DeviceEnv, cuda_build: Path, sshd_server, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The CUDA board over SSH of devices/cuda.toml's comment: its providers and options in an
    ssh profile; the board's onnxruntime is the CUDA build without CUDA libraries."""
    spec = device_env.ssh_profile(
        "jetson", sshd_server, tmp_path / "board",
        providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
        provider_options={"CUDAExecutionProvider": {"device_id": 0}},
        env={"PYTHONPATH": str(cuda_build)})
    code, _, err = run_cli(["devices", "check", spec], capsys)
    assert (code, err) == (3, f"error: {spec}: {_gpuless_reason()}\n")
    code, out, err = run_cli(["run", GOLDEN, "--device", spec], capsys)
    assert (code, out, err) == (3, "", f"error: {spec}: {_gpuless_reason()}\n")


def test_cpu_only_runs_through_the_cuda_build_still_work(
        device_env: DeviceEnv, cuda_build: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--provider CPUExecutionProvider on the same device: nothing asked of CUDA, a clean run."""
    spec = _gpuless_profile(device_env, cuda_build)
    doc = run_json(["run", GOLDEN, "--device", spec, "--provider", "CPUExecutionProvider"],
                   capsys)
    assert doc["passed"] is True
    assert doc["device"]["onnxruntime"] == ORT_GPU_VERSION


def test_bench_reports_the_cuda_setting_as_a_device_error(
        device_env: DeviceEnv, cuda_build: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _gpuless_profile(device_env, cuda_build)
    code, _, err = run_cli(["bench", GOLDEN, "--device", spec, "--providers", "cuda",
                            "--repeat", "1"], capsys)
    assert code == 3
    assert _gpuless_reason() in err


# --- on a GPU --------------------------------------------------------------------------------
gpu = pytest.mark.skipif(not _cuda_usable(), reason="no usable CUDA provider here (needs a GPU, "
                                                    "onnxruntime-gpu and the CUDA libraries)")


@pytest.mark.gpu
@gpu
def test_gpu_devices_check_and_run(device_env: DeviceEnv, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["devices", "check", "cuda", "--json"], capsys)
    assert code == 0 and json.loads(out)["probe"]["CUDAExecutionProvider"] is None
    doc = run_json(["run", GOLDEN, "--device", "cuda", "--iter", "5"], capsys)
    assert doc["passed"] is True
    assert doc["options"]["providers"][0] == "CUDAExecutionProvider"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("level", ["disable", "all"])
def test_gpu_dump_and_diff_against_the_cpu(device_env: DeviceEnv, tmp_path: Path, level: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    for spec in ("cuda", "local"):
        code, _, err = run_cli(["run", GOLDEN, "--device", spec, "--opt-level", level,
                                "--bin-io-dump", tmp_path / spec], capsys)
        assert code == 0, err
    code, out, err = run_cli(["diff", tmp_path / "cuda", tmp_path / "local", "--json"], capsys)
    assert code in (0, 1), err
    doc = json.loads(out)
    assert doc["cases"], doc


@pytest.mark.gpu
@gpu
def test_gpu_profile_has_kernel_events(device_env: DeviceEnv, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "prof.json"
    code, _, err = run_cli(["run", GOLDEN, "--device", "cuda", "--profile", trace], capsys)
    assert code == 0, err
    events = json.loads(trace.read_text())
    assert any(e.get("cat") == "Kernel" for e in events), "no CUDA kernel events in the trace"
    doc = run_json(["profile", trace], capsys)
    assert doc


@pytest.mark.gpu
@gpu
def test_gpu_bench_over_opt_levels(device_env: DeviceEnv,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["bench", GOLDEN, "--device", "cuda", "--opt-levels", "disable,all",
                            "--repeat", "1"], capsys)
    assert code == 0, err
