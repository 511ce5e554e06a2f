"""The compiled comparison kernel (`verify/scan_native.py`, `scan_native.c`): the same results
as the numpy and numba engines, auto's first choice where it builds, and every way it cannot be
had (no compiler, a compiler that fails, a damaged cached library, VERIFY_NO_NATIVE) leaving
auto on numpy or numba with the reason said.

The build tests each start from a fresh process's state and an empty cache folder, and run the
real compiler (cc is part of the test set-up); a compiler that fails is a real program too."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fixtures_dump import cnn_dumps, dump_factory  # noqa: F401 (fixtures)
from verify import scan_native, scan_numba
from verify.compare import AllcloseRule, MagnitudeRule, compare
from verify.scan import Batch, Scan, _rows_at, scan
from verify.scan_numba import _NB_BLOCK, PARALLEL_MIN_BLOCKS, choose_engine

HAVE = scan_native.native_available()
needs_native = pytest.mark.skipif(not HAVE, reason=f"no compiled kernel: "
                                  f"{scan_native.native_problem()}")
REPO = Path(__file__).resolve().parents[1]


def _fresh(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """A process that has not loaded the kernel, with `cache` as verify's cache folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("VERIFY_NO_NATIVE", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(scan_native, "_state", "unloaded")
    monkeypatch.setattr(scan_native, "_problem", "")
    monkeypatch.setattr(scan_native, "_kernels", {})


# a row's columns that two engines must agree on to the bit (the sums may differ in order)
MAXIMA_AND_COUNTS = [scan_numba._MAXD, scan_numba._PEAK, scan_numba._MAXREL, scan_numba._MAXTR,
                     scan_numba._NV, scan_numba._NCMP]


def _blocks(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The engine's blocks over n elements: their starts and stops."""
    starts = np.arange(0, n, _NB_BLOCK, dtype=np.int64)
    return starts, np.minimum(starts + _NB_BLOCK, n)


def _libraries(cache: Path) -> list[Path]:
    return sorted((cache / "verify" / "kernels").glob("scan-*.so"))


def _pairs(dtype: type) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    r = rng.standard_normal(300_001).astype(dtype)
    noisy = (r + rng.normal(0, 1e-3, r.shape)).astype(dtype)
    spiky = r.copy()
    spiky[[5, 70_000, 300_000]] += dtype(0.5)
    floored = r.copy()  # zeros and subnormals in the reference: relative error against the
    floored[::1000] = 0  # floor `tiny`
    floored[1::1000] = dtype(1e-40) if dtype is np.float32 else 1e-310
    return [(noisy, r), (spiky, r), (r.copy(), r), (noisy, floored), (noisy[:1], r[:1]),
            (noisy[:4097], r[:4097])]


def _same(got, want) -> None:
    """Two engines' TensorDiffs: everything equal but the metrics from float64 sums (mean
    error, cosine, SQNR), which differ in summation order: within 1e-12."""
    got, want = got.to_dict(), want.to_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        if key in ("mean_abs", "cosine", "sqnr_db") and isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-300), key
        else:
            assert got[key] == value, key


# --- the same results --------------------------------------------------------------------------

@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rule", [MagnitudeRule(), AllcloseRule(1e-4, 1e-3)],
                         ids=["magnitude", "allclose"])
def test_native_gives_numpys_verdicts_maxima_and_counts(dtype: type, rule) -> None:
    """Against the numpy engine, an independent implementation: maxima, counts and verdicts
    equal, the float64 sums within 1e-12 (summation order differs)."""
    for a, r in _pairs(dtype):
        _same(compare("t", a, r, rule, engine="native"), compare("t", a, r, rule,
                                                                 engine="numpy"))


@needs_native
@pytest.mark.skipif(not scan_numba.numba_available(), reason="no numba")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("atol, rtol, want_tr", [(np.inf, 0.0, False), (0.0, 0.0, False),
                                                 (1e-5, 1e-3, True), (0.0, 1e-3, True),
                                                 (2e-3, 0.0, True)])
