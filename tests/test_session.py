"""One device session per command (verify/session.py): bench's settings × rounds and localize's
rounds open ONE device connection and start ONE runner process where the runner serves
(docs/runner-contract.md, "Serve"); a runner that does not serve gets one process per job; a
serving runner that dies or overruns ends the command as a one-shot runner would (exit 3, one
line, nothing left running).

Counted independently of what verify reports: runner starts by tests/counting_python.py (a
python that logs its pid and arguments, then execs the real one), connections by the driver's
own `_open_impl` (local) or the real sshd's log of accepted logins (ssh)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fixtures_devices import run_cli
from fixtures_localize import FAULTY_RUNNER
from sshd_host import process_alive
from verify.dump import open_dump

TESTS = Path(__file__).resolve().parent
COUNTING = TESTS / "counting_python.py"
RUNNER = TESTS.parent / "verify" / "runner" / "runner.py"


def _starts(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def _connections(transport: str, monkeypatch: pytest.MonkeyPatch,
                 device: Any) -> Callable[[], int]:
    """A counter of device connections opened from now on: logins the real sshd accepted, or
    the local and adb drivers' own connects."""
    if transport == "ssh":
        before = device.log_text().count("Accepted publickey")
        return lambda: device.log_text().count("Accepted publickey") - before
    from verify.drivers.adb import AdbDriver
    from verify.drivers.local import LocalDriver

    cls: Any = AdbDriver if transport == "adb" else LocalDriver
    opened: list[int] = []
    real = cls._open_impl

    def counted(self: Any) -> None:
        opened.append(1)
        real(self)

    monkeypatch.setattr(cls, "_open_impl", counted)
    return lambda: len(opened)


def _profile(device_env: Any, transport: str, name: str, device: Any, **fields: Any) -> str:
    if transport == "ssh":
        return device_env.ssh_profile(name, device, device_env.cache / f"ssh-{name}", **fields)
    if transport == "adb":
        server, end = device
        return device_env.adb_profile(name, server, end, device_env.cache / f"adb-{name}",
                                      **fields)
    device_env.write_profile(name, {"transport": "local", **fields})
    return name


