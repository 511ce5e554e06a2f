"""One device for the whole of one command: connected once, files pushed once, jobs run in turn.

A `DeviceSession` holds the driver (one connection), the runner's path on the device, what this
command has pushed (content-addressed: the same model, runner or inputs are never sent twice),
a host temporary folder, and, where the runner offers it, one runner process left serving the
command's jobs (`serve`, docs/runner-contract.md): bench's settings × rounds and localize's
rounds then pay one connection and one runner start. A runner that does not say `"serve": true`
in its `--describe` (the native runner, a third-party one) runs one process per job, as before.
Jobs that capture layers start with clean memory: a dump's peak must not hold what earlier
sessions left in a serving process's heap. A serving runner whose ready line says `"dumps":
true` (verify's own, where the device can fork) runs each in a child forked for it, with the
heap handed back first; any other runner gets a process of its own for them. `verify run` with
a dump above opt-level disable (a timed job, then the dump job) serves both: one runner start.

    with DeviceSession(profile) as session:
        model = session.push_bytes(model_bytes, ".onnx", "model")
        workdir = session.workdir()
        result = session.job({...}, workdir)      # the runner's result, checked
        session.pull(workdir, result["cases"][0]["outputs"]["y"], local)
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from verify.devices import Profile
from verify.drivers import make_driver
from verify.drivers.base import Driver, Progress
from verify.drivers.channel import LineChannel
from verify.drivers.live import DeviceLock
from verify.errors import (
    DeviceError,
    DeviceTimeout,
    InputError,
    ModelError,
    ProfileError,
    ProviderUnavailable,
    RunnerError,
)
from verify.runner.contract import STATUS_OK, Describe, Error, Job, Result, Serve
from verify.runner_files import RUNNER_SOURCE, runner_file  # noqa: F401 (RUNNER_SOURCE: for tests)

SERVE_FLAG = Serve.FLAG      # the runner's serve mode (docs/runner-contract.md, "Serve")
SERVE_REPLY = Serve.REPLY    # the key of each reply line a serving runner prints
SERVE_STOP_S = 10.0         # how long a serving runner may take to exit at end of input

# A callback for the CLI: status(message) between phases, and a progress factory for transfers.
Status = Callable[[str], None]
ProgressFactory = Callable[[str, int], "Progress | None"]


def runner_argv(profile: Profile, runner_path: str | None) -> list[str]:
    """How the device starts the runner: a native runner, or Python running runner.py."""
    if profile.runner:
        return list(profile.runner)
    python = list(profile.python) or (
        [sys.executable] if profile.transport == "local" else ["python3"])
    assert runner_path is not None
    return [*python, runner_path]


def check_support_files(profile: Profile) -> None:
    """Every [[push]] file of the profile exists: checked before connecting, so nothing is sent
    for a run that cannot start (not when the profile loads: `devices list` must not fail)."""
    for item in profile.push:
        if not item.src.is_file():
            raise ProfileError(f"{profile.source or profile.name}: [[push]] src {item.src} "
                               "does not exist")


def push_support_files(driver: Driver, profile: Profile, progress: ProgressFactory | None) -> None:
    """Push the profile's extra files (libraries, binaries) through the cache, linked in place."""
    for item in profile.push:
        cached = driver.push_cached(item.src, _progress(progress, item.src.name, item.src))
        dest = item.dest if item.dest.startswith("/") else f"{driver.base_dir}/{item.dest}"
        parent = dest.rsplit("/", 1)[0] or "/"
        driver.makedirs(parent)
        if item.src.stat().st_mode & 0o111:
            driver.run(["chmod", "755", cached], what="chmod on device")
        driver.run(["ln", "-sf", cached, dest], what=f"linking {item.dest} on device")


def _progress(factory: ProgressFactory | None, label: str, path: Path) -> Progress | None:
    return factory(label, path.stat().st_size) if factory else None


