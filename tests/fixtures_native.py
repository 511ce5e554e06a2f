"""The native runner (runner/native/) for tests: its bundles, built by
scripts/build_native_runner.py (cached; scripts/setup.sh --test builds both Linux bundles
first, so here the build is normally a check of the manifest), and the argv of each runner.

`RUNNERS` names the two runners every contract test runs over: `python` (verify/runner/runner.py
under this Python) and `native` (the linux-x86_64 bundle).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from fixtures_devices import DeviceEnv

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "build_native_runner.py"
PY_RUNNER = REPO / "verify" / "runner" / "runner.py"
RUNNERS: tuple[str, ...] = ("python", "native")
# A third party's runner, checked by the same contract tests (docs/native-runner.md,
# "Checking another runner"): VERIFY_CONFORMANCE_RUNNER="ARGV..." adds it as `third`.
THIRD = os.environ.get("VERIFY_CONFORMANCE_RUNNER", "").strip()
if THIRD:
    RUNNERS += ("third",)
# The user's cache as it was when the tests started: fixtures that move $XDG_CACHE_HOME into a
# test's temp dir must not make the bundles (and their npm tarballs) be built again there.
_XDG_AT_START = os.environ.get("XDG_CACHE_HOME")


@lru_cache(maxsize=None)
def build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_native_runner", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_native_runner"] = module
    spec.loader.exec_module(module)
    return module


@lru_cache(maxsize=None)
def bundle(target: str = "linux-x86_64") -> Path:
    """The target's bundle folder, built if missing or stale (minutes on a cold cache)."""
    saved = os.environ.get("XDG_CACHE_HOME")
    _set_xdg(_XDG_AT_START)
    try:
        return Path(build_script().build(target))
    finally:
        _set_xdg(saved)


def _set_xdg(value: str | None) -> None:
    if value is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = value


def native_bin(target: str = "linux-x86_64") -> Path:
    return bundle(target) / "bin" / "verify-runner"


SCHEMA = REPO / "verify" / "runner" / "contract.schema.json"


def validate(doc: object, kind: str) -> None:
    """Check doc against the contract's JSON Schema: kind is job, result, describe or
    dump_manifest (a $defs entry of verify/runner/contract.schema.json)."""
    import json

    import jsonschema

    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.validate(doc, {**schema, "$ref": f"#/$defs/{kind}"},
                        cls=jsonschema.Draft202012Validator)


def runner_argv(kind: str) -> list[str]:
    if kind == "python":
        return [sys.executable, str(PY_RUNNER)]
    if kind == "third":
        import shlex

        return shlex.split(THIRD)
    return [str(native_bin())]


@lru_cache(maxsize=None)
def unit_test_bin() -> Path:
    """runner/native/tests/ built from this checkout (its own build folder, incremental)."""
    saved = os.environ.get("XDG_CACHE_HOME")
    _set_xdg(_XDG_AT_START)
    try:
        return Path(build_script().unit_tests("linux-x86_64"))
    finally:
        _set_xdg(saved)


def minimal_root() -> Path:
    from verify.devices import arm64_root

    return Path(str(arm64_root()) + "-minimal")


@pytest.fixture
def arm64_native(device_env: DeviceEnv) -> str:
    """The shipped devices/arm64-native.toml, its {cache} pointed at the built bundles."""
    import shutil

    if shutil.which("qemu-aarch64-static") is None or not (minimal_root() / "lib").is_dir():
        pytest.skip("no minimal arm64 root or qemu: python scripts/build_arm64_root.py --minimal")
    cache = device_env.cache / "verify"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "native-runner").symlink_to(bundle("linux-aarch64").parent)
    return "arm64-native"
