"""A per-layer dump on the emulated ARM64 target, through the same pipeline as every device:
the runner rewrites and chunks the model there, and the dump diffs cleanly against the host's
per-layer goldens (aarch64 differs from x86 in the last bits only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures_dump import CNN, pack
from verify.cli import main
from verify.compare import ToleranceSet
from verify.diff import diff_captures
from verify.dump import open_dump

pytestmark = [pytest.mark.arm64, pytest.mark.slow]


def test_dump_on_emulated_arm64_diffs_cleanly_against_host_goldens(tmp_path: Path) -> None:
    archive = pack(CNN, tmp_path / "cnn.vtc", "--layers")
    dump = tmp_path / "arm64"
    code = main(["run", str(archive), "--device", "arm64", "--iter", "1", "--warmup", "0",
                 "--opt-level", "all", "--bin-io-dump", str(dump),
                 "--io-dump", str(tmp_path / "arm64.txt"), "--dump-budget-mb", "1", "--json"])
    assert code == 0
    d = open_dump(dump)
    assert d.manifest["device"]["arch"] == "aarch64"
    assert d.manifest["graph"] == "optimized" and d.manifest["options"]["budget_bytes"] == 1 << 20
    report = diff_captures(dump, archive, ToleranceSet())
    assert report.passed, report.verdict()
    assert len(report.compared) >= 10 and "prob" in {r.name for r in report.compared}
    assert (tmp_path / "arm64.txt").read_text().count("\n[") == len(d.entries(0))
