"""The gate an archive passes before anything in it is read, and the typed access to its parts
(verify/archive_file.py): what a user sees for a file that is not an archive, an archive from a
newer verify, a label or a part damaged the way a truncated download, another HDF5 tool or a
hand edit damages it, and a part at or just over the size limit. Each case is a file `verify
pack` wrote, then damaged, read by `verify inspect` or `verify run`: exit 2 and the one line
naming the damage. Holes found by mutation testing of archive_file.py (docs/mutation.md): no
test in the reader's selection reached these decisions, or none read the line they give."""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from fixtures_dump import pack
from helpers_archive import reseal
from helpers_cli import only_line, verify
from onnx import TensorProto, helper

from verify import __version__, schema

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "goldens" / "models"
NOWHERE = "ssh:nobody@127.0.0.1:1"  # connection refused at once: exit 3 if ever reached
IN0 = f"{schema.CASES}/0/{schema.INPUTS}/0"

Edit = Callable[[h5py.File], None]


@pytest.fixture(scope="module")
def two_io(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """two_io.onnx packed: its model (1497 bytes) is its largest part."""
    return pack(MODELS / "two_io.onnx", tmp_path_factory.mktemp("afile") / "two.vtc")


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-node model (y = x, one float) packed: its provenance record (some 400 bytes of
    JSON) is its largest part, larger than the model and every tensor."""
    info = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [info("x", TensorProto.FLOAT, [1])],
                              [info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return pack(model.SerializeToString(), tmp_path_factory.mktemp("afile") / "id.vtc")


def damaged(src: Path, dest: Path, edit: Edit) -> Path:
    shutil.copyfile(src, dest)
    with h5py.File(dest, "r+") as f:
        edit(f)
    return dest


def _replace(where: str, **dataset: object) -> Edit:
    """The dataset at `where` replaced, its attributes (name, digest) kept: the archive
    checksum, which covers those, still matches."""
    def edit(f: h5py.File) -> None:
        attrs = dict(f[where].attrs)
        del f[where]
        f.create_dataset(where, **dataset).attrs.update(attrs)
    return edit


def _set_attr(where: str, key: str, value: object) -> Edit:
    def edit(f: h5py.File) -> None:
        f[where].attrs[key] = value
    return edit


def _vlen_attr(key: str, value: str) -> Edit:
    def edit(f: h5py.File) -> None:
        del f.attrs[key]
        f.attrs.create(key, value, dtype=h5py.string_dtype())
    return edit


def _delete_attr(key: str) -> Edit:
    def edit(f: h5py.File) -> None:
        del f.attrs[key]
    return edit


def _both(*edits: Edit) -> Edit:
    def edit(f: h5py.File) -> None:
        for e in edits:
            e(f)
    return edit


# --- the gate: is it an archive at all, in a version this verify reads ----------------------

@pytest.mark.parametrize("name", ["my model.onnx", "MODEL.ONNX", "cut.vtc", "cut.onnx.vtc",
                                  "model saved as.vtc"])
def test_a_file_that_is_not_hdf5_is_named_for_what_it_is(
        capsys: pytest.CaptureFixture[str], two_io: Path, tmp_path: Path, name: str) -> None:
    """A model given where an archive is expected (any case of `.onnx`, or any name when its
    bytes begin as a model's) is told to pack it first; anything else that is not HDF5 (a
    truncated download) is not an archive."""
    path = tmp_path / name
    if name.lower().endswith(".onnx") or name.startswith("model"):
        path.write_bytes((MODELS / "two_io.onnx").read_bytes())
        named = name.lower().endswith(".onnx")
        vtc = path.with_suffix(".vtc") if named else path.with_name(path.stem + ".packed.vtc")
        line = (f"error: {path}: an ONNX model, not a testcase archive; pack it first (verify "
                f"pack {shlex.quote(str(path))}{'' if named else f' -o {shlex.quote(str(vtc))}'}"
                f" writes {shlex.quote(str(vtc))}) and give that")
    else:
        path.write_bytes(two_io.read_bytes()[: two_io.stat().st_size // 2])
        line = f"error: {path}: not a verify testcase archive (not HDF5, or truncated/corrupt)"
    code, _, err = verify(capsys, "run", path, "--device", NOWHERE)
    assert (code, only_line(err)) == (2, line)


NEWER = schema.NEWEST_VERSION + 1
# how the newer archive's verify_version is stored -> how the line names it
WRITTEN_BY: dict[str, tuple[Edit, str]] = {
    "fixed-length text, as pack writes it": (
        _set_attr("/", schema.ATTR_VERIFY_VERSION, np.bytes_(b"9.1.0")), "9.1.0"),
    "variable-length text, as h5py writes a str": (
        _vlen_attr(schema.ATTR_VERIFY_VERSION, "9.2.0"), "9.2.0"),
    "not UTF-8": (_set_attr("/", schema.ATTR_VERIFY_VERSION, np.bytes_(b"9.3\xff")), "9.3\ufffd"),
    "an integer": (_set_attr("/", schema.ATTR_VERIFY_VERSION, np.int64(9)), "?"),
    "missing": (_delete_attr(schema.ATTR_VERIFY_VERSION), "?"),
    "too long": (_set_attr("/", schema.ATTR_VERIFY_VERSION, np.bytes_(b"9" * 100)), "9" * 40),
}


@pytest.mark.parametrize("stored", list(WRITTEN_BY))
def test_an_archive_from_a_newer_format_says_which_verify_wrote_it(
        capsys: pytest.CaptureFixture[str], two_io: Path, tmp_path: Path, stored: str) -> None:
    edit, written_by = WRITTEN_BY[stored]
    newer = damaged(two_io, tmp_path / "newer.vtc",
                    _both(_set_attr("/", schema.ATTR_VERSION, np.int64(NEWER)), edit))
    code, _, err = verify(capsys, "inspect", newer)
    assert (code, only_line(err)) == (
        2, f"error: {newer}: written in archive format version {NEWER} by verify {written_by}; "
           f"this verify {__version__} reads up to version {schema.NEWEST_VERSION}: upgrade verify")


LABELS: dict[str, Edit] = {
    # format 2 writes the label as fixed-length text: a variable-length one is not followed
    # into the global heap (where a damaged file can make the HDF5 library loop forever)
    "variable-length label in a format-2 file": _vlen_attr(schema.ATTR_FORMAT,
                                                          schema.FORMAT_NAME),
    "label not UTF-8": _set_attr("/", schema.ATTR_FORMAT,
                                 np.bytes_(schema.FORMAT_NAME.encode() + b"\xff")),
    # format 1's label is variable-length text; another tool's opaque blob is not a label
    "opaque label in a format-1 file": _both(
        _set_attr("/", schema.ATTR_VERSION, np.int64(schema.UNCHECKED_VERSION)),
        _set_attr("/", schema.ATTR_FORMAT, np.void(schema.FORMAT_NAME.encode()))),
}


@pytest.mark.parametrize("label", list(LABELS))
def test_an_hdf5_file_whose_label_is_not_the_archives_is_not_an_archive(
        capsys: pytest.CaptureFixture[str], two_io: Path, tmp_path: Path, label: str) -> None:
    other = damaged(two_io, tmp_path / "other.vtc", LABELS[label])
    code, _, err = verify(capsys, "inspect", other)
    assert (code, only_line(err)) == (
        2, f"error: {other}: an HDF5 file, but not a verify testcase archive")


# --- typed access to the parts ------------------------------------------------------------

def _not_json(f: h5py.File) -> None:
    del f[schema.ATTR_TOLERANCES]
    f[schema.ATTR_TOLERANCES] = np.bytes_(b'{"atol": 1e-3,')  # a hand edit cut short


def _json_list(f: h5py.File) -> None:
    del f[schema.ATTR_TOLERANCES]
    f[schema.ATTR_TOLERANCES] = np.bytes_(b'[]')


# (edit, re-seal the archive checksum after it, the line after "error: PATH: ")
PARTS: dict[str, tuple[Edit, bool, str]] = {
    "model missing": (lambda f: f.__delitem__(schema.MODEL), False,
                      "corrupt archive: the model (model) is missing or not a dataset"),
    "input as a group": (lambda f: (f.__delitem__(IN0), f.create_group(IN0)), False,
                         f"corrupt archive: {IN0} is missing or not a dataset"),
    # another tool writing a tensor as text: fixed-length strings hold no object references,
    # so only the kind check refuses them
    "input as text": (_replace(IN0, data=np.array([b"0.5", b"0.25"])), False,
                      f"corrupt archive: {IN0} is not a numeric array"),
    "source not UTF-8": (_set_attr(f"{schema.CASES}/0", schema.ATTR_SOURCE,
                                   np.bytes_(b"rand \xff")), False,
                         "corrupt archive: attribute 'source' of /cases/0 is not UTF-8 text"),
    "record not UTF-8": (_replace(schema.ATTR_TOLERANCES, data=np.bytes_(b'{"\xff": 1}')),
                         False, "corrupt archive: the tolerances record is not UTF-8 text"),
    "record not JSON": (_not_json, True, "corrupt archive: the tolerances record is not JSON"),
    "record of another JSON type": (_json_list, True,
                                    "corrupt archive: the tolerances record is not a JSON dict"),
    # a small file declaring 2**64 floats (chunked, nothing allocated): the element count in
    # 64-bit integers would wrap to 0 and pass the limit, then the read fail
    "2**64 elements declared": (
        _replace(IN0, shape=(2**32, 2**32), dtype=np.float32, chunks=(1, 1024)), False,
        f"{IN0} declares 7.037e+13 MB, over the 2048 MB limit (raise it with verify "
        "--max-tensor-mb N or $VERIFY_MAX_TENSOR_MB)"),
}


@pytest.mark.parametrize("part", list(PARTS))
def test_a_damaged_part_is_one_line_naming_it(capsys: pytest.CaptureFixture[str], two_io: Path,
                                              tmp_path: Path, part: str) -> None:
    edit, sealed, what = PARTS[part]
    bad = damaged(two_io, tmp_path / "bad.vtc", edit)
    if sealed:
        reseal(bad)
    for args in (("inspect", bad), ("run", bad, "--device", NOWHERE)):
        code, _, err = verify(capsys, *args)
        assert (code, only_line(err)) == (2, f"error: {bad}: {what}"), args


# --- the size limit is inclusive, for datasets and records alike -----------------------------

def _largest(path: Path) -> tuple[str, int]:
    """The largest part of an archive, by its declared size: (path, bytes)."""
    sizes: dict[str, int] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: sizes.__setitem__(name, obj.size * obj.dtype.itemsize)
                     if isinstance(obj, h5py.Dataset) else None)
    name = max(sizes, key=sizes.__getitem__)
    assert sorted(sizes.values())[-2] < sizes[name]  # one part is the largest, alone
    return name, sizes[name]


@pytest.mark.parametrize("archive, part", [("two_io", schema.MODEL),
                                           ("identity", schema.ATTR_PROVENANCE)])
def test_a_part_of_exactly_the_limit_is_read_and_one_byte_over_is_refused(
        capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, archive: str,
        part: str) -> None:
    """`--max-tensor-mb` at the archive's largest part, to the byte: the archive reads; one
    byte under it, the part is refused by name before it is read, in the same words for a
    record as for a dataset: how to raise the limit."""
    path: Path = request.getfixturevalue(archive)
    name, size = _largest(path)
    assert name == part
    code, _, err = verify(capsys, "--max-tensor-mb", size / 2**20, "inspect", path)
    assert code == 0, err
    code, _, err = verify(capsys, "--max-tensor-mb", (size - 1) / 2**20, "inspect", path)
    what = "the model" if part == schema.MODEL else f"the {part} record"
    assert (code, only_line(err)) == (
        2, f"error: {path}: {what} declares {size / 2**20:.4g} MB, over the "
           f"{(size - 1) / 2**20:.4g} MB limit (raise it with verify --max-tensor-mb N or "
           "$VERIFY_MAX_TENSOR_MB)")
