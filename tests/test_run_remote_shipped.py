"""The shipped example profiles `board` (ssh) and `phone` (adb, native runner) work as shipped,
with only what a user edits changed: the address, the key files, the python path, and the
files the phone profile pushes (here tests/alt_runner.py stands in for a native runner and an
empty file for libonnxruntime.so)."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import pytest
from fixtures_devices import ALT_RUNNER, REPO, DeviceEnv, run_json

from verify.devices import tomllib


def _shipped(name: str) -> dict:
    return tomllib.loads((REPO / "devices" / f"{name}.toml").read_text())


def test_shipped_board_profile_over_ssh(device_env: DeviceEnv, sshd_server, small_vtc: Path,
                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    board = _shipped("board")
    board["address"] = sshd_server.address
    board["python"] = [sys.executable]
    board["base_dir"] = str(tmp_path / "board")
    board["options"].update(known_hosts=str(sshd_server.known_hosts),
                            identity=str(sshd_server.client_key))
    device_env.write_profile("board", board)
    doc = run_json(["run", small_vtc, "--device", "board", "--iter", "2"], capsys)
    assert doc["passed"] is True and doc["device"]["spec"] == "board"
    assert list((tmp_path / "board" / "jobs").iterdir()) == []


def test_shipped_phone_profile_over_adb(device_env: DeviceEnv, adb_server, adb_device,
                                        small_vtc: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    phone = _shipped("phone")
    assert [p["dest"] for p in phone["push"]] == ["bin/verify-runner", "lib/libonnxruntime.so"]
    lib = tmp_path / "libonnxruntime.so"
    lib.write_bytes(b"\x7fELF stand-in")
    phone["push"][0]["src"], phone["push"][1]["src"] = str(ALT_RUNNER), str(lib)
    base = adb_device.sandbox / f"phone-{secrets.token_hex(4)}" / "data-local-tmp"
    phone["base_dir"] = str(base)
    phone["address"] = adb_device.address
    phone["options"]["adb_port"] = adb_server.port
    device_env.write_profile("phone", phone)
    doc = run_json(["run", small_vtc, "--device", "adb:phone", "--iter", "2"], capsys)
    assert doc["passed"] is True
    assert doc["device"]["runner"].startswith("alt_runner")
    assert doc["device"]["ld_library_path"] == f"{base}/lib"
    assert (base / "lib" / "libonnxruntime.so").resolve().read_bytes() == lib.read_bytes()
    assert doc["transfers"]["files_put"] == 6  # runner, library, model, 2 inputs, job
    again = run_json(["run", small_vtc, "--device", "phone", "--iter", "1"], capsys)
    assert (again["transfers"]["files_put"], again["transfers"]["files_cached"]) == (1, 5)
