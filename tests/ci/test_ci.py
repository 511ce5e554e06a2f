"""`verify ci` end to end: the sample suite on local and the emulated ARM64 target, all four
reports, injected regressions (a perturbed model, a slowed runner, a noisy runner), device
failures, per-job timeouts, the HTML report in headless Chromium, JUnit against its schema."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures_ci import (
    SAMPLE,
    TESTCASES,
    busy_cores,
    local_suite,
    lost_board_suite,
    perturbed_archive,
    run_ci,
    wrapped_runner_profile,
)

XSD = Path(__file__).resolve().parents[1] / "ci_junit.xsd"
PLOT_BLUE = (0x09, 0x69, 0xDA)   # the error curve's colour in verify/ci/html.py
PLOT_RED = (0xCF, 0x22, 0x2E)    # the tolerance line and first-divergent marker


def validate_junit(path: Path) -> None:
    import xmlschema

    xmlschema.XMLSchema(str(XSD)).validate(str(path))


@pytest.mark.arm64
@pytest.mark.slow
def test_sample_suite_on_local_and_arm64_writes_all_four_reports(
        ci_baselines: Path, device_env, tmp_path: Path, capsys) -> None:
    # baselines recorded on a quiet machine (the fixture), judged with both cores busy
    out = tmp_path / "reports"
    with busy_cores(2):
        run = run_ci([SAMPLE, "--baselines", ci_baselines, "--junit", out / "ci.xml",
                      "--markdown", out / "ci.md", "--html", out / "ci.html"], capsys, tmp_path)
    assert run.code == 0, run.out + run.err
    for job in run.report["jobs"]:   # judged over the control probe, not recorded
        if job["device"]["arch"] == "aarch64":
            continue                     # the emulator's latency is not judged (sample.toml)
        lat = run.gate(job["id"], "latency")
        assert lat["status"] == "pass" and lat["details"]["control"] == "probe", lat
        assert lat["details"]["machine"] == job["machine"] != ""
    ids = [j["id"] for j in run.report["jobs"]]
    assert ids == ["cnn/local/opt-all", "cnn/local/opt-off", "two_io/local/opt-all",
                   "two_io/arm64/opt-all", "int_bool/local/opt-all"]
    assert run.report["verdict"] == "passed" and run.report["counts"] == {
        "passed": 5, "failed": 0, "error": 0}
    arm = run.job("two_io/arm64/opt-all")
    assert arm["device"]["arch"] == "aarch64" and arm["latency"]["n"] == 20
    assert {g["gate"]: g["status"] for g in arm["gates"]} == {
        "accuracy": "pass", "regression": "pass"}
    assert run.gate("cnn/local/opt-all", "determinism")["status"] == "pass"
    # every figure is in the JSON: per-output errors and every latency sample
    prob = run.job("cnn/local/opt-all")["outputs"][0]
    assert prob["name"] == "prob" and set(prob) >= {"max_abs", "threshold", "tol_units", "cosine"}
    assert len(run.job("cnn/local/opt-all")["latency"]["samples_ms"]) == 30
    validate_junit(out / "ci.xml")   # also as strict as Jenkins' junit-10 on <testsuites>
    from xml.etree import ElementTree

    root = ElementTree.parse(out / "ci.xml").getroot()
    assert "skipped" not in root.attrib and root.get("tests") == "5"
    # each case named by its whole job id: two devices' "two_io/opt-all" stay apart
    assert sorted(c.get("name") for c in root.iter("testcase")) == sorted(ids)
    md = (out / "ci.md").read_text()
    assert md.startswith("## verify ci: sample — ✅ all gates held")
    assert "| `two_io/arm64/opt-all` | arm64 (aarch64) | ✅ passed |" in md
    html = (out / "ci.html").read_text()
    assert "Every job held every gate." in html and "http" not in html.replace(
        "http://www.w3.org", "")
    assert "PASS  two_io/arm64/opt-all" in run.out


def test_a_baseline_recorded_for_other_inputs_is_noted(device_env, tmp_path: Path,
                                                      capsys) -> None:
    """The same model re-packed with other inputs (another --seed): every error changes with
    them, and the regression gate compared against the old experiment's figures without a
    word (the note existed for another model only). The baseline now records its cases."""
    from verify.cli import main

    two_io = tmp_path / "tc" / "two_io.vtc"
    two_io.parent.mkdir()
    model = Path(__file__).resolve().parents[2] / "goldens" / "models" / "two_io.onnx"
    assert main(["pack", str(model), "-o", str(two_io)]) == 0
    suite = local_suite(tmp_path, testcases={"two_io": two_io})
    base = tmp_path / "bl"
    run = run_ci([suite, "--baselines", base, "--only", "two_io", "--update-goldens"], capsys,
                 tmp_path)
    assert run.code == 0, run.err
    recorded = json.loads(next(base.rglob("opt-all.json")).read_text())
    assert len(recorded["cases_sha256"]) == 64
    run = run_ci([suite, "--baselines", base, "--only", "two_io"], capsys, tmp_path)
    assert not any("other inputs" in n for n in run.job("two_io/local/opt-all")["notes"])
    assert main(["pack", str(model), "--seed", "7", "-o", str(two_io)]) == 0
    run = run_ci([suite, "--baselines", base, "--only", "two_io", "--html",
                  tmp_path / "ci.html"], capsys, tmp_path)
    note = next(n for n in run.job("two_io/local/opt-all")["notes"] if "other inputs" in n)
    # a passing job's note is in the HTML too (only failed jobs' sections had notes)
    import html

    assert run.job("two_io/local/opt-all")["status"] == "passed"
    assert f"<li><code>two_io/local/opt-all</code>: {html.escape(note)}</li>" in \
        (tmp_path / "ci.html").read_text()
    assert note.startswith("the baseline was recorded for other inputs or ground truth (cases "
                           f"sha256 {recorded['cases_sha256'][:12]}…, now ")
    # the terminal shows the job's notes under its line, as the reports do
    lines = run.out.splitlines()
    at = next(i for i, line in enumerate(lines) if " two_io/local/opt-all " in line)
    assert lines[at + 1] == f"      note: {note}"
    # the suite's own tolerance globs ([suite.tolerance] "prob", the cnn's output) are meant
    # for every testcase: one matching none of two_io's outputs is no typo to note
    assert not any("matches no output" in n for n in run.job("two_io/local/opt-all")["notes"])


def test_a_suite_atol_setting_aside_an_archive_glob_says_how_a_suite_keeps_it(
        device_env, tmp_path: Path, capsys) -> None:
    """The note named `--atol/--rtol` and `--tol`, flags `verify ci` does not have."""
    from verify.cli import main

    vtc = tmp_path / "tol.vtc"
    assert main(["pack", str(TESTCASES.parent / "models" / "cnn.onnx"), "-d",
                 str(TESTCASES.parent / "images" / "sample.png"), "--scale", "0.00392",
                 "--tol", "prob:k=2^-10", "-o", str(vtc)]) == 0
    suite = tmp_path / "s.toml"
    suite.write_text(f'[suite]\nname = "s"\nbaselines = "bl"\ngates = ["accuracy"]\n'
                     f'iterations = 1\n[suite.tolerance]\natol = 1e-3\n'
                     f'[[testcase]]\npath = "{vtc}"\n', encoding="utf-8")
    run = run_ci([suite], capsys, tmp_path)
    [job] = run.report["jobs"]
    assert ("the suite's or testcase's atol/rtol replace the archive's stored tolerances (--tol "
            "'prob:k=2^-10'); a glob in its [*.tolerance] tensors keeps one") in job["notes"]


def test_a_layers_job_on_an_archive_without_layer_references_says_so(
        device_env, tmp_path: Path, capsys) -> None:
    """The suite asks for per-layer gates on an archive packed without --layers: the job is
    judged on its outputs, and the note saying so is in the report and on the terminal."""
    from verify.cli import main

    cnn = tmp_path / "tc" / "cnn.vtc"
    cnn.parent.mkdir()
    model = Path(__file__).resolve().parents[2] / "goldens" / "models" / "cnn.onnx"
    assert main(["pack", str(model), "-o", str(cnn)]) == 0
    suite = local_suite(tmp_path, testcases={"cnn": cnn})
    run = run_ci([suite, "--baselines", tmp_path / "bl", "--only", "cnn/local/opt-all",
                  "--update-goldens"], capsys, tmp_path)
    assert run.code == 0, run.err
    expected = "cnn.vtc has no per-layer references (pack it with --layers): outputs only"
    assert expected in run.job("cnn/local/opt-all")["notes"]
    assert f"      note: {expected}" in run.out.splitlines()


def test_perturbed_model_within_tolerance_fails_regression_only(
        ci_baselines: Path, device_env, tmp_path: Path, capsys) -> None:
    cnn = perturbed_archive(tmp_path / "bad" / "cnn.vtc", 1.00001)
    suite = local_suite(tmp_path, testcases={"cnn": cnn})
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "cnn/local/opt-off",
                  "--junit", tmp_path / "ci.xml", "--markdown", tmp_path / "ci.md"],
                 capsys, tmp_path)
    assert run.code == 1, run.err
    job = "cnn/local/opt-off"
    gates = {g["gate"]: g["status"] for g in run.job(job)["gates"]}
    assert gates.pop("latency") in ("pass", "fail")  # timing on a shared machine: either
    assert gates == {"accuracy": "pass", "determinism": "pass", "regression": "fail"}
    details = run.gate(job, "regression")["details"]
    assert [w["tensor"] for w in details["worse_outputs"]] == ["prob"]
    first = details["worse_layers"][0]   # the scaled conv is where the error starts to grow
    assert (first["tensor"], first["op"]) == ("block2/proj/conv:0", "Conv")
    assert first["max_abs"] > first["limit"]
    assert run.job(job)["attempts"] == 1   # a mismatch is never retried
    assert any("the baseline was recorded for another model" in n for n in run.job(job)["notes"])
    validate_junit(tmp_path / "ci.xml")
    xml = (tmp_path / "ci.xml").read_text()
    assert 'type="regression"' in xml
    assert "first layer #17 Conv block2/proj/conv:0: max_abs=" in xml
    # the Markdown's cell names the same tensor as the text and JUnit (it took the output's)
    from verify.ci.results import fmt3
    assert first["baseline_max_abs"] == 0  # optimizations off: the baseline was exact there
    cell = (f"❌ {fmt3(first['max_abs'])} vs 0 ({fmt3(first['max_abs'] / first['limit'])}x "
            "the limit) at `block2/proj/conv:0`")
    assert cell in (tmp_path / "ci.md").read_text()


def test_a_job_failing_regression_records_no_latency_baseline(
        ci_baselines: Path, device_env, tmp_path: Path, capsys, monkeypatch) -> None:
    """docs/suite.md: a missing latency baseline is recorded only when no other gate of the
    job failed; the regression gate's failure was decided after that check."""
    monkeypatch.setenv("VERIFY_MACHINE", "fresh-runner")
    base = tmp_path / "baselines"
    shutil.copytree(ci_baselines, base)
    cnn = perturbed_archive(tmp_path / "bad" / "cnn.vtc", 1.00001)
    suite = local_suite(tmp_path, testcases={"cnn": cnn})
    run = run_ci([suite, "--baselines", base, "--only", "cnn/local/opt-off"], capsys, tmp_path)
    assert run.code == 1, run.out + run.err
    job = "cnn/local/opt-off"
    assert run.gate(job, "regression")["status"] == "fail"
    assert run.gate(job, "latency")["status"] == "no-baseline", run.gate(job, "latency")
    assert run.report["recorded_latency_baselines"] == []
    assert not list((base / "sample" / "latency").glob("fresh-runner-*"))


