"""`verify devices check SPEC --conformance`: the runner contract's checks against a profile's
runner, through the device's transport — passed by both of verify's runners (Python and
native, locally, and the native one under qemu arm64 in a root with no Python), failed by a
runner that breaks the contract (tests/broken_runner.py), with the check that caught it named."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fixtures_devices import DeviceEnv, device_env, run_cli  # noqa: F401
from fixtures_native import arm64_native, native_bin  # noqa: F401  (a fixture)

TESTS = Path(__file__).resolve().parent
BROKEN = TESTS / "broken_runner.py"
CHECKS = ["describe", "timed job", "bad model is kind model", "bad input is kind input",
          "missing provider is kind provider", "bad job exits 2", "dump job"]


def check(spec: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, bool], str]:
    """`verify devices check SPEC --conformance --json`: exit code, check name -> passed, the
    failing checks' details."""
    code, out, _ = run_cli(["devices", "check", spec, "--conformance", "--json"], capsys)
    report = json.loads(out)
    assert report["passed"] is (code == 0) and report["spec"] == spec
    return code, {c["name"]: c["passed"] for c in report["checks"]}, \
        "\n".join(f"{c['name']}: {c['detail']}" for c in report["checks"] if not c["passed"])


@pytest.mark.parametrize("runner", ["python", "native"])
def test_our_runners_conform(runner: str, device_env: DeviceEnv,
                             capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(native_bin())] if runner == "native" else \
        [sys.executable, str(TESTS.parent / "verify" / "runner" / "runner.py")]
    device_env.write_profile("dev", {"transport": "local", "runner": argv})
    code, out, err = run_cli(["devices", "check", "dev", "--conformance"], capsys)
    assert code == 0, out + err
    assert [ln.split(":")[0] for ln in out.splitlines()[:-1]] == [f"PASS  {n}" for n in CHECKS]
    assert out.splitlines()[-1] == "dev: all 7 checks passed"


def test_the_native_runner_conforms_under_qemu_without_python(
        arm64_native: str, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, checks, failed = check(arm64_native, capsys)
    assert code == 0 and checks == {name: True for name in CHECKS}, failed


@pytest.mark.parametrize("mode,failing", [
    ("outputs", {"timed job", "dump job"}),  # the dump is judged against a plain run
    ("kind", {"bad model is kind model", "bad input is kind input",
              "missing provider is kind provider"}),
    ("schema", {"timed job", "dump job"}),
    ("exit", {"bad job exits 2"}),
])
def test_a_broken_runner_fails_the_check_it_breaks(mode: str, failing: set[str],
                                                   device_env: DeviceEnv,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("broken", {"transport": "local",
                                        "runner": [sys.executable, str(BROKEN), "--break", mode]})
    code, checks, failed = check("broken", capsys)
    assert code == 1
    assert checks == {name: name not in failing for name in CHECKS}, failed
    code, out, _ = run_cli(["devices", "check", "broken", "--conformance"], capsys)
    assert code == 1 and out.splitlines()[-1] == f"broken: {len(failing)} of 7 checks failed"
