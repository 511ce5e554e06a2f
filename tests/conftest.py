"""Shared fixtures. Transport fixtures live in fixtures_*.py beside this file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDENS = REPO / "goldens"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked arm64 need the emulated userland and qemu; without them, one clean skip."""
    if item.get_closest_marker("arm64") is not None:
        from fixtures_ci import have_arm64

        if not have_arm64():
            pytest.skip("no emulated arm64 root or no qemu-aarch64-static: "
                        "bash scripts/setup.sh --test (or python scripts/build_arm64_root.py)")


@pytest.fixture
def local_profile(tmp_path: Path):
    """A local device whose work area is private to the test."""
    from verify.devices import Profile

    return Profile(name="local-test", transport="local", base_dir=str(tmp_path / "device"),
                   python=(sys.executable,))
from fixtures_ssh import *  # noqa: E402,F401,F403
from fixtures_adb import *  # noqa: E402,F401,F403
from fixtures_devices import *  # noqa: E402,F401,F403
from fixtures_profile import *  # noqa: E402,F401,F403
from fixtures_localize import *  # noqa: E402,F401,F403
from fixtures_ci import *  # noqa: E402,F401,F403
