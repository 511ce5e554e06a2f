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
            pull({**rec, **bad}, None)
    with pytest.raises(RunnerError, match="a second file named c0.npys"):
        pull({**rec, "file": "x/c0.npys", "offset": 0},
             {**rec, "name": "b", "file": "y/c0.npys", "offset": 0})
    # one record per planned tensor, in the plan's order, or null: nothing else is taken
    for records, why in [((rec,), "1 records for 2 tensors"),
                         ((rec, None, None), "3 records for 2 tensors"),
                         (({**rec, "name": "bogus"}, None), "'bogus' where 'a' belongs"),
                         ((None, rec), "'a' where 'b' belongs"),
                         ((rec, "b"), "'b' where 'b' belongs")]:
        with pytest.raises(RunnerError, match=why):
            pull(*records)
    assert len(pull(rec, None).records[0]) == 1  # b not written (no .npy form): null


def test_manifest_cases_refuses_a_dump_of_other_cases_than_were_run() -> None:
    from types import SimpleNamespace

    import pytest

    from verify.errors import RunnerError
    from verify.layerdump import manifest_cases

    capture = SimpleNamespace(plan=SimpleNamespace(tensors=[], optimized_only=()),
                              records=((), ()))
    with pytest.raises(RunnerError, match="holds 2 case"):
        manifest_cases(capture, [0])
    assert len(manifest_cases(capture, [0, 3])) == 2


def test_a_packed_tensor_reads_the_same_by_the_one_map_path_and_by_numpys_reader(tmp_path: Path) -> None:
    """np.save's header for the manifest's dtype and shape: header and data from one map, no
    read of the file. Any other valid .npy image (a 2.0 header, Fortran order, other padding)
    goes to the reader that parses the header, with the same values."""
    import io
    from dataclasses import dataclass

    import verify.dump_read as dr

    @dataclass
    class E:
        name: str
        dtype: str
        shape: tuple[int, ...]

    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    images = []
    for write in (lambda f: np.save(f, a), lambda f: np.save(f, np.float16(a)),
                  lambda f: np.lib.format.write_array(f, a, version=(2, 0)),
                  lambda f: np.save(f, np.asfortranarray(a)),
                  lambda f: np.save(f, np.zeros((0, 3), np.int64))):
        buf = io.BytesIO()
        write(buf)
        images.append(buf.getvalue())
    path = tmp_path / "c0.npys"
    offsets, blob = [], b""
    for image in images:
        blob += b"\0" * (-len(blob) % 64)
        offsets.append(len(blob))
        blob += image
    path.write_bytes(blob)
    entries = [E("a", "float32", (2, 3, 4)), E("h", "float16", (2, 3, 4)),
               E("v2", "float32", (2, 3, 4)), E("f", "float32", (2, 3, 4)),
               E("z", "int64", (0, 3))]
    files = OpenFiles()
    fh, size = files.get(path, "t")
    fast = [dr.packed_image(files, path, at, e, "t") for at, e in zip(offsets, entries)]
    assert [f is not None for f in fast] == [True, True, False, False, True]
    for at, e, f in zip(offsets, entries, fast):
        slow = dr.read_npy(fh, size, at, path.name, e, "t", mapper=lambda o, n: files.mapped(path, o, n))
        assert slow.dtype == np.dtype(e.dtype) and slow.shape == e.shape
        assert np.array_equal(slow, a if e.name != "z" else np.zeros((0, 3)))
        if f is not None:
            assert f.dtype == slow.dtype and np.array_equal(f, slow)
    # the manifest naming the dtype by an alias, or a subarray dtype: not taken here (numpy's
    # reader then refuses what its name does not match)
    for odd in ("f4", "<f4", "(2,)f4", "(-1,)i4", "object"):
        assert dr.packed_image(files, path, offsets[0], E("a", odd, (2, 3, 4)), "t") is None
    # a header that is np.save's but for another shape, or data cut short: not taken here
    assert dr.packed_image(files, path, offsets[0], E("a", "float32", (4, 3, 2)), "t") is None
    assert dr.packed_image(files, path, offsets[-1] + 64, entries[-1], "t") is None
    files.close()
    short = tmp_path / "c1.npys"
    short.write_bytes(images[0][:-4])
    files.get(short, "t")
    assert dr.packed_image(files, short, 0, entries[0], "t") is None
    files.close()


