"""verify.files: a file appears whole, with the user's permissions, or not at all."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from verify.files import atomic_write, save_npy_atomic, write_json_atomic, write_text_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    write_json_atomic(target, {"ok": True})

    def half_then_fail(fh) -> None:  # type: ignore[no-untyped-def]
        fh.write(b'{"ok": fal')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, half_then_fail)
    assert target.read_text() == '{\n "ok": true\n}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_new_files_get_the_umask_permissions_not_mkstemps_0600(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "sub" / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "sub" / "a.txt").stat().st_mode) == 0o640


def test_json_is_strict_and_npy_never_pickles(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_json_atomic(tmp_path / "nan.json", {"x": float("nan")})
    assert not list(tmp_path.iterdir())
    write_json_atomic(tmp_path / "np.json", {"n": np.int64(3), "t": (1, 2)})
    assert (tmp_path / "np.json").read_text() == '{\n "n": 3,\n "t": [\n  1,\n  2\n ]\n}'
    with pytest.raises(ValueError):
        save_npy_atomic(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["np.json"]


def test_files_pulled_from_a_device_get_the_umask_permissions(tmp_path: Path) -> None:
    from verify.drivers.base import DriverConfig
    from verify.drivers.local import LocalDriver

    (tmp_path / "device").mkdir()
    (tmp_path / "device" / "out.npy").write_bytes(b"data")
    old = os.umask(0o022)
    try:
        with LocalDriver(DriverConfig("local", base_dir=str(tmp_path / "device"))) as driver:
            driver.get(str(tmp_path / "device" / "out.npy"), tmp_path / "host" / "out.npy")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "host" / "out.npy").stat().st_mode) == 0o644
    assert sorted(p.name for p in (tmp_path / "host").iterdir()) == ["out.npy"]


def test_a_short_write_by_numpy_is_named_as_a_full_disk(tmp_path: Path) -> None:
    """np.save of a large array writes with tofile, whose short write on a nearly full disk
    raises an OSError with no errno ('102400 requested and 23520 written')."""
    from verify.files import os_reason

    assert os_reason(OSError("102400 requested and 23520 written")) == (
        "No space left on device? (a short write: 23520 of 102400 bytes written)")
    assert os_reason(OSError(28, "No space left on device")) == "No space left on device"
    assert os_reason(OSError("something else")) == "something else"