@pytest.fixture(params=["local", "ssh", "adb"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def sshd(transport: str, request: pytest.FixtureRequest) -> Any:
    """The device end of `transport`: the real sshd, the adb server and device end, or None."""
    if transport == "ssh":
        return request.getfixturevalue("sshd_server")
    if transport == "adb":
        return request.getfixturevalue("adb_server"), request.getfixturevalue("adb_device")
    return None


def test_bench_opens_one_connection_and_starts_one_runner(
        transport: str, sshd: Any, device_env: Any, cnn_two_cases: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "starts.log"
    spec = _profile(device_env, transport, "counted", sshd,
                    python=[sys.executable, str(COUNTING), str(log)])
    connections = _connections(transport, monkeypatch, sshd)
    settings, rounds = 3, 3
    code, out, err = run_cli(["bench", cnn_two_cases, "--device", spec, "--opt-levels",
                              "disable,basic,all", "--repeat", rounds, "--iter", 2, "--json"],
                             capsys)
    assert code == 0, err
    doc = json.loads(out)
    starts = _starts(log)
    assert [s["argv"][1:] for s in starts] == [["--serve"]]  # one runner, serving 9 jobs
    assert connections() == 1
    assert doc["session"] == {"connections": 1, "runner_starts": 1, "jobs": settings * rounds}
    # every job ran: 2 cases x 2 iterations x 3 rounds per setting, each checked
    assert [len(r["iter_ms"]) for r in doc["results"]] == [2 * 2 * rounds] * settings
    assert all(r["passed"] for r in doc["results"])


@pytest.mark.parametrize("level", ["disable", "all"])
def test_a_dump_run_starts_one_runner(
        level: str, transport: str, sshd: Any, device_env: Any, cnn_two_cases: Path,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`verify run --bin-io-dump`: above opt-level disable the timed job and then the dump job
    go to one serving runner, which forks a child for the dump (its ready line says "dumps":
    true); at disable the timed runner forks the dump before its session. One runner start
    either way, and the dump whole."""
    log = tmp_path / "starts.log"
    spec = _profile(device_env, transport, f"dumping-{level}", sshd,
                    python=[sys.executable, str(COUNTING), str(log)])
    out = tmp_path / "d"
    code, _, err = run_cli(["run", cnn_two_cases, "--device", spec, "--iter", 1, "--warmup", 0,
                            "--opt-level", level, "--bin-io-dump", out], capsys)
    assert code == 0, err
    starts = [s["argv"][1:] for s in _starts(log)]
    assert len(starts) == 1 and (starts[0] == ["--serve"]) == (level != "disable"), starts
    dump = open_dump(out)
    assert dump.graph == ("model" if level == "disable" else "optimized")
    for case in dump.case_numbers:
        entries = dump.entries(case)
        assert len(entries) > 5 and all(dump.load(e).shape == e.shape for e in entries)


def test_a_serving_runner_that_does_not_fork_dumps_gets_a_process_for_the_dump(
        device_env: Any, cnn_two_cases: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A runner that serves but whose ready line does not say "dumps": true (the faulty
    runner, which serves through a function of its own) runs the timed job served and the
    dump job in a process of its own, as before serving dumps existed."""
    log = tmp_path / "starts.log"
    device_env.write_profile("no-fork", {"transport": "local", "runner": [
        sys.executable, str(COUNTING), str(log), str(FAULTY_RUNNER), "--fault", "scale",
        "--node", "no-such-node"]})
    code, _, err = run_cli(["run", cnn_two_cases, "--device", "no-fork", "--iter", 1,
                            "--opt-level", "all", "--bin-io-dump", tmp_path / "d"], capsys)
    assert code == 0, err
    assert [s["argv"][-1].rsplit("/", 1)[-1] for s in _starts(log)] == [
        "--describe", "--serve", "dump_job.json"]
    assert open_dump(tmp_path / "d").graph == "optimized"


def test_localize_rounds_share_one_connection_and_one_runner(
        transport: str, sshd: Any, device_env: Any, residual_vtc: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "starts.log"
    spec = _profile(device_env, transport, "faulty", sshd, runner=[
        sys.executable, str(COUNTING), str(log), str(FAULTY_RUNNER), "--fault", "scale",
        "--node", "br1/conv"])
    connections = _connections(transport, monkeypatch, sshd)
    code, out, err = run_cli(["localize", residual_vtc, "--device", spec, "--no-dump",
                              "-o", tmp_path / "repro", "--json"], capsys)
    assert code == 1, err
    doc = json.loads(out)
    assert doc["suspect"]["name"] == "br1/conv"  # the fault was in every served round
    assert doc["round_trips"] >= 4
    # a runner of its own (profile `runner`) is asked once whether it serves, then serves
    assert [s["argv"][-1] for s in _starts(log)] == ["--describe", "--serve"]
    assert connections() == 1


def test_a_runner_that_does_not_serve_runs_one_process_per_job(
        device_env: Any, cnn_two_cases: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "starts.log"
    device_env.write_profile("third", {"transport": "local", "runner": [
        sys.executable, str(COUNTING), str(log), str(TESTS / "alt_runner.py")]})
    code, out, err = run_cli(["bench", cnn_two_cases, "--device", "third", "--opt-levels",
                              "disable,all", "--repeat", 2, "--iter", 1], capsys)
    assert code == 0, err
    kinds = [s["argv"][-1].rsplit("/", 1)[-1] for s in _starts(log)]
    assert kinds == ["--describe"] + ["job.json"] * 4
    assert ("device session: 1 connection, 5 runner processes started for 4 jobs (the runner "
            "does not serve: one each)") in out


def test_one_bench_job_says_nothing_of_serving(device_env: Any, cnn_two_cases: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """One setting, one job, one runner start: that is no sign of a runner that does not
    serve, which the line said of verify's own runner."""
    code, out, err = run_cli(["bench", cnn_two_cases, "--device", "local", "--setting",
                              "opt=all", "--iter", 1], capsys)
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("device session: "))
    assert line.endswith("started for 1 job"), line


def test_a_serving_runner_that_dies_mid_bench_exits_3(
        device_env: Any, cnn_two_cases: Path, capsys: pytest.CaptureFixture[str]) -> None:
    device_env.write_profile("dying", {"transport": "local", "runner": [
        sys.executable, str(TESTS / "dying_server.py"), "2"]})
    code, out, err = run_cli(["bench", cnn_two_cases, "--device", "dying", "--opt-levels",
                              "disable,all", "--iter", 1], capsys)
    assert (code, out) == (3, "")
    assert err == ("error: dying: the runner exited with status 9 without writing a result: "
                   "dying_server: lost the accelerator\n")
    assert list(device_env.local_jobs().iterdir()) == []  # its work directory went too


def test_a_runner_writing_no_result_is_quoted_from_its_stdout_when_stderr_is_empty(
        device_env: Any, cnn_two_cases: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A wrapper printing its failure on stdout: the error said "no output"."""
    device_env.write_profile("talky", {"transport": "local", "runner": [
        sys.executable, "-c", "print('wrapper: model cache is full')"]})
    code, out, err = run_cli(["run", cnn_two_cases, "--device", "talky", "--iter", 1], capsys)
    assert (code, out) == (3, "")
    assert err == ("error: talky: the runner exited with status 0 without writing a result: "
                   "on stdout: wrapper: model cache is full\n")


def test_a_serving_runner_that_overruns_is_killed(
        transport: str, sshd: Any, device_env: Any, cnn_two_cases: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "starts.log"
    spec = _profile(device_env, transport, "slow", sshd, runner=[
        sys.executable, str(COUNTING), str(log), str(TESTS / "ci_wrapped_runner.py"),
        "--sleep-ms", "60000", str(RUNNER)])
    code, out, err = run_cli(["bench", cnn_two_cases, "--device", spec, "--setting", "opt=all",
                              "--iter", 1, "--timeout", 8], capsys)
    assert (code, out) == (3, "")
    address = {"ssh": lambda: f"ssh:{sshd.address}", "adb": lambda: f"adb:{sshd[1].address}",
               "local": lambda: "local"}[transport]()
    where = f"{spec} ({address})"  # as the user named it, then where that led
    assert err == (f"error: {where}: a job on the serving runner did not finish within 8 s (the "
                   "runner's job: load, warmups, iterations, dumps); allow more with --timeout "
                   "SECONDS (a suite's timeout) or the device profile's [timeouts] command\n")
    server = _starts(log)[-1]
    assert server["argv"][-1] == "--serve"
    deadline = time.monotonic() + 10  # killed through a second channel (ssh): a moment later
    while process_alive(server["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(server["pid"])


def test_ctrl_c_during_a_served_job_exits_130_and_leaves_nothing(
        transport: str, sshd: Any, device_env: Any, cnn_two_cases: Path,
        tmp_path: Path) -> None:
    import signal

    from fixtures_devices import verify_process

    log = tmp_path / "starts.log"
    spec = _profile(device_env, transport, "slow", sshd, runner=[
        sys.executable, str(COUNTING), str(log), str(TESTS / "ci_wrapped_runner.py"),
        "--sleep-ms", "60000", str(RUNNER)])
    jobs = device_env.local_jobs() if transport == "local" else \
        device_env.cache / f"{transport}-slow" / "jobs"
    proc = verify_process(["bench", cnn_two_cases, "--device", spec, "--setting", "opt=all",
                           "--iter", 1], device_env.env)
    deadline = time.monotonic() + 120
    while not any(s["argv"][-1] == "--serve" for s in _starts(log)) \
            or not list(jobs.glob("*/job.json")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the served job never started"
        time.sleep(0.05)
    time.sleep(1.0)  # the job handed over: the runner sleeps inside its first inference
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", "\ninterrupted\n")
    server = _starts(log)[-1]
    deadline = time.monotonic() + 10
    while process_alive(server["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(server["pid"])
    assert list(jobs.iterdir()) == []


def test_ci_runs_each_devices_jobs_in_one_connection(
        transport: str, sshd: Any, device_env: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The sample suite's four jobs (cnn at two opt levels with a per-layer dump and the
    determinism gate's second run, two_io, int_bool), all on one device: one connection."""
    from fixtures_ci import local_suite, run_ci

    spec = _profile(device_env, transport, "board", sshd)
    suite = local_suite(tmp_path, devices=f'[[device]]\nname = "board"\nspec = "{spec}"\n'
                                          'iterations = 3\n')
    text = suite.read_text()
    for listed in ('devices = ["local", "arm64"]', 'devices = ["local"]'):
        text = text.replace(listed, 'devices = ["board"]')
    suite.write_text(text)
    connections = _connections(transport, monkeypatch, sshd)
    run = run_ci([suite, "--baselines", tmp_path / "bl", "--update-goldens"], capsys, tmp_path)
    assert run.code == 0, run.out + run.err
    assert sorted(j["id"] for j in run.report["jobs"]) == [
        "cnn/board/opt-all", "cnn/board/opt-off", "int_bool/board/opt-all",
        "two_io/board/opt-all"]
    assert all(j["status"] == "passed" for j in run.report["jobs"])
    assert connections() == 1


def test_a_failed_job_closes_its_session_and_the_next_reconnects(
        device_env: Any, cnn_two_cases: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify.session.Sessions (ci's per-device sessions): reused while jobs succeed; a job
    that raises leaves no session behind, so the next job connects afresh."""
    from verify.devices import resolve_profile
    from verify.errors import RunnerError
    from verify.sessions import Sessions

    device_env.write_profile("plain", {"transport": "local"})
    profile = resolve_profile("plain")
    connections = _connections("local", monkeypatch, None)
    sessions = Sessions()
    try:
        with sessions.use(profile) as first:
            pass
        with sessions.use(profile) as again:
            assert again is first and again.driver is not None
        with pytest.raises(RunnerError), sessions.use(profile):
            raise RunnerError("plain: the runner failed")
        assert first.driver is None  # closed with the failure
        with sessions.use(profile) as fresh:
            assert fresh is not first and fresh.driver is not None
        assert connections() == 2
    finally:
        sessions.close()
    assert fresh.driver is None
