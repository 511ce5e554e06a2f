"""The format-3 reader of external data files (`verify/archive_reader.py`: `_external`,
`extract_external`, `check_external`, `external_data`, `export_external`), decision by decision:
each test tampers with one field of an archive pack wrote (re-sealing its archive checksum where
that covers the field, so the structural check alone must catch it) and asserts the one line the
reader gives, or the bytes it extracts. Holes found by mutation testing of the reader
(docs/mutation.md): no test in the reader's selection reached these decisions before.

The model is tiny: y = x + w, z = x * v, with w in `w.bin` and v in `sub/v.bin` (a location in
a sub-folder), kept as external data by `pack --keep-external-data`."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from onnx import TensorProto, helper

from helpers_archive import damage_chunk as _compress
from helpers_archive import external_tensor as _tensor
from helpers_archive import refused_line as _refused
from helpers_archive import reseal as _reseal
from helpers_cli import only_line, verify
from verify import external as external_mod
from verify import schema
from verify.archive_reader import ArchiveReader, export_external, external_data, read_archive
from verify.errors import ArchiveError
from verify.external import ExternalFile
from verify.testcase import write_archive

W = np.arange(1, 5, dtype=np.float32)
V = np.arange(10, 14, dtype=np.float32)
EXT = f"{schema.EXTERNAL}"


def _model(folder: Path, v_location: str = "sub/v.bin") -> Path:
    (folder / v_location).parent.mkdir(parents=True, exist_ok=True)
    (folder / "w.bin").write_bytes(W.tobytes())
    (folder / v_location).write_bytes(V.tobytes())
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"]), helper.make_node("Mul", ["x", "v"], ["z"])],
        "g", [info("x", TensorProto.FLOAT, [4])],
        [info("y", TensorProto.FLOAT, [4]), info("z", TensorProto.FLOAT, [4])],
        [_tensor("w", W, "w.bin"), _tensor("v", V, v_location)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model packed with its two external files kept (format 3)."""
    folder = tmp_path_factory.mktemp("ext")
    vtc = folder / "m.vtc"
    from verify.cli import main

    code = main(["pack", str(_model(folder / "src")), "--keep-external-data", "-d", "x:rand",
                 "--seed", "3", "-o", str(vtc)])
    assert code == 0
    return vtc


@pytest.fixture
def archive(packed: Path, tmp_path: Path) -> Path:
    """A copy of `packed` to tamper with."""
    dest = tmp_path / "m.vtc"
    shutil.copyfile(packed, dest)
    return dest


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _set_attr(where: str, key: str, value: object) -> Callable[[h5py.File], None]:
    def edit(f: h5py.File) -> None:
        f[where].attrs[key] = value
    return edit


def _del_attr(where: str, key: str) -> Callable[[h5py.File], None]:
    def edit(f: h5py.File) -> None:
        del f[where].attrs[key]
    return edit


def _replace(where: str, make: Callable[[h5py.File, str, np.ndarray], object]
             ) -> Callable[[h5py.File], None]:
    """`where` replaced by what `make` puts there, its attributes carried over."""
    def edit(f: h5py.File) -> None:
        attrs = dict(f[where].attrs)
        data = f[where][()]
        del f[where]
        obj = make(f, where, data)
        for k, v in attrs.items():
            obj.attrs[k] = v  # type: ignore[attr-defined]
    return edit


def _as_text(value: str) -> np.bytes_:
    return np.bytes_(value.encode())


def _vlen_name(f: h5py.File) -> None:
    ds = f[f"{EXT}/0"]
    name = ds.attrs[schema.ATTR_NAME].decode()
    del ds.attrs[schema.ATTR_NAME]
    ds.attrs.create(schema.ATTR_NAME, name, dtype=h5py.string_dtype())


def _version(n: int) -> Callable[[h5py.File], None]:
    def edit(f: h5py.File) -> None:
        f.attrs[schema.ATTR_VERSION] = np.int64(n)
    return edit


