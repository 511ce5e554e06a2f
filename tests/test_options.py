"""The shared option values (verify/options.py) check what no command-line type can, and layer
like the suite files and commands expect."""

from __future__ import annotations

import pytest

from verify.errors import UsageError
from verify.options import DeviceTarget, SessionSettings, TimedRuns, Tolerances


def test_values_refuse_what_a_run_cannot_use() -> None:
    with pytest.raises(UsageError, match="^--iter must be at least 1$"):
        TimedRuns(0)
    with pytest.raises(UsageError, match="^--warmup must be 0 or more$"):
        TimedRuns(1, -1)
    with pytest.raises(UsageError, match="^--opt-level must be one of disable, basic, "
                                         "extended, layout, all$"):
        SessionSettings("fast")
    for threads in (-2, 1025, 100000):  # 100000 hung the device until the job's timeout
        with pytest.raises(UsageError) as caught:
            SessionSettings(threads=threads)
        assert str(caught.value) == (f"--threads {threads}: expected 0 (onnxruntime's "
                                     "default) to 1024")
    assert SessionSettings(threads=1024).threads == 1024


def test_tolerances_layer_the_more_specific_in_front() -> None:
    inner = Tolerances(None, 0.1, ("a:atol=1",))
    assert inner.over(Tolerances(1.0, 2.0, ("b:atol=2",))) == \
        Tolerances(1.0, 0.1, ("a:atol=1", "b:atol=2"))
    assert Tolerances().over(Tolerances()) == Tolerances()
    # a suite's globs go over every testcase: only the testcase's own are its to match
    suite = Tolerances(None, None, ("prob:k=2^-14",))
    job = inner.over(suite, shared=True)
    assert job.specs == ("a:atol=1", "prob:k=2^-14")
    assert job.own_specs() == ("a:atol=1",)
    assert inner.over(suite).own_specs() == ("a:atol=1", "prob:k=2^-14")


def test_a_device_target_resolves_to_its_profile_with_the_host_key_choice() -> None:
    plain, lax = DeviceTarget("ssh:me@box").profile(), DeviceTarget("ssh:me@box", True).profile()
    assert (plain.transport, plain.address) == ("ssh", "me@box")
    assert "insecure_host_key" not in plain.options
    assert lax.options["insecure_host_key"] is True
    with pytest.raises(UsageError, match="expected ssh:user@host"):
        DeviceTarget("ssh:me@@box").profile()


def test_no_other_dataclass_redeclares_the_shared_options() -> None:
    """opt_level/threads/providers, the tolerances, the device spec's host-key choice and the
    timed runs are declared once, here; requests and suites hold these values instead."""
    import ast
    from pathlib import Path

    shared = {"opt_level", "threads", "atol", "rtol", "tol_specs", "insecure_host_key",
              "iterations", "warmup", "case_index"}
    # results that record what ran, and the suite's per-level overrides (None: not set there)
    allowed = {("localize/__init__.py", "LocalizeResult", "opt_level"),
               ("localize/__init__.py", "LocalizeResult", "case_index"),
               ("rules.py", "AllcloseRule", "atol"), ("rules.py", "AllcloseRule", "rtol"),
               ("bench.py", "BenchReport", "iterations"), ("bench.py", "BenchReport", "warmup"),
               ("ci/suite.py", "Device", "iterations"), ("ci/suite.py", "Device", "warmup"),
               ("ci/suite.py", "TestcaseEntry", "iterations"),
               ("ci/suite.py", "TestcaseEntry", "warmup"),
               ("ci/suite.py", "Suite", "iterations"), ("ci/suite.py", "Suite", "warmup"),
               ("ci/jobs.py", "Job", "iterations"), ("ci/jobs.py", "Job", "warmup")}
    package = Path(__file__).resolve().parent.parent / "verify"
    found = set()
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).as_posix()
        if rel in ("options.py", "runner/runner.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                    "dataclass" in ast.unparse(d) for d in node.decorator_list):
                found |= {(rel, node.name, s.target.id) for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                          and s.target.id in shared}
    assert found <= allowed, sorted(found - allowed)
