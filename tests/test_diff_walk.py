"""`verify diff`'s walk on real dumps of the golden cnn (`run --bin-io-dump`, whole or narrowed
with --dump-filter): which captures it compares and which it refuses, what the report notes,
what --only-failing shows, and the library call on an install without numba.

Captures of one model file are compared whatever their filters share; captures of two model
files (the cnn and a copy with one conv's weights scaled, as a retrained or re-exported model)
are compared when they share names for at least half of the smaller side's computed tensors
and refused (exit 2, "captures of different models") below that, the rule that keeps two
unrelated models sharing a few names by chance from being "compared"."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from fixtures_dump import CNN, perturb
from fixtures_dump import cnn_dumps, dump_factory  # noqa: F401 (fixtures)
from helpers_cli import only_line, verify

# node names of the cnn (tensor X's node is X without ':0'); --dump-filter searches both
ACTUAL = r"^(stem/|block1/conv)"  # 6 computed tensors: stem conv, bn, relu, pool; block1 conv1, 2
HALF = r"^(stem/(conv|bn|relu)$|block2/)"  # shares 3 of them (and has block2's 9)
UNDER_HALF = r"^(stem/(conv|bn)$|block2/)"  # shares 2 of them


@pytest.fixture(scope="module")
def retrained() -> bytes:
    """The cnn with one conv after everything ACTUAL keeps perturbed: another model file whose
    first layers compute the same values."""
    return perturb(onnx.load(CNN), "conv", "block3/se/fc2").SerializeToString()


def _sha(model: bytes) -> str:
    return hashlib.sha256(model).hexdigest()


def test_same_model_filtered_differently_is_compared_not_refused(
        dump_factory: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Two dumps of one model file, narrowed to different layers, share 2 of 6 tensors: the
    two are compared (the shared two), not taken for captures of different models."""
    actual = dump_factory(CNN, "disable", "--dump-filter", ACTUAL)
    reference = dump_factory(CNN, "disable", "--dump-filter", UNDER_HALF)
    code, out, err = verify(capsys, "diff", actual, reference, "--json")
    assert code == 0, err
    report = json.loads(out)["cases"][0]
    assert report["verdict"] == "PASS: 2 tensors within tolerance"
    assert [r["name"] for r in report["rows"] if r["diff"]] == ["stem/conv:0", "stem/bn:0"]
    assert report["counts"] == {"compared": 2, "failed": 0, "only_in_actual": 4,
                                "only_in_reference": 9}
    assert not any("different model" in n for n in report["notes"])


def test_two_model_files_sharing_half_their_tensors_are_compared_and_noted(
        dump_factory: Callable[..., Path], retrained: bytes,
        capsys: pytest.CaptureFixture[str]) -> None:
    actual = dump_factory(retrained, "disable", "--dump-filter", ACTUAL)
    reference = dump_factory(CNN, "disable", "--dump-filter", HALF)
    code, out, err = verify(capsys, "diff", actual, reference)
    assert code == 0, err
    assert (f"note: the two captures come from different model files (sha256 "
            f"{_sha(retrained)[:12]} vs {_sha(CNN.read_bytes())[:12]})") in out.splitlines()
    assert out.splitlines()[-1] == "=== PASS: 3 tensors within tolerance"


def test_two_model_files_sharing_under_half_are_refused(
        dump_factory: Callable[..., Path], retrained: bytes,
        capsys: pytest.CaptureFixture[str]) -> None:
    actual = dump_factory(retrained, "disable", "--dump-filter", ACTUAL)
    reference = dump_factory(CNN, "disable", "--dump-filter", UNDER_HALF)
    code, out, err = verify(capsys, "diff", actual, reference)
    assert code == 2 and out == ""
    assert only_line(err) == (
        f"error: {actual} and {reference} are captures of different models (model sha256 "
        f"{_sha(retrained)[:12]}… vs {_sha(CNN.read_bytes())[:12]}…; 2 of 6 computed tensors "
        "share a name)")


_TABLE_ROW = re.compile(r"^\s*\d+  \S")


def test_only_failing_shows_exactly_the_failing_tensors(
        cnn_dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = verify(capsys, "diff", cnn_dumps["all"], cnn_dumps["disable"],
                          "--atol", "1e-9", "--json")
    assert code == 1
    rows = json.loads(out)["cases"][0]["rows"]
    failing = [r["name"] for r in rows if r["diff"] and not r["diff"]["passed"]]
    passing = [r["name"] for r in rows if r["diff"] and r["diff"]["passed"]]
    assert failing and passing
    code, out, _ = verify(capsys, "diff", cnn_dumps["all"], cnn_dumps["disable"],
                          "--atol", "1e-9", "--only-failing")
    shown = [ln.split()[1] for ln in out.splitlines() if _TABLE_ROW.match(ln)]
    assert code == 1 and shown == failing


_NO_NUMBA = """
import sys
sys.modules["numba"] = None  # as installed without the fast extra: `import numba` fails
from pathlib import Path
from verify.compare import ToleranceSet
from verify.diff import diff_captures
a, r = Path(sys.argv[1]), Path(sys.argv[2])
print(diff_captures(a, r, ToleranceSet()).verdict())
try:
    diff_captures(a, r, ToleranceSet(), engine="numba")
except ImportError as exc:
    print("ImportError:", exc)
"""


def test_library_diff_without_numba(cnn_dumps: dict[str, Path]) -> None:
    """The default install has no numba: `diff_captures` with its default engine compares
    (on numpy); asking for the numba engine there is an ImportError, not silently numpy."""
    env = {k: v for k, v in os.environ.items() if k != "VERIFY_NO_NUMBA"}
    dump = cnn_dumps["disable"]
    done = subprocess.run([sys.executable, "-c", _NO_NUMBA, str(dump), str(dump)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    verdict, error = done.stdout.splitlines()
    assert verdict == "PASS: 38 tensors within tolerance"
    assert error.startswith("ImportError: numba is not installed")


def test_iter_rows_yields_every_compared_row_unless_asked_for_failing_ones(
        cnn_dumps: dict[str, Path]) -> None:
    from verify.compare import ToleranceSet
    from verify.diff import diff_captures, iter_rows

    report = diff_captures(cnn_dumps["all"], cnn_dumps["disable"], ToleranceSet())
    assert report.passed and len(report.compared) > 10
    assert list(iter_rows(report)) == list(report.compared)
    assert list(iter_rows(report, only_failing=True)) == []