def test_a_baseline_recorded_on_another_device_spec_or_options_is_noted(
        ci_baselines: Path, device_env, tmp_path: Path, capsys) -> None:
    """A [[device]] whose spec changed under the same name (a profile swapped), or an option
    set changed under the same name, compared against the old setting's errors without a
    word."""
    spec = wrapped_runner_profile(device_env.profiles, "wrapped")
    suite = local_suite(tmp_path, devices=f'[[device]]\nname = "local"\nspec = "{spec}"\n')
    suite.write_text(suite.read_text().replace(
        'name = "opt-all"\nopt_level = "all"\nthreads = 1',
        'name = "opt-all"\nopt_level = "all"\nthreads = 2'))
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "two_io/local/opt-all"],
                 capsys, tmp_path)
    notes = run.job("two_io/local/opt-all")["notes"]
    assert ("the baseline was recorded on device spec 'local', now 'wrapped': its errors are "
            "another device's; refresh it with --update-goldens if the change is intended"
            ) in notes, notes
    assert ("the baseline was recorded with other options (threads 1, now 2); refresh it with "
            "--update-goldens if the change is intended") in notes, notes
    (tmp_path / "same").mkdir()
    same = run_ci([local_suite(tmp_path / "same"), "--baselines", ci_baselines, "--only",
                   "two_io/local/opt-all"], capsys, tmp_path)
    assert not any("recorded on device spec" in n or "other options" in n
                   for n in same.job("two_io/local/opt-all")["notes"])