class DeviceSession:
    """A device opened once for one command. Use as a context manager; not thread-safe.

    `serve`: keep one runner process for the session's jobs where the runner offers it
    (worth it from the second job on; `verify run` turns it on only for a dump, whose job
    follows the timed one above opt-level disable)."""

    def __init__(self, profile: Profile, *, status: Status | None = None,
                 progress: ProgressFactory | None = None, serve: bool = False) -> None:
        self.profile = profile
        self.spec = profile.spec
        self.say: Status = status or (lambda _msg: None)
        self.progress = progress
        self.serve = serve
        self.driver: Driver | None = None
        self.argv: list[str] = []
        self.tmp = Path()
        self.connections = 0        # driver connections opened (one per session)
        self.runner_starts = 0      # runner processes started, serving or one job each
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._pushed: dict[str, str] = {}  # sha256 → path on the device
        self._server: LineChannel | None = None
        self._serves: bool | None = None   # whether the runner offers serve (None: not asked)
        self._fork_dumps = False           # whether the serving runner forks per dump job
        self._n = 0
        self._lock: DeviceLock | None = None
        self.last_stderr = ""       # the last job's runner stderr (a serving runner's: so far)

    # --- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> DeviceSession:
        check_support_files(self.profile)
        self._tmp = tempfile.TemporaryDirectory(prefix="verify-run-")
        self.tmp = Path(self._tmp.name)
        try:
            self.say(f"connecting to {self.spec}")
            driver = make_driver(self.profile)
            # held while the session is open: `devices clean` must not remove its files
            self._lock = DeviceLock(driver.work_key, self.spec).__enter__()
            self.driver = driver.open()
            self.connections += 1
            runner = runner_file()  # runner.py with contract.py beside it, one zip application
            runner_path = None if self.profile.runner else self.driver.push_cached(
                runner, _progress(self.progress, "runner", runner))
            push_support_files(self.driver, self.profile, self.progress)
            self.argv = runner_argv(self.profile, runner_path)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(failing=et is not None)

    def close(self, *, failing: bool = False) -> None:
        """End the session: a serving runner gets end of input (killed when `failing`), the
        connection closes, the temporary folder goes."""
        try:
            self._stop_server(failing=failing)
            if self.driver is not None:
                self.driver.close()
        finally:
            self.driver = None
            if self._lock is not None:
                self._lock.__exit__()
                self._lock = None
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    @property
    def dev(self) -> Driver:
        if self.driver is None:
            raise DeviceError(f"{self.spec}: the device session is not open")
        return self.driver

    @property
    def stats(self) -> dict[str, int]:
        return self.dev.stats.as_dict()

    # --- files ----------------------------------------------------------------------------
    def push_bytes(self, data: bytes, suffix: str, label: str) -> str:
        """Bytes into the device's cache, once per session (and once per device)."""
        digest = hashlib.sha256(data).hexdigest()
        if digest not in self._pushed:
            progress = self.progress(label, len(data)) if self.progress else None
            self._pushed[digest] = self.dev.push_cached(
                self.tmp / f"push-{digest[:16]}{suffix}", progress, digest, data=data)
        return self._pushed[digest]

    def push_file(self, path: Path, label: str, digest: str | None = None) -> str:
        """A file into the device's cache, once per session (and once per device)."""
        key = digest or f"file:{path.resolve()}"
        if key not in self._pushed:
            progress = _progress(self.progress, label, path)
            self._pushed[key] = self.dev.push_cached(path, progress, digest)
        return self._pushed[key]

    def push_array(self, value: np.ndarray, label: str) -> str:
        """An array as .npy into the device's cache (0-d arrays keep their shape)."""
        buf = io.BytesIO()
        np.save(buf, np.asarray(value, order="C"), allow_pickle=False)
        return self.push_bytes(buf.getvalue(), ".npy", label)

    def workdir(self) -> str:
        """A fresh private directory on the device for one job."""
        return self.dev.make_workdir()

    def put_json(self, data: Mapping[str, Any], remote: str) -> None:
        self._n += 1
        local = self.tmp / f"put{self._n}.json"
        local.write_text(json.dumps(data, indent=1))
        self.dev.put(local, remote)

    def pull(self, remote: str, local: Path, *, move: bool = False) -> None:
        """A device file to the host, atomically (`move`: the device needs it no more)."""
        self.dev.get(remote, local, move=move)

    def remove(self, remote: str, *, quiet: bool = False) -> None:
        self.dev.remove(remote, quiet=quiet)

    # --- jobs -----------------------------------------------------------------------------
    def job(self, job: Mapping[str, Any], workdir: str, *, name: str = "job.json",
            timeout: float | None = None) -> dict[str, Any]:
        """Write `job` into `workdir`, run it and return the runner's result, checked (an error
        the runner reported becomes verify's error of that kind). A job that captures layers
        starts with clean memory: in a process of its own, or on a serving runner that forks
        a child for it (its ready line says "dumps": true); a timed job with a forked dump
        (`dump_first`) always in a process of its own."""
        path = f"{workdir}/{name}"
        self.put_json(job, path)
        result_name = str(Job.RESULT.of(job))
        served = not Job.DUMP_FIRST.of(job) and self._serving()
        if served and Job.DUMP.of(job):
            served = self._serves_dumps(timeout)
        try:
            stdout = ""  # a served runner's is the protocol's
            if served:
                status, stderr = self._served_job(path, timeout)
            else:
                self.runner_starts += 1
                res = self.dev.run([*self.argv, path], cwd=workdir, timeout=timeout, check=False)
                status, stderr, stdout = res.status, res.stderr, res.stdout
        except DeviceTimeout as exc:  # say what ran and how to give it longer
            raise DeviceTimeout(f"{exc} (the runner's job: load, warmups, iterations, dumps); "
                                "allow more with --timeout SECONDS (a suite's timeout) or the "
                                "device profile's [timeouts] command") from exc
        self.last_stderr = stderr
        return self.result(workdir, result_name, status, stderr, stdout)

    def result(self, workdir: str, name: str, status: int = 0, stderr: str = "",
               stdout: str = "") -> dict[str, Any]:
        """A result file the runner wrote, read and checked (see `job`); without one, the error
        quotes what the runner said: its stderr, else its stdout."""
        self._n += 1
        local = self.tmp / f"result{self._n}-{name}"
        try:
            self.dev.get(f"{workdir}/{name}", local)
        except DeviceError as lost:
            try:  # a device gone (unplugged) lost the result: say so, not "runner killed"
                self.dev.exists(workdir)
            except DeviceError:
                raise lost from None
            how = f"was killed by signal {-status}" if status < 0 else \
                f"exited with status {status}"
            said = tail(stderr) or (f"on stdout: {tail(stdout)}" if stdout.strip() else "")
            raise RunnerError(f"{self.spec}: the runner {how} without writing a result: "
                              f"{said or 'no output'}") from None
        try:
            result = json.loads(local.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RunnerError(f"{self.spec}: the runner wrote an unreadable result file") \
                from None
        if result.get(Result.STATUS) != STATUS_OK:
            err = result.get(Result.ERROR) or {}
            kind = err.get(Error.KIND, "runtime")
            message = err.get(Error.MESSAGE, "unknown error")
            if kind == "model":
                raise ModelError(f"{self.spec}: {message}")
            if kind == "input":
                raise InputError(f"{self.spec}: {message}")
            if kind == "provider":
                raise ProviderUnavailable(f"{self.spec}: {message}")
            missing = re.search(r"No module named '(numpy|onnxruntime)'", message)
            if missing:  # the device's Python, not the model: say what to do about it
                message += (f" (the device's Python lacks {missing.group(1)}: install numpy and "
                            "onnxruntime there, or use the native runner, which needs no "
                            "Python: docs/native-runner.md)")
            raise RunnerError(f"{self.spec}: the runner failed: {message}")
        return result

    # --- the serving runner ---------------------------------------------------------------
    def _serving(self) -> bool:
        """Whether jobs go to a serving runner: asked for, and offered by the runner (verify's
        own runner.py does; another runner must say `"serve": true` in its --describe)."""
        if not self.serve:
            return False
        if self._serves is None:
            self._serves = not self.profile.runner or self._describe_says_serve()
        return self._serves

    def _describe_says_serve(self) -> bool:
        self.runner_starts += 1
        res = self.dev.run([*self.argv, "--describe"], timeout=120.0, check=False)
        try:
            info = json.loads(res.stdout) if res.status == 0 else {}
        except json.JSONDecodeError:
            info = {}
        return isinstance(info, dict) and info.get(Describe.SERVE) is True

    def _start_server(self, limit: float) -> LineChannel | None:
        """A runner started with --serve, once it said it is ready; None when the transport
        cannot hold a process open or the runner ended without offering (a wrapper that
        took --serve for a job file): jobs then run one process each."""
        server = self.dev.spawn([*self.argv, SERVE_FLAG], cwd=self.dev.jobs_dir)
        if server is None:
            return None
        self.runner_starts += 1
        deadline = time.monotonic() + limit
        try:
            while (line := server.receive(deadline, limit, "the runner's start (--serve)")) \
                    is not None:
                reply = _reply(line)
                if reply is not None and reply.get(Serve.READY) is True:
                    self._fork_dumps = reply.get(Serve.DUMPS) is True
                    return server
        except BaseException:
            server.kill()
            raise
        server.close(SERVE_STOP_S)
        return None

    def _serves_dumps(self, timeout: float | None) -> bool:
        """Whether the serving runner (started now if need be) forks a child per dump job."""
        return self._started(timeout) is not None and self._fork_dumps

    def _started(self, timeout: float | None) -> LineChannel | None:
        """The serving runner, started on first use; None (and no more serving) when it
        could not be."""
        if self._server is None and self._serves is not False:
            limit = self.dev.config.command_timeout if timeout is None else timeout
            self._server = self._start_server(limit)
            if self._server is None:
                self._serves = False
        return self._server

    def _served_job(self, path: str, timeout: float | None) -> tuple[int, str]:
        """Hand one job to the serving runner (started on first use) and wait for its reply
        line: the reply's status; the runner's exit status and stderr when it died."""
        limit = self.dev.config.command_timeout if timeout is None else timeout
        server = self._started(timeout)
        if server is None:
            self.runner_starts += 1
            res = self.dev.run([*self.argv, path], cwd=path.rsplit("/", 1)[0],
                               timeout=timeout, check=False)
            return res.status, res.stderr
        try:
            server.send(json.dumps({Serve.JOB: path}))
            deadline = time.monotonic() + limit
            while (line := server.receive(deadline, limit, "a job on the serving runner")) \
                    is not None:
                reply = _reply(line)
                if reply is not None and reply.get(Serve.JOB) == path:
                    status = reply.get(Serve.STATUS, 0)
                    return (status if isinstance(status, int) else 1), server.stderr_tail()
        except BaseException:
            self._server = None
            server.kill()  # a timeout, Ctrl-C, a lost link: nothing left running
            raise
        # the runner ended without answering: it died on this job
        self._server = None
        status = server.close(SERVE_STOP_S)
        return (status if status is not None else -9), server.stderr_tail()

    def _stop_server(self, failing: bool) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if failing or self.driver is None:
            server.kill()
        else:  # end of input: the runner finishes and exits 0
            server.close(SERVE_STOP_S)


def _reply(line: str) -> dict[str, Any] | None:
    """A serving runner's reply line, or None for anything else on its stdout."""
    if SERVE_REPLY not in line:
        return None
    try:
        reply = json.loads(line)
    except json.JSONDecodeError:
        return None
    return reply if isinstance(reply, dict) and SERVE_REPLY in reply else None


def tail(text: str, n: int = 1) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])

