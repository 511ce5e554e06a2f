"""`verify localize` over real transports: a faulty device reached over ssh (a real sshd on
loopback) and over adb (a real adb server and a device end), and benign cross-platform noise
on the emulated ARM64 target, which must be "no faulty node" at default tolerances.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from fixtures_devices import run_cli

pytest.importorskip("paramiko",
                    reason="the ssh extra is not installed: pip install 'onnx-verify[ssh]'")


def _localize(argv: list, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code, out, err = run_cli(["localize", *argv, "--json"], capsys)
    assert code in (0, 1), err
    return code, json.loads(out)


@pytest.mark.parametrize("mode", ["dump", "bisect"])
def test_faulty_node_found_over_ssh(residual_vtc: Path, sshd_server, faulty_profile, mode: str,
                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = faulty_profile("board", "scale", "br1/conv", 1.01, ssh=sshd_server)
    extra = ["--no-dump"] if mode == "bisect" else []
    code, doc = _localize([residual_vtc, "--device", spec, "-o", tmp_path, *extra], capsys)
    assert code == 1
    assert (doc["verdict"], doc["suspect"]["name"]) == ("faulty here", "br1/conv")
    assert doc["device"]["spec"] == spec == "ssh:board"  # as typed, not the profile's name
    repro = Path(doc["repro"])
    code, out, err = run_cli(["run", repro, "--device", spec, "--iter", "1"], capsys)
    assert code == 1, err
    code, out, err = run_cli(["run", repro, "--device", "local", "--iter", "1"], capsys)
    assert code == 0, err


def test_the_replay_line_keeps_insecure_host_key(residual_vtc: Path, sshd_server, device_env,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A board whose host key is not known: the search reached it with --insecure-host-key,
    and the replay line it printed, without it, was refused there."""
    import sys

    from fixtures_localize import FAULTY_RUNNER

    known = tmp_path / "known_hosts"
    known.write_text("")
    runner = [sys.executable, str(FAULTY_RUNNER), "--fault", "scale", "--node", "br1/conv",
              "--value", "1.01"]
    spec = device_env.ssh_profile("fresh", sshd_server, device_env.cache / "ssh-fresh",
                                  runner=runner, options={"known_hosts": str(known)})
    with pytest.warns(UserWarning, match="not checking the host key"):
        code, out, err = run_cli(["localize", residual_vtc, "--device", spec,
                                  "--insecure-host-key", "-o", tmp_path], capsys)
    assert code == 1, err
    replay = next(ln for ln in out.splitlines() if ln.lstrip().startswith("replay:"))
    assert replay.endswith(" --insecure-host-key")
    with pytest.warns(UserWarning, match="not checking the host key"):
        code, _, err = run_cli(replay.split()[2:], capsys)  # `verify run ...` as printed
    assert code == 1, err  # the repro fails there


def test_faulty_node_found_over_adb(residual_vtc: Path, adb_server, adb_device, device_env,
                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from fixtures_localize import FAULTY_RUNNER

    base = adb_device.sandbox / f"loc-{secrets.token_hex(4)}" / "verify"
    runner = [sys.executable, str(FAULTY_RUNNER), "--fault", "leaky", "--node", "br0/relu",
              "--value", "0.1"]
    spec = device_env.adb_profile("phone", adb_server, adb_device, base, runner=runner)
    code, doc = _localize([residual_vtc, "--device", spec, "-o", tmp_path, "--no-dump"], capsys)
    assert code == 1
    assert (doc["verdict"], doc["suspect"]["name"]) == ("faulty here", "br0/relu")


def test_ssh_device_gone_exits_3(residual_vtc: Path, sshd_factory, faulty_profile,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    server = sshd_factory()
    spec = faulty_profile("gone", "scale", "br1/conv", 1.01, ssh=server)
    server.stop()
    code, out, err = run_cli(["localize", residual_vtc, "--device", spec], capsys)
    assert code == 3 and out == ""
    assert err == (f"error: {spec} (ssh:{server.address}): connection refused by 127.0.0.1 port "
                   f"{server.port}; is sshd running there?\n")


@pytest.mark.arm64
@pytest.mark.slow
@pytest.mark.parametrize("archive", ["cnn_vtc", "residual_vtc"])
@pytest.mark.parametrize("extra", [[], ["--no-dump"], ["--opt-level", "disable"]],
                         ids=["dump", "bisect", "opt-off"])
def test_arm64_noise_is_no_faulty_node(archive: str, extra: list[str],
                                       device_env, request: pytest.FixtureRequest,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    vtc = request.getfixturevalue(archive)
    code, doc = _localize([vtc, "--device", "arm64", *extra], capsys)
    assert code == 0
    assert doc["device"]["arch"] == "aarch64"
    assert doc["verdict"] == "no faulty node" and doc["repro"] is None
    assert doc["round_trips"] == (2 if doc["mode"] == "dump" else 1)


# A runner that pulls the cable: on the first piece of a search it kills the adb device end it
# runs under ($DEVICE_END_PID), then dies itself.
_UNPLUGGING_RUNNER = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import faulty_runner
run = faulty_runner.run_faulty
def unplug(args, runner, path):
    import json, onnx
    job = json.load(open(path))
    model = onnx.load(os.path.join(os.path.dirname(os.path.abspath(path)), job["model"]))
    if model.producer_name == "verify-localize":
        os.kill(int(os.environ["DEVICE_END_PID"]), signal.SIGKILL)
        os._exit(9)
    return run(args, runner, path)
faulty_runner.run_faulty = unplug
sys.exit(faulty_runner.main(sys.argv))
"""


def test_an_adb_device_unplugged_mid_search_is_named_not_a_killed_runner(
        residual_vtc: Path, adb_server, device_env, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The driver said "device offline (was it unplugged?)" fetching the result; the session
    swallowed that and said the runner "was killed by signal 9", which sends an Android user
    after the low-memory killer."""
    import re
    import sys

    script = tmp_path / "unplugging_runner.py"
    script.write_text(_UNPLUGGING_RUNNER.format(tests=str(Path(__file__).parents[1])))
    device = adb_server.attach(tmp_path / "sandbox")
    try:
        spec = device_env.adb_profile(
            "phone", adb_server, device, device.sandbox / "verify",
            runner=[sys.executable, str(script), "--fault", "scale", "--node", "br1/conv"],
            env={"DEVICE_END_PID": str(device.proc.pid)})
        code, out, err = run_cli(["localize", residual_vtc, "--device", spec, "--no-dump",
                                  "-o", tmp_path / "out"], capsys)
    finally:
        adb_server.detach(device)
    assert (code, out) == (3, ""), err
    assert "killed by signal" not in err
    assert re.fullmatch(r"error: adb:phone \(adb:127\.0\.0\.1:\d+\): \S+ .*failed: device "
                        r"(offline|'.*' not found) \(was it unplugged\? see `adb devices`\) "
                        r"\(in round \d+ of the search: .*\)\n",
                        err), err
    assert not (tmp_path / "out").exists()