def test_perturbed_model_over_tolerance_fails_accuracy_and_names_the_tensor(
        ci_baselines: Path, device_env, tmp_path: Path, capsys) -> None:
    cnn = perturbed_archive(tmp_path / "bad" / "cnn.vtc", 1.01)
    suite = local_suite(tmp_path, testcases={"cnn": cnn})
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "cnn", "--junit",
                  tmp_path / "ci.xml", "--markdown", tmp_path / "ci.md"], capsys, tmp_path)
    assert run.code == 1
    for job in ("cnn/local/opt-all", "cnn/local/opt-off"):
        assert run.gate(job, "accuracy")["status"] == "fail"
        first = run.job(job)["first_divergent"]
        assert first["name"].startswith("block2/") and first["max_abs"] > first["threshold"]
        assert run.job(job)["outputs"][0]["passed"] is False
    # optimizations off: the scaled conv's own output is the first over tolerance
    assert run.job("cnn/local/opt-off")["first_divergent"]["name"] == "block2/proj/conv:0"
    validate_junit(tmp_path / "ci.xml")
    xml = (tmp_path / "ci.xml").read_text()
    assert ('message="accuracy: 1 of 1 output(s) over tolerance; first prob (case 0): '
            'max_abs=') in xml
    assert "first divergent layer block2/proj/conv:0 (Conv, #17, case 0): max_abs=" in xml
    assert "first divergent tensor: `block2/proj/conv:0` (Conv, #17, case 0)" in \
        (tmp_path / "ci.md").read_text()
    assert run.out.splitlines()[0].startswith("FAIL  cnn/local/opt-all")


def test_slowed_runner_fails_latency_and_nothing_else(
        ci_baselines: Path, device_env, tmp_path: Path, capsys) -> None:
    spec = wrapped_runner_profile(device_env.profiles, "slowlocal", "--sleep-ms", "3")
    suite = local_suite(tmp_path, devices=f'[[device]]\nname = "local"\nspec = "{spec}"\n')
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "two_io/local/opt-all",
                  "--html", tmp_path / "ci.html"], capsys, tmp_path)
    assert run.code == 1, run.out + run.err
    assert not any("intra-op" in n for n in run.job("two_io/local/opt-all")["notes"])
    gates = {g["gate"]: g["status"] for g in run.job("two_io/local/opt-all")["gates"]}
    assert gates == {"accuracy": "pass", "regression": "pass", "latency": "fail"}
    lat = run.gate("two_io/local/opt-all", "latency")["details"]
    assert lat["ratio_lower_bound"] > 1.25 and lat["median_ms"] >= 3.0
    assert "latency: slower: median" in run.out
    # with several intra-op threads, the failure says what a single-threaded probe cannot see
    suite.write_text(suite.read_text().replace(
        'name = "opt-all"\nopt_level = "all"\nthreads = 1',
        'name = "opt-all"\nopt_level = "all"\nthreads = 2'))
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "two_io/local/opt-all"],
                 capsys, tmp_path)
    assert run.gate("two_io/local/opt-all", "latency")["status"] == "fail"
    assert any(n.startswith("the session ran 2 intra-op threads: the control probe is single-"
                            "threaded") for n in run.job("two_io/local/opt-all")["notes"])


def test_a_2x_slower_runner_fails_latency_beside_a_busy_machine(
        ci_baselines: Path, device_env, tmp_path: Path, capsys) -> None:
    # every inference done twice: the work of a model that got 2x slower, so the busy loop
    # slows it as much as the real one; the sample's own threshold (25 %)
    spec = wrapped_runner_profile(device_env.profiles, "twice", "--repeat", "2")
    suite = local_suite(tmp_path, devices=f'[[device]]\nname = "local"\nspec = "{spec}"\n',
                        latency_threshold=None)
    (tmp_path / "plain").mkdir()
    plain = local_suite(tmp_path / "plain", latency_threshold=None)
    base = tmp_path / "baselines"
    shutil.copytree(ci_baselines, base)
    with busy_cores(2):
        # this machine's latency recorded just before, beside the same busy loop: the session's
        # baseline was taken whenever the session started, under whatever load there was then
        assert run_ci([plain, "--baselines", base, "--only", "cnn/local/opt-off",
                       "--update-goldens"], capsys, tmp_path).code == 0
        run = run_ci([suite, "--baselines", base, "--only", "cnn/local/opt-off"],
                     capsys, tmp_path)
    job = run.job("cnn/local/opt-off") if run.report else {}
    assert run.code == 1, (run.out + run.err, job.get("latency"), job.get("baseline_latency"))
    gates = {g["gate"]: g["status"] for g in run.job("cnn/local/opt-off")["gates"]}
    assert gates == {"accuracy": "pass", "determinism": "pass", "regression": "pass",
                     "latency": "fail"}
    lat = run.gate("cnn/local/opt-off", "latency")["details"]
    assert lat["control"] == "probe" and lat["ratio_lower_bound"] > 1.25, lat


