"""A device profile's placeholders and timeouts are checked when it is read: an unset
{env:NAME} or an unknown placeholder is an error naming the key (it used to become an empty
string, and `{env:NOPE}/x` made folders at the file system's root), a timeout that is not a
number of seconds > 0 is refused, and `local:1` is not a device."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers_cli import only_line, verify


@pytest.fixture
def profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VERIFY_DEVICES", str(tmp_path))
    monkeypatch.delenv("NOPE", raising=False)
    return tmp_path


@pytest.mark.parametrize("body, message", [
    ('base_dir = "{env:NOPE}/x"', "line 2: base_dir: {env:NOPE}: $NOPE is not set"),
    ('base_dir = "{nosuch}/x"', "line 2: base_dir: unknown placeholder {nosuch} (known: "
                                "{base_dir}, {profile_dir}, {cache}, {arm64_root}, {env:NAME})"),
    ('[env]\nLD_LIBRARY_PATH = "{env:NOPE}/lib"', "line 3: env.LD_LIBRARY_PATH: {env:NOPE}: "
                                                   "$NOPE is not set"),
    ('[timeouts]\ncommand = "x"', "line 3: timeouts.command: expected a number of seconds > 0, "
                                  "got 'x'"),
    ('[timeouts]\nconnect = -1', "line 3: timeouts.connect: expected a number of seconds > 0, "
                                 "got -1"),
    ('[timeouts]\ncommand = 0', "line 3: timeouts.command: expected a number of seconds > 0, "
                                "got 0"),
])
def test_a_bad_profile_is_one_line_naming_the_key(capsys: pytest.CaptureFixture[str],
                                                  profiles: Path, body: str,
                                                  message: str) -> None:
    path = profiles / "board.toml"
    path.write_text(f'transport = "local"\n{body}\n', encoding="utf-8")
    code, _, err = verify(capsys, "devices", "check", "board")
    assert (code, only_line(err)) == (2, f"error: {path}: {message}")
    assert not Path("/x").exists()


def test_a_set_variable_is_used(capsys: pytest.CaptureFixture[str], profiles: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    from verify.devices import load_profile

    monkeypatch.setenv("NOPE", str(profiles / "here"))
    path = profiles / "board.toml"
    path.write_text('transport = "local"\nbase_dir = "{env:NOPE}/x"\n'
                    'runner = ["{base_dir}/bin/r"]\n', encoding="utf-8")
    profile = load_profile(path)
    assert profile.base_dir == f"{profiles}/here/x"
    assert profile.runner == (f"{profiles}/here/x/bin/r",)


def test_local_takes_no_target(capsys: pytest.CaptureFixture[str], profiles: Path) -> None:
    code, _, err = verify(capsys, "devices", "check", "local:1")
    assert (code, only_line(err)) == (2, "error: device 'local:1': local takes no target "
                                         "(cuda:N picks a GPU)")