def test_native_rows_equal_numbas_maxima_and_counts_exactly(dtype: type, atol: float,
                                                            rtol: float, want_tr: bool) -> None:
    """Row by row against the numba kernel it copies: the magnitude rule's first pass (atol
    inf), exact, allclose and tolerance units; references with zeros and subnormals."""
    tiny = float(np.finfo(dtype).tiny)
    for a, r in _pairs(dtype):
        starts, stops = _blocks(a.size)
        ours = scan_numba.native_rows(a, r, starts, stops, atol, rtol, tiny, want_tr)
        theirs = scan_numba.nb_rows(a, r, starts, stops, atol, rtol, tiny, want_tr)
        assert np.array_equal(ours[:, MAXIMA_AND_COUNTS], theirs[:, MAXIMA_AND_COUNTS])
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)


@needs_native
def test_blocks_with_nan_and_inf_are_redone_in_numpy() -> None:
    """A block holding NaN/Inf is found by its non-finite sums and judged by numpy, so counts
    and position mismatches come out as numpy's."""
    rng = np.random.default_rng(3)
    r = rng.standard_normal(5 * _NB_BLOCK).astype(np.float32)
    a = r.copy()
    a[[10, _NB_BLOCK + 1]] = np.nan
    r[10] = np.nan  # one NaN against NaN (fine), one against a number (a mismatch)
    a[3 * _NB_BLOCK + 7] = np.inf
    a[4 * _NB_BLOCK] += 1.0
    got = compare("t", a, r, engine="native")
    _same(got, compare("t", a, r, engine="numpy"))
    assert not got.passed and got.nan_actual == 2 and got.inf_actual == 1


@needs_native
def test_a_call_of_many_blocks_splits_over_the_threads_with_the_same_rows(monkeypatch) -> None:
    a, r = _pairs(np.float32)[1]
    a, r = np.tile(a, 20), np.tile(r, 20)  # 6 M elements: 92 blocks
    starts, stops = _blocks(a.size)
    assert starts.size >= PARALLEL_MIN_BLOCKS
    calls: list[tuple[int, int]] = []
    real = scan_numba.spread
    monkeypatch.setattr(scan_numba, "spread", lambda n, threads, job: (
        calls.append((n, threads)), real(n, threads, job)))
    monkeypatch.setattr(scan_numba, "THREADS", 2)
    split = _rows_at(a, r, "native", starts, stops, 1e-5, 1e-3, 1.2e-38, True)
    monkeypatch.setattr(scan_numba, "THREADS", 1)
    whole = _rows_at(a, r, "native", starts, stops, 1e-5, 1e-3, 1.2e-38, True)
    assert calls == [(starts.size, 2), (starts.size, 1)]
    assert np.array_equal(split, whole)


@needs_native
def test_arrays_not_aligned_to_their_dtype_are_compared_from_aligned_copies() -> None:
    a, r = _pairs(np.float32)[1]
    raw = np.zeros(a.nbytes + 1, np.uint8)
    odd = np.frombuffer(raw.data, np.uint8, a.nbytes, offset=1).view(np.float32)
    assert not odd.flags.aligned
    odd[...] = a
    _same(compare("t", odd, r, engine="native"), compare("t", a, r, engine="numpy"))
    with pytest.raises(ValueError, match="aligned"):
        scan_native.native_fill(odd, r, np.array([0]), np.array([10]), 0.0, 0.0, 1.0, False,
                                np.zeros((1, scan_native.NCOL)))