def test_no_latency_baseline_for_this_machine_records_one_and_says_so(
        ci_baselines: Path, device_env, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("VERIFY_MACHINE", "another-runner")
    base = tmp_path / "baselines"
    shutil.copytree(ci_baselines, base)
    suite = local_suite(tmp_path)
    run = run_ci([suite, "--baselines", base, "--only", "two_io/local/opt-all", "--markdown",
                  tmp_path / "ci.md"], capsys, tmp_path)
    assert run.code == 0, run.out + run.err
    machine = run.job("two_io/local/opt-all")["machine"]
    assert machine.startswith("another-runner-")
    lat = run.gate("two_io/local/opt-all", "latency")
    assert lat["status"] == "recorded" and machine in lat["message"]
    assert run.report["recorded_latency_baselines"] == ["two_io/local/opt-all"]
    recorded = base / "sample" / "latency" / machine / "two_io" / "local" / "opt-all.json"
    assert json.loads(recorded.read_text())["latency"]["n"] == 30
    assert "their latency was recorded, not judged" in run.err
    assert f"- `two_io/local/opt-all` on machine `{machine}`" in (tmp_path / "ci.md").read_text()
    # the next run on this machine is judged against it; --require-baselines fails a recording
    again = run_ci([suite, "--baselines", base, "--only", "two_io/local/opt-all"], capsys,
                   tmp_path)
    assert again.gate("two_io/local/opt-all", "latency")["status"] == "pass", again.out
    monkeypatch.setenv("VERIFY_MACHINE", "a-third-runner")
    strict = run_ci([suite, "--baselines", base, "--only", "two_io/local/opt-all",
                     "--require-baselines"], capsys, tmp_path)
    assert strict.code == 1 and strict.gate("two_io/local/opt-all", "latency")["status"] == \
        "recorded"


def test_a_latency_baseline_that_cannot_be_written_is_a_note_not_a_job_error(
        ci_baselines: Path, device_env, tmp_path: Path, capsys, monkeypatch) -> None:
    """Writes raise OutputError (exit 2 errors), and the recording caught only OSError: a full
    disk under the baselines made the job an error instead of the note meant for it."""
    import errno
    import os

    from verify.ci import baseline as baselines
    from verify.files import output_errors

    monkeypatch.setenv("VERIFY_MACHINE", "full-disk-runner")
    base = tmp_path / "baselines"
    shutil.copytree(ci_baselines, base)
    real = baselines.write

    def write(path: Path, doc: dict) -> None:
        if "full-disk-runner" in str(path):  # the disk fills as the latency file is written
            with output_errors(path):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, doc)

    monkeypatch.setattr(baselines, "write", write)
    suite = local_suite(tmp_path)
    run = run_ci([suite, "--baselines", base, "--only", "two_io/local/opt-all"], capsys,
                 tmp_path)
    assert run.code == 0, run.out + run.err
    assert run.gate("two_io/local/opt-all", "accuracy")["status"] == "pass"
    final = base / "sample" / "latency" / run.job("two_io/local/opt-all")["machine"]
    assert (f"note: could not record the latency baseline at {final}/two_io/local/opt-all.json: "
            "No space left on device\n") in run.out
    assert run.report["recorded_latency_baselines"] == []


def test_a_baselines_folder_that_cannot_be_written_is_a_latency_note_with_its_reason(
        ci_baselines: Path, device_env, tmp_path: Path, capsys, monkeypatch) -> None:
    """A read-only baselines folder: the staging folder cannot be made there, and the note
    gave that folder's path and 'cannot write' again before the reason."""
    import errno
    import os

    from verify.ci import staging

    monkeypatch.setenv("VERIFY_MACHINE", "read-only-runner")
    base = tmp_path / "baselines"
    shutil.copytree(ci_baselines, base)

    def refused(*_: object, **__: object) -> str:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(staging, "_new_folder", refused)  # its mkdtemp, in a read-only folder
    run = run_ci([local_suite(tmp_path), "--baselines", base, "--only",
                  "two_io/local/opt-all"], capsys, tmp_path)
    assert run.code == 0, run.out + run.err
    final = base / "sample" / "latency" / run.job("two_io/local/opt-all")["machine"]
    assert (f"note: could not record the latency baseline at {final}/two_io/local/opt-all.json: "
            "Permission denied\n") in run.out


def test_the_same_run_again_holds_every_gate(ci_baselines: Path, device_env, tmp_path: Path,
                                             capsys) -> None:
    suite = local_suite(tmp_path)
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "local"], capsys, tmp_path)
    assert run.code == 0, run.out
    assert run.report["counts"] == {"passed": 4, "failed": 0, "error": 0}


def test_noisy_runner_fails_determinism(ci_baselines: Path, device_env, tmp_path: Path,
                                        capsys) -> None:
    spec = wrapped_runner_profile(device_env.profiles, "noisy", "--noise")
    suite = local_suite(tmp_path, devices=f'[[device]]\nname = "local"\nspec = "{spec}"\n')
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "cnn/local/opt-off"],
                 capsys, tmp_path)
    assert run.code == 1
    det = run.gate("cnn/local/opt-off", "determinism")
    assert det["status"] == "fail" and det["details"]["differing"][0]["tensor"] == "prob"
    assert run.gate("cnn/local/opt-off", "accuracy")["status"] == "pass"


def test_unreachable_device_errors_its_jobs_and_the_others_go_on(
        ci_baselines: Path, device_env, tmp_path: Path, capsys) -> None:
    devices = ('[[device]]\nname = "local"\nspec = "local"\n\n'
               '[[device]]\nname = "board"\nspec = "ssh:nobody@127.0.0.1:1"\n')
    suite = local_suite(tmp_path, devices=devices)
    text = suite.read_text().replace('devices = ["local"]\ngates',
                                     'devices = ["local", "board"]\ngates')
    suite.write_text(text)
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "cnn", "--junit",
                  tmp_path / "ci.xml"], capsys, tmp_path)
    assert [j["id"] for j in run.report["jobs"]] == [
        "cnn/local/opt-all", "cnn/local/opt-off", "cnn/board/opt-all", "cnn/board/opt-off"]
    assert run.code == 3, run.out     # only device errors
    first, second = run.job("cnn/board/opt-all"), run.job("cnn/board/opt-off")
    assert first["status"] == second["status"] == "error"
    assert first["error"]["type"] == "ConnectError" and first["attempts"] == 2  # retried once
    assert second["error"]["message"].startswith("not run: device board was unreachable")
    assert second["attempts"] == 0
    assert run.job("cnn/local/opt-all")["status"] == "passed"
    validate_junit(tmp_path / "ci.xml")
    assert 'type="device-error"' in (tmp_path / "ci.xml").read_text()


