"""A model that keeps its weights in external data (pack --keep-external-data) over the real
transports: the data file goes through the device's content-addressed cache (sent once), is
linked beside the other under its location, and the runner's per-layer dump at opt-level
disable and all diffs cleanly against the archive's per-layer references."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from corpus_made import external_model
from fixtures_devices import DeviceEnv, run_cli, run_json


@pytest.fixture(scope="module")
def kept_vtc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from verify.cli import main

    vtc = tmp_path_factory.mktemp("ext") / "ro.vtc"
    assert main(["pack", str(external_model()), "--shape", "x:1x3x224x224",
                 "--keep-external-data", "--layers", "-o", str(vtc)]) == 0
    return vtc


def _through(spec: str, vtc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = external_model().with_suffix(".data").stat().st_size
    first = run_json(["run", vtc, "--device", spec, "--iter", "1"], capsys)
    assert first["passed"] is True and first["transfers"]["bytes_put"] > data
    again = run_json(["run", vtc, "--device", spec, "--iter", "1"], capsys)
    assert again["passed"] is True and again["transfers"]["bytes_put"] < 10_000  # job only
    for level in ("disable", "all"):
        code, out, err = run_cli(["run", vtc, "--device", spec, "--iter", "1", "--opt-level",
                                  level, "--bin-io-dump", tmp_path / level], capsys)
        assert code == 0, err
        code, out, err = run_cli(["diff", tmp_path / level, vtc, "--json"], capsys)
        assert code == 0, out + err
        assert len(json.loads(out)["cases"][0]["rows"]) > 20


def test_external_data_over_ssh(device_env: DeviceEnv, sshd_server, kept_vtc: Path,
                                tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = device_env.ssh_profile("ext-board", sshd_server, tmp_path / "board")
    _through(spec, kept_vtc, tmp_path, capsys)


def test_external_data_over_adb(device_env: DeviceEnv, adb_server, adb_device, kept_vtc: Path,
                                tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = adb_device.sandbox / f"ext-{secrets.token_hex(4)}" / "verify"
    spec = device_env.adb_profile("ext-phone", adb_server, adb_device, base)
    _through(spec, kept_vtc, tmp_path, capsys)
