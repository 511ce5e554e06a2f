"""The archive reader refuses a checksummed archive that is not what pack wrote, at each level
of its structure, with the check that names the damage (holes found by mutation testing of
verify/testcase.py, docs/mutation.md: with any one of these checks dropped the damaged archive
was read, and a verdict given on an archive nobody wrote).

The archive checksum covers the metadata values and every dataset's path, name and digest; an
attribute or an entry added beside them, a record stored as another type, a digest that is not
one, are caught by the structural checks alone: each case below passes the checksum."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from fixtures_dump import pack
from helpers_archive import damage_chunk, set_record, to_format_1
from helpers_archive import refused_line as _refused
from helpers_cli import only_line, verify

from verify import schema
from verify.archive_reader import ArchiveReader, iter_layers, read_archive
from verify.errors import ArchiveError, ArchiveWarning
from verify.testcase import Case, write_archive

REPO = Path(__file__).resolve().parent.parent
TWO_IO = REPO / "goldens" / "models" / "two_io.onnx"  # inputs a, b; outputs sum_relu, prod


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """two_io, two cases, with per-layer references."""
    return pack(TWO_IO, tmp_path_factory.mktemp("reader") / "two.vtc", "--layers",
                "-d", "a:rand", "-d", "b:rand", "-d", "a:rand", "-d", "b:rand")


def _text(value: str) -> np.bytes_:
    return np.bytes_(value.encode())  # fixed-length text, as the writer stores attributes


def _rename_case(f: h5py.File) -> None:
    f.move(f"{schema.CASES}/1", f"{schema.CASES}/2")


def _same_name(f: h5py.File) -> None:
    outs = f[f"{schema.CASES}/0/{schema.OUTPUTS}"]
    outs["1"].attrs[schema.ATTR_NAME] = outs["0"].attrs[schema.ATTR_NAME]


def _float_model(f: h5py.File) -> None:
    sha = f[schema.MODEL].attrs[schema.ATTR_SHA256]
    data = f[schema.MODEL][()]
    del f[schema.MODEL]
    f.create_dataset(schema.MODEL, data=data.astype(np.float32)).attrs[schema.ATTR_SHA256] = sha


def _int_record(f: h5py.File) -> None:
    del f[schema.ATTR_TOLERANCES]
    f.create_dataset(schema.ATTR_TOLERANCES, data=np.int64(0))


def _array_record(f: h5py.File) -> None:
    text = f[schema.ATTR_TOLERANCES][()]
    del f[schema.ATTR_TOLERANCES]
    f.create_dataset(schema.ATTR_TOLERANCES, data=np.array([text, text]))


def _case_dataset(f: h5py.File) -> None:
    del f[f"{schema.CASES}/1"]
    f.create_dataset(f"{schema.CASES}/1", data=np.zeros(3, np.float32))


def _vlen_source(f: h5py.File) -> None:
    group = f[f"{schema.CASES}/0"]
    source = group.attrs[schema.ATTR_SOURCE]
    del group.attrs[schema.ATTR_SOURCE]
    group.attrs.create(schema.ATTR_SOURCE, source.decode(), dtype=h5py.string_dtype())


def _set_attr(where: str, key: str, value: object) -> Callable[[h5py.File], None]:
    def damage(f: h5py.File) -> None:
        f[where].attrs[key] = value
    return damage


def _delete(where: str) -> Callable[[h5py.File], None]:
    def damage(f: h5py.File) -> None:
        del f[where]
    return damage


def _delete_attr(where: str, key: str) -> Callable[[h5py.File], None]:
    def damage(f: h5py.File) -> None:
        del f[where].attrs[key]
    return damage


CASE0 = f"{schema.CASES}/0"
OUT0 = f"{CASE0}/{schema.OUTPUTS}/0"
DAMAGES: dict[str, tuple[Callable[[h5py.File], None], str]] = {
    # an attribute nobody wrote, at each level
    "root attribute": (_set_attr("/", "note", _text("x")), "/ carries unexpected attribute(s) ['note']"),
    "record attribute": (_set_attr(schema.ATTR_TOLERANCES, "note", _text("x")),
                         "/tolerances carries unexpected attribute(s) ['note']"),
    "model attribute": (_set_attr(schema.MODEL, "note", _text("x")),
                        "/model carries unexpected attribute(s) ['note']"),
    "cases attribute": (_set_attr(schema.CASES, "note", _text("x")),
                        "/cases carries unexpected attribute(s) ['note']"),
    "case attribute": (_set_attr(CASE0, "note", _text("x")),
                       "/cases/0 carries unexpected attribute(s) ['note']"),
    "kind attribute": (_set_attr(f"{CASE0}/{schema.INPUTS}", "note", _text("x")),
                       "/cases/0/inputs carries unexpected attribute(s) ['note']"),
    "tensor attribute": (_set_attr(OUT0, "note", _text("x")),
                         "/cases/0/outputs/0 carries unexpected attribute(s) ['note']"),
    # entries nobody wrote, or missing
    "root entry": (lambda f: f.create_group("notes"), "unexpected entries ['notes']"),
    "case entry": (lambda f: f.create_group(f"{CASE0}/notes"),
                   "case 0 does not hold inputs and outputs only"),
    "no outputs": (_delete(f"{CASE0}/{schema.OUTPUTS}"),
                   "case 0 does not hold inputs and outputs only"),
    "no inputs": (_delete(f"{CASE0}/{schema.INPUTS}"),
                  "case 0 does not hold inputs and outputs only"),
    "case as a dataset": (_case_dataset, "cases/1 is not a group"),
    "kind as a dataset": (lambda f: (f.__delitem__(f"{CASE0}/{schema.LAYERS}"),
                                     f.create_dataset(f"{CASE0}/{schema.LAYERS}", data=[1.0])),
                          "cases/0/layers is not a group"),
    "cases numbered 0, 2": (_rename_case, "cases is not numbered 0..1"),
    "tensors numbered 0, 01": (lambda f: f.move(f"{CASE0}/{schema.OUTPUTS}/1",
                                                f"{CASE0}/{schema.OUTPUTS}/01"),
                               "cases/0/outputs is not numbered 0..1"),
    # records and attributes of another type or form
    "record not text": (_int_record, "the tolerances record is missing or not text"),
    "record not a scalar": (_array_record, "the tolerances record is missing or not text"),
    "record missing": (_delete(schema.ATTR_PROVENANCE),
                       "the provenance record is missing or not text"),
    "variable-length source": (_vlen_source,
                               "attribute 'source' of /cases/0 is not fixed-length text"),
    "tensor without a name": (_delete_attr(OUT0, schema.ATTR_NAME),
                              "attribute 'name' of /cases/0/outputs/0 is missing or not str"),
    "model not bytes": (_float_model, "the model is not a byte array"),
    "model sha malformed": (_set_attr(schema.MODEL, schema.ATTR_SHA256, _text("abc")),
                            "the model's sha256 attribute is malformed"),
    "model sha empty": (_set_attr(schema.MODEL, schema.ATTR_SHA256, _text("")),
                        "the model has no sha256"),
    "tensor digest malformed": (_set_attr(OUT0, schema.ATTR_SHA256, _text("0" * 63 + "g")),
                                "cases/0/outputs/0 ('sum_relu') has a malformed digest"),
    "a name twice": (_same_name, "cases/0/outputs holds 'sum_relu' twice"),
    "no checksum": (_delete_attr("/", schema.ATTR_CHECKSUM),
                    "the archive checksum is missing or malformed"),
    "checksum malformed": (_set_attr("/", schema.ATTR_CHECKSUM, _text("f" * 63)),
                           "the archive checksum is missing or malformed"),
    # parts missing whole
    "no model": (_delete(schema.MODEL), "the model (model) is missing or not a dataset"),
    "no cases group": (_delete(schema.CASES), "no cases"),
    "case without a source": (_delete_attr(CASE0, schema.ATTR_SOURCE),
                              "its metadata or layout does not match the archive checksum "
                              "(re-pack it, or get an intact copy)"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_structure_is_refused_with_what_is_wrong(packed: Path, tmp_path: Path,
                                                           damage: str) -> None:
    edit, what = DAMAGES[damage]
    archive = tmp_path / "damaged.vtc"
    shutil.copyfile(packed, archive)
    with h5py.File(archive, "r+") as f:
        edit(f)
    with pytest.raises(ArchiveError) as e:
        read_archive(archive)
    assert str(e.value) == f"{archive}: corrupt archive: {what}"


def test_the_intact_archive_reads_back_what_pack_wrote(packed: Path) -> None:
    """The control for the damages above: the same archive, untouched, reads; and every part
    the reader hands on is the stored one."""
    tc = read_archive(packed)
    assert len(tc.cases) == 2 and tc.checked and tc.format_version == schema.FORMAT_VERSION
    assert tc.has_layers and tc.path == packed
    with h5py.File(packed, "r") as f:
        for c in range(2):
            for kind, got in ((schema.INPUTS, tc.cases[c].inputs),
                              (schema.OUTPUTS, tc.cases[c].outputs)):
                group = f[f"{schema.CASES}/{c}/{kind}"]
                stored = {group[k].attrs[schema.ATTR_NAME].decode(): group[k][()] for k in group}
                assert sorted(got) == sorted(stored)
                for name, value in stored.items():
                    assert got[name].dtype == value.dtype and np.array_equal(got[name], value)
    assert tc.cases[0].inputs["a"].tobytes() != tc.cases[1].inputs["a"].tobytes()
    layers = dict(iter_layers(packed, 1))
    assert set(tc.cases[1].outputs) <= set(layers)
    only = dict(iter_layers(packed, 1, names={"prod"}))
    assert list(only) == ["prod"] and np.array_equal(only["prod"], layers["prod"])
    for case in (-1, 2):
        with pytest.raises(ArchiveError, match=f"case {case} has no per-layer references"):
            list(iter_layers(packed, case))
    with ArchiveReader(packed) as reader:
        assert [e.name for e in reader.cases[0][schema.OUTPUTS]] == \
            [k for k in tc.cases[0].outputs]



def _copy(packed: Path, tmp_path: Path) -> Path:
    archive = tmp_path / "edited.vtc"
    shutil.copyfile(packed, archive)
    return archive


RECORDS = {schema.ATTR_PROVENANCE: ("provenance", "dict"),
           schema.ATTR_TOLERANCES: ("tolerances", "dict"),
           schema.ATTR_TENSOR_ORDER: ("tensor order", "list")}


@pytest.mark.parametrize("key", list(RECORDS))
def test_a_record_that_is_not_its_json_is_refused_by_name(packed: Path, tmp_path: Path,
                                                          key: str) -> None:
    """Each JSON record edited (and the archive re-sealed): text that is not JSON, and JSON of
    another type, each refused naming the record."""
    what, kind = RECORDS[key]
    archive = _copy(packed, tmp_path)
    set_record(archive, key, '{"atol": 0.1')
    assert _refused(archive) == f"the {what} record is not JSON"
    set_record(archive, key, '"a string"' if kind == "list" else "[1, 2]")
    assert _refused(archive) == f"the {what} record is not a JSON {kind}"


ENTRY3 = {"index": 3, "name": "sum_relu", "node": "sum/relu", "op": "Relu", "is_output": True}
# (the tensor order's entry 3 replaced by, the line after "corrupt archive: ")
BAD_ENTRIES: dict[str, tuple[object, str]] = {
    "index as text": ({**ENTRY3, "index": "3"},
                      "tensor order entry \"{'index': '3', 'name': 'sum_relu', 'node': "
                      "'sum/relu', 'op':\" is malformed"),
    "is_output as text": ({**ENTRY3, "is_output": "yes"},
                          "tensor order entry \"{'index': 3, 'name': 'sum_relu', 'node': "
                          "'sum/relu', 'op': '\" is malformed"),
    "no name": ({k: v for k, v in ENTRY3.items() if k != "name"},
                "tensor order entry \"{'index': 3, 'node': 'sum/relu', 'op': 'Relu', "
                "'is_output': \" is malformed"),
    "a list": ([3, "sum_relu"], "tensor order entry \"[3, 'sum_relu']\" is malformed"),
}


@pytest.mark.parametrize("bad", list(BAD_ENTRIES))
def test_a_malformed_tensor_order_entry_is_refused_and_shown(packed: Path, tmp_path: Path,
                                                             bad: str) -> None:
    """One entry of the tensor order (the layers' order localize and diff walk) edited and the
    archive re-sealed: refused, the entry shown (its first 60 characters)."""
    entry, what = BAD_ENTRIES[bad]
    archive = _copy(packed, tmp_path)
    with h5py.File(archive, "r") as f:
        order = json.loads(bytes(f[schema.ATTR_TENSOR_ORDER][()]))
    assert order[3] == ENTRY3  # the entry edited, as pack wrote it
    order[3] = entry
    set_record(archive, schema.ATTR_TENSOR_ORDER, json.dumps(order))
    assert _refused(archive) == what


def test_a_case_linked_to_a_missing_file_is_refused_as_a_link(
        packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A case that is an HDF5 external link into a file not beside the archive (an archive
    split by an HDF5 tool, copied without its parts): refused as a link, never followed (HDF5's
    own error for the missing file is not reached), exit 2, before any device. Links at every
    level, the archive re-sealed around them or not: tests/test_archive_links.py."""
    archive = _copy(packed, tmp_path)
    with h5py.File(archive, "r+") as f:
        del f[CASE0]
        f[CASE0] = h5py.ExternalLink("parts.h5", "/cases/0")
    line = (f"error: {archive}: corrupt archive: cases/0 is an external link to "
            "'parts.h5:/cases/0'; verify archives hold no links")
    for args in (("inspect", archive), ("run", archive, "--device", "ssh:nobody@127.0.0.1:1")):
        code, _, err = verify(capsys, *args)
        assert (code, only_line(err)) == (2, line), args


@pytest.mark.parametrize(("where", "what"), [
    (schema.MODEL, "model cannot be read: "),
    (f"{CASE0}/{schema.INPUTS}/0", "cases/0/inputs/0 ('a') cannot be read: "),
    (f"{CASE0}/{schema.LAYERS}/2", "cases/0/layers/2 ('sum/add:0') cannot be read: ")])
def test_a_part_hdf5_cannot_read_back_is_one_line_naming_it(
        packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str,
        what: str) -> None:
    """The model, an input, a layer reference stored compressed with a byte of the chunk
    damaged (the archive checksum does not cover storage): the open succeeds, the read fails,
    one line naming the part."""
    archive = _copy(packed, tmp_path)
    damage_chunk(archive, where)
    code, _, err = verify(capsys, "inspect", archive)
    assert code == 2
    assert only_line(err).startswith(f"error: {archive}: corrupt archive: {what}")


def test_iter_layers_streams_case_0_unless_told(packed: Path) -> None:
    default, first, second = (dict(iter_layers(packed, *case)) for case in ((), (0,), (1,)))
    assert list(default) == list(first) == list(second)
    assert all(np.array_equal(default[name], first[name]) for name in first)
    assert not np.array_equal(first["sum_relu"], second["sum_relu"])  # the cases differ


def test_read_fills_the_buffer_it_is_given(packed: Path, tmp_path: Path) -> None:
    """`read(entry, out)` reads into `out` (diff's one scratch buffer for every tensor), for
    tensors of one element, of none and of many."""
    stored = {"one": np.array([2.5], np.float32), "scalar": np.array(7, np.int64),
              "empty": np.zeros((0, 3), np.float32),
              "many": np.arange(12, dtype=np.float64).reshape(3, 4)}
    archive = tmp_path / "sizes.vtc"
    tc = read_archive(packed)
    write_archive(archive, dataclasses.replace(
        tc, cases=(Case(inputs=stored, outputs=dict(tc.cases[0].outputs), source="sizes"),)))
    with ArchiveReader(archive) as reader:
        for entry in reader.cases[0][schema.INPUTS]:
            want = stored[entry.name]
            out = np.full(want.shape, 99, want.dtype)
            got = reader.read(entry, out)
            assert got.dtype == want.dtype and np.array_equal(got, want), entry.name
            assert np.array_equal(out, want), entry.name


def test_format_1_without_case_sources_reads_them_as_empty(packed: Path, tmp_path: Path) -> None:
    """Format 1's reader took a case's source as optional (empty when absent); so does this
    one, for format 1 (format 2 covers it by the checksum: "case without a source" above)."""
    archive = _copy(packed, tmp_path)
    to_format_1(archive)
    with pytest.warns(ArchiveWarning):
        sources = [c.source for c in read_archive(archive).cases]
    assert sources == ["a:rand; b:rand; a:rand; b:rand"] * 2
    with h5py.File(archive, "r+") as f:
        for i in range(2):
            del f[schema.case_path(i)].attrs[schema.ATTR_SOURCE]
    with pytest.warns(ArchiveWarning):
        tc = read_archive(archive)
    assert [c.source for c in tc.cases] == ["", ""] and not tc.checked


def test_format_1_carrying_a_checksum_is_refused(packed: Path, tmp_path: Path) -> None:
    """A format-1 layout with an archive checksum: no verify wrote it (format 1 had none),
    and turning the version down must not switch the checks off."""
    archive = _copy(packed, tmp_path)
    to_format_1(archive, keep_checksum=True)
    assert _refused(archive) == "format version 1 but carries checksums"


def test_localize_warns_once_of_a_format_1_archive_it_opens_twice(
        packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """localize opens the archive for its cases and again for the layer references: one
    warning, as Python's default filter shows a warning once per place it is raised from."""
    archive = _copy(packed, tmp_path)
    to_format_1(archive)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")  # a plain `python`'s action for a UserWarning
        code, out, err = verify(capsys, "localize", archive)
    assert code == 0, err
    assert [str(w.message) for w in shown] == [
        f"{archive}: archive format 1 has no checksums, so damage to it cannot be detected; "
        "re-pack it with this verify"]


@pytest.mark.parametrize("part", [schema.case_path(0), f"{schema.case_path(1)}/{schema.OUTPUTS}"])
def test_an_object_header_hdf5_cannot_read_is_one_line_naming_the_error(
        capsys: pytest.CaptureFixture[str], packed: Path, tmp_path: Path, part: str) -> None:
    """A byte of the archive's HDF5 metadata damaged (the version byte of a group's object
    header: what a bit flip in storage or a bad copy does) makes HDF5 itself fail to open the
    group while the layout is read. One line, exit 2, naming HDF5's own error (its class and
    text), before any tensor is read: `verify run` never reaches its device."""
    with h5py.File(packed, "r") as f:
        addr = h5py.h5o.get_info(f[part].id).addr
    data = bytearray(packed.read_bytes())
    data[addr] ^= 0xFF
    archive = tmp_path / "header.vtc"
    archive.write_bytes(bytes(data))
    for args in (("inspect", archive), ("run", archive, "--device", "ssh:nobody@127.0.0.1:1")):
        code, _, err = verify(capsys, *args)
        line = only_line(err)
        assert code == 2, (args, err)
        assert line.startswith(f"error: {archive}: corrupt archive: KeyError: "), line
        assert "bad object header version number" in line, line
