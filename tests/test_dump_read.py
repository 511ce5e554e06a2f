"""Reading a dump's pack file: tensors mapped a window at a time stay right and stay valid."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from verify.dump_read import OpenFiles


def test_mapped_windows_give_the_files_bytes_and_outlive_the_next_window(tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
    path = tmp_path / "c0.npys"
    path.write_bytes(data.tobytes())
    files = OpenFiles(window=1 << 20)
    files.get(path, "t")
    spans = [(0, 10), (100, 4000), (70_000, 1 << 20), (5, 3), ((1 << 20) + 17, (2 << 20) - 17),
             ((3 << 20) - 9, 9), (2 << 20, 1)]
    held = []
    for at, n in spans:  # forward, back into an earlier window, one longer than the window
        view = files.mapped(path, at, n)
        held.append((at, n, np.frombuffer(view, np.uint8)))
        assert len(view) == n
    for at, n, got in held:  # every view still reads its bytes after the maps moved on
        assert np.array_equal(got, data[at:at + n])
    files.close()
    assert np.array_equal(held[2][2], data[70_000:70_000 + (1 << 20)])


def test_at_most_two_packs_stay_open_however_many_are_read(tmp_path: Path) -> None:
    """A dump of many cases is read case by case: the files and maps of earlier cases go."""
    import os

    files = OpenFiles(window=1 << 16)
    held = []
    before = len(os.listdir("/proc/self/fd"))
    for k in range(40):
        path = tmp_path / f"c{k}.npys"
        path.write_bytes(bytes([k]) * 5000)
        files.get(path, "t")
        got = np.frombuffer(files.mapped(path, 100, 10), np.uint8)
        if k < 3:
            held.append(got)  # an array made from a dropped map keeps its own pages
        else:  # two files, each mapped (a map holds a descriptor of its own), the 3 held
            assert len(os.listdir("/proc/self/fd")) - before <= 4 + 3
    assert all((got == k).all() for k, got in enumerate(held))
    files.close()


def test_file_names_and_offsets_are_checked_together() -> None:
    from verify.dump_check import file_problem

    assert file_problem("c0.npys", 0) is None and file_problem("c3.npys", 128) is None
    assert file_problem("c0_t00001.npy", None) is None
    assert file_problem("c0.npys", None) == "offset None into c0.npys is not a multiple of 64"
    assert file_problem("c0.npys", 3) == "offset 3 into c0.npys is not a multiple of 64"
    assert file_problem("c0.npys", True) is not None  # a bool is no offset
    assert file_problem("c0_t00001.npy", 64) == (
        "c0_t00001.npy is a tensor's own file, yet an offset (64) is given")
    assert file_problem("../c0.npys", 0) is not None and file_problem("x/c0.npys", 0) is not None


def test_the_host_refuses_a_runners_dump_record_with_a_wrong_file_or_offset(tmp_path: Path) -> None:
    """Checked as pulled (layerdump._pull): the device names the files, never a path of its
    choice; a pack takes an offset on a 64-byte step; two device files of one name are not
    merged into one."""
    from types import SimpleNamespace

    import pytest

    from verify.errors import RunnerError
    from verify.layerdump import DumpSpec, _pull

    pulled: list[str] = []
    session = SimpleNamespace(spec="dev", pull=lambda src, dst, move: pulled.append(src))
    plan = SimpleNamespace(tensors=[SimpleNamespace(name="a"), SimpleNamespace(name="b")])

    def pull(*records: dict) -> object:
        result = {"dump": {"cases": [list(records)], "budget_bytes": 1, "ms": 1.0}}
        return _pull(session, "w", DumpSpec(dest=tmp_path), plan, result, keep=False)

    rec = {"name": "a", "dtype": "float32", "shape": [1], "size": 1}
    got = pull({**rec, "file": "dump/c0.npys", "offset": 0},
               {**rec, "name": "b", "file": "dump/c0.npys", "offset": 64})
    assert pulled == ["w/dump/c0.npys"]  # one pull for the case's pack
    assert [r["file"] for r in got.records[0]] == ["c0.npys", "c0.npys"]
    for bad, why in [({"file": "dump/c0.npys", "offset": None}, "not a multiple of 64"),
                     ({"file": "dump/c0.npys", "offset": 3}, "not a multiple of 64"),
                     ({"file": "dump/c0_t00000.npy", "offset": 128}, "yet an offset"),
                     ({"file": "dump/../../x.npys", "offset": 0}, "is not c<case>.npys")]:
        with pytest.raises(RunnerError, match=why):
            pull({**rec, **bad})
    with pytest.raises(RunnerError, match="a second file named c0.npys"):
        pull({**rec, "file": "x/c0.npys", "offset": 0},
             {**rec, "name": "b", "file": "y/c0.npys", "offset": 0})
