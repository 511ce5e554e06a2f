"""Layer dumps over the real transports (a real sshd on loopback, a real adb server with a
device end speaking adb's protocol): the same chunked capture, pulled tensor by tensor, diffing
cleanly against the archive's per-layer goldens at opt-level disable and all."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from fixtures_devices import DeviceEnv
from fixtures_dump import REPO, pack
from verify.cli import main
from verify.compare import ToleranceSet
from verify.diff import diff_captures
from verify.dump import open_dump


@pytest.fixture(scope="module")
def two_io_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack(REPO / "goldens" / "models" / "two_io.onnx",
                tmp_path_factory.mktemp("tr") / "two_io.vtc", "--layers")


def _dump_and_diff(spec: str, archive: Path, out: Path, level: str) -> None:
    code = main(["run", str(archive), "--device", spec, "--iter", "1", "--opt-level", level,
                 "--bin-io-dump", str(out), "--dump-budget-mb", "0.001", "--json"])
    assert code == 0
    d = open_dump(out)
    assert d.manifest["spec"] in spec and len(d.entries(0)) >= 6
    report = diff_captures(out, archive, ToleranceSet())
    assert report.passed and len(report.compared) >= 6, report.verdict()


@pytest.mark.parametrize("level", ["disable", "all"])
def test_dump_over_ssh(level: str, device_env: DeviceEnv, sshd_server, two_io_layers: Path,
                       tmp_path: Path) -> None:
    spec = device_env.ssh_profile("dump-board", sshd_server, tmp_path / "board")
    _dump_and_diff(spec, two_io_layers, tmp_path / "d", level)


@pytest.mark.parametrize("level", ["disable", "all"])
def test_dump_over_adb(level: str, device_env: DeviceEnv, adb_server, adb_device,
                       two_io_layers: Path, tmp_path: Path) -> None:
    base = adb_device.sandbox / f"dump-{secrets.token_hex(4)}" / "verify"
    spec = device_env.adb_profile("dump-phone", adb_server, adb_device, base)
    _dump_and_diff(spec, two_io_layers, tmp_path / "d", level)