@needs_native
def test_a_batch_of_small_pairs_gives_each_pair_its_own_rows() -> None:
    batch = Batch(1 << 16)
    pairs = [(a[:n], r[:n]) for (a, r), n in zip(_pairs(np.float32), (5, 1000, 33, 70, 1, 4097))]
    spans = [batch.add(a, r)[2] for a, r in pairs]
    rows = batch.rows(spans, "native", 1e-5, 1e-3, 1.2e-38, True)
    for (a, r), got in zip(pairs, rows):
        alone = scan(a, r, np.dtype(np.float32), "native", 1e-5, 1e-3, 1.2e-38, True, None)
        assert scan(a, r, np.dtype(np.float32), "native", 1e-5, 1e-3, 1.2e-38, True, None,
                    rows=got) == alone
        assert isinstance(alone, Scan) and alone.n_compared == a.size


@needs_native
def test_the_c_kernel_is_never_handed_what_it_would_read_or_write_past() -> None:
    a = np.zeros(10, np.float32)
    starts, stops, rows = np.array([0]), np.array([10]), np.zeros((1, scan_native.NCOL))

    def fill(x=a, y=a, lo=starts, hi=stops, out=rows) -> None:
        scan_native.native_fill(x, y, lo, hi, 0.0, 0.0, 1.0, False, out)

    fill()
    assert rows[0, scan_numba._NCMP] == 10
    for bad in ({"hi": np.array([11])}, {"lo": np.array([-1])}, {"lo": np.array([5]),
                                                                 "hi": np.array([4])}):
        with pytest.raises(ValueError, match="outside"):
            fill(**bad)
    with pytest.raises(ValueError, match="outside"):  # the shorter side bounds the blocks
        fill(y=np.zeros(9, np.float32))
    two = np.full((2, scan_native.NCOL), 7.0)  # one bad block: nothing is read or written
    with pytest.raises(ValueError, match="outside"):
        fill(lo=np.array([0, 5]), hi=np.array([5, 11]), out=two)
    assert (two == 7.0).all()
    with pytest.raises(ValueError, match="one dtype"):
        fill(y=a.astype(np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        fill(x=a[::2], y=a[::2], hi=np.array([5]))
    for rtol in (np.inf, np.nan):
        with pytest.raises(ValueError, match="finite rtol"):
            scan_native.native_fill(a, a, starts, stops, 0.0, rtol, 1.0, False, rows)
    with pytest.raises(ValueError, match="atol >= 0"):
        scan_native.native_fill(a, a, starts, stops, np.nan, 0.0, 1.0, False, rows)
    for bad in ({"out": np.zeros((2, scan_native.NCOL))}, {"out": np.zeros((1, 3))},
                {"lo": np.array([0], np.int32)}, {"hi": np.array([10, 10])}):
        with pytest.raises(ValueError, match="int64 block bounds and float64 rows"):
            fill(**bad)


# --- auto's choice -----------------------------------------------------------------------------

@needs_native
def test_auto_takes_native_for_every_size_and_never_loads_numba(monkeypatch) -> None:
    loads: list[int] = []
    monkeypatch.setattr(scan_numba, "_nb_state", "unloaded")
    monkeypatch.setattr(scan_numba, "_bytes_seen", 0)
    monkeypatch.setattr(scan_numba, "_load_numba", lambda: loads.append(1))
    monkeypatch.delenv("VERIFY_NO_NATIVE", raising=False)
    assert choose_engine("auto", 8) == "native"
    assert scan_numba.expect_bytes(1 << 33) is True  # an 8 GiB job: numba is not loaded
    assert choose_engine("auto", scan_numba.NUMBA_AFTER_BYTES) == "native"
    assert choose_engine("numpy", 1 << 20) == "numpy"  # an engine asked for is the one used
    assert loads == []


def test_verify_no_native_keeps_auto_off_it_and_says_so(monkeypatch, tmp_path) -> None:
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("VERIFY_NO_NATIVE", "1")
    monkeypatch.setenv("VERIFY_NO_NUMBA", "1")
    assert not scan_native.native_available()
    assert choose_engine("auto", 1 << 20) == "numpy"
    assert scan_native.native_problem() == "VERIFY_NO_NATIVE is set"
    assert _libraries(tmp_path) == []  # nothing built


# --- building, caching, failing ----------------------------------------------------------------

@needs_native
def test_the_first_use_builds_into_the_cache_and_later_ones_load_it(monkeypatch,
                                                                    tmp_path) -> None:
    _fresh(monkeypatch, tmp_path)
    assert scan_native.native_available(), scan_native.native_problem()
    built = _libraries(tmp_path)
    assert len(built) == 1 and not list(built[0].parent.glob("*.tmp"))
    mtime = built[0].stat().st_mtime_ns
    # a later process, with no compiler at all: the cached library is enough
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert scan_native.native_available(), scan_native.native_problem()
    assert _libraries(tmp_path) == built and built[0].stat().st_mtime_ns == mtime
    a, r = _pairs(np.float32)[0]
    _same(compare("t", a, r, engine="native"), compare("t", a, r, engine="numpy"))


def _program(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_compiler_that_fails_leaves_auto_on_numpy_and_is_asked_once(monkeypatch,
                                                                       tmp_path) -> None:
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("VERIFY_NO_NUMBA", "1")
    calls = tmp_path / "calls"
    cc = _program(tmp_path / "broken-cc", f'echo x >> {calls}; '
                  'echo "broken-cc: fatal: out of licences" >&2; exit 4')
    monkeypatch.setenv("CC", cc)
    assert not scan_native.native_available()
    problem = scan_native.native_problem()
    assert problem.startswith(f"{cc} cannot build the kernel: broken-cc: fatal: out of "
                              "licences (remembered in "), problem
    assert problem.endswith(".failed: delete it to build again)") and "\n" not in problem
    assert choose_engine("auto", 1 << 20) == "numpy"
    rng = np.random.default_rng(5)
    r = rng.standard_normal(1000).astype(np.float32)
    assert compare("t", r + 1, r).passed is False  # still judged, by numpy
    assert _libraries(tmp_path) == [] and not list(tmp_path.rglob("*.tmp"))
    tries = len(calls.read_text().split())
    assert tries == len(scan_native._flag_sets())  # for this CPU, then the baseline
    # later processes: the failure is remembered, the compiler not asked again
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("CC", cc)
    assert not scan_native.native_available()
    assert scan_native.native_problem() == problem
    assert len(calls.read_text().split()) == tries
    # another compiler command is another try; deleting the record retries the same one
    marker, = (tmp_path / "verify" / "kernels").glob("*.failed")
    marker.unlink()
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("CC", cc)
    assert not scan_native.native_available()
    assert len(calls.read_text().split()) == 2 * tries


def test_a_compiler_that_builds_what_will_not_load_is_remembered_too(monkeypatch,
                                                                     tmp_path) -> None:
    """CC set to a cross compiler: its library is for another machine. Removed, remembered."""
    _fresh(monkeypatch, tmp_path)
    cc = _program(tmp_path / "cross-cc", 'while [ "$1" != -o ]; do shift; done; '
                  'printf "\\177ELF for another machine" > "$2"')
    monkeypatch.setenv("CC", cc)
    assert not scan_native.native_available()
    problem = scan_native.native_problem()
    assert problem.startswith("cannot load ") and "remembered in" in problem, problem
    assert _libraries(tmp_path) == []
    assert len(list((tmp_path / "verify" / "kernels").glob("*.failed"))) == 1


def test_no_compiler_at_all_is_said(monkeypatch, tmp_path) -> None:
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert not scan_native.native_available()
    assert scan_native.native_problem().startswith("no C compiler")


@needs_native
def test_a_compiler_refusing_march_native_builds_without_it(monkeypatch, tmp_path) -> None:
    real = scan_native._compiler()
    assert real is not None
    cc = _program(tmp_path / "picky-cc", 'for a in "$@"; do [ "$a" = -march=native ] && '
                  '{ echo "picky-cc: unknown cpu" >&2; exit 1; }; done; exec '
                  + " ".join(real) + ' "$@"')
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("CC", cc)
    assert scan_native.native_available(), scan_native.native_problem()
    assert _libraries(tmp_path) == [scan_native.library_path(scan_native.FLAGS)]
    # the next process loads that one and asks no compiler again
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("CC", _program(tmp_path / "no-cc", "exit 9"))
    assert scan_native.native_available(), scan_native.native_problem()


@needs_native
def test_a_cache_folder_that_cannot_be_written_leaves_auto_on_numpy(monkeypatch,
                                                                    tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    _fresh(monkeypatch, blocker)  # $XDG_CACHE_HOME/verify/kernels cannot be made
    monkeypatch.setenv("VERIFY_NO_NUMBA", "1")
    assert not scan_native.native_available()
    problem = scan_native.native_problem()
    assert problem.startswith("cannot build the kernel with ") and "Not a directory" in problem
    assert "\n" not in problem
    assert choose_engine("auto", 1 << 20) == "numpy"


def test_a_cc_that_is_not_a_command_line_is_said(monkeypatch, tmp_path) -> None:
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("CC", "gcc '-O2")
    assert not scan_native.native_available()
    assert scan_native.native_problem() == "CC is not a command line (No closing quotation)"


def _kernel_state(cache: Path) -> str:
    """native_available() and native_problem() in a process of its own (a library this
    process has loaded stays loaded under its path, whatever the file holds later)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("VERIFY_NO_NATIVE", None)
    proc = subprocess.run([sys.executable, "-c", "from verify import scan_native as n; "
                           "print(n.native_available(), n.native_problem())"], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@needs_native
def test_a_damaged_cached_library_is_built_again(tmp_path) -> None:
    assert _kernel_state(tmp_path) == "True"
    lib, = _libraries(tmp_path)
    damaged = tmp_path / "damaged"
    damaged.write_bytes(b"\x7fELF not really")
    os.replace(damaged, lib)  # (replaced, as the build replaces it: never written in place)
    assert _kernel_state(tmp_path) == "True"  # removed, built again, loaded
    assert lib.read_bytes() != b"\x7fELF not really" and lib.stat().st_size > 1000


def _verify_diff(cnn_dumps: dict[str, Path], cache: Path, env: dict[str, str],
                 *options: str) -> subprocess.CompletedProcess[str]:
    """`verify diff` of the cnn's dumps at opt all and disable as a process of its own, with
    `cache` as verify's cache folder, without numba, and `env` on top of this environment
    (CC and VERIFY_NO_NATIVE only from `env`)."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("CC", "VERIFY_NO_NATIVE")},
           "XDG_CACHE_HOME": str(cache), "VERIFY_NO_NUMBA": "1", **env}
    return subprocess.run([sys.executable, "-m", "verify", "diff", str(cnn_dumps["all"]),
                           str(cnn_dumps["disable"]), *options], env=env, capture_output=True,
                          text=True, cwd=REPO, timeout=300)


@needs_native
@pytest.mark.parametrize("tol", [[], ["--atol", "0", "--rtol", "0"]], ids=["default", "exact"])
def test_verify_diff_gives_the_same_report_with_and_without_the_kernel(
        cnn_dumps: dict[str, Path], tmp_path: Path, tol: list[str]) -> None:
    """As a user runs it: whole `verify diff` processes of the cnn's dumps at opt all and
    disable (values that differ a little), the first building the kernel into a fresh cache;
    the report is the numpy engine's, tensor for tensor (tolerance 0: many fail)."""
    reports = {}
    for label, no_native in (("native", "0"), ("numpy", "1")):
        proc = _verify_diff(cnn_dumps, tmp_path / "cache", {"VERIFY_NO_NATIVE": no_native},
                            "--json", *tol)
        assert proc.returncode == (1 if tol else 0), proc.stderr
        reports[label] = json.loads(proc.stdout)
    assert len(_libraries(tmp_path / "cache")) == 1
    rows = {label: [row for case in report.pop("cases") for row in case.pop("rows")]
            for label, report in reports.items()}
    assert reports["native"] == reports["numpy"]  # verdicts, counts, the first divergent
    assert [r["name"] for r in rows["native"]] == [r["name"] for r in rows["numpy"]]
    for ours, theirs in zip(rows["native"], rows["numpy"]):
        for key in ("mean_abs", "cosine", "sqnr_db"):  # from float64 sums: summation order
            if isinstance((theirs["diff"] or {}).get(key), float):
                assert ours["diff"].pop(key) == pytest.approx(theirs["diff"].pop(key),
                                                              rel=1e-12)
        assert ours == theirs
    failing = [row for row in rows["native"] if row["diff"] and not row["diff"]["passed"]]
    assert bool(failing) == bool(tol)


def test_verify_diff_says_when_a_compiler_is_there_but_the_kernel_cannot_be_built(
        cnn_dumps: dict[str, Path], tmp_path: Path) -> None:
    """A broken toolchain shows as one line on stderr (the report is unchanged); no compiler
    at all, or VERIFY_NO_NATIVE, is said nowhere: numpy is then simply the engine."""
    broken = _program(tmp_path / "broken-cc", 'echo "broken-cc: cannot exec cc1" >&2; exit 1')
    bare = tmp_path / "bin"  # a PATH holding python alone: no compiler
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    runs = {}
    for label, extra in (("broken", {"CC": broken}), ("none", {"PATH": str(bare)}),
                         ("off", {"CC": broken, "VERIFY_NO_NATIVE": "1"})):
        runs[label] = _verify_diff(cnn_dumps, tmp_path / f"cache-{label}", extra)
    for proc in runs.values():
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == runs["off"].stdout
    note, = [line for line in runs["broken"].stderr.splitlines() if line.startswith("note:")]
    assert note.startswith(f"note: compared without the compiled kernel: {broken} cannot "
                           "build the kernel: broken-cc: cannot exec cc1 (remembered in ")
    assert note.endswith("; VERIFY_NO_NATIVE=1 skips it")
    assert "note:" not in runs["none"].stderr and "note:" not in runs["off"].stderr


COMPILERS = [c for c in ("gcc", "clang") if shutil.which(c)]


@pytest.mark.skipif(not scan_numba.numba_available(), reason="no numba")
@pytest.mark.parametrize("compiler", COMPILERS or [pytest.param("cc", marks=pytest.mark.skip(
    reason="no gcc or clang"))])
def test_each_compiler_builds_a_kernel_with_numbas_maxima_counts_and_nan_blocks(
        monkeypatch, tmp_path, compiler: str) -> None:
    """The C code asks no compiler for fast-math beyond reassociating sums, so GCC and clang
    (macOS's) give the same maxima and counts as numba, and a block holding NaN or Inf still
    shows a non-finite sum (under clang's no-NaN assumption it need not have)."""
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("CC", compiler)
    assert scan_native.native_available(), scan_native.native_problem()
    for a, r in _pairs(np.float32)[:4]:
        a = a.copy()
        a[[3, 2 * _NB_BLOCK + 5]] = [np.nan, np.inf]
        starts, stops = _blocks(a.size)
        for atol, rtol, want_tr in ((np.inf, 0.0, False), (1e-5, 1e-3, True)):
            ours = scan_numba.native_rows(a, r, starts, stops, atol, rtol, 1.2e-38, want_tr)
            theirs = scan_numba.nb_rows(a, r, starts, stops, atol, rtol, 1.2e-38, want_tr)
            bad = ~np.isfinite(ours[:, scan_numba._SAA] + ours[:, scan_numba._SRR])
            assert bad.tolist() == [j in (0, 2) for j in range(starts.size)]
            assert np.array_equal(ours[~bad][:, MAXIMA_AND_COUNTS],
                                  theirs[~bad][:, MAXIMA_AND_COUNTS])
