"""Every onnxruntime optimization level `--opt-level` offers, `layout` included, and a device
whose onnxruntime lacks a level (`layout` came in a later onnxruntime than the others)."""

from __future__ import annotations

import enum
import json
import types
from pathlib import Path

import onnxruntime as ort
import pytest
from helpers_cli import verify

from verify.runner import runner

VTC = Path(__file__).resolve().parent.parent / "goldens" / "testcases" / "cnn.vtc"
needs_layout = pytest.mark.skipif(
    not hasattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT"),
    reason=f"onnxruntime {ort.__version__} has no ORT_ENABLE_LAYOUT (it came in 1.21)")


@needs_layout
def test_levels_map_to_onnxruntime_in_increasing_order() -> None:
    assert list(runner.OPT_LEVELS) == ["disable", "basic", "extended", "layout", "all"]
    values = [getattr(ort.GraphOptimizationLevel, v).value for v in runner.OPT_LEVELS.values()]
    assert values == sorted(values) and len(set(values)) == len(values)


@needs_layout
def test_run_at_layout_passes_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = verify(capsys, "run", VTC, "--opt-level", "layout", "--iter", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["passed"] is True and doc["options"]["opt_level"] == "layout"


def test_an_onnxruntime_without_the_level_is_a_provider_error() -> None:
    """The real onnxruntime, with the level its older releases lack taken out of the enum."""
    older = enum.Enum("GraphOptimizationLevel", {
        m.name: m.value for m in ort.GraphOptimizationLevel.__members__.values()
        if m.name != "ORT_ENABLE_LAYOUT"})
    old_ort = types.SimpleNamespace(**{k: getattr(ort, k) for k in dir(ort)
                                       if not k.startswith("__")})
    old_ort.GraphOptimizationLevel = older
    old_ort.__version__ = "1.16.3"
    with pytest.raises(runner.JobError) as info:
        runner.make_session(old_ort, b"", {"opt_level": "layout"})
    assert info.value.kind == "provider"
    assert str(info.value) == ("onnxruntime 1.16.3 here has no 'layout' optimization level "
                               "(ORT_ENABLE_LAYOUT); use extended or all")
    with pytest.raises(runner.JobError, match="unknown opt_level 'fast'"):
        runner.make_session(ort, b"", {"opt_level": "fast"})
