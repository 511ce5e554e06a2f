"""The auto engine's choice between numpy and numba (`scan_numba.choose_engine`), at its edges:
the bytes a process has compared so far (summed over calls) against `NUMBA_AFTER_BYTES`, the
per-pair minimum `_NUMBA_MIN_BYTES`, `VERIFY_NO_NUMBA`, and a numba that cannot be loaded.

Each test starts from a fresh process's state (nothing compared, numba not loaded) and without
the compiled C kernel (`VERIFY_NO_NATIVE=1`: auto's first choice where it builds, whose choice
tests/test_scan_native.py covers); this is the policy where no C compiler is. The loader
is replaced by a stand-in that records its calls: loading the real numba is a once-per-process
cost these tests must not depend on, and a numba that fails to load cannot be had for real on a
machine where it is installed. The last test crosses the threshold with the real numba."""

from __future__ import annotations

import numpy as np
import pytest

from verify import scan_numba
from verify.compare import compare
from verify.scan_numba import _NUMBA_MIN_BYTES, NUMBA_AFTER_BYTES, choose_engine


def _fresh(monkeypatch: pytest.MonkeyPatch, loads: bool | None) -> list[int]:
    """A process that has compared nothing and not loaded numba; `loads`: what the loader does
    when called (True: numba loads, False: it fails, None: the real loader). The list returned
    counts the loader's calls."""
    monkeypatch.delenv("VERIFY_NO_NUMBA", raising=False)
    monkeypatch.setenv("VERIFY_NO_NATIVE", "1")
    monkeypatch.setattr(scan_numba, "_bytes_seen", 0)
    monkeypatch.setattr(scan_numba, "_nb_state", "unloaded")
    calls: list[int] = []
    if loads is not None:
        def load() -> object | None:
            calls.append(1)
            scan_numba._nb_state = "loaded" if loads else "missing"  # as _load_numba sets it
            return object() if loads else None

        monkeypatch.setattr(scan_numba, "_load_numba", load)
    return calls


def test_numpy_until_the_process_has_compared_numba_after_bytes(monkeypatch) -> None:
    calls = _fresh(monkeypatch, loads=True)
    below = NUMBA_AFTER_BYTES - 1 - _NUMBA_MIN_BYTES
    assert choose_engine("auto", below) == "numpy"
    assert choose_engine("auto", _NUMBA_MIN_BYTES) == "numpy"  # AFTER - 1 seen: still numpy
    assert calls == []  # and numba not loaded for it
    assert choose_engine("auto", 1 << 20) == "numba"  # past the threshold: loads numba
    assert calls == [1]


def test_the_threshold_is_reached_at_exactly_numba_after_bytes(monkeypatch) -> None:
    calls = _fresh(monkeypatch, loads=True)
    assert choose_engine("auto", NUMBA_AFTER_BYTES - _NUMBA_MIN_BYTES) == "numpy"
    assert choose_engine("auto", _NUMBA_MIN_BYTES) == "numba"
    assert calls == [1]


def test_bytes_add_up_over_the_pairs_of_a_process(monkeypatch) -> None:
    _fresh(monkeypatch, loads=True)
    half = NUMBA_AFTER_BYTES // 2
    assert choose_engine("auto", half) == "numpy"
    assert choose_engine("auto", half) == "numba"  # the second half reaches the threshold


def test_small_pairs_stay_on_numpy_once_numba_is_loaded(monkeypatch) -> None:
    _fresh(monkeypatch, loads=True)
    monkeypatch.setattr(scan_numba, "_nb_state", "loaded")
    assert choose_engine("auto", _NUMBA_MIN_BYTES - 1) == "numpy"
    assert choose_engine("auto", _NUMBA_MIN_BYTES) == "numba"


def test_verify_no_numba_0_allows_numba_and_1_keeps_numpy(monkeypatch) -> None:
    calls = _fresh(monkeypatch, loads=True)
    monkeypatch.setenv("VERIFY_NO_NUMBA", "1")
    assert choose_engine("auto", NUMBA_AFTER_BYTES) == "numpy"
    assert calls == []
    monkeypatch.setenv("VERIFY_NO_NUMBA", "0")  # "0" reads as unset
    assert choose_engine("auto", NUMBA_AFTER_BYTES) == "numba"
    assert calls == [1]


def test_a_numba_that_fails_to_load_leaves_auto_on_numpy(monkeypatch) -> None:
    calls = _fresh(monkeypatch, loads=False)
    assert choose_engine("auto", NUMBA_AFTER_BYTES) == "numpy"  # the load is tried, fails
    assert choose_engine("auto", NUMBA_AFTER_BYTES) == "numpy"  # and is not tried again
    assert calls == [1]


@pytest.mark.parametrize("seen", [0, NUMBA_AFTER_BYTES])
def test_compare_past_the_threshold_without_a_loadable_numba_gives_numpys_verdict(
        monkeypatch, seen: int) -> None:
    """A user without a working numba who compares enough in one process: every pair is judged
    (numpy), none raises. The pairs are 64 KiB in all (numba's minimum), one of them failing."""
    rng = np.random.default_rng(7)
    r = rng.standard_normal(_NUMBA_MIN_BYTES // 8).astype(np.float32)
    bad = r.copy()
    bad[100] += 1.0
    expected = [compare(f"t{i}", a, r, engine="numpy") for i, a in enumerate((r, bad, r))]
    calls = _fresh(monkeypatch, loads=False)
    scan_numba._bytes_seen = seen
    got = [compare(f"t{i}", a, r) for i, a in enumerate((r, bad, r))]
    assert got == expected
    assert [d.passed for d in got] == [True, False, True]
    assert calls == ([1] if seen else [])


@pytest.mark.skipif(not scan_numba.numba_available(), reason="no numba")
def test_compare_crossing_the_threshold_loads_the_real_numba(monkeypatch) -> None:
    _fresh(monkeypatch, loads=None)
    rng = np.random.default_rng(8)
    r = rng.standard_normal(1 << 15).astype(np.float32)  # 256 KiB a pair
    a = r + np.float32(1e-7)
    scan_numba._bytes_seen = NUMBA_AFTER_BYTES - a.nbytes - r.nbytes - 1
    first = compare("t", a, r)
    assert scan_numba._nb_state == "unloaded"  # one byte short
    second = compare("t", a, r)
    assert scan_numba._nb_state == "loaded"
    assert first.passed and second.passed and first.n_outside == second.n_outside == 0
    assert second.max_abs == first.max_abs