def test_a_device_that_keeps_timing_out_is_taken_out_of_the_run(
        ci_baselines: Path, device_env, tmp_path: Path, capsys) -> None:
    """A board that hangs cost every one of its jobs (retries + 1) x its timeout (hours with
    the defaults); after two jobs in a row time out, its other jobs are not run."""
    spec = wrapped_runner_profile(device_env.profiles, "hangs", "--sleep-ms", "60000")
    devices = ('[[device]]\nname = "local"\nspec = "local"\n\n'
               f'[[device]]\nname = "board"\nspec = "{spec}"\ntimeout = 1.5\n')
    suite = local_suite(tmp_path, devices=devices)
    suite.write_text(suite.read_text().replace('devices = ["local"]',
                                               'devices = ["local", "board"]'))
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "board"], capsys, tmp_path)
    ids = [j["id"] for j in run.report["jobs"]]
    assert len(ids) >= 3 and run.code == 3, run.out
    first, second, *rest = (run.job(i) for i in ids)
    for job in (first, second):
        assert job["error"]["type"] == "DeviceTimeout" and job["attempts"] == 2, job["error"]
    for job in rest:
        assert job["attempts"] == 0 and job["error"]["message"].startswith(
            f"not run: device board timed out in 2 jobs in a row earlier in this run (the "
            f"last: {second['id']}: "), job["error"]


def test_a_connect_error_subclass_also_takes_the_device_out_of_the_run(
        link_down_transport: str, device_env, tmp_path: Path, capsys) -> None:
    # a third-party driver raises its own ConnectError subclass: the device is still lost
    suite = lost_board_suite(tmp_path, link_down_transport, retries=1,
                             gates=["accuracy"])
    run = run_ci([suite], capsys, tmp_path)
    assert run.code == 3, run.out
    first, second = run.job("two_io/board/default"), run.job("int_bool/board/default")
    assert first["error"] == {"kind": "device", "type": "LinkDown",
                              "message": "linkdown:rack7: the link is down"}
    assert first["attempts"] == 2  # retried once, like any ConnectError
    assert second["error"]["message"] == ("not run: device board was unreachable earlier in "
                                          "this run (linkdown:rack7: the link is down)")
    assert second["attempts"] == 0
    assert [run.job(f"{t}/local/default")["status"] for t in ("two_io", "int_bool")] == [
        "passed", "passed"]


def test_per_job_timeout_is_a_device_error(ci_baselines: Path, device_env, tmp_path: Path,
                                           capsys) -> None:
    spec = wrapped_runner_profile(device_env.profiles, "stuck", "--sleep-ms", "20000")
    suite = local_suite(tmp_path, devices=f'[[device]]\nname = "local"\nspec = "{spec}"\n'
                                          'timeout = 3\n')
    suite.write_text(suite.read_text().replace("retries = 1 ", "retries = 0 "))
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "two_io"], capsys, tmp_path)
    assert run.code == 3
    job = run.job("two_io/local/opt-all")
    assert job["error"] == {"kind": "device", "type": "DeviceTimeout",
                            "message": f"{spec} (local): {Path(sys.executable).name} did "
                                       "not finish "
                                       "within 3 s (the runner's job: load, warmups, iterations, "
                                       "dumps); allow more with --timeout SECONDS (a suite's "
                                       "timeout) or the device profile's [timeouts] command"}
    assert job["attempts"] == 1


def test_missing_baselines_are_reported_not_created(device_env, tmp_path: Path, capsys) -> None:
    suite = local_suite(tmp_path)
    empty = tmp_path / "none"
    run = run_ci([suite, "--baselines", empty, "--only", "two_io", "--markdown",
                  tmp_path / "ci.md", "--html", tmp_path / "ci.html"], capsys, tmp_path)
    assert run.code == 0
    assert run.job("two_io/local/opt-all")["summary"] == \
        "every judged gate held; not judged (no baseline): regression, latency"
    assert run.gate("two_io/local/opt-all", "regression")["status"] == "no-baseline"
    assert run.gate("two_io/local/opt-all", "latency")["status"] == "no-baseline"
    assert run.report["missing_baselines"] == ["two_io/local/opt-all"]
    assert "### Missing baselines" in (tmp_path / "ci.md").read_text()
    # the advice records them where this run looked for them, --baselines included
    record = f"`verify ci {suite} --baselines {empty} --update-goldens`"
    assert f"1 job(s) have no baseline; record them with {record}" in run.err
    assert f"Record baselines on purpose with {record}" in (tmp_path / "ci.md").read_text()
    # the HTML says as much (it said "all gates held" and "Every job held every gate.")
    import html

    page = (tmp_path / "ci.html").read_text()
    assert "<h2>Missing baselines</h2>" in page and "Every job held every gate it was judged " \
        "by." in page and "<li><code>two_io/local/opt-all</code></li>" in page
    assert "Record baselines on purpose with <code>" + html.escape(record.strip("`")) + \
        "</code>" in page
    assert not empty.exists()
    strict = run_ci([suite, "--baselines", empty, "--only", "two_io", "--require-baselines",
                     "--junit", tmp_path / "ci.xml"], capsys, tmp_path)
    assert strict.code == 1 and not empty.exists()
    assert strict.job("two_io/local/opt-all")["summary"] == \
        "no baseline for regression, latency (--require-baselines)"
    validate_junit(tmp_path / "ci.xml")
    assert 'type="missing-baseline"' in (tmp_path / "ci.xml").read_text()


def test_update_goldens_writes_sorted_reviewable_json_and_keeps_failing_jobs_out(
        device_env, tmp_path: Path, capsys) -> None:
    cnn = perturbed_archive(tmp_path / "bad" / "cnn.vtc", 1.01)
    suite = local_suite(tmp_path, testcases={"cnn": cnn})
    base = tmp_path / "bl"
    run = run_ci([suite, "--baselines", base, "--update-goldens", "--only", "cnn/local/opt-all",
                  "--only", "int_bool"], capsys, tmp_path)
    assert run.code == 1                     # cnn fails accuracy: no baseline for it
    assert not (base / "sample" / "cnn").exists()
    path = base / "sample" / "int_bool" / "local" / "opt-all.json"
    text = path.read_text()
    doc = json.loads(text)
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert doc["format"] == "verify-ci-baseline" and doc["job"] == "int_bool/local/opt-all"
    assert set(doc["outputs"]) == {"case0/argmax", "case0/mask", "case0/selected", "case0/count"}
    assert "latency" not in doc    # kept per machine, beside
    machine = run.job("int_bool/local/opt-all")["machine"]
    lat = json.loads((base / "sample" / "latency" / machine / "int_bool" / "local" /
                      "opt-all.json").read_text())
    assert lat["format"] == "verify-ci-latency" and lat["machine"] == machine
    assert len(lat["latency"]["samples_ms"]) == len(lat["latency"]["control_ms"]) == 30
    assert run.gate("int_bool/local/opt-all", "latency")["status"] == "updated"
    assert "baseline not written: a gate failed (no " in " ".join(
        run.job("cnn/local/opt-all")["notes"])  # there was none to leave as it was
    assert run.report["baselines_not_updated"] == [
        {"job": "cnn/local/opt-all", "why": "a gate failed (accuracy)"}]


