"""The fast paths keep their results: zero-copy .npy reads, the diff engine choice, the
capture's fixed-cost cuts. (Speed itself is measured in benchmarks/, never asserted here.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from verify.dump import DumpEntry, Scratch, load_npy
from verify.errors import DumpError


def _entry(a: np.ndarray) -> DumpEntry:
    return DumpEntry(0, "t", "n", "Op", str(a.dtype), tuple(a.shape), "x.npy", {})


@pytest.mark.parametrize("array", [
    np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    np.array([True, False, True]),
    np.array(3.5, np.float32),
    np.zeros((0, 5), np.int64),
    np.arange(1 << 18, dtype=np.int32),  # spans many pages
])
def test_mapped_read_equals_np_load_and_is_read_only(tmp_path: Path, array: np.ndarray) -> None:
    path = tmp_path / "x.npy"
    np.save(path, array, allow_pickle=False)
    got = load_npy(path, _entry(array), "t")
    assert got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(got, array)
    assert got.flags.f_contiguous == array.flags.f_contiguous
    if array.size:
        assert not got.flags.writeable  # a map of the file, never written through
    buffered = load_npy(path, _entry(array), "t", Scratch())
    assert np.array_equal(buffered, array)


def test_mapped_array_outlives_the_file_handle_and_a_rewrite_of_the_name(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    a = np.arange(1000, dtype=np.float32)
    np.save(path, a, allow_pickle=False)
    got = load_npy(path, _entry(a), "t")
    tmp = tmp_path / "y.npy"
    np.save(tmp, np.zeros_like(a), allow_pickle=False)
    tmp.replace(path)  # a new dump written over the old one replaces files by rename
    assert np.array_equal(got, a)


def test_mapped_read_refuses_trailing_data(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    a = np.arange(10, dtype=np.float32)
    np.save(path, a, allow_pickle=False)
    with open(path, "ab") as fh:
        fh.write(b"\0" * 8)
    with pytest.raises(DumpError, match=r"^t: x.npy has 8 bytes of trailing data$"):
        load_npy(path, _entry(a), "t")