def _dump_folder(folder: Path, cases: list[dict], version: int = 2) -> Path:
    import json

    from verify.dump import manifest_header

    folder.mkdir(exist_ok=True)
    m = manifest_header(device={}, spec="local", providers=[], options={}, model_sha256="",
                        graph="model", outputs=[])
    m["cases"] = cases
    m["format_version"] = version
    (folder / "manifest.json").write_text(json.dumps(m))
    return folder


def _entry(i: int, name: str, a: np.ndarray, file: str, offset: int | None) -> dict:
    return {"index": i, "name": name, "node": "", "op": "Relu", "dtype": str(a.dtype),
            "shape": list(a.shape), "file": file, "offset": offset, "stats": {}}


def test_an_image_running_into_the_next_one_is_refused(tmp_path: Path) -> None:
    """np.save writes a 128-byte header for a 4-D tensor: B placed 64 bytes before A's data
    ends passes the manifest's check (which counts 64 bytes of header), and A's last 16 values
    would be B's header bytes. The read stops at the next image's start, both ways of reading."""
    import pytest

    from verify.dump import open_dump
    from verify.dump_read import Scratch
    from verify.errors import DumpError

    a = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    b = np.full((1, 1, 4, 4), 7.0, np.float32)
    d = tmp_path / "d"
    d.mkdir()
    at_b = 64 + a.nbytes
    with open(d / "c0.npys", "wb") as fh:
        np.save(fh, a)
        fh.seek(at_b)
        np.save(fh, b)
    _dump_folder(d, [{"case": 0, "tensors": [_entry(0, "A", a, "c0.npys", 0),
                                             _entry(1, "B", b, "c0.npys", at_b)]}])
    dump = open_dump(d)
    a_entry, b_entry = dump.entries(0)
    assert np.array_equal(dump.load(b_entry), b)
    for scratch in (None, Scratch()):
        with pytest.raises(DumpError, match="runs 64 bytes into the next tensor's, at byte 192"):
            dump.load(a_entry, scratch)
    # laid out as np.save needs it, A reads back
    with open(d / "c0.npys", "wb") as fh:
        np.save(fh, a)
        fh.seek(128 + a.nbytes)
        np.save(fh, b)
    _dump_folder(d, [{"case": 0, "tensors": [_entry(0, "A", a, "c0.npys", 0),
                                             _entry(1, "B", b, "c0.npys", 128 + a.nbytes)]}])
    dump = open_dump(d)
    assert [np.array_equal(dump.load(e), v) for e, v in zip(dump.entries(0), (a, b))] == [
        True, True]


def test_a_case_reading_another_case_s_image_or_two_tensors_one_file_are_refused(
        tmp_path: Path) -> None:
    """Case 1's entry at case 0's image (diff would compare case 0's values under case 1), and
    in format 1 two tensors naming one file (one's values read under the other's name)."""
    import pytest

    from verify.dump import open_dump
    from verify.errors import DumpError

    a = np.ones((2, 2), np.float32)
    d = tmp_path / "d2"
    d.mkdir()
    with open(d / "c0.npys", "wb") as fh:
        np.save(fh, a)
    same = [_entry(0, "t", a, "c0.npys", 0)]
    _dump_folder(d, [{"case": 0, "tensors": same}, {"case": 1, "tensors": same}])
    with pytest.raises(DumpError, match="tensors 't' and 't' overlap in c0.npys"):
        open_dump(d)
    f1 = tmp_path / "d1"
    f1.mkdir()
    np.save(f1 / "c0_t00000.npy", a)
    _dump_folder(f1, [{"case": 0, "tensors": [_entry(0, "t", a, "c0_t00000.npy", None),
                                              _entry(1, "u", a, "c0_t00000.npy", None)]}],
                 version=1)
    with pytest.raises(DumpError, match="tensors 't' and 'u' share c0_t00000.npy"):
        open_dump(f1)
    _dump_folder(f1, [{"case": 0, "tensors": [_entry(0, "t", a, "c0_t00000.npy", None)]}],
                 version=1)
    assert np.array_equal(open_dump(f1).load(open_dump(f1).entries(0)[0]), a)