def test_a_corrupt_baseline_fails_the_job_and_update_goldens_replaces_it(
        device_env, tmp_path: Path, capsys) -> None:
    suite = local_suite(tmp_path)
    base = tmp_path / "bl"
    path = base / "sample" / "int_bool" / "local" / "opt-all.json"
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    run = run_ci([suite, "--baselines", base, "--only", "int_bool"], capsys, tmp_path)
    assert run.code == 2 and run.job("int_bool/local/opt-all")["error"]["kind"] == "input"
    run = run_ci([suite, "--baselines", base, "--only", "int_bool", "--update-goldens"],
                 capsys, tmp_path)
    assert run.code == 0
    assert json.loads(path.read_text())["job"] == "int_bool/local/opt-all"
    assert any(n.startswith("replacing an unreadable baseline: ")
               for n in run.job("int_bool/local/opt-all")["notes"])


def test_html_report_links_each_job_that_has_a_section_and_no_other(
        ci_baselines: Path, device_env, tmp_path: Path, capsys) -> None:
    """One failing and one passing job: the failing one's row links to its section; the
    passing one's row links nowhere. Every row linked '#job-id', and passing jobs have no
    section, so their links led nowhere."""
    cnn = perturbed_archive(tmp_path / "bad" / "cnn.vtc", 1.01)
    suite = local_suite(tmp_path, testcases={"cnn": cnn})
    html = tmp_path / "ci.html"
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "cnn/local/opt-off",
                  "--only", "two_io/local/opt-all", "--html", html], capsys, tmp_path)
    assert run.code == 1
    page = html.read_text()
    links = re.findall(r"href='#([^']*)'", page)
    anchors = set(re.findall(r"id='([^']*)'", page))
    assert links == ["cnn/local/opt-off"] and set(links) <= anchors
    assert "<code>two_io/local/opt-all</code>" in page


def test_html_report_shows_the_plot_in_headless_chromium(ci_baselines: Path, device_env,
                                                          tmp_path: Path, capsys) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/setup.sh --test installs it)")
    cnn = perturbed_archive(tmp_path / "bad" / "cnn.vtc", 1.01)
    suite = local_suite(tmp_path, testcases={"cnn": cnn})
    html = tmp_path / "ci.html"
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "cnn/local/opt-off",
                  "--html", html], capsys, tmp_path)
    assert run.code == 1
    page = html.read_text()
    assert page.count("data:image/png;base64,") == 1
    assert "<script" not in page and "src='http" not in page and 'src="http' not in page
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1280,1100",
         "--hide-scrollbars", f"--screenshot={shot}", html.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    # the plot sits below the job table: its area must not be blank, and it must show the
    # error curve's blue and the tolerance line's / first-divergent marker's red
    plot_area = pixels[300:, :1000]
    assert (plot_area.sum(axis=2) < 600).mean() > 0.02, "the plot area is blank"

    def near(colour: tuple[int, int, int]) -> int:
        return int((np.abs(plot_area - np.array(colour)).sum(axis=2) < 40).sum())

    assert near(PLOT_BLUE) > 200 and near(PLOT_RED) > 200


