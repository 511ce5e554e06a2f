"""Shared fixtures. Transport fixtures live in fixtures_*.py beside this file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDENS = REPO / "goldens"
sys.path.insert(0, str(Path(__file__).resolve().parent))


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
