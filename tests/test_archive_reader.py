"""The archive reader refuses a checksummed archive that is not what pack wrote, at each level
of its structure, with the check that names the damage (holes found by mutation testing of
verify/testcase.py, docs/mutation.md: with any one of these checks dropped the damaged archive
was read, and a verdict given on an archive nobody wrote).

The archive checksum covers the metadata values and every dataset's path, name and digest; an
attribute or an entry added beside them, a record stored as another type, a digest that is not
one, are caught by the structural checks alone: each case below passes the checksum."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from fixtures_dump import pack

from verify import schema
from verify.archive_reader import ArchiveReader, iter_layers, read_archive
from verify.errors import ArchiveError

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
