"""Fixtures for `verify ci` tests: the sample suite's baselines recorded once per session, suite
files written into a test's folder, perturbed archives and wrapped (slowed, noisy) runners.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from verify.drivers.base import CommandResult, Driver, Progress
from verify.errors import ConnectError

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "goldens" / "suites" / "sample.toml"
TESTCASES = REPO / "goldens" / "testcases"
WRAPPED_RUNNER = Path(__file__).resolve().parent / "ci_wrapped_runner.py"
RUNNER_PY = REPO / "verify" / "runner" / "runner.py"

__all__ = [
    "CiRun",
    "busy_cores",
    "ci_baselines",
    "have_arm64",
    "link_down_transport",
    "local_suite",
    "lost_board_suite",
    "perturbed_archive",
    "run_ci",
    "wrapped_runner_profile",
]


@dataclass(frozen=True)
class CiRun:
    code: int
    out: str
    err: str
    report: dict[str, Any]

    def job(self, job_id: str) -> dict[str, Any]:
        return next(j for j in self.report["jobs"] if j["id"] == job_id)

    def gate(self, job_id: str, gate: str) -> dict[str, Any]:
        return next(g for g in self.job(job_id)["gates"] if g["gate"] == gate)


def run_ci(argv: Sequence[Any], capsys: pytest.CaptureFixture[str], tmp: Path) -> CiRun:
    """`verify ci ARGV --report-json tmp/report.json` in-process; the parsed report with it."""
    from verify.cli import main

    report = tmp / "report.json"
    report.unlink(missing_ok=True)
    capsys.readouterr()
    code = main(["ci", *[str(a) for a in argv], "--report-json", str(report)])
    out, err = capsys.readouterr()
    doc = json.loads(report.read_text()) if report.is_file() else {}
    return CiRun(code, out, err, doc)


BUSY_LOOP = ("import time\nend = time.monotonic() + {seconds}\n"
             "while time.monotonic() < end:\n    pass\n")


@contextmanager
def busy_cores(count: int = 2, seconds: float = 600.0) -> Iterator[None]:
    """`count` processes spinning on the CPU beside the block (each in a session of its own,
    like other people's jobs on a shared machine); they stop by themselves after `seconds`
    and are killed when the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(seconds=seconds)],
                              start_new_session=True) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)


def have_arm64() -> bool:
    from verify.devices import arm64_root

    return (arm64_root() / "usr/bin/python3.11").is_file() and shutil.which(
        "qemu-aarch64-static") is not None


