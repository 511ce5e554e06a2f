"""Fixtures for the profile and bench tests: the sample CNN packed into an archive (two cases),
and a module-wide private verify cache so device work areas stay inside the test run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers_cli import only_line, verify  # noqa: F401 (used by the profile and bench tests)
from verify.devices import arm64_root

REPO = Path(__file__).resolve().parent.parent
CNN = REPO / "goldens" / "models" / "cnn.onnx"
IMAGE = REPO / "goldens" / "images" / "sample.png"

__all__ = ["cnn_two_cases", "private_cache"]


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """$XDG_CACHE_HOME in a temp dir for one test module; the arm64 root stays where it is."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    root = str(arm64_root())  # resolved before XDG_CACHE_HOME moves
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(cache))
        mp.setenv("VERIFY_ARM64_ROOT", root)
        mp.setenv("CI", "1")
        yield cache


@pytest.fixture(scope="session")
def cnn_two_cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """goldens/models/cnn.onnx packed with two cases: the sample image and seeded noise."""
    from verify.cli import main

    out = tmp_path_factory.mktemp("cnn-vtc") / "cnn.vtc"
    code = main(["pack", str(CNN), "-d", f"data:{IMAGE}", "-d", "data:rand",
                 "--scale", "0.00392", "-o", str(out)])
    assert code == 0 and out.is_file()
    return out
