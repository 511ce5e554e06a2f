"""Mutation testing of the verdict chain, on demand, module by module (mutmut 3).

Usage:
    python3 scripts/mutation.py                    # every module below, one after the other
    python3 scripts/mutation.py compare check      # just these
    python3 scripts/mutation.py --list             # the modules, their tests and mutant filters
    python3 scripts/mutation.py check --children 1 # fewer parallel workers (default 2)

What it does, per module: copies this working tree (the files git tracks or would track) into
.mutation/MODULE/, writes a [tool.mutmut] section there that mutates that one file and runs only
the test files listed for it (mutmut then runs, for each mutant, just the tests that call the
mutated function), runs `nice -n 15 mutmut run`, and reads back each mutant's status. mutmut
does not mutate decorated functions (@property, @lru_cache), so a few hand-written mutants of
the properties that carry a verdict (`HAND_MUTANTS`) are applied to the copy and run against
their tests the same way. Ends with one line per module and the total score (killed / all
mutants, a mutant with no test counts as surviving) and writes the surviving mutants' diffs to
.mutation/survivors.md. docs/mutation.md keeps the latest figures and a reason per survivor.

Needs mutmut (pip install 'verify[mutation]'). Tests marked arm64/gpu/hardware never run, nor
the ssh/adb test files: none of the modules below needs a transport to be judged.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".mutation"
MUTMUT = "mutmut==3.8.1"  # pinned: the statuses and config keys read here are 3.8's


@dataclass(frozen=True)
class Module:
    source: str                       # the file mutated
    tests: tuple[str, ...]            # the test files that exercise it (mutmut picks per mutant)
    only: tuple[str, ...] = ()        # mutant-name globs to run (default: every mutant of it)
    skip_lines: tuple[str, ...] = ()  # regexes of source lines left unmutated (the reason beside)


_MESSAGES = r"raise \w+Error\("  # a raise's message wording: tested where users rely on it

_COMPARE_TESTS = ("tests/test_compare.py", "tests/test_tolerance.py",
                  "tests/test_tolerance_specs.py",
                  # numpy only: the batch tests' numba variants hung in mutmut's forked
                  # workers (scan.py's thread pool, since fixed); the engines agree anyway
                  *(f"tests/test_diff_batch.py::test_compare_batch_equals_compare_field_by_"
                    f"field[spec{i}-numpy]" for i in range(5)),
                  "tests/test_diff_batch.py::test_batch_blocks_never_straddle_tensors[numpy]",
                  "tests/test_verdict_edges.py::test_tol_rank_orders_figureless_failures_first_"
                  "and_figureless_passes_last")

_DIFF_TESTS = ("tests/test_diff.py", "tests/test_diff_cases.py", "tests/test_diff_perturb.py",
               "tests/test_verdict_edges.py")

# the archive reader's tests: damaged archives refused (reader), the format-3 external data
# files (external), the gate and typed parts below the layout (file), links and data kept
# outside the file refused (links), round trips
# (roundtrip), the verdict edges that read archives, and the integrity tests that need no device
_READER_TESTS = ("tests/test_archive_reader.py", "tests/test_archive_external.py",
                 "tests/test_archive_file.py", "tests/test_archive_links.py",
                 "tests/test_archive_roundtrip.py", "tests/test_verdict_edges.py",
                 *(f"tests/test_archive_integrity.py::{t}" for t in (
                     "test_one_flipped_bit_is_one_line_and_exit_2_before_the_device",
                     "test_metadata_edited_behind_the_archive_is_corrupt",
                     "test_a_dataset_over_the_size_limit_is_refused_before_it_is_read",
                     "test_a_format_1_archive_is_read_with_one_warning",
                     "test_a_version_1_label_on_a_checksummed_archive_is_corrupt")))

MODULES: dict[str, Module] = {
    # compare.py's verdict chain in three files: the comparison and ranking (compare), the
    # rules and gates (rules), the spec grammar and the set picking a tensor's rule
    # (tolerance_specs); not the number and shape formatting, the JSON rendering, the
    # constant-reference note or the floored relative error (reported beside a verdict,
    # judging nothing)
    "compare": Module("verify/compare.py", _COMPARE_TESTS,
                      only=("verify.compare.x_compare__*", "verify.compare.x_compare_batch__*",
                            "verify.compare.x__prepare__*", "verify.compare.x__finish__*",
                            "verify.compare.x_topk_agreement__*",
                            "verify.compare.x_tol_rank__*", "verify.compare.x_first_divergent__*"),
                      skip_lines=(_MESSAGES,)),
    "rules": Module("verify/rules.py", (*_COMPARE_TESTS, "tests/test_rules.py"),
                    only=("verify.rules.x_saturating_floor__*", "verify.rules.x__ratio__*",
                          "verify.rules.xǁMagnitudeRuleǁ*", "verify.rules.xǁAllcloseRuleǁ*",
                          "verify.rules.xǁExactRuleǁ*", "verify.rules.xǁGateRuleǁ*",
                          "verify.rules.xǁCosineGateǁ*", "verify.rules.xǁSqnrGateǁ*",
                          "verify.rules.xǁQuantileGateǁ*", "verify.rules.x_abs_error_quantile__*",
                          "verify.rules.x_check_value__*", "verify.rules.x_float_eps_or_f32__*"),
                    skip_lines=(_MESSAGES,)),
    "tolerance_specs": Module("verify/tolerance_specs.py",
                              (*_COMPARE_TESTS, "tests/test_rules.py"),
                              only=("verify.tolerance_specs.xǁToleranceSetǁ*",
                                    "verify.tolerance_specs.xǁToleranceOverrideǁ*",
                                    "verify.tolerance_specs.x_parse_tolerance__*",
                                    "verify.tolerance_specs.x__parse_number__*",
                                    "verify.tolerance_specs.x__parse_gate__*"),
                              skip_lines=(_MESSAGES,)),
    "tolerance": Module("verify/tolerance.py", ("tests/test_tolerance.py",
                                                "tests/test_verdict_edges.py",
                                                "tests/cli/test_cli_foundation.py"),
                        skip_lines=(_MESSAGES,)),
    "check": Module("verify/check.py", ("tests/test_verdict_edges.py",
                                        "tests/cli/test_cli_foundation.py"),
                    skip_lines=(_MESSAGES,)),
    # the kernel in two files: the numpy engine and the scan (scan), the numba engine and the
    # auto engine's choice (scan_numba)
    "scan": Module("verify/scan.py", ("tests/test_compare.py", "tests/test_speedups.py",
                                      "tests/test_scan_counts.py", "tests/test_scan_layout.py"),
                   only=("verify.scan.x__np_block__*", "verify.scan.x__np_rows__*",
                         "verify.scan.x__rows__*", "verify.scan.x__chunks__*",
                         "verify.scan.x_count_unequal__*", "verify.scan.x_scan__*",
                         "verify.scan.x_cosine__*", "verify.scan.x_sqnr_db__*"),
                   skip_lines=(_MESSAGES,)),
    "scan_numba": Module("verify/scan_numba.py", ("tests/test_compare.py",
                                                  "tests/test_speedups.py",
                                                  "tests/test_engine_choice.py"),
                         only=("verify.scan_numba.x_choose_engine__*",),
                         # _nb_rows_py is compiled by numba, which cannot compile mutmut's
                         # trampoline (nor a body calling one): its def line's `no mutate
                         # block` pragma keeps mutmut from rewriting it at all
                         skip_lines=(_MESSAGES,)),
    # diff in two files: the walk and the report (diff), the captures opened (diff_sources)
    # diff: also the walk's own tests (which captures are compared or refused, the notes,
    # --only-failing, no numba) and the real-model ones for a QDQ/fp16 model against its float
    # original and for two unrelated models sharing some names
    "diff": Module("verify/diff.py",
                   (*_DIFF_TESTS, "tests/test_diff_walk.py", "tests/test_corpus_quant.py",
                    "tests/test_corpus_data.py::test_diff_of_two_unrelated_models_is_a_usage_"
                    "error"),
                   only=("verify.diff.x__walk__*", "verify.diff.x_diff_cases__*",
                         "verify.diff.x_diff_captures__*", "verify.diff.x_iter_rows__*"),
                   skip_lines=(_MESSAGES,)),
    # diff_sources: also its own tests (what an archive side carries into the report, the
    # module attribution, a layer of no elements, a model not ONNX or with external data,
    # the host loader's pass) and the tests that open its other kinds of capture: archives
    # packed without --layers on either side (the walk's tests), a multi-case dump diffed
    # case by case, a damaged layer reference, an archive keeping its external data, a dump
    # that left If bodies out
    "diff_sources": Module("verify/diff_sources.py",
                           (*_DIFF_TESTS, "tests/test_diff_sources.py", "tests/test_diff_walk.py",
                            "tests/test_dump_run.py::test_dynamic_integer_and_multi_case_"
                            "models_dump_and_diff",
                            "tests/test_archive_integrity.py::test_a_flipped_layer_reference_"
                            "is_found_by_inspect_and_by_diff",
                            "tests/test_corpus_external.py::test_kept_external_data_is_stored_"
                            "pushed_once_and_exported",
                            "tests/runner/test_segments.py::test_if_bodies_are_counted_and_"
                            "reported_by_run_and_diff"),
                           only=("verify.diff_sources.x_open_source__*",
                                 "verify.diff_sources.x__dump_side__*",
                                 "verify.diff_sources.x__archive_source__*",
                                 "verify.diff_sources.x_streamed__*"),
                           skip_lines=(_MESSAGES,)),
    # execute: the verdict edges and the CLI, its own tests (external data, the status and
    # progress callbacks), and the tests elsewhere that reach its other decisions on the local
    # device: the per-layer check (integrity), --tol given to run (gates), ci's shared session
    "execute": Module("verify/execute.py", (
        "tests/test_verdict_edges.py", "tests/cli/test_cli_foundation.py",
        "tests/test_execute_run.py",
        "tests/test_archive_integrity.py::test_a_flipped_layer_reference_stops_every_verdict_"
        "on_the_local_device",
        "tests/test_corpus_gates.py::test_gates_judge_a_real_model_and_name_their_rule",
        "tests/test_session.py::test_ci_runs_each_devices_jobs_in_one_connection[local]"),
                      only=("verify.execute.x_run__*", "verify.execute.x_prepare__*",
                            "verify.execute.x_output_floors__*"),
                      skip_lines=(_MESSAGES,)),
    "capture": Module("verify/capture.py", ("tests/test_capture.py", "tests/test_verdict_edges.py",
                                            "tests/test_dump_run.py", "tests/test_capture_plan.py",
                                            "tests/runner/test_segments.py::"
                                            "test_plan_dump_sizes_and_counts_if_bodies"),
                      only=("verify.capture.x_plan_dump__*", "verify.capture.x_compile_dump_filter__*",
                            "verify.capture.x__reindex__*"),
                      skip_lines=(_MESSAGES,)),
    # the reader in two files (the layout and tensors: archive_reader; the file opened and
    # gated, typed access to its parts: archive_file) and Testcase.case_indices; not the
    # writer, the size-limit setting or the external-data extraction helpers
    "archive_reader": Module("verify/archive_reader.py", _READER_TESTS,
                             only=("verify.archive_reader.x_read_archive__*",
                                   "verify.archive_reader.x_iter_layers__*",
                                   "verify.archive_reader.xǁArchiveReaderǁ*"),
                             skip_lines=(_MESSAGES,)),
    "archive_file": Module("verify/archive_file.py", _READER_TESTS,
                           only=("verify.archive_file.xǁArchiveFileǁ*",
                                 "verify.archive_file.x_open_archive__*",
                                 "verify.archive_file.x_int_attr__*",
                                 "verify.archive_file.x__format_name__*"),
                           skip_lines=(_MESSAGES,)),
    "testcase": Module("verify/testcase.py", _READER_TESTS,
                       only=("verify.testcase.xǁTestcaseǁcase_indices__*",),
                       skip_lines=(_MESSAGES,)),
    "inputs": Module("verify/input_casts.py", ("tests/test_inputs.py", "tests/test_inputs_casts.py",
                                               "tests/test_verdict_edges.py"),
                     only=("verify.input_casts.x_cast__*", "verify.input_casts.x_image_cast__*",
                           "verify.input_casts.x_int_limits__*", "verify.input_casts.x_kind__*"),
                     skip_lines=(_MESSAGES,)),
    "search": Module("verify/localize/search.py", ("tests/localize/test_localize.py",
                                                   "tests/localize/test_localize_subgraph.py",
                                                   "tests/localize/test_localize_refs.py",
                                                   "tests/localize/test_localize_search.py"),
                     skip_lines=(_MESSAGES,)),
}


@dataclass(frozen=True)
class HandMutant:
    """One mutant mutmut cannot make: `old` replaced by `new` in `source`."""

    name: str
    source: str
    old: str
    new: str
    tests: tuple[str, ...]


HAND_MUTANTS: dict[str, tuple[HandMutant, ...]] = {
    "check": (HandMutant("CaseCheck.passed all->any", "verify/check.py",
                         "else all(d.passed for d in self.diffs)",
                         "else any(d.passed for d in self.diffs)",
                         ("tests/test_verdict_edges.py",)),
              HandMutant("CaseCheck.passed None check dropped", "verify/check.py",
                         "return None if self.diffs is None else all(",
                         "return all(", ("tests/cli/test_cli_foundation.py",))),
    "execute": (HandMutant("RunOutcome.passed all->any", "verify/execute.py",
                           "return all(verdicts) if verdicts else None",
                           "return any(verdicts) if verdicts else None",
                           ("tests/test_verdict_edges.py",)),
                HandMutant("RunOutcome.passed no-check -> True", "verify/execute.py",
                           "return all(verdicts) if verdicts else None",
                           "return all(verdicts)", ("tests/cli/test_cli_foundation.py",))),
    "diff": (HandMutant("DiffRow.passed missing row -> False", "verify/diff.py",
                        "return None if self.diff is None else self.diff.passed",
                        "return False if self.diff is None else self.diff.passed",
                        ("tests/test_diff.py",)),
             HandMutant("DiffReport.failing keeps passing rows", "verify/diff.py",
                        "return tuple(r for r in self.rows if r.passed is False)",
                        "return tuple(r for r in self.rows if r.passed is not True)",
                        ("tests/test_diff.py",))),
}

@dataclass
class Result:
    module: str
    statuses: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(1 for s in self.statuses.values() if s == status)

    @property
    def killed(self) -> int:
        return self.count("killed") + self.count("timeout") + self.count("segfault")

    @property
    def total(self) -> int:
        return sum(1 for s in self.statuses.values() if s not in ("skipped", "not checked"))


_KILLED = ("killed", "timeout", "segfault")


def _copy_tree(dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.split(b"\0")
    for raw in files:
        rel = raw.decode()
        if not rel or rel.startswith(".mutation/") or not (REPO / rel).is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)


def _toml_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join('"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
                           for s in items) + "]"


def _configure(dest: Path, mod: Module) -> None:
    pytest_args = ["-p", "no:cacheprovider", "-m", "not arm64 and not gpu and not hardware"]
    section = (
        "\n[tool.mutmut]\n"
        'source_paths = ["verify/"]\n'
        f"only_mutate = {_toml_list([mod.source])}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(mod.tests)}\n"
        f"pytest_add_cli_args = {_toml_list(pytest_args)}\n"
        f"do_not_mutate_patterns = {_toml_list(mod.skip_lines)}\n"
        'also_copy = ["goldens", "scripts", "devices", "examples", "benchmarks"]\n'
        "use_git_change_detection = false\n")
    with open(dest / "pyproject.toml", "a", encoding="utf-8") as f:
        f.write(section)


def _env(dest: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The mutated copy, for the tests and for the `verify` processes they start. Through a
    # folder of its own holding a link to mutants/verify: mutmut drops sys.path entries equal
    # to the folder it is in, and when it is in mutants/ an editable install of verify would
    # then be imported instead, unmutated.
    root = dest / ".importroot"
    root.mkdir(exist_ok=True)
    if not (root / "verify").is_symlink():
        (root / "verify").symlink_to(dest / "mutants" / "verify", target_is_directory=True)
    env["PYTHONPATH"] = str(root)
    env.pop("VERIFY_NO_NUMBA", None)
    # mutmut forks each mutant's worker from a pytest that has run the numba kernel: numba's
    # default threading layer here is GNU OpenMP, which kills a forked child that runs a
    # parallel kernel again (SIGTERM: mutmut's "suspicious") or hangs it (a "timeout"),
    # whatever the mutant. The workqueue layer survives a fork and computes the same results.
    env["NUMBA_THREADING_LAYER"] = "workqueue"
    return env


def _run_mutmut(dest: Path, mod: Module, children: int, log: Path,
                names: list[str] | None = None) -> dict[str, str]:
    cmd = ["nice", "-n", "15", sys.executable, "-m", "mutmut", "run", "--max-children",
           str(children), *(names if names is not None else mod.only)]
    for _attempt in range(2):
        with open(log, "wb") as out:
            proc = subprocess.run(cmd, cwd=dest, env=_env(dest), stdout=out,
                                  stderr=subprocess.STDOUT)
        # mutmut 3.8's first run in a fresh folder can record no test for any function and
        # stop; a second run (its stats file now exists) collects them
        if b"could not find any test case for any mutant" not in log.read_bytes():
            break
    statuses = _read_statuses(dest, mod)
    if proc.returncode != 0 and not statuses:
        raise SystemExit(f"mutmut failed for {mod.source} (exit {proc.returncode}); see {log}")
    return statuses


def _read_statuses(dest: Path, mod: Module) -> dict[str, str]:
    """Each mutant's status as `mutmut results` reports it, limited to the module's filter."""
    listing = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"],
                             cwd=dest, env=_env(dest), capture_output=True, text=True)
    statuses = {}
    for line in listing.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith("verify."):
            statuses[name] = status
    if mod.only:
        import fnmatch

        statuses = {k: v for k, v in statuses.items()
                    if any(fnmatch.fnmatchcase(k, g) for g in mod.only)}
    return statuses


FRESH_LIMIT_S = 300  # a mutant whose tests still run this long in a process of their own hangs


def _fresh(dest: Path, statuses: dict[str, str]) -> dict[str, str]:
    """Timeouts and 'suspicious' ends, run again one by one in a fresh pytest (no fork).

    mutmut forks each mutant's worker from one warmed-up pytest; a test that runs the numba
    kernel (parallel threads) in a forked child can hang there whatever the mutant, and load on
    a shared machine can push a worker past mutmut's wall limit (15x the tests' own time).
    Neither says whether a test catches the mutant. Here each one runs alone, with the tests
    mutmut picked for its function: exit 1 is `killed`, 0 `survived`, still running after
    FRESH_LIMIT_S a real hang (`timeout`, counted as killed: a user would see it hang)."""
    stats_path = dest / "mutants" / "mutmut-stats.json"
    tests_by_fn = json.loads(stats_path.read_text(encoding="utf-8"))[
        "tests_by_mangled_function_name"] if stats_path.is_file() else {}
    out = dict(statuses)
    for name, status in sorted(statuses.items()):
        if status not in ("timeout", "suspicious"):
            continue
        tests = sorted(tests_by_fn.get(name.rpartition("__mutmut_")[0], ()))
        if not tests:
            out[name] = "no tests"
            continue
        env = dict(_env(dest), MUTANT_UNDER_TEST=name)
        cmd = ["nice", "-n", "15", sys.executable, "-m", "pytest", "-x", "-q", "-p",
               "no:cacheprovider", "-m",
               "not arm64 and not gpu and not hardware", *tests]
        try:
            proc = subprocess.run(cmd, cwd=dest / "mutants", env=env, capture_output=True,
                                  timeout=FRESH_LIMIT_S)
            out[name] = {0: "survived", 1: "killed", 5: "no tests"}.get(proc.returncode,
                                                                       "suspicious")
        except subprocess.TimeoutExpired:
            out[name] = "timeout"
        print(f"   fresh run of {name} ({status}): {out[name]}", flush=True)
    return out


def _recheck(dest: Path, mod: Module, children: int, log: Path) -> dict[str, str]:
    """The last run's statuses, with its survivors run again against the current tests."""
    if (REPO / mod.source).read_bytes() != (dest / mod.source).read_bytes():
        raise SystemExit(f"{mod.source} changed since its last mutation run: run it in full")
    # from what the last run concluded, not from mutmut's own record: a mutmut run on some
    # names may reset the others' (one cut short left 288 of diff's kills "not checked")
    saved = WORK / f"{dest.name}.statuses.json"
    before = (json.loads(saved.read_text(encoding="utf-8")) if saved.is_file()
              else _read_statuses(dest, mod))
    for folder in (dest / "tests", dest / "mutants" / "tests"):
        shutil.rmtree(folder)
        shutil.copytree(REPO / "tests", folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", dest / "pyproject.toml")
    _configure(dest, mod)  # the module's test files as listed now
    # timeouts and suspicious ends too: forked workers that ran numba died whatever the mutant
    # before NUMBA_THREADING_LAYER was set (see _env), and load can push a worker past its limit
    again = [k for k, v in before.items() if v not in ("killed", "skipped", "not checked")]
    if again:
        after = _run_mutmut(dest, mod, children, log, names=again)
        before.update({k: after.get(k, "not checked") for k in again})
    return before


def _run_hand(dest: Path, mutants: tuple[HandMutant, ...]) -> dict[str, str]:
    statuses = {}
    for hm in mutants:
        path = dest / hm.source
        src = path.read_text(encoding="utf-8")
        if src.count(hm.old) != 1:
            statuses[f"hand: {hm.name}"] = "stale (source changed: update HAND_MUTANTS)"
            continue
        path.write_text(src.replace(hm.old, hm.new), encoding="utf-8")
        try:
            env = dict(os.environ, PYTHONPATH=str(dest))
            proc = subprocess.run(["nice", "-n", "15", sys.executable, "-m", "pytest", "-x", "-q",
                                   "-p", "no:cacheprovider", "-m",
                                   "not arm64 and not gpu and not hardware", *hm.tests],
                                  cwd=dest, env=env, capture_output=True, text=True)
        finally:
            path.write_text(src, encoding="utf-8")
        statuses[f"hand: {hm.name}"] = "killed" if proc.returncode == 1 else "survived"
    return statuses


def _survivor_diffs(dest: Path, names: list[str]) -> str:
    parts = []
    for name in names:
        if name.startswith("hand: "):
            parts.append(f"### {name}\n")
            continue
        shown = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=dest,
                               env=_env(dest), capture_output=True, text=True).stdout
        lines = [ln for ln in shown.splitlines()
                 if ln.startswith(("-", "+")) and not ln.startswith(("---", "+++"))]
        parts.append(f"### {name}\n```diff\n" + "\n".join(lines) + "\n```\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help=f"of {', '.join(MODULES)} (default: all)")
    ap.add_argument("--children", type=int, default=2, help="parallel mutant workers")
    ap.add_argument("--list", action="store_true", help="print the modules and exit")
    ap.add_argument("--report", action="store_true",
                    help="print the figures of the last runs again (nothing is run)")
    ap.add_argument("--survivors", action="store_true",
                    help="after adding tests: re-run only the mutants that survived the last run "
                         "of each module (its source unchanged), with the tests as they are now")
    args = ap.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        ap.error(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    if args.list:
        for name, mod in MODULES.items():
            print(f"{name}: {mod.source}; tests {' '.join(mod.tests)}"
                  + (f"; only {' '.join(mod.only)}" if mod.only else ""))
        return 0
    try:
        import mutmut  # noqa: F401  (only whether it is installed)
    except ImportError:
        print(f"mutmut is not installed: pip install '{MUTMUT}' (or the project's "
              "'mutation' extra)", file=sys.stderr)
        return 2
    WORK.mkdir(exist_ok=True)
    results: list[Result] = []
    survivors_md = []
    for name in args.modules or list(MODULES):
        mod = MODULES[name]
        dest = WORK / name
        start = time.monotonic()
        print(f"== {name}: {mod.source} against {' '.join(mod.tests)}", flush=True)
        res = Result(name)
        if args.report:
            if not (dest / "mutants").is_dir():
                print("   not run yet")
                continue
            saved = WORK / f"{name}.statuses.json"  # what the last run or re-run concluded
            res.statuses = (json.loads(saved.read_text(encoding="utf-8")) if saved.is_file()
                            else _read_statuses(dest, mod))
            hand = WORK / f"{name}.hand.json"
            if hand.is_file():
                res.statuses.update(json.loads(hand.read_text(encoding="utf-8")))
        elif args.survivors and (dest / "mutants").is_dir():
            res.statuses = _fresh(dest, _recheck(dest, mod, args.children,
                                                 WORK / f"{name}.log"))
        else:
            _copy_tree(dest)
            _configure(dest, mod)
            res.statuses = _fresh(dest, _run_mutmut(dest, mod, args.children,
                                                    WORK / f"{name}.log"))
        if not args.report:  # mutmut may reset what a re-run did not touch: keep ours
            (WORK / f"{name}.statuses.json").write_text(json.dumps(res.statuses),
                                                        encoding="utf-8")
        if not args.report or not (WORK / f"{name}.hand.json").is_file():
            hand_statuses = _run_hand(dest, HAND_MUTANTS.get(name, ()))
            (WORK / f"{name}.hand.json").write_text(json.dumps(hand_statuses), encoding="utf-8")
            res.statuses.update(hand_statuses)
        res.seconds = time.monotonic() - start
        results.append(res)
        bad = sorted(k for k, v in res.statuses.items() if v not in (*_KILLED, "skipped",
                                                                    "not checked"))
        print(f"   {res.killed}/{res.total} killed ({_pct(res.killed, res.total)}) in "
              f"{res.seconds:.0f} s; {len(bad)} surviving"
              + (f", {res.count('not checked')} not checked (run cut short)"
                 if res.count("not checked") else ""), flush=True)
        if bad:
            survivors_md.append(f"## {name} ({mod.source})\n\n" + "\n".join(
                f"- {k}: {res.statuses[k]}" for k in bad) + "\n\n" + _survivor_diffs(dest, bad))
    killed = sum(r.killed for r in results)
    total = sum(r.total for r in results)
    print("\nmodule       killed / mutants   score")
    for r in results:
        print(f"{r.module:<12} {r.killed:>6} / {r.total:<7}   {_pct(r.killed, r.total)}")
    print(f"{'total':<12} {killed:>6} / {total:<7}   {_pct(killed, total)}")
    (WORK / "survivors.md").write_text("# Surviving mutants\n\n" + "\n".join(survivors_md),
                                       encoding="utf-8")
    print(f"surviving mutants with their diffs: {WORK / 'survivors.md'}")
    return 0


def _pct(k: int, n: int) -> str:
    return f"{100.0 * k / n:.1f}%" if n else "-"


if __name__ == "__main__":
    sys.exit(main())
