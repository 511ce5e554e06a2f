"""A bounded fuzz of the archive and dump-manifest readers, every run: a few hundred seeded
mutants (scripts/fuzz_archives.py, in one child process that calls verify's main() per
mutant, so a crash of the HDF5 library or a hang is this test's failure, not pytest's).

Rules checked for every mutant: no exit 4; a mutant whose stored content changed never gets
a verdict (exit 0/1) from inspect nor from a local run (every 10th mutant, and every one changed
only in its per-layer references, which run checks in the background), and never reaches the
device from run when what run reads changed. The longer run
for on-demand use is `python scripts/fuzz_archives.py` (2,000 archives)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_mutated_archives_and_manifests(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "VERIFY_DEVICES": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "fuzz_archives.py"), "--archives", "200",
         "--manifests", "100", "--seconds", "80", "--seed", "16",
         "--local-every", "10", "--local-layers"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # else it crashed or hung
    result = json.loads(proc.stdout)
    assert result["problems"] == [], "\n".join(result["problems"][:20])
    counts = result["archive"]["counts"]
    # the run exercised both kinds of mutant and both commands, so the rules were tested
    assert counts.get("mutants changed", 0) >= 20 and counts.get("mutants unchanged", 0) >= 1
    assert sum(v for k, v in counts.items() if k.startswith("inspect exit")) >= 20
    assert counts.get("local runs on per-layer-only changes", 0) >= 3
    assert sum(v for k, v in counts.items() if k.startswith("local run exit")) >= 10
    assert sum(result["manifest"]["counts"].values()) >= 10