def test_cli_exit_codes_and_listing(device_env, tmp_path: Path, capsys) -> None:
    from verify.cli import main

    suite = local_suite(tmp_path)
    assert main(["ci", str(suite), "--list", "--shard", "1/1"]) == 0
    out, err = capsys.readouterr()
    assert out.split() == ["cnn/local/opt-all", "cnn/local/opt-off", "two_io/local/opt-all",
                           "int_bool/local/opt-all"]
    assert err == "4 of 4 job(s) in shard 1/1\n"
    assert main(["ci", str(suite), "--shard", "3/2"]) == 2
    assert capsys.readouterr().err == ("error: --shard '3/2': expected I/N with 1 <= I <= N, "
                                       "e.g. --shard 2/4\n")
    assert main(["ci", str(suite), "--only", "resnet"]) == 2
    assert capsys.readouterr().err == ("error: --only resnet: matches none of the 4 jobs "
                                       "(ids look like cnn/local/opt-all)\n")
    assert main(["ci", str(tmp_path / "nope.toml")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nope.toml'}: no such file\n"


@pytest.mark.parametrize("option", ["--junit", "--markdown", "--report-json", "--html"])
def test_a_report_path_that_cannot_be_a_file_stops_ci_before_any_job_runs(
        option: str, device_env, tmp_path: Path, capsys) -> None:
    from verify.cli import main

    suite = local_suite(tmp_path)
    folder, blocker = tmp_path / "a-folder", tmp_path / "a-file"
    folder.mkdir()
    blocker.write_text("not a folder")
    assert main(["ci", str(suite), "--baselines", str(tmp_path / "bl"), option, str(folder)]) == 2
    out, err = capsys.readouterr()
    assert err == f"error: {option} {folder}: is a folder; give a file name\n"
    assert out == ""  # no job ran: none printed its line
    inside = blocker / "r.out"
    assert main(["ci", str(suite), option, str(inside)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"error: {option} {inside}: {blocker} is a file, not a folder\n")
    assert not (tmp_path / "bl").exists()


def test_ci_reads_its_suite_once(device_env, tmp_path: Path, capsys,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With reports asked for, the suite was read to check their paths and read again to run:
    an edit in between ran another suite than the one checked."""
    import verify.ci as ci_lib
    from verify.cli import main

    suite, reads = local_suite(tmp_path), []
    real = ci_lib.load_suite
    monkeypatch.setattr(ci_lib, "load_suite", lambda path: reads.append(path) or real(path))
    report = tmp_path / "r.json"
    assert main(["ci", str(suite), "--only", "cnn/local/opt-all", "--baselines",
                 str(tmp_path / "bl"), "--report-json", str(report)]) in (0, 1)
    assert json.loads(report.read_text())["jobs"] and reads == [suite]


def test_a_device_spec_that_names_no_device_stops_ci_before_any_job_runs(
        device_env, tmp_path: Path, capsys) -> None:
    """A malformed spec (`ssh:` with no host) or a profile this machine lacks, for a device
    the run selects: one line naming the suite and the [[device]], exit 2, and no job run.
    Each used to be a job error at the end, after the other devices' jobs had run. A device
    --only leaves out is not asked for."""
    from verify.cli import main

    for spec, why in (("ssh:", "device 'ssh:': nothing after ':'; give ssh:user@host[:port]"),
                      ("nosuch", "unknown device 'nosuch': no profile nosuch.toml in ")):
        suite = local_suite(tmp_path, devices='[[device]]\nname = "local"\nspec = "local"\n'
                            f'[[device]]\nname = "board"\nspec = "{spec}"\n',
                            extra="")
        text = suite.read_text().replace('devices = ["local"]', 'devices = ["local", "board"]')
        suite.write_text(text)
        assert main(["ci", str(suite), "--baselines", str(tmp_path / "bl")]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"error: {suite}: [[device]] 'board': {why}")
        assert len(err.splitlines()) == 1
        assert not (tmp_path / "bl").exists()
    assert main(["ci", str(suite), "--only", "*/local/*", "--baselines",
                 str(tmp_path / "bl")]) == 0
    assert "PASS  cnn/local/opt-all" in capsys.readouterr().out


def test_a_run_that_stops_on_the_way_leaves_no_earlier_report_standing(
        device_env, tmp_path: Path, capsys) -> None:
    """The reports are removed before any job runs and written at its end: a run that stops
    on the way (here on a device spec naming no device; killed: tests/ci/test_ci_stop.py)
    leaves none, rather than an earlier run's that a CI step would read as this one's."""
    from verify.cli import main

    suite = local_suite(tmp_path, devices='[[device]]\nname = "local"\nspec = "local"\n'
                        '[[device]]\nname = "board"\nspec = "nosuch"\n')
    suite.write_text(suite.read_text().replace('devices = ["local"]',
                                               'devices = ["local", "board"]'))
    reports = {option: tmp_path / f"old.{ext}" for option, ext in (
        ("--junit", "xml"), ("--markdown", "md"), ("--report-json", "json"), ("--html", "html"))}
    for path in reports.values():
        path.write_text("an earlier run's report, all green\n")
    argv = [str(x) for option, path in reports.items() for x in (option, path)]
    assert main(["ci", str(suite), "--baselines", str(tmp_path / "bl"), *argv]) == 2
    assert "[[device]] 'board': unknown device 'nosuch'" in capsys.readouterr().err
    assert [path for path in reports.values() if path.exists()] == []


def test_help_has_an_example(capsys) -> None:
    from verify.cli import main

    assert main(["ci", "--help"]) == 0
    out = capsys.readouterr().out
    assert "verify ci goldens/suites/sample.toml --junit ci.xml" in out
    assert "2 a bad suite file" in out


@pytest.mark.slow
def test_suite_over_ssh_and_adb_test_devices_in_parallel(device_env, sshd_server, adb_server,
                                                         adb_device, tmp_path: Path,
                                                         capsys) -> None:
    import secrets

    board = device_env.ssh_profile("ci-board", sshd_server, tmp_path / "board")
    phone = device_env.adb_profile("ci-phone", adb_server, adb_device,
                                   adb_device.sandbox / f"ci-{secrets.token_hex(4)}" / "verify")
    devices = "".join(f'[[device]]\nname = "{n}"\nspec = "{s}"\niterations = 5\n\n'
                      for n, s in (("local", "local"), ("board", board), ("phone", phone)))
    suite = local_suite(tmp_path, devices=devices)
    suite.write_text(suite.read_text().replace('devices = ["local"]\noptions = ["opt-all"]',
                                               'devices = ["local", "board", "phone"]\n'
                                               'options = ["opt-all"]', 1))
    base = tmp_path / "bl"
    first = run_ci([suite, "--baselines", base, "--only", "two_io", "--update-goldens"],
                   capsys, tmp_path)
    assert first.code == 0, first.out + first.err
    assert [j["id"] for j in first.report["jobs"]] == [
        "two_io/local/opt-all", "two_io/board/opt-all", "two_io/phone/opt-all"]
    assert [j["device"]["spec"] for j in first.report["jobs"]] == ["local", board, phone]
    again = run_ci([suite, "--baselines", base, "--only", "two_io", "--junit",
                    tmp_path / "ci.xml"], capsys, tmp_path)
    assert again.code == 0, again.out
    for dev in ("local", "board", "phone"):
        gates = {g["gate"]: g["status"] for g in again.job(f"two_io/{dev}/opt-all")["gates"]}
        assert gates == {"accuracy": "pass", "regression": "pass", "latency": "pass"}, dev
    validate_junit(tmp_path / "ci.xml")
    from junitparser import JUnitXml

    suites = {s.name: s for s in JUnitXml.fromfile(str(tmp_path / "ci.xml"))}
    assert set(suites) == {"sample.local", "sample.board", "sample.phone"}
    assert all(s.tests == 1 and s.failures == 0 and s.errors == 0 for s in suites.values())


def test_json_on_stdout_is_the_report(ci_baselines: Path, device_env, tmp_path: Path,
                                      capsys) -> None:
    from verify.cli import main

    suite = local_suite(tmp_path)
    assert main(["ci", str(suite), "--baselines", str(ci_baselines), "--only", "int_bool",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "verify-ci-report" and doc["verdict"] == "passed"
    job = doc["jobs"][0]
    assert job["id"] == "int_bool/local/opt-all"
    assert [o["name"] for o in job["outputs"]] == ["argmax", "mask", "selected", "count"]
    assert {o["rule"] for o in job["outputs"]} >= {"exact"}


def test_a_corrupt_testcase_is_an_input_error_exit_2(device_env, tmp_path: Path,
                                                     capsys) -> None:
    bad = tmp_path / "cnn.vtc"
    bad.write_bytes(b"not an archive")
    suite = local_suite(tmp_path, testcases={"cnn": bad})
    run = run_ci([suite, "--baselines", tmp_path / "bl", "--only", "cnn/local/opt-all", "--only",
                  "two_io"], capsys, tmp_path)
    assert run.code == 2
    job = run.job("cnn/local/opt-all")
    assert job["status"] == "error" and job["error"]["kind"] == "input"
    assert job["error"]["message"].startswith(str(bad))
    assert run.job("two_io/local/opt-all")["status"] == "passed"   # the others go on


def test_a_layers_job_with_determinism_runs_the_device_twice_not_three_times(
        ci_baselines: Path, device_env, tmp_path: Path, capsys,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-layer run's outputs come from the unmarked model: it is the determinism gate's
    second run, so no third run is made."""
    from verify import execute

    runs: list[bool] = []
    real = execute.run
    monkeypatch.setattr(execute, "run", lambda req, **kw: runs.append(
        req.dump.bin_io_dump is not None) or real(req, **kw))
    suite = local_suite(tmp_path)
    run = run_ci([suite, "--baselines", ci_baselines, "--only", "cnn/local/opt-all"],
                 capsys, tmp_path)
    assert run.code == 0, run.out
    gates_run = {g["gate"]: g["status"] for g in run.job("cnn/local/opt-all")["gates"]}
    assert gates_run["determinism"] == "pass" and run.job("cnn/local/opt-all")["layers"]
    assert runs == [False, True]  # the timed run, then the per-layer run; nothing else


@pytest.mark.parametrize("option, library", [("--junit", "junitparser"), ("--html", "matplotlib")])
def test_a_missing_report_extra_stops_ci_before_any_job_runs(tmp_path: Path, option: str,
                                                             library: str) -> None:
    # the library made unimportable in a process of its own, as on an install without the
    # `report` extra
    code = (f"import sys\nsys.modules[{library!r}] = None\nfrom verify.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-c", code, "ci", str(SAMPLE), option,
                           str(tmp_path / "out"), "--report-json", str(report), "--baselines",
                           str(tmp_path / "bl")], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == f"error: {option} needs {library}: pip install 'onnx-verify[report]'\n"
    assert proc.stdout == ""     # no job ran: none printed its line, no report was written
    assert not report.exists() and not (tmp_path / "out").exists()
    assert not (tmp_path / "bl").exists()


def test_a_testcase_glob_judging_a_layer_is_not_noted_as_matching_nothing(
        device_env, tmp_path: Path, capsys) -> None:
    """With `layers = true` a testcase's glob may name a layer: it judged the job, so no note
    may say it matched nothing; a glob naming neither an output nor a layer is noted, in the
    suite's words (not --tol's)."""
    suite = tmp_path / "s.toml"
    suite.write_text(f"""[suite]
name = "s"
gates = ["accuracy"]
iterations = 2
warmup = 0
[[options]]
name = "all"
opt_level = "all"
[[testcase]]
path = {json.dumps(str(TESTCASES / "cnn.vtc"))}
layers = true
[testcase.tolerance]
tensors = {{ "block3/relu:0" = "atol=1e-30,rtol=0", "block3/rleu:0" = "atol=1" }}
""", encoding="utf-8")
    run = run_ci([suite], capsys, tmp_path)
    assert run.code == 1, run.out + run.err  # the strict layer glob fails the job
    notes = run.job("cnn/local/all")["notes"]
    assert not any("'block3/relu:0:" in n for n in notes), notes
    assert ("the testcase's tolerance 'block3/rleu:0:atol=1' matches no output or layer of the "
            "archive (prob); the glob must match a whole name") in notes


def test_a_report_never_lands_on_an_unselected_testcase_or_a_baseline(
        device_env, tmp_path: Path, capsys) -> None:
    """--only picks one testcase; a report path naming another testcase of the suite, or a
    file in its baselines folder, would destroy it: exit 2 before any job, both left as they
    were."""
    cnn = tmp_path / "tc" / "cnn.vtc"
    cnn.parent.mkdir()
    shutil.copy(TESTCASES / "cnn.vtc", cnn)
    suite = local_suite(tmp_path, testcases={"cnn": cnn})
    before = cnn.read_bytes()
    run = run_ci([suite, "--only", "int_bool", "--markdown", cnn], capsys, tmp_path)
    assert run.code == 2 and cnn.read_bytes() == before
    assert f"--markdown {cnn}: is testcase 'cnn' of the suite" in run.err
    base = tmp_path / "bl"
    assert run_ci([suite, "--only", "int_bool", "--baselines", base, "--update-goldens"],
                  capsys, tmp_path).code == 0
    recorded = next(base.rglob("*.json"))
    kept = recorded.read_bytes()
    run = run_ci([suite, "--only", "int_bool", "--baselines", base, "--junit", recorded],
                 capsys, tmp_path)
    assert run.code == 2 and recorded.read_bytes() == kept
    assert f"--junit {recorded}: is inside the baselines folder {base.resolve()}" in run.err


def test_the_markdown_regression_cell_of_a_zero_baseline_shows_the_error_not_inf() -> None:
    from types import SimpleNamespace

    from verify.ci.report import _gate_cell

    gate = SimpleNamespace(gate="regression", status="fail", details={
        "worse_outputs": [{"tensor": "y", "max_abs": 2.5e-6, "baseline_max_abs": 0.0,
                           "limit": 1e-6, "ratio": "inf"}], "worse_layers": []})
    cell = _gate_cell(SimpleNamespace(gates=[gate]), "regression")  # type: ignore[arg-type]
    assert cell.endswith(" 2.5e-06 vs 0 (2.5x the limit) at `y`") and "inf" not in cell
    gate.details["worse_outputs"][0].update(baseline_max_abs=1e-6, limit=2e-6, ratio=2.5)
    assert _gate_cell(SimpleNamespace(gates=[gate]), "regression").endswith(" 2.5x at `y`")
    # a NaN error against a baseline that was a number: said so, not "nan vs 0"
    gate.details["worse_outputs"][0].update(max_abs="nan", baseline_max_abs=5e-4, ratio="nan")
    assert _gate_cell(SimpleNamespace(gates=[gate]), "regression").endswith(
        " nan vs 0.0005 at `y`")
