"""Fixtures for end-to-end device tests: a small archive, profiles written into $VERIFY_DEVICES,
and helpers that run the `verify` CLI in-process or as a subprocess.

Runs are isolated from the user's machine: $XDG_CACHE_HOME points into the test's temp dir (so
the local device's work area is private) and $VERIFY_ARM64_ROOT keeps pointing at the built
emulated root, which lives in the real cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from verify.devices import arm64_root

REPO = Path(__file__).resolve().parent.parent
ALT_RUNNER = Path(__file__).resolve().parent / "alt_runner.py"

__all__ = ["device_env", "small_vtc"]


@dataclass
class DeviceEnv:
    """A private profile folder on $VERIFY_DEVICES and a private verify cache."""

    profiles: Path
    cache: Path
    env: dict[str, str]

    def write_profile(self, name: str, data: Mapping[str, Any]) -> Path:
        """Write devices/NAME.toml from a dict (tables as nested dicts, [[push]] as a list)."""
        path = self.profiles / f"{name}.toml"
        path.write_text(to_toml(data), encoding="utf-8")
        return path

    def ssh_profile(self, name: str, server: Any, base_dir: Path, **extra: Any) -> str:
        """A profile for a fixtures_ssh server; returns the spec `ssh:NAME`."""
        options = {"known_hosts": str(server.known_hosts), "identity": str(server.client_key),
                   "ssh_config": "none", **extra.pop("options", {})}
        self.write_profile(name, {"transport": "ssh", "address": server.address,
                                  "python": [sys.executable], "base_dir": str(base_dir),
                                  **extra, "options": options})
        return f"ssh:{name}"

    def adb_profile(self, name: str, server: Any, device: Any, base_dir: Path,
                    **extra: Any) -> str:
        """A profile for a fixtures_adb device end (None: no serial); returns `adb:NAME`."""
        self.write_profile(name, {"transport": "adb", "address": device.address if device else "",
                                  "python": [sys.executable], "base_dir": str(base_dir), **extra,
                                  "options": {"adb_port": server.port}})
        return f"adb:{name}"

    def local_jobs(self) -> Path:
        """Where `--device local` (and other local-transport profiles) put work directories."""
        return self.cache / "verify" / "local" / "jobs"


def to_toml(data: Mapping[str, Any]) -> str:
    """The small TOML subset profiles need (JSON strings and lists are valid TOML values)."""
    def value_text(v: Any) -> str:
        if isinstance(v, dict):  # an inline table
            return "{" + ", ".join(f"{k} = {value_text(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)

    head, tables = [], []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append(f"\n[{key}]")
            tables += [f"{k} = {value_text(v)}" for k, v in value.items()]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                tables.append(f"\n[[{key}]]")
                tables += [f"{k} = {json.dumps(v)}" for k, v in item.items()]
        else:
            head.append(f"{key} = {json.dumps(value)}")
    return "\n".join(head + tables) + "\n"


@pytest.fixture
def device_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DeviceEnv:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    cache = tmp_path / "xdg-cache"
    root = str(arm64_root())  # resolved before XDG_CACHE_HOME moves
    monkeypatch.setenv("VERIFY_DEVICES", str(profiles))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("VERIFY_ARM64_ROOT", root)
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)
    monkeypatch.setenv("CI", "1")
    return DeviceEnv(profiles, cache, dict(os.environ))


@pytest.fixture(scope="session")
def small_vtc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """goldens/models/two_io.onnx packed with seeded random inputs (two inputs, two outputs)."""
    from verify.cli import main

    out = tmp_path_factory.mktemp("vtc") / "two_io.vtc"
    code = main(["pack", str(REPO / "goldens" / "models" / "two_io.onnx"), "-o", str(out)])
    assert code == 0 and out.is_file()
    yield out


def run_cli(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`verify ARGV` in this process: exit code, stdout, stderr."""
    from verify.cli import main

    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """`verify ARGV --json`, which must exit 0; its document."""
    code, out, err = run_cli([*argv, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def verify_process(argv: Sequence[str], env: Mapping[str, str], **kwargs: Any) -> subprocess.Popen[str]:
    """`verify ARGV` as a child process, through the `verify` command's own entry point
    (main() reading sys.argv, which also decides how the process ends)."""
    # SIGINT as at a terminal, even when the test runner's own SIGINT is ignored (background).
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from verify.cli import main; main()")
    options = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE,
               "stderr": subprocess.PIPE, "text": True, "cwd": str(REPO), **kwargs}
    return subprocess.Popen([sys.executable, "-c", code, *map(str, argv)], env=dict(env),
                            **options)
