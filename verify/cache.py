"""Where verify keeps what it builds or fetches once per machine: `$XDG_CACHE_HOME/verify`
(`~/.cache/verify`): the local runner's copy, the emulated ARM64 userland, the compiled
comparison kernel, the real models the tests use."""

from __future__ import annotations

import os
from pathlib import Path


def verify_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "verify"