@pytest.fixture(scope="session")
def ci_baselines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Baselines of the sample suite's local jobs (and arm64's, when it is built), recorded once
    with --update-goldens into a private folder."""
    from verify.cli import main
    from verify.devices import arm64_root

    root = tmp_path_factory.mktemp("ci-baselines")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VERIFY_ARM64_ROOT", str(arm64_root()))
        mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
        only = [] if have_arm64() else ["--only", "local"]
        code = main(["ci", str(SAMPLE), "--baselines", str(root / "baselines"),
                     "--update-goldens", *only])
    assert code == 0
    yield root / "baselines"


def local_suite(folder: Path, *, testcases: dict[str, Path] | None = None,
                devices: str = '[[device]]\nname = "local"\nspec = "local"\n',
                extra: str = "", latency_threshold: float | None = 1.0) -> Path:
    """The sample suite rewritten into `folder`: testcases by absolute path (some replaced by
    `testcases`), its devices replaced by `devices`, `extra` TOML appended; the latency gate's
    threshold set to `latency_threshold` (None: the sample's own)."""
    text = SAMPLE.read_text()
    head, _, rest = text.partition("[[device]]")
    _, _, rest = rest.partition("[[options]]")
    replaced = testcases or {}
    body = "[[options]]" + rest
    for name in ("cnn", "two_io", "int_bool"):
        body = body.replace(f'"../testcases/{name}.vtc"',
                            json.dumps(str(replaced.get(name, TESTCASES / f"{name}.vtc"))))
    if 'name = "arm64"' not in devices:
        body = body.replace('devices = ["local", "arm64"]', 'devices = ["local"]')
    head = head.replace('baselines = "../baselines"', 'baselines = "baselines"')
    # tests that do not inject a slowdown must not fail on a busy machine: allow 2x (an
    # injected sleep is hundreds of times the tiny models' latency)
    if latency_threshold is not None:
        head = head.replace("threshold = 0.25 ", f"threshold = {latency_threshold}  ")
    path = folder / "suite.toml"
    path.write_text(head + devices + "\n" + body + "\n" + extra, encoding="utf-8")
    return path


def lost_board_suite(folder: Path, transport: str, *, retries: int,
                     gates: Sequence[str]) -> Path:
    """`folder/lost.toml`: two_io and int_bool on `local` and on `board`, a device reached by
    `transport` (`link_down_transport`: its link is down)."""
    path = folder / "lost.toml"
    path.write_text(
        f'[suite]\nname = "lost"\niterations = 2\nwarmup = 0\nretries = {retries}\n'
        f'gates = {json.dumps(list(gates))}\n\n'
        f'[[device]]\nname = "board"\nspec = "{transport}:rack7"\n\n'
        '[[device]]\nname = "local"\nspec = "local"\n\n'
        f'[[testcase]]\npath = {json.dumps(str(TESTCASES / "two_io.vtc"))}\n\n'
        f'[[testcase]]\npath = {json.dumps(str(TESTCASES / "int_bool.vtc"))}\n',
        encoding="utf-8")
    return path


def perturbed_archive(dest: Path, factor: float, name: str = "cnn") -> Path:
    """goldens/testcases/NAME.vtc with one mid-network conv's weights scaled by `factor`; the
    inputs, ground truth and per-layer references are the original's."""
    import onnx
    from onnx import numpy_helper

    from verify.archive_reader import iter_layers, read_archive
    from verify.testcase import write_archive

    source = TESTCASES / f"{name}.vtc"
    tc = read_archive(source)
    model = onnx.load_from_string(tc.model_bytes)
    weights = [t for t in model.graph.initializer if t.name.endswith("/W")]
    target = weights[len(weights) // 2]
    scaled = (numpy_helper.to_array(target) * np.float32(factor)).astype(np.float32)
    target.CopyFrom(numpy_helper.from_array(scaled, target.name))
    dest.parent.mkdir(parents=True, exist_ok=True)
    layers = [iter_layers(source, i) for i in range(len(tc.cases))] if tc.has_layers else None
    write_archive(dest, dataclasses.replace(tc, model_bytes=model.SerializeToString()), layers)
    return dest


def wrapped_runner_profile(profiles: Path, name: str, *args: str) -> str:
    """A local device profile whose runner is tests/ci_wrapped_runner.py with `args`."""
    argv = [sys.executable, str(WRAPPED_RUNNER), *args, str(RUNNER_PY)]
    (profiles / f"{name}.toml").write_text(
        f'transport = "local"\nrunner = {json.dumps(argv)}\n', encoding="utf-8")
    return name


class LinkDown(ConnectError):
    """What a third-party driver may raise: a ConnectError of its own kind."""


class LinkDownDriver(Driver):
    """A third-party transport (entry point `verify.drivers`) whose device never answers."""

    transport = "linkdown"

    def _open_impl(self) -> None:
        raise LinkDown(f"linkdown:{self.config.address}: the link is down")

    def _close_impl(self) -> None:
        pass

    def _exec_impl(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str],
                   cwd: str | None) -> CommandResult:
        raise AssertionError("never opened")

    def _put_impl(self, local: Path, remote: str, progress: Progress | None) -> None:
        raise AssertionError("never opened")

    def _get_impl(self, remote: str, local: Path, progress: Progress | None) -> None:
        raise AssertionError("never opened")


@pytest.fixture
def link_down_transport(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The `linkdown` transport, installed the way a third-party package is: a distribution
    on sys.path whose entry point in the `verify.drivers` group names LinkDownDriver."""
    dist = tmp_path / "site" / "verify_linkdown-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: verify-linkdown\n"
                                   "Version: 1.0\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(
        f"[verify.drivers]\nlinkdown = {__name__}:LinkDownDriver\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(dist.parent))
    return "linkdown"