E0, E1 = f"{EXT}/0", f"{EXT}/1"
# (edit, re-seal the archive checksum after it, the line after "corrupt archive: ")
DAMAGES: dict[str, tuple[Callable[[h5py.File], None], bool, str]] = {
    "group attribute": (_set_attr(EXT, "note", _as_text("x")), False,
                        "/external carries unexpected attribute(s) ['note']"),
    "file attribute": (_set_attr(E0, "note", _as_text("x")), False,
                       "/external/0 carries unexpected attribute(s) ['note']"),
    "group as a dataset": (lambda f: (f.__delitem__(EXT), f.create_dataset(EXT, data=[1])), True,
                           "external is not a group"),
    "files numbered 0, 2": (lambda f: f.move(E1, f"{EXT}/2"), False,
                            "external is not numbered 0..1"),
    "files numbered 0, 01": (lambda f: f.move(E1, f"{EXT}/01"), False,
                             "external is not numbered 0..1"),
    "file as a group": (_replace(E0, lambda f, w, d: f.create_group(w)), False,
                        "external/0 is not a byte array"),
    "file of float32": (_replace(E0, lambda f, w, d: f.create_dataset(
        w, data=d.view(np.float32))), False, "external/0 is not a byte array"),
    "file of int8": (_replace(E0, lambda f, w, d: f.create_dataset(
        w, data=d.view(np.int8))), False, "external/0 is not a byte array"),
    "file 2-D": (_replace(E0, lambda f, w, d: f.create_dataset(w, data=d.reshape(4, 4))), False,
                 "external/0 is not a byte array"),
    "file scalar": (_replace(E0, lambda f, w, d: f.create_dataset(w, data=np.uint8(d[0]))),
                    False, "external/0 is not a byte array"),
    "no location": (_del_attr(E0, schema.ATTR_NAME), True,
                    "attribute 'name' of /external/0 is missing or not str"),
    "no digest": (_del_attr(E0, schema.ATTR_SHA256), True,
                  "attribute 'sha256' of /external/0 is missing or not str"),
    "variable-length location": (_vlen_name, False,
                                 "attribute 'name' of /external/0 is not fixed-length text"),
    "location up and out": (_set_attr(E0, schema.ATTR_NAME, _as_text("../w.bin")), True,
                            "external/0 has a bad or repeated location '../w.bin'"),
    "location up and out, deeper": (_set_attr(E1, schema.ATTR_NAME, _as_text("sub/../../v")),
                                    True,
                                    "external/1 has a bad or repeated location 'sub/../../v'"),
    "location absolute": (_set_attr(E0, schema.ATTR_NAME, _as_text("/tmp/w.bin")), True,
                          "external/0 has a bad or repeated location '/tmp/w.bin'"),
    "location with a backslash": (_set_attr(E0, schema.ATTR_NAME, _as_text("..\\w.bin")), True,
                                  "external/0 has a bad or repeated location '..\\\\w.bin'"),
    "location empty": (_set_attr(E0, schema.ATTR_NAME, _as_text("")), True,
                       "external/0 has a bad or repeated location ''"),
    "location twice": (_set_attr(E1, schema.ATTR_NAME, _as_text("w.bin")), True,
                       "external/1 has a bad or repeated location 'w.bin'"),
    "location twice, spelt apart": (_set_attr(E1, schema.ATTR_NAME, _as_text("./w.bin")), True,
                                    "external/1 has a bad or repeated location './w.bin'"),
    "location a folder of another": (_set_attr(E0, schema.ATTR_NAME, _as_text("sub")), True,
                                     "external/1 has a bad or repeated location 'sub/v.bin'"),
    "location a folder of an earlier one": (
        lambda f: (f[E0].attrs.__setitem__(schema.ATTR_NAME, _as_text("a/b.bin")),
                   f[E1].attrs.__setitem__(schema.ATTR_NAME, _as_text("a"))), True,
        "external/1 has a bad or repeated location 'a'"),
    "location inside an earlier file": (_set_attr(E1, schema.ATTR_NAME, _as_text("w.bin/v.bin")),
                                        True,
                                        "external/1 has a bad or repeated location 'w.bin/v.bin'"),
    "location the folder itself": (_set_attr(E0, schema.ATTR_NAME, _as_text(".")), True,
                                   "external/0 has a bad or repeated location '.'"),
    "digest with a non-hex digit": (_set_attr(E0, schema.ATTR_SHA256, _as_text("0" * 63 + "g")),
                                    True, "external/0 ('w.bin') has a malformed digest"),
    "digest in upper case": (_set_attr(E0, schema.ATTR_SHA256, _as_text(_sha(W.tobytes()).upper())),
                             True, "external/0 ('w.bin') has a malformed digest"),
    "digest one short": (_set_attr(E1, schema.ATTR_SHA256, _as_text("0" * 63)), True,
                         "external/1 ('sub/v.bin') has a malformed digest"),
    "digest one long": (_set_attr(E1, schema.ATTR_SHA256, _as_text("0" * 65)), True,
                        "external/1 ('sub/v.bin') has a malformed digest"),
    # what the archive checksum covers: an edit not re-sealed
    "location edited": (_set_attr(E1, schema.ATTR_NAME, _as_text("sub/v2.bin")), False,
                        "its metadata or layout does not match the archive checksum (re-pack "
                        "it, or get an intact copy)"),
    "digest and bytes edited together": (
        lambda f: (f[E0].__setitem__(0, 99),
                   f[E0].attrs.__setitem__(schema.ATTR_SHA256,
                                           _as_text(_sha(bytes(f[E0][()]))))), False,
        "its metadata or layout does not match the archive checksum (re-pack it, or get an "
        "intact copy)"),
    "format 2 with external data": (_version(2), True, "unexpected entries ['external']"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_external_part_is_refused_with_what_is_wrong(archive: Path, damage: str) -> None:
    edit, reseal, what = DAMAGES[damage]
    with h5py.File(archive, "r+") as f:
        edit(f)
    if reseal:
        _reseal(archive)
    assert _refused(archive) == what


def test_the_intact_archive_lists_its_external_files(packed: Path) -> None:
    """The control for the damages above, and what the reader hands on: each file's location,
    size and digest, in the stored order."""
    tc = read_archive(packed)
    assert tc.format_version == schema.EXTERNAL_VERSION and tc.checked
    assert tc.external == (ExternalFile("w.bin", W.nbytes, _sha(W.tobytes())),
                           ExternalFile("sub/v.bin", V.nbytes, _sha(V.tobytes())))
    with ArchiveReader(packed) as reader:
        reader.check_external()


def test_a_resealed_copy_reads_as_the_original(archive: Path) -> None:
    """The control for `_reseal`: on an untouched archive it writes the checksum pack wrote."""
    with h5py.File(archive) as f:
        before = f.attrs[schema.ATTR_CHECKSUM]
    _reseal(archive)
    with h5py.File(archive) as f:
        assert f.attrs[schema.ATTR_CHECKSUM] == before


def test_format_3_without_an_external_group_holds_no_external_data(archive: Path) -> None:
    with h5py.File(archive, "r+") as f:
        del f[EXT]
    _reseal(archive)
    assert read_archive(archive).external == ()


def test_extracted_files_hold_the_stored_bytes_and_go_after(packed: Path) -> None:
    tc = read_archive(packed)
    with external_data(tc) as data:
        assert data is not None
        folder = data.folder
        assert [(f.location, f.size, f.sha256, f.path) for f in data.files] == [
            ("w.bin", 16, _sha(W.tobytes()), folder / "w.bin"),
            ("sub/v.bin", 16, _sha(V.tobytes()), folder / "sub" / "v.bin")]
        assert (folder / "w.bin").read_bytes() == W.tobytes()
        assert (folder / "sub" / "v.bin").read_bytes() == V.tobytes()
        assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == [
            "sub", "sub/v.bin", "w.bin"]
    assert not folder.exists()


def test_external_data_of_a_self_contained_or_unsaved_testcase(packed: Path) -> None:
    tc = read_archive(packed)
    with external_data(dataclasses.replace(tc, external=())) as data:
        assert data is None
    with pytest.raises(ArchiveError) as e, external_data(dataclasses.replace(tc, path=None)):
        pass
    assert str(e.value) == "a model with external data must be read from its archive"
    assert export_external(dataclasses.replace(tc, external=()), packed.parent) == []
    assert export_external(dataclasses.replace(tc, path=None), packed.parent) == []


def _flip_last_byte(path: Path, where: str) -> None:
    with h5py.File(path, "r+") as f:
        f[where][-1] ^= 0xFF


def test_damaged_bytes_of_the_second_file_are_refused_and_not_left(archive: Path,
                                                                   tmp_path: Path) -> None:
    """Each file is checked, not the first only; a file that fails its check is removed, the
    one before it (checked) kept."""
    _flip_last_byte(archive, E1)
    what = (f"{archive}: corrupt archive: external data 'sub/v.bin' does not match its checksum "
            "(re-pack it, or get an intact copy)")
    out = tmp_path / "out"
    with ArchiveReader(archive) as reader:
        with pytest.raises(ArchiveError) as e:
            reader.check_external()
        assert str(e.value) == what
        with pytest.raises(ArchiveError) as e:
            reader.extract_external(out)
        assert str(e.value) == what
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["sub", "w.bin"]


@pytest.mark.parametrize("command", ["inspect", "run", "export"])
def test_the_cli_refuses_damaged_external_bytes_in_one_line(archive: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str],
                                                            command: str) -> None:
    _flip_last_byte(archive, E1)
    out = tmp_path / "out"
    out.mkdir()
    argv = {"inspect": [archive], "run": [archive, "--iter", "1"],
            "export": [archive, "-o", out / "m.onnx"]}[command]
    code, _, err = verify(capsys, command, *argv)
    assert (code, only_line(err)) == (
        2, f"error: {archive}: corrupt archive: external data 'sub/v.bin' does not match its "
           "checksum (re-pack it, or get an intact copy)")
    assert list(out.iterdir()) == []  # export: no model, no data file, no scratch folder


@pytest.mark.parametrize("how", ["link", "virtual"])
@pytest.mark.parametrize("command", ["inspect", "run", "export"])
def test_an_external_file_read_from_another_archive_is_refused_unread(
        archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
        how: str) -> None:
    """external/1 made an HDF5 external link into a byte-identical copy of the archive, or a
    virtual dataset mapping the copy's external/1 (its checksum still matches, so followed it
    would be read, extracted and exported from there): refused by name and file, nothing
    written (archive_file.py `_names`, `_own_data`)."""
    copy = tmp_path / "copy.vtc"
    shutil.copyfile(archive, copy)
    with h5py.File(archive, "r+") as f:
        attrs, n = dict(f[E1].attrs), f[E1].shape[0]
        del f[E1]
        if how == "link":
            f[E1] = h5py.ExternalLink(str(copy), f"/{E1}")
            what = f"is an external link to '{copy}:/{E1}'; verify archives hold no links"
        else:
            layout = h5py.VirtualLayout(shape=(n,), dtype=np.uint8)
            layout[...] = h5py.VirtualSource(str(copy), E1, shape=(n,))
            f.create_virtual_dataset(E1, layout).attrs.update(attrs)
            what = (f"is a virtual dataset, its data mapped from ['{copy}']; verify archives "
                    "hold their own data")
    out = tmp_path / "out"
    out.mkdir()
    argv = {"inspect": [archive], "run": [archive, "--iter", "1"],
            "export": [archive, "-o", out / "m.onnx"]}[command]
    code, _, err = verify(capsys, command, *argv)
    assert (code, only_line(err)) == (2, f"error: {archive}: corrupt archive: {E1} {what}")
    assert list(out.iterdir()) == []


def test_export_writes_each_file_under_its_location(packed: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = verify(capsys, "export", packed, "-o", tmp_path / "m.onnx")
    assert code == 0, err
    assert (tmp_path / "w.bin").read_bytes() == W.tobytes()
    assert (tmp_path / "sub" / "v.bin").read_bytes() == V.tobytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "sub", "w.bin"]
    assert f"wrote external data 1: {tmp_path / 'sub' / 'v.bin'}" in out


def test_inspect_counts_every_external_file(packed: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = verify(capsys, "inspect", packed)
    assert code == 0, err
    assert "external data: 2 file(s), 32 B (w.bin, sub/v.bin)" in out
    assert "verified: the model, 3 tensor(s) and 2 external data file(s) match their checksums" \
        in out


def test_a_file_the_model_names_but_the_archive_lacks(archive: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with h5py.File(archive, "r+") as f:
        f[E1].attrs[schema.ATTR_NAME] = _as_text("sub/other.bin")
    _reseal(archive)
    code, _, err = verify(capsys, "run", archive, "--iter", "1")
    assert code == 2
    assert only_line(err).endswith("initializer 'v' is stored in external file 'sub/v.bin', "
                                   "which the archive does not hold")


@pytest.mark.parametrize("command", ["inspect", "run"])
def test_an_unreadable_external_file_is_one_line(archive: Path, command: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _compress(archive, E1)
    code, _, err = verify(capsys, command, archive, *(["--iter", "1"] if command == "run" else []))
    assert code == 2
    assert only_line(err).startswith(f"error: {archive}: corrupt archive: external/1 "
                                     "('sub/v.bin') cannot be read: ")


def test_no_space_for_an_external_file_is_refused_before_writing(
        packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The free space is faked (a full file system cannot be had here); the refusal is real."""
    import os

    from verify.errors import OutputError

    class Full:
        f_bavail, f_frsize = 1, 4096

    monkeypatch.setattr(os, "statvfs", lambda path: Full())
    with ArchiveReader(packed) as reader, pytest.raises(OutputError) as e:
        reader.extract_external(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'w.bin'}: cannot write: No space left on device")
    assert not (tmp_path / "w.bin").exists()


SIZES = [0, 1, 4, 5, 6, 10, 11, 23]


def test_files_are_streamed_in_chunks_whole(packed: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy loop at its boundaries: sizes around multiples of the chunk (64 MiB, set to 5
    bytes here so that the boundaries are cheap), each written, checked and extracted whole."""
    monkeypatch.setattr(external_mod, "CHUNK", 5)
    src = tmp_path / "src"
    src.mkdir()
    files = []
    for n in SIZES:
        (src / f"f{n}").write_bytes(bytes(range(1, n + 1)))
        files.append(ExternalFile(f"f{n}", n, "", src / f"f{n}"))
    vtc = tmp_path / "sizes.vtc"
    write_archive(vtc, dataclasses.replace(read_archive(packed), external=tuple(files)))
    out = tmp_path / "out"
    with ArchiveReader(vtc) as reader:
        assert [(e.location, e.size, e.sha256) for e in reader.external] == [
            (f"f{n}", n, _sha(bytes(range(1, n + 1)))) for n in SIZES]
        reader.check_external()
        reader.extract_external(out)
    for n in SIZES:
        assert (out / f"f{n}").read_bytes() == bytes(range(1, n + 1))
    for n in SIZES[1:]:  # the last byte of each, past the last whole chunk, is checked too
        damaged = tmp_path / f"damaged{n}.vtc"
        shutil.copyfile(vtc, damaged)
        _flip_last_byte(damaged, f"{EXT}/{SIZES.index(n)}")
        with ArchiveReader(damaged) as reader, \
                pytest.raises(ArchiveError, match=f"'f{n}' does not"):
            reader.check_external()


def test_one_file_named_two_ways_is_stored_once(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A model whose tensors name one file as 'w.bin' and as './w.bin': pack stores it once
    (the reader refuses two files that land on one path), and every stage reads it."""
    (tmp_path / "w.bin").write_bytes(W.tobytes() + V.tobytes())
    v = _tensor("v", V, "./w.bin")
    v.external_data[1].value = str(W.nbytes)  # offset: v lies after w in the one file
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"]), helper.make_node("Mul", ["x", "v"], ["z"])],
        "g", [info("x", TensorProto.FLOAT, [4])],
        [info("y", TensorProto.FLOAT, [4]), info("z", TensorProto.FLOAT, [4])],
        [_tensor("w", W, "w.bin"), v])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    vtc = tmp_path / "m.vtc"
    code, _, err = verify(capsys, "pack", tmp_path / "m.onnx", "--keep-external-data",
                          "-d", "x:rand", "-o", vtc)
    assert code == 0, err
    assert read_archive(vtc).external == (
        ExternalFile("w.bin", 32, _sha(W.tobytes() + V.tobytes())),)
    code, out, err = verify(capsys, "run", vtc, "--iter", "1")
    assert code == 0, err
    assert out.rstrip().endswith("=== PASS: all outputs within tolerance in 1 case(s)")
    code, _, err = verify(capsys, "inspect", vtc)
    assert code == 0, err


def test_a_file_folders_deep_is_extracted_for_a_run_and_exported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A location two folders down (`sub/deeper/v.bin`): each folder on its way is made, in the
    run's scratch folder and beside the exported model; the run passes."""
    vtc = tmp_path / "m.vtc"
    code, _, err = verify(capsys, "pack", _model(tmp_path / "src", "sub/deeper/v.bin"),
                          "--keep-external-data", "-d", "x:rand", "-o", vtc)
    assert code == 0, err
    assert [f.location for f in read_archive(vtc).external] == ["w.bin", "sub/deeper/v.bin"]
    code, out, err = verify(capsys, "run", vtc, "--iter", "1")
    assert code == 0, err
    assert out.rstrip().endswith("=== PASS: all outputs within tolerance in 1 case(s)")
    target = tmp_path / "out"
    target.mkdir()
    code, _, err = verify(capsys, "export", vtc, "-o", target / "m.onnx")
    assert code == 0, err
    assert (target / "sub" / "deeper" / "v.bin").read_bytes() == V.tobytes()
    assert (target / "w.bin").read_bytes() == W.tobytes()
