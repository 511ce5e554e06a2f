"""JUnit XML: one <testsuite> per device, one <testcase> per job.

A failed gate is a <failure> whose message is the one-line summary (with the first divergent
tensor and its numbers) and whose text has every failing gate's figures; a device or input
error is an <error>. Written with junitparser; the layout follows the Ant/Jenkins schema that
Jenkins, GitLab, GitHub test-report actions and Azure DevOps read.
"""

from __future__ import annotations

import platform
from xml.etree import ElementTree
from collections.abc import Sequence
from pathlib import Path

from verify.ci.report import RunInfo
from verify.ci.results import ERROR, FAILED, NO_BASELINE, JobResult
from verify.errors import MissingDependency
from verify.files import write_text_atomic


def _failure_text(r: JobResult) -> str:
    lines = [f"{g.gate}: {g.message}" for g in r.gates]
    first = r.first_divergent
    if first is not None:
        lines.append(f"first divergent tensor: {first.describe()}")
    if r.latency and r.baseline_latency:
        lines.append(f"latency samples (ms): {', '.join(f'{x:.4g}' for x in r.latency.samples_ms)}")
        lines.append("baseline samples (ms): "
                     f"{', '.join(f'{x:.4g}' for x in r.baseline_latency.samples_ms)}")
        for name, lat in (("control probe", r.latency), ("baseline control probe",
                                                          r.baseline_latency)):
            if lat.control_ms:
                lines.append(f"{name} (ms): {', '.join(f'{x:.4g}' for x in lat.control_ms)}")
    return "\n".join(lines)


def _options(r: JobResult) -> str:
    o, s = r.job.options, r.job.options.session
    return (f"{o.name}: opt_level={s.opt_level} threads={s.threads} "
            f"providers={','.join(s.providers) or 'the device default'}")


def _system_out(r: JobResult) -> str:
    dev = ", ".join(f"{k}={r.device[k]}" for k in ("arch", "os", "python", "onnxruntime")
                    if r.device.get(k))
    lines = [f"device {r.job.device.name} ({r.job.device.spec}) {dev}",
             f"options {_options(r)}, iterations {r.job.iterations}, "
             f"warmup {r.job.warmup}, attempts {r.attempts}"]
    lines += [f"{g.gate}: {g.status}: {g.message}" for g in r.gates]
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def junit_xml(results: Sequence[JobResult], info: RunInfo) -> str:
    try:
        from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite
    except ImportError:
        raise MissingDependency("--junit needs junitparser: pip install 'onnx-verify[report]'") from None
    xml = JUnitXml(info.suite_name)
    suites: dict[str, TestSuite] = {}
    for r in results:
        dev = r.job.device.name
        if dev not in suites:
            suite = TestSuite(f"{info.suite_name}.{dev}")
            suite.hostname = platform.node() or "localhost"
            suite.timestamp = info.created_utc
            suite.add_property("device.spec", r.job.device.spec)
            for key in ("arch", "os", "onnxruntime"):
                if r.device.get(key):
                    suite.add_property(f"device.{key}", str(r.device[key]))
            suites[dev] = suite
        # the job id in full (testcase/device/options): a report listing every device's
        # cases together (GitLab's, GitHub's) must still tell cnn on the phone from cnn here
        case = TestCase(r.job.id, f"{info.suite_name}.{dev}", round(r.seconds, 3))
        if r.status == FAILED:
            failure = Failure(r.summary(), ",".join(g.gate for g in r.failed_gates)
                              or "missing-baseline")
            failure.text = _failure_text(r)
            case.result = [failure]
        elif r.status == ERROR:
            error = Error(r.error, f"{r.error_kind}-error")
            error.text = "\n".join(n for n in r.notes) or r.error
            case.result = [error]
        elif not r.gates:
            case.result = [Skipped("no gate applies to this job")]
        if any(g.status == NO_BASELINE for g in r.gates) and r.status != FAILED:
            r_notes = "missing baseline: regression/latency not judged"
            case.system_out = _system_out(r) + "\n" + r_notes
        else:
            case.system_out = _system_out(r)
        suites[dev].add_testcase(case)
    for suite in suites.values():
        suite.update_statistics()
        xml.add_testsuite(suite)
    xml.update_statistics()
    text = xml.tostring()
    root = ElementTree.fromstring(text)   # our own document, just written
    for extra in ("skipped", "disabled"):   # Jenkins' junit-10 schema refuses them up here
        root.attrib.pop(extra, None)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ElementTree.tostring(root, "unicode")


def write_junit(path: Path, results: Sequence[JobResult], info: RunInfo) -> None:
    write_text_atomic(Path(path), junit_xml(results, info))
