"""The runner's NpyWriter (verify/runner/runner.py): the dump's .npy files, written through a
few aligned buffers by a thread of its own with O_DIRECT where the file system takes it, are
byte for byte what np.save writes, whatever the array; without O_DIRECT, or when a write
refuses it, the same bytes go through the page cache; a failed write is raised, never lost."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import numpy as np
import pytest

from verify.runner import runner as R


def _saved(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    big = rng.standard_normal((3, 70, 1000)).astype(np.float32)  # 840,000 bytes
    return {
        "f32": big,
        "f16": rng.standard_normal((5, 7)).astype(np.float16),
        "i64": np.arange(-5, 40000, dtype=np.int64),
        "bool": rng.random(1001) > 0.5,
        "scalar": np.array(3.5, dtype=np.float64),
        "empty": np.zeros((0, 3), np.float32),
        "fortran": np.asfortranarray(rng.standard_normal((300, 200))),
        "strided": big[:, ::3, 1::2],
        "exact": np.zeros(65536 - 128, np.uint8),  # header + data = exactly one buffer
        "u8": rng.integers(0, 255, 4097, dtype=np.uint8),
    }


@pytest.mark.parametrize("block", [1 << 16, 4 << 20])
def test_the_files_are_what_np_save_writes(block: int, tmp_path: Path) -> None:
    arrays = _arrays()
    writer = R.NpyWriter(np, block=block)
    for name, a in arrays.items():
        writer.write(str(tmp_path / f"{name}.npy"), a)
    writer.close()
    for name, a in arrays.items():
        assert (tmp_path / f"{name}.npy").read_bytes() == _saved(a), name


def test_without_o_direct_the_same_bytes_go_through_the_page_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "O_DIRECT", raising=False)
    arrays = _arrays()
    writer = R.NpyWriter(np, block=1 << 16)
    for name, a in arrays.items():
        writer.write(str(tmp_path / f"{name}.npy"), a)
    writer.close()
    for name, a in arrays.items():
        assert (tmp_path / f"{name}.npy").read_bytes() == _saved(a), name


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="a platform without O_DIRECT")
def test_a_write_that_refuses_o_direct_is_finished_through_the_page_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that opens with O_DIRECT but refuses the write (EINVAL): the flag is
    dropped on that file and the same bytes written."""
    import fcntl

    real = os.write
    refused = []

    def write(fd: int, data: bytes) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    a = _arrays()["f32"]
    writer = R.NpyWriter(np, block=1 << 16)
    writer.write(str(tmp_path / "a.npy"), a)
    writer.close()
    assert refused and (tmp_path / "a.npy").read_bytes() == _saved(a)


def test_a_failed_write_is_raised_by_close_and_by_the_next_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    writer = R.NpyWriter(np, block=1 << 16)
    with pytest.raises(OSError, match="No space left"):
        for i in range(50):  # the writer thread's error reaches a later write ...
            writer.write(str(tmp_path / f"b{i}.npy"), np.ones(100000, np.float32))
    with pytest.raises(OSError, match="No space left"):
        writer.close()  # ... and close
    writer.close(raise_error=False)  # the caller already failing: closes quietly


def test_what_np_save_refuses_is_refused_and_a_bad_folder_raises_at_once(
        tmp_path: Path) -> None:
    writer = R.NpyWriter(np)
    with pytest.raises(ValueError, match="allow_pickle"):
        writer.write(str(tmp_path / "o.npy"), np.array(["a", None], dtype=object))
    with pytest.raises(FileNotFoundError):
        writer.write(str(tmp_path / "no" / "such.npy"), np.ones(3))
    writer.write(str(tmp_path / "after.npy"), np.ones(3))  # the writer goes on
    writer.close()
    assert (tmp_path / "after.npy").read_bytes() == _saved(np.ones(3))
