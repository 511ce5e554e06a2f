"""Device specs, profiles (the shipped ones included), `verify devices list` and `check`."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fixtures_devices import REPO, DeviceEnv, run_cli, run_json

from verify.devices import CPU, CUDA, load_profile, profile_dirs, resolve
from verify.errors import ProfileError, UsageError

SHIPPED = {"local", "cuda", "board", "phone", "arm64"}


# --- the spec grammar -------------------------------------------------------------------------
@pytest.mark.parametrize("spec, transport, address, name", [
    ("ssh:me@192.0.2.10:2222", "ssh", "me@192.0.2.10:2222", "ssh:me@192.0.2.10:2222"),
    ("ssh:board.lan", "ssh", "board.lan", "ssh:board.lan"),
    ("adb:R58M12ABCDE", "adb", "R58M12ABCDE", "adb:R58M12ABCDE"),
    ("adb", "adb", "", "adb"),
])
def test_builtin_specs(device_env: DeviceEnv, spec: str, transport: str, address: str,
                       name: str) -> None:
    p = resolve(spec)
    assert (p.transport, p.address, p.spec, p.source) == (transport, address, name, None)
    assert p.providers == (CPU,)


def test_shipped_profiles_back_local_and_cuda(device_env: DeviceEnv) -> None:
    local = resolve("local")
    assert (local.transport, local.providers, local.source) == \
        ("local", (CPU,), REPO / "devices" / "local.toml")
    gpu = resolve("cuda")
    assert (gpu.transport, gpu.spec, gpu.providers) == ("local", "cuda", (CUDA, CPU))
    assert gpu.provider_options[CUDA]["device_id"] == 0
    second = resolve("cuda:1")
    assert (second.spec, second.provider_options[CUDA]["device_id"]) == ("cuda:1", 1)
    assert second.provider_options[CUDA]["cudnn_conv_algo_search"] == "EXHAUSTIVE"


@pytest.mark.parametrize("spec, message", [
    ("", "device spec '' is empty"),
    ("cuda:x", "device 'cuda:x': cuda takes a GPU index, e.g. cuda:0"),
    ("ssh:me@host:port", "device 'ssh:me@host:port': expected ssh:user@host[:port]"),
    ("nosuch", "unknown device 'nosuch': no profile nosuch.toml in "),
    ("ssh:phone", "device 'ssh:phone': profile "),
])
def test_bad_specs_are_usage_errors(device_env: DeviceEnv, spec: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        resolve(spec)
    assert str(info.value).startswith(message)


def test_profile_by_name_or_by_transport_and_name(device_env: DeviceEnv) -> None:
    device_env.write_profile("pi", {"transport": "ssh", "address": "pi@10.0.0.2",
                                    "python": "/usr/bin/python3 -X utf8"})
    for spec in ("pi", "ssh:pi"):
        p = resolve(spec)
        assert (p.spec, p.target, p.python, p.source) == \
            (spec, "ssh:pi@10.0.0.2", ("/usr/bin/python3", "-X", "utf8"),
             device_env.profiles / "pi.toml")
    with pytest.raises(UsageError, match="profile .*pi.toml is for transport 'ssh', not 'adb'"):
        resolve("adb:pi")


def test_profiles_on_verify_devices_win_over_shipped_ones(device_env: DeviceEnv) -> None:
    device_env.write_profile("board", {"transport": "ssh", "address": "me@mine"})
    assert resolve("board").address == "me@mine"


def test_placeholders(device_env: DeviceEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERIFY_ARM64_ROOT", "/opt/arm64")
    monkeypatch.setenv("SDK", "/opt/sdk")
    path = device_env.write_profile("p", {
        "transport": "adb", "base_dir": "/data/local/tmp/v",
        "runner": ["{base_dir}/bin/r", "--root", "{arm64_root}"],
        "env": {"LD_LIBRARY_PATH": "{base_dir}/lib:{env:SDK}/lib"},
        "push": [{"src": "build/r", "dest": "bin/r"}]})
    p = load_profile(path)
    assert p.runner == ("/data/local/tmp/v/bin/r", "--root", "/opt/arm64")
    assert p.env == {"LD_LIBRARY_PATH": "/data/local/tmp/v/lib:/opt/sdk/lib"}
    assert (p.push[0].src, p.push[0].dest) == (path.parent / "build" / "r", "bin/r")
    assert load_profile(REPO / "devices" / "arm64.toml").python[2] == "/opt/arm64"


@pytest.mark.parametrize("text, message", [
    ("transport = ", "not valid TOML: "),
    ('transport = "ssh"\nadress = "x"', "line 2: adress: unknown key (known: address, "
                                          "base_dir, description, env, options, provider_options, "
                                          "providers, push, python, runner, timeouts, transport)"),
    ("address = 'x'", "transport: missing: one of local, cuda, ssh, adb or a third-party "
                      "driver's name"),
    ("transport = 3", "line 1: transport: must be one of local, cuda, ssh, adb or a third-party "
                      "driver's name"),
    ('transport = "ssh"\npython = 3', "line 2: python: must be a list of strings"),
    ('transport = "ssh"\n[[push]]\nsrc = "a"', "line 2: push[0]: needs string keys src and dest"),
    ('transport = "ssh"\n[[push]]\nsrc = "a"\ndest = "b"\n\n[[push]]\nsrc = "c"\ndest = "d"\n'
     'mode = 1', "line 9: push[1].mode: unknown key (known: src, dest)"),
    ('transport = "ssh"\n[provider_options]\nCUDAExecutionProvider = 1',
     "line 3: provider_options.CUDAExecutionProvider: must be a table"),
    ('transport = "ssh"\nenv = "x"', "line 2: env: must be a table"),
])
def test_malformed_profiles(device_env: DeviceEnv, text: str, message: str) -> None:
    """The same reader (tomltable) as ci suites: FILE: line N: key.path: message."""
    path = device_env.profiles / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError) as info:
        resolve("bad")
    assert str(info.value).startswith(f"{path}: {message}"), str(info.value)


def test_every_shipped_profile_loads() -> None:
    found = {p.stem: load_profile(p) for p in (REPO / "devices").glob("*.toml")}
    assert SHIPPED <= set(found)
    assert found["board"].transport == "ssh" and found["phone"].transport == "adb"
    assert found["phone"].runner and found["phone"].env["LD_LIBRARY_PATH"].endswith("/lib")
    assert found["arm64"].python[0] == "qemu-aarch64-static"


# --- verify devices list / check ---------------------------------------------------------------
def test_devices_list(device_env: DeviceEnv, capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("mine", {"transport": "ssh", "address": "me@box",
                                      "description": "my box"})
    doc = run_json(["devices", "list"], capsys)
    assert doc["search_path"][0] == str(device_env.profiles)
    rows = {r["name"]: r for r in doc["profiles"]}
    assert SHIPPED | {"mine"} <= set(rows)
    assert (rows["mine"]["spec"], rows["mine"]["description"]) == ("ssh:me@box", "my box")
    assert rows["phone"]["runner"] == "native" and rows["arm64"]["runner"] == "python"
    code, out, err = run_cli(["devices", "list"], capsys)
    assert code == 0 and err == ""
    names = [line.split()[0] for line in out.splitlines()[2:]]
    assert SHIPPED | {"mine"} <= set(names)
    assert doc["problems"] == []


def test_devices_list_shows_the_rest_and_names_a_broken_profile(
        device_env: DeviceEnv, capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("mine", {"transport": "ssh", "address": "me@box"})
    bad = device_env.profiles / "zz.toml"
    bad.write_text('transport = "ssh"\nbogus = 1\n')
    (device_env.profiles / "local.toml").write_text("not toml [")  # shadows the shipped local
    code, out, err = run_cli(["devices", "list"], capsys)
    assert code == 2
    names = [line.split()[0] for line in out.splitlines()[2:]]
    assert "mine" in names and "phone" in names and "zz" not in names and "local" not in names
    lines = err.splitlines()
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines)
    assert any(f"{bad}: line 2: bogus: unknown key" in line for line in lines)
    code, out, _ = run_cli(["devices", "list", "--json"], capsys)
    doc = json.loads(out)
    assert code == 2 and len(doc["problems"]) == 2 and "mine" in {r["name"] for r in doc["profiles"]}


def test_devices_check_local(device_env: DeviceEnv, capsys: pytest.CaptureFixture[str]) -> None:
    info = run_json(["devices", "check", "local"], capsys)
    assert (info["arch"], info["spec"], info["transport"]) == (platform.machine(), "local", "local")
    assert info["python"] == platform.python_version()
    assert CPU in info["providers"] and info["free_disk_bytes"] > 0
    code, out, err = run_cli(["devices", "check", "local"], capsys)
    assert err == ""
    assert code == 0 and out.splitlines()[0] == "device local: reachable"
    assert f"  arch         {platform.machine()}" in out.splitlines()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm, a second file system")
def test_devices_check_reports_the_free_disk_of_the_work_folder(
        device_env: DeviceEnv, capsys: pytest.CaptureFixture[str]) -> None:
    """A profile whose base_dir is on another file system (tmpfs) than the folder verify runs
    in: the free disk shown is the base_dir's, where dumps go (it was the CLI's folder's, and
    over adb /'s)."""
    base = tempfile.mkdtemp(prefix="verify-free-", dir="/dev/shm")
    try:
        device_env.write_profile("shm", {"transport": "local", "base_dir": base})
        info = run_json(["devices", "check", "shm"], capsys)
        free = {path: os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
                for path in (base, os.getcwd())}
        assert abs(info["free_disk_bytes"] - free[base]) < 64 << 20
        if abs(free[base] - free[os.getcwd()]) > 256 << 20:  # told apart: not the CLI's
            assert abs(info["free_disk_bytes"] - free[os.getcwd()]) > 128 << 20
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_devices_check_ssh_and_adb(device_env: DeviceEnv, sshd_server, adb_server, adb_device,
                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ssh = device_env.ssh_profile("b", sshd_server, tmp_path / "b")
    adb = device_env.adb_profile("p", adb_server, adb_device, adb_device.sandbox / "chk" / "v")
    for spec, transport in ((ssh, "ssh"), (adb, "adb")):
        info = run_json(["devices", "check", spec], capsys)
        assert (info["spec"], info["transport"], info["arch"], info["onnxruntime"]) == \
            (spec, transport, platform.machine(), __import__("onnxruntime").__version__)
    code, out, err = run_cli(["devices", "check", ssh], capsys)
    assert (code, err, out.splitlines()[0]) == (0, "", "device ssh:b: reachable")


def test_reports_name_the_device_as_typed(device_env: DeviceEnv, small_vtc: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`TRANSPORT:NAME` takes the profile NAME, and every report says `TRANSPORT:NAME`."""
    device_env.write_profile("mine", {"transport": "local", "python": [sys.executable],
                                      "base_dir": str(tmp_path / "mine")})
    assert run_json(["devices", "check", "local:mine"], capsys)["spec"] == "local:mine"
    doc = run_json(["run", small_vtc, "--device", "local:mine", "--iter", "1"], capsys)
    assert doc["device"]["spec"] == "local:mine"
    code, out, err = run_cli(["run", small_vtc, "--device", "local:mine", "--iter", "1"], capsys)
    assert code == 0, err
    assert [ln for ln in out.splitlines() if ln.startswith("device ")][0].startswith(
        "device local:mine: ")
    code, out, err = run_cli(["devices", "clean", "local:mine"], capsys)
    assert (code, err, out.splitlines()[-1]) == (0, "", "device local:mine: clean")
    code, out, err = run_cli(["devices", "check", "mine"], capsys)  # by name: the name
    assert (code, err, out.splitlines()[0]) == (0, "", "device mine: reachable")


def test_a_push_file_that_is_missing_names_the_profile_file(
        device_env: DeviceEnv, small_vtc: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    toml = device_env.write_profile("libs", {"transport": "local", "python": [sys.executable],
                                             "base_dir": str(tmp_path / "libs"),
                                             "push": [{"src": "lib/libgone.so",
                                                       "dest": "lib/libgone.so"}]})
    message = f"error: {toml}: [[push]] src {toml.parent / 'lib' / 'libgone.so'} does not exist\n"
    code, out, err = run_cli(["run", small_vtc, "--device", "local:libs", "--iter", "1"], capsys)
    assert (code, out, err) == (2, "", message)
    assert not (tmp_path / "libs").exists()  # refused before connecting: nothing was sent
    code, out, err = run_cli(["devices", "check", "local:libs"], capsys)
    assert (code, err) == (2, message)


def test_devices_check_a_runner_that_cannot_start(device_env: DeviceEnv,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("broken", {"transport": "local", "python": [
        sys.executable, "-c", "import sys; sys.stderr.write('no onnxruntime here\\n'); sys.exit(1)"]})
    code, out, err = run_cli(["devices", "check", "broken"], capsys)
    assert (code, out) == (3, "")
    assert err.startswith("error: broken: the runner could not start (")
    assert err.endswith(" exited 1): no onnxruntime here\n")


def test_devices_check_missing_arm64_root(device_env: DeviceEnv, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VERIFY_ARM64_ROOT", str(tmp_path / "no-root"))
    code, out, err = run_cli(["devices", "check", "arm64"], capsys)
    assert (code, out) == (3, "")
    assert err == (f"error: arm64: {tmp_path / 'no-root'} does not exist; build the emulated "
                   "ARM64 userland with python scripts/build_arm64_root.py\n")


def test_devices_check_unknown_device_is_a_usage_error(device_env: DeviceEnv,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["devices", "check", "nosuch"], capsys)
    assert (code, out) == (2, "")
    dirs = ", ".join(str(d) for d in profile_dirs())
    assert dirs.startswith(str(device_env.profiles))
    assert err == (f"error: unknown device 'nosuch': no profile nosuch.toml in {dirs}; use "
                   "local, cuda[:N], ssh:user@host[:port], adb[:SERIAL] or a profile name\n")


def test_a_mistyped_profile_name_gets_a_suggestion(device_env: DeviceEnv,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["devices", "check", "arm65"], capsys)
    assert code == 2
    assert "no profile arm65.toml in " in err
    assert "; did you mean 'arm64'? use local, cuda[:N]" in err


@pytest.mark.parametrize("spec, word", [("local:", "PROFILE"), ("adb:", "SERIAL"),
                                        ("cuda:", "N"), ("ssh:", "user@host[:port]")])
def test_a_spec_ending_in_a_colon_is_refused(device_env: DeviceEnv, spec: str,
                                            word: str) -> None:
    """`local:` ran on the local device and `adb:` on adb's default one, as if no target had
    been left out by mistake."""
    with pytest.raises(UsageError) as caught:
        resolve(spec)
    transport = spec[:-1]
    alone = "" if transport == "ssh" else f"{transport} alone or "  # `ssh` alone names no host
    assert str(caught.value) == f"device {spec!r}: nothing after ':'; give {alone}{transport}:{word}"


def test_unknown_transport_lists_the_available_ones(device_env: DeviceEnv,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("odd", {"transport": "serial", "address": "/dev/ttyUSB0"})
    code, out, err = run_cli(["devices", "check", "odd"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("error: unknown transport 'serial'; available: adb, local, ssh")


def test_a_missing_driver_library_names_the_extra(device_env: DeviceEnv) -> None:
    """Without paramiko the ssh transport says what to install; everything else still works."""
    code = ("import sys; sys.modules['paramiko'] = None; from verify.cli import main; "
            "print(main(['devices', 'check', 'local', '--json']) == 0, flush=True); "
            "sys.exit(main(['devices', 'check', 'ssh:me@127.0.0.1:1']))")
    proc = subprocess.run([sys.executable, "-c", code], env=device_env.env, capture_output=True,
                          check=False, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2  # set-up, not a device failure: nothing to retry
    assert proc.stdout.splitlines()[-1] == "True"
    assert proc.stderr == ("error: the ssh transport needs the paramiko package: "
                           "pip install 'onnx-verify[ssh]'\n")


HELD_RUNNER = '''
import os, runpy, sys, time
if "--describe" not in sys.argv:
    open({started!r}, "w").close()
    while not os.path.exists({go!r}):
        time.sleep(0.05)
sys.argv = [{runner!r}, *sys.argv[1:]]
runpy.run_path({runner!r}, run_name="__main__")
'''


def test_clean_leaves_a_device_in_use_alone(device_env: DeviceEnv, small_vtc: Path,
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A run under way from another process (its runner held before it starts the job), and
    `devices clean` of another profile on the same local work folder: refused in one line
    (exit 2), the run's job folder untouched, and the run then passes. Every local profile
    shares one folder, so the clean deleted the live job folder and the run failed (exit 3).
    Once the run has ended, the clean goes through."""
    held = tmp_path / "held_runner.py"
    started, go = tmp_path / "started", tmp_path / "go"
    held.write_text(HELD_RUNNER.format(started=str(started), go=str(go),
                                       runner=str(REPO / "verify" / "runner" / "runner.py")))
    device_env.write_profile("slow", {"transport": "local", "python": [sys.executable],
                                      "runner": [sys.executable, str(held)]})
    device_env.write_profile("other", {"transport": "local", "python": [sys.executable]})
    run = subprocess.Popen([sys.executable, "-m", "verify", "run", str(small_vtc), "--device",
                            "local:slow", "--iter", "1"], env=device_env.env, cwd=tmp_path,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):
            if started.exists() or run.poll() is not None:
                break
            __import__("time").sleep(0.05)
        assert started.exists(), run.communicate()[1]
        jobs = list(device_env.local_jobs().iterdir())
        assert len(jobs) == 1
        code, out, err = run_cli(["devices", "clean", "local:other"], capsys)
        assert (code, out) == (2, "")
        assert err == ("error: local:other: a verify command on this host is using this device "
                       "now (a run, dump, localize or ci job); clean it when that has ended\n")
        assert jobs[0].is_dir()
        go.touch()
        out, err = run.communicate(timeout=120)
    finally:
        go.touch()
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    assert out.splitlines()[-1].startswith("=== PASS")
    code, out, err = run_cli(["devices", "clean", "local:other"], capsys)
    assert (code, err, out.splitlines()[-1]) == (0, "", "device local:other: clean")
    assert not device_env.local_jobs().exists()


def test_a_cache_that_takes_no_lock_leaves_runs_unguarded_not_refused(
        device_env: DeviceEnv, small_vtc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The device lock lives in verify's cache; where no lock file can be made there (the
    cache folder is a file here, as a read-only or full disk would refuse it), runs and
    cleans go on as they did before there was a lock, rather than every run failing."""
    blocked = tmp_path / "cache-is-a-file"
    blocked.write_text("")
    device_env.write_profile("own", {"transport": "local", "python": [sys.executable],
                                     "base_dir": str(tmp_path / "own")})
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    code, out, err = run_cli(["run", small_vtc, "--device", "local:own", "--iter", "1"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["devices", "clean", "local:own"], capsys)
    assert (code, out.splitlines()[-1]) == (0, "device local:own: clean")
