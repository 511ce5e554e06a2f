"""Helpers for tests that call the `verify` CLI in this process (a plain module, no fixtures)."""

from __future__ import annotations

import pytest

from fixtures_devices import run_cli


def verify(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """`verify ARGS` in this process: exit code, stdout, stderr (of this command only)."""
    return run_cli([str(a) for a in args], capsys)


def only_line(err: str) -> str:
    """The one non-blank line of `err` (fails the test if there are more)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one error line, got: {err!r}"
    return lines[0]
