"""Suite files (every mistake exits 2 naming the line or key), the job matrix, --shard and
--only, the gates' decisions on synthetic figures, and the committed goldens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures_ci import REPO, SAMPLE, TESTCASES

from verify.ci import baseline as baselines
from verify.ci import gates
from verify.ci.jobs import expand, select, shard_of
from verify.ci.results import Latency, TensorError
from verify.ci.suite import GateSettings, load_suite

GOOD = f"""
[suite]
name = "t"
iterations = 4

[[device]]
name = "local"

[[options]]
name = "o1"

[[testcase]]
path = "{TESTCASES / 'two_io.vtc'}"
"""


def suite_error(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    from verify.cli import main

    path = tmp_path / "s.toml"
    path.write_text(text)
    capsys.readouterr()
    assert main(["ci", str(path), "--list"]) == 2
    return capsys.readouterr().err.replace(str(path), "S")


@pytest.mark.parametrize("change, message", [
    (("iterations = 4", "iteratons = 4"),
     "error: S: line 4: suite.iteratons: unknown key (known: name, baselines, iterations, "
     "warmup, timeout, retries, gates, tolerance)\n"),
    (("iterations = 4", "iterations = 0"), "error: S: line 4: suite.iterations: must be an "
                                           "integer >= 1\n"),
    (('name = "o1"', 'name = "o1"\nopt_level = "max"'),
     "error: S: line 11: options[0].opt_level: must be one of disable, basic, extended, layout, all\n"),
    (("[[testcase]]", '[[testcase]]\ndevices = ["phone"]'),
     "error: S: line 13: testcase[0].devices: no [[device]] named 'phone' (known: local)\n"),
    (("[[testcase]]", '[[testcase]]\ngates = ["speed"]'),
     "error: S: line 13: testcase[0].gates: unknown gate 'speed' (known: accuracy, regression, "
     "latency, determinism)\n"),
    (('name = "local"', 'name = "local"\ngates = ["speed"]'),
     "error: S: line 8: device[0].gates: unknown gate 'speed' (known: accuracy, regression, "
     "latency, determinism)\n"),
    (("[[device]]", '[gate.latency]\ncontrol = "job"\n\n[[device]]'),
     "error: S: line 7: gate.latency.control: must be one of none, probe\n"),
    # an empty list ran nothing, or judged nothing, and the night passed green
    (("[[testcase]]", '[[testcase]]\ndevices = []'),
     "error: S: line 13: testcase[0].devices: an empty list runs the testcase nowhere: name at "
     "least one (known: local), or leave devices out for all\n"),
    (("[[testcase]]", '[[testcase]]\noptions = []'),
     "error: S: line 13: testcase[0].options: an empty list runs the testcase nowhere: name at "
     "least one (known: o1), or leave options out for all\n"),
    (('name = "local"', 'name = "local"\ngates = []'),
     "error: S: line 8: device[0].gates: an empty list judges nothing: name at least one of "
     "accuracy, regression, latency, determinism\n"),
    (("iterations = 4", "iterations = 4\ngates = []"),
     "error: S: line 5: suite.gates: an empty list judges nothing: name at least one of "
     "accuracy, regression, latency, determinism\n"),
    # names are folders of the baselines: ".." put a testcase's beside the suite's
    (('name = "t"', 'name = ".."'),
     "error: S: line 3: suite.name: must be a name of letters, digits and _ . + - (not . or ..)\n"),
    (('name = "o1"', 'name = "."'),
     "error: S: line 10: options[0].name: must be a name of letters, digits and _ . + - (not . "
     "or ..)\n"),
    (("two_io.vtc", "nothing*.vtc"), None),
    (("[[device]]", '[suite.tolerance]\ntensors = { "prob" = "atol=x" }\n\n[[device]]'), None),
    (("iterations = 4", "iterations = [4"), None),
])
def test_bad_suite_files_exit_2_naming_the_line_or_key(tmp_path: Path, capsys, change,
                                                       message) -> None:
    err = suite_error(tmp_path, GOOD.replace(*change), capsys)
    if message is not None:
        assert err == message
    elif "nothing" in change[1]:
        assert err.startswith("error: S: line 13: testcase[0].path: '") and \
            err.endswith("nothing*.vtc' matches no file (relative to " f"{tmp_path})\n")
    elif "atol=x" in change[1]:
        assert err.startswith("error: S: line 7: suite.tolerance.tensors.prob: ")
    else:
        assert err.startswith("error: S: not valid TOML: ") and "(at line 6" in err


def test_duplicate_testcase_names_are_refused(tmp_path: Path, capsys) -> None:
    text = GOOD + f'\n[[testcase]]\npath = "{TESTCASES / "two_io.vtc"}"\n'
    err = suite_error(tmp_path, text, capsys)
    assert err.startswith("error: S: line 16: testcase[1].path: testcase name 'two_io' is used "
                          "twice")
    assert err.rstrip().endswith('give one a name of its own (name = "...")')
    # a testcase that has a name already is told to take another (it was told to take one)
    text = GOOD + (f'\n[[testcase]]\npath = "{TESTCASES / "cnn.vtc"}"\nname = "two_io"\n')
    err = suite_error(tmp_path, text, capsys)
    assert "testcase[1].name: testcase name 'two_io' is used twice" in err
    assert err.rstrip().endswith('give one another name (its own name = "...")')


def test_matrix_settings_layer_testcase_then_device_then_suite() -> None:
    suite = load_suite(SAMPLE)
    jobs = {j.id: j for j in expand(suite)}
    assert list(jobs) == ["cnn/local/opt-all", "cnn/local/opt-off", "two_io/local/opt-all",
                          "two_io/arm64/opt-all", "int_bool/local/opt-all"]
    arm = jobs["two_io/arm64/opt-all"]
    assert (arm.iterations, arm.warmup, arm.timeout) == (20, 1, 600.0)
    local = jobs["two_io/local/opt-all"]
    assert (local.iterations, local.warmup, local.timeout, local.retries) == (30, 3, 300.0, 1)
    assert jobs["int_bool/local/opt-all"].tolerance.specs == ("selected:exact", "prob:k=2^-14")
    assert jobs["cnn/local/opt-off"].options.session.opt_level == "disable"
    assert "determinism" in jobs["cnn/local/opt-all"].gates
    assert "determinism" not in local.gates
    assert local.gates == ("accuracy", "regression", "latency")   # the suite's
    assert arm.gates == ("accuracy", "regression")                 # the device's
    assert suite.baselines == SAMPLE.parent / "../baselines"


def test_gates_a_testcase_names_win_over_the_device_s(tmp_path: Path) -> None:
    text = GOOD.replace('name = "local"', 'name = "local"\ngates = ["accuracy"]') + (
        f'\n[[testcase]]\nname = "own"\npath = "{TESTCASES / "two_io.vtc"}"\n'
        'gates = ["determinism", "latency"]\n')
    (tmp_path / "s.toml").write_text(text)
    jobs = {j.id: j.gates for j in expand(load_suite(tmp_path / "s.toml"))}
    assert jobs == {"two_io/local/o1": ("accuracy",), "own/local/o1": ("determinism", "latency")}


def test_gate_accuracy_layers_is_every_testcase_default(tmp_path: Path, capsys) -> None:
    text = GOOD.replace("[[device]]", "[gate.accuracy]\nlayers = true\n\n[[device]]") + (
        f'\n[[testcase]]\nname = "plain"\npath = "{TESTCASES / "two_io.vtc"}"\nlayers = false\n')
    path = tmp_path / "s.toml"
    path.write_text(text)
    assert {j.id: j.layers for j in expand(load_suite(path))} == {
        "two_io/local/o1": True, "plain/local/o1": False}
    err = suite_error(tmp_path, text.replace("layers = true", "layers = 1"), capsys)
    assert err == "error: S: line 7: gate.accuracy.layers: must be true or false\n"


def test_shards_are_disjoint_complete_and_stable() -> None:
    jobs = expand(load_suite(SAMPLE))
    for n in (1, 2, 3, 7):
        parts = [select(jobs, shard=(i, n)) for i in range(1, n + 1)]
        ids = [j.id for part in parts for j in part]
        assert sorted(ids) == sorted(j.id for j in jobs) and len(ids) == len(set(ids))
    # a job's shard depends on its id and N only: dropping other jobs never moves it
    for j in jobs:
        assert [x.id for x in select([j], shard=(shard_of(j.id, 4), 4))] == [j.id]
    # pinned: a job must land in the same shard on every runner and every verify version
    assert [shard_of(i, 4) for i in ("cnn/local/opt-all", "two_io/arm64/opt-all",
                                      "int_bool/local/opt-all")] == [4, 1, 3]


def test_only_matches_globs_and_names() -> None:
    jobs = expand(load_suite(SAMPLE))
    assert [j.id for j in select(jobs, only=["arm64"])] == ["two_io/arm64/opt-all"]
    assert [j.id for j in select(jobs, only=["cnn/*/opt-off", "int_bool"])] == [
        "cnn/local/opt-off", "int_bool/local/opt-all"]


def _t(max_abs: float, name: str = "y", passed: bool = True, index: int = 0) -> TensorError:
    return TensorError(case=0, index=index, name=name, op="Conv", passed=passed,
                       rule="magnitude", max_abs=max_abs, threshold=1e-4,
                       tol_units=max_abs / 1e-4)


def test_a_failure_beyond_any_tolerance_says_so_not_infx() -> None:
    finite = _t(3e-4, passed=False)
    assert finite.numbers() == ("max_abs=0.0003 threshold=0.0001 (3x tolerance), 0 element(s) "
                                "outside [magnitude]")
    zero = TensorError(case=0, index=0, name="y", op="Conv", passed=False, rule="allclose atol=0",
                       max_abs=1e-7, threshold=0.0, tol_units=float("inf"), n_outside=2)
    assert zero.numbers() == ("max_abs=1e-07 threshold=0 (beyond any tolerance), 2 element(s) "
                              "outside [allclose atol=0]")


def test_regression_gate_factor_and_noise_floor() -> None:
    s = GateSettings(regression_factor=2.0, regression_min_units=0.01)
    base = {"case0/y": 1e-6}
    assert gates.regression([_t(1.9e-6)], [], base, {}, s, "b").status == "pass"
    fail = gates.regression([_t(2.1e-6)], [], base, {}, s, "b")
    assert fail.status == "fail" and fail.details["worse_outputs"][0]["ratio"] == 2.1
    # a baseline error of 0: the floor (1% of the tolerance) keeps last-bit noise from failing
    assert gates.regression([_t(1.5e-6)], [], {"case0/y": 0.0}, {}, s, "b").status == "pass"
    assert gates.regression([_t(3e-6)], [], {"case0/y": 0.0}, {}, s, "b").status == "fail"
    layer = gates.regression([_t(0.0)], [_t(5e-6, "conv", index=3)], {"case0/y": 0.0},
                             {"case0/conv": 1e-6}, s, "b")
    assert layer.status == "fail" and "first layer #3 Conv conv: max_abs=5e-06" in layer.message
    assert gates.regression([_t(1e-6)], [], None, {}, s, "b/x.json").status == "no-baseline"
    # a baseline recorded without layers judges none of them, and says so (it said "0 layer(s)
    # worse" of NaN layers, and nothing at all when the outputs held)
    nan_layers = [_t(float("nan"), f"conv{i}", passed=False, index=i) for i in range(3)]
    held = gates.regression([_t(1e-6)], nan_layers, base, {}, s, "b")
    assert held.status == "pass" and held.message.endswith(
        "(3 layer(s) not judged: the baseline was recorded without layers; refresh it with "
        "--update-goldens)")
    assert held.details["not_in_baseline"] == ["case0/conv0", "case0/conv1", "case0/conv2"]
    worse = gates.regression([_t(3e-6)], nan_layers, base, {}, s, "b")
    assert worse.status == "fail" and "(3 layer(s) not judged" in worse.message


def test_latency_gate_decides_on_the_samples_not_one_average() -> None:
    rng = np.random.default_rng(1)
    s = GateSettings(latency_threshold=0.25, latency_confidence=0.95, latency_min_delta_ms=0.05)
    base = Latency(tuple(10 + rng.exponential(0.5, 30)))
    same = Latency(tuple(10 + rng.exponential(0.5, 30)))
    slower = Latency(tuple(13.5 + rng.exponential(0.5, 30)))
    assert gates.latency(same, base, s, "j", "b").status == "pass"
    verdict = gates.latency(slower, base, s, "j", "b")
    assert verdict.status == "fail" and verdict.details["ratio_lower_bound"] > 1.25
    # one huge outlier moves the mean by 50% but not the median: no failure
    spiky = Latency((*same.samples_ms[:-1], 160.0))
    assert np.mean(spiky.samples_ms) > 1.4 * np.mean(base.samples_ms)
    assert gates.latency(spiky, base, s, "j", "b").status == "pass"
    # three noisy samples 30% slower: not enough evidence at 95%
    few = Latency((9.0, 13.0, 17.0))
    assert gates.latency(few, base, s, "j", "b").status == "pass"
    # a tiny model: 2x slower but by less than min_delta_ms
    tiny = GateSettings(latency_min_delta_ms=0.05)
    assert gates.latency(Latency((0.02,) * 20), Latency((0.01,) * 20), tiny, "j", "b").status \
        == "pass"
    # the same inputs give the same decision (a seeded bootstrap)
    assert gates.latency(slower, base, s, "j", "b") == verdict


def test_determinism_gate_is_bitwise() -> None:
    a = {"y": np.array([1.0, np.nan], np.float32)}
    assert gates.determinism([a], [{"y": a["y"].copy()}]).status == "pass"
    b = {"y": np.array([np.nextafter(np.float32(1), np.float32(2)), np.nan], np.float32)}
    fail = gates.determinism([a], [b])
    assert fail.status == "fail" and fail.details["differing"][0]["tensor"] == "y"


def test_a_malformed_or_newer_baseline_is_a_clear_error(tmp_path: Path) -> None:
    from verify.errors import UsageError

    path = tmp_path / "b.json"
    path.write_text("{")
    with pytest.raises(UsageError, match="unreadable baseline"):
        baselines.load(path)
    path.write_text(json.dumps({"format": "verify-ci-baseline", "version": 99}))
    with pytest.raises(UsageError, match="newer than this verify understands"):
        baselines.load(path)
    assert baselines.load(tmp_path / "none.json") is None


def test_committed_baselines_cover_the_sample_suite_and_are_sorted() -> None:
    suite = load_suite(SAMPLE)
    for job in expand(suite):
        path = baselines.baseline_path(suite.baselines, suite.name, job)
        text = path.read_text()
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n", path
        base = baselines.load(path)
        assert base is not None and base.outputs, path
        # latency is per machine: none is committed for the sample, a clone records its own
        assert "latency" not in json.loads(text), path
    assert not (suite.baselines / suite.name / "latency").exists()


def test_latency_baselines_are_per_machine_files_that_read_back(tmp_path: Path) -> None:
    job = expand(load_suite(SAMPLE))[0]
    a = baselines.latency_path(tmp_path, "s", "vm-0123456789", job)
    b = baselines.latency_path(tmp_path, "s", "vm-abcdefabcd", job)
    assert a != b and a.relative_to(tmp_path).parts[:3] == ("s", "latency", "vm-0123456789")
    assert baselines.load_latency(a) is None
    lat = Latency((1.0, 2.0, 4.0), (0.5, 0.5, 0.25))
    doc = {"format": baselines.LATENCY_FORMAT, "version": 1, "latency": lat.to_dict()}
    baselines.write(a, doc)
    assert baselines.load_latency(a) == lat
    a.write_text(json.dumps({"format": baselines.LATENCY_FORMAT, "version": 9}))
    with pytest.raises(Exception, match="newer than this verify understands"):
        baselines.load_latency(a)


def test_machine_fingerprint_keys_on_the_machine_and_the_label_replaces_it(monkeypatch) -> None:
    from verify.ci import machine

    monkeypatch.delenv(machine.ENV, raising=False)
    desc = {"hostname": "vm", "arch": "x86_64", "os": "Linux 6.1", "cpu_count": 2,
            "cpu": "AMD EPYC", "machine_id": "e0d86cadadc7b8e0", "python": "3.11.7",
            "onnxruntime": "1.32.0"}
    fp = machine.fingerprint(desc, host="vm")
    assert fp.startswith("vm-") and len(fp) == 13
    # the kernel release, python and onnxruntime are not the machine (an upgrade is judged)
    assert machine.fingerprint({**desc, "os": "Linux 6.9", "python": "3.12", "onnxruntime":
                                "1.33"}, host="vm") == fp
    for key, other in (("machine_id", "ffff"), ("cpu_count", 4), ("arch", "aarch64"),
                       ("cpu", "Intel Xeon")):   # two VMs both named "vm" differ
        assert machine.fingerprint({**desc, key: other}, host="vm") != fp
    monkeypatch.setenv(machine.ENV, "ci pool/a")
    labelled = machine.fingerprint(desc, host="vm")
    assert labelled.startswith("ci-pool-a-") and labelled == machine.fingerprint(
        {**desc, "machine_id": "ffff"}, host="vm")      # every runner of the pool alike
    assert machine.fingerprint({**desc, "hostname": "phone"}, host="vm").startswith("phone-")


def test_latency_gate_over_the_control_probe_cancels_a_busy_machine() -> None:
    rng = np.random.default_rng(2)
    s = GateSettings(latency_control="probe")
    probe = 0.2 + rng.exponential(0.01, 30)
    model = 0.5 + rng.exponential(0.02, 30)
    base = Latency(tuple(model), tuple(probe))
    # the whole machine 1.8x slower (other work on its cores): both slow alike
    busy = Latency(tuple(1.8 * model[::-1]), tuple(1.8 * probe[::-1]))
    held = gates.latency(busy, base, s, "j", "b", "vm-1")
    assert held.status == "pass" and held.details["control"] == "probe", held.message
    assert "1.00x over the control" in held.message and held.details["machine"] == "vm-1"
    assert gates.latency(busy, base, GateSettings(), "j", "b").status == "fail"  # no control
    # the model itself 2x slower on the same busy machine: caught
    slow = Latency(tuple(2 * 1.8 * model), tuple(1.8 * probe))
    verdict = gates.latency(slow, base, s, "j", "b")
    assert verdict.status == "fail" and verdict.details["ratio_lower_bound"] > 1.25
    # busier still: 16 of this run's 30 iterations descheduled (10x) while their probes were
    # not - the fastest tenths over the control hold where the median would not; 2x still fails
    hit = rng.permutation(30) < 16
    preempted = np.where(hit, 10.0, 1.0)
    held = gates.latency(Latency(tuple(model * preempted), tuple(probe)), base, s, "j", "b")
    assert held.status == "pass" and held.details["statistic"] == "p10", held.message
    assert np.median(model * preempted) / np.median(model) > 1.25   # the median would fail
    slow = Latency(tuple(2 * model * preempted), tuple(probe))
    assert gates.latency(slow, base, s, "j", "b").status == "fail"
    # a baseline without probe samples: compared as measured, and said so
    plain = gates.latency(Latency(tuple(model)), Latency(tuple(model)), s, "j", "b")
    assert plain.status == "pass" and plain.details["control"] == "none"
    assert "control probe missing from the baseline" not in plain.message
    assert "control probe missing from this run" in plain.message


def test_latency_record_keys_and_figures() -> None:
    assert Latency((1.0, 2.0, 4.0)).to_dict() == {
        "n": 3, "median_ms": 2.0, "mean_ms": 2.33333, "sd_ms": 1.52753, "min_ms": 1.0,
        "max_ms": 4.0, "samples_ms": [1.0, 2.0, 4.0]}
    assert Latency((3.0,)).to_dict()["sd_ms"] == 0.0
    assert Latency(()).to_dict() == {"n": 0, "median_ms": "nan", "mean_ms": "nan", "sd_ms": 0.0,
                                     "min_ms": "nan", "max_ms": "nan", "samples_ms": []}


def test_ci_goldens_are_current() -> None:
    proc = subprocess.run([sys.executable, "scripts/build_ci_goldens.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "goldens/testcases are current" in proc.stderr


def _strings(node: object) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


@pytest.mark.parametrize("name", ["github-nightly.yml", "gitlab-nightly.yml"])
def test_example_workflows_parse_and_call_verify_ci_with_real_options(name: str) -> None:
    import re
    import shlex

    import yaml

    from verify.cli.ci_cmd import ci

    doc = yaml.safe_load((REPO / "examples" / "ci" / name).read_text())
    commands = [s for s in _strings(doc) if s.lstrip().startswith("verify ci ")]
    assert len(commands) >= 2
    for command in commands:
        plain = re.sub(r"\$\{\{[^}]*\}\}", "1", command).replace("$CI_NODE_INDEX", "1") \
            .replace("$CI_NODE_TOTAL", "2").replace("$GITHUB_STEP_SUMMARY", "summary.md")
        args = shlex.split(plain)[2:]
        ctx = ci.make_context("ci", args)   # raises on an unknown option or a missing value
        assert ctx.params["suite"] == Path("nightly.toml")
        if ctx.params["shard"]:
            from verify.ci.jobs import parse_shard

            parse_shard(ctx.params["shard"])


def test_devices_of_one_group_share_a_lane(tmp_path: Path) -> None:
    text = GOOD.replace('[[device]]\nname = "local"\n',
                        '[[device]]\nname = "local"\ngroup = "host"\n\n'
                        '[[device]]\nname = "arm64"\ngroup = "host"\n\n'
                        '[[device]]\nname = "board"\nspec = "ssh:me@board"\n')
    path = tmp_path / "s.toml"
    path.write_text(text)
    devices = load_suite(path).devices
    assert devices["local"].lane == devices["arm64"].lane == "group:host"
    assert devices["board"].lane == "device:board"


def test_a_profile_file_as_device_spec_is_read_relative_to_the_suite(tmp_path: Path,
                                                                     monkeypatch) -> None:
    from verify.devices import resolve
    from verify.errors import UsageError

    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "lo.toml").write_text('transport = "local"\n')
    path = tmp_path / "s.toml"
    path.write_text(GOOD.replace('[[device]]\nname = "local"\n',
                                 '[[device]]\nspec = "profiles/lo.toml"\n'))
    monkeypatch.chdir(REPO)   # not the suite's folder: the path is the suite's, not the cwd's
    suite = load_suite(path)
    assert list(suite.devices) == ["lo"] and [j.id for j in expand(suite)] == ["two_io/lo/o1"]
    spec = suite.devices["lo"].spec
    assert spec == str(tmp_path / "profiles" / "lo.toml")
    profile = resolve(spec)                    # not "lo.toml.toml"
    assert profile.transport == "local" and profile.name == spec
    with pytest.raises(UsageError, match=r"^device 'gone.toml': no such profile file gone.toml$"):
        resolve("gone.toml")


def test_a_failed_job_s_summary_names_the_gates_it_could_not_judge() -> None:
    """With a latency failure, the summary named that alone; a regression gate with no
    baseline (a failure itself under --require-baselines) went unsaid."""
    from verify.ci.results import FAILED, JobResult

    r = JobResult(None, FAILED, gates=(  # type: ignore[arg-type]
        gates.GateResult("accuracy", "pass", "1 output(s) within tolerance"),
        gates.GateResult("regression", "no-baseline", "no baseline at b"),
        gates.GateResult("latency", "fail", "slower: median 3 ms vs baseline 1 ms")))
    assert r.summary() == ("latency: slower: median 3 ms vs baseline 1 ms; not judged (no "
                           "baseline): regression")


def test_a_profile_file_spec_is_the_same_device_wherever_ci_ran() -> None:
    """A `spec = "board.toml"` is stored as the path ci resolved it to ("ci/board.toml" from
    one folder, "board.toml" from another): not another device."""
    from types import SimpleNamespace

    from verify.ci.baseline import Baseline
    from verify.ci.schedule import _setting_notes

    def job(spec: str) -> SimpleNamespace:
        return SimpleNamespace(device=SimpleNamespace(spec=spec),
                               options=SimpleNamespace(to_dict=lambda: {"threads": 1}))

    base = Baseline({}, {}, device_spec="ci/board.toml", options={"threads": 1})
    assert _setting_notes(base, job("board.toml")) == []  # type: ignore[arg-type]
    assert _setting_notes(base, job("/ci/checkout/ci/board.toml")) == []  # type: ignore[arg-type]
    [note] = _setting_notes(base, job("phone.toml"))  # type: ignore[arg-type]
    assert note.startswith("the baseline was recorded on device spec 'ci/board.toml', now "
                           "'phone.toml'")
