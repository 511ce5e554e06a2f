"""An archive whose tree holds an HDF5 soft or external link is refused, the link named and never
followed (verify/archive_file.py `_names`): h5py follows both transparently, so an archive edited
with h5py could make verify read another file by a path the archive names (an external link), or
read one part of the archive as another (a soft link). verify's writer never writes either. The
same holds one level down, for a dataset whose bytes HDF5 reads from another file (external
storage, a virtual dataset): refused by name and file (`_own_data`).

Each case is an archive `verify pack` wrote, edited with h5py, read by `verify inspect` and by
`verify run` (whose device, if ever reached, refuses the connection: exit 3): exit 2 and one line.
Each link is made so that, followed, it would read as an intact archive: an external link into a
byte-identical copy of the archive (its checksum still matches), a soft link with the archive
re-sealed through it. Without the check these archives are read, and run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import pytest
from h5py import h5d, h5g, h5p, h5s, h5t
from fixtures_dump import pack
from helpers_archive import reseal
from helpers_cli import only_line, verify

from verify import schema

REPO = Path(__file__).resolve().parent.parent
TWO_IO = REPO / "goldens" / "models" / "two_io.onnx"  # inputs a, b; outputs sum_relu, prod
NOWHERE = "ssh:nobody@127.0.0.1:1"  # connection refused at once: exit 3 if ever reached
NO_LINKS = "verify archives hold no links"

Edit = Callable[[h5py.File, Path], None]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """two_io, two cases, with per-layer references."""
    return pack(TWO_IO, tmp_path_factory.mktemp("links") / "two.vtc", "--layers",
                "-d", "a:rand", "-d", "b:rand", "-d", "a:rand", "-d", "b:rand")


def _external(where: str) -> Edit:
    """`where` replaced by an external link to the same path in `copy`, a byte-identical copy
    of the archive, by its absolute path."""
    def edit(f: h5py.File, copy: Path) -> None:
        del f[where]
        f[where] = h5py.ExternalLink(str(copy), f"/{where}")
    return edit


def _soft(where: str, target: str) -> Edit:
    def edit(f: h5py.File, copy: Path) -> None:
        del f[where]
        f[where] = h5py.SoftLink(target)
    return edit


CASE0, CASE1 = schema.case_path(0), schema.case_path(1)
# the link, at each level of the tree the reader walks -> (re-seal after it, what it points to)
LINKS: dict[str, tuple[Edit, bool]] = {
    # the root: a record, the model
    schema.ATTR_TOLERANCES: (_external(schema.ATTR_TOLERANCES), False),
    schema.MODEL: (_external(schema.MODEL), False),
    # the cases group, a case, a kind, a tensor
    CASE0: (_external(CASE0), False),
    CASE1: (_soft(CASE1, f"/{CASE0}"), True),
    f"{CASE1}/{schema.INPUTS}": (_soft(f"{CASE1}/{schema.INPUTS}", f"/{CASE0}/{schema.INPUTS}"),
                                 True),
    f"{CASE0}/{schema.LAYERS}/2": (_external(f"{CASE0}/{schema.LAYERS}/2"), False),
}


def _linked(packed: Path, tmp_path: Path, link: str) -> tuple[Path, str]:
    """A copy of `packed` with the link `link` made (and re-sealed where its case says so),
    and the target the refusal names."""
    archive, copy = tmp_path / "linked.vtc", tmp_path / "copy.vtc"
    shutil.copyfile(packed, archive)
    shutil.copyfile(packed, copy)
    edit, sealed = LINKS[link]
    with h5py.File(archive, "r+") as f:
        edit(f, copy)
        target = f.get(link, getlink=True)
    if sealed:
        reseal(archive)
    if isinstance(target, h5py.ExternalLink):
        return archive, f"an external link to '{copy}:/{link}'"
    return archive, f"a soft link to '{target.path}'"


def _refused(capsys: pytest.CaptureFixture[str], archive: Path, line: str) -> None:
    for args in (("inspect", archive), ("run", archive, "--device", NOWHERE)):
        code, _, err = verify(capsys, *args)
        assert (code, only_line(err)) == (2, line), args


@pytest.mark.parametrize("link", list(LINKS))
def test_a_link_is_refused_by_name_and_target(capsys: pytest.CaptureFixture[str], packed: Path,
                                              tmp_path: Path, link: str) -> None:
    archive, target = _linked(packed, tmp_path, link)
    _refused(capsys, archive,
             f"error: {archive}: corrupt archive: {link} is {target}; {NO_LINKS}")


@pytest.mark.parametrize("link", [CASE1, f"{CASE1}/{schema.INPUTS}"])
def test_what_a_soft_link_reads_copied_in_its_place_is_read(
        capsys: pytest.CaptureFixture[str], packed: Path, tmp_path: Path, link: str) -> None:
    """The control for the soft links above: the archive with a copy of the link's target in
    its place (what following the link reads), re-sealed, inspects clean, exit 0; so the link
    check alone refuses the linked one. (The external links' control is `packed` itself: the
    file they point into is a byte-identical copy of it.)"""
    archive = tmp_path / "copied.vtc"
    shutil.copyfile(packed, archive)
    with h5py.File(archive, "r+") as f:
        del f[link]
        f.copy(f[link.replace(CASE1, CASE0)], link)  # with its attributes (a case's source)
    reseal(archive)
    code, out, err = verify(capsys, "inspect", archive)
    assert code == 0, err
    assert "integrity: verified" in out


def test_an_unsealed_soft_link_is_refused_as_a_link(capsys: pytest.CaptureFixture[str],
                                                    packed: Path, tmp_path: Path) -> None:
    """A soft link made and the archive not re-sealed: the archive checksum no longer matches
    what the link reads, but the link is found first (the names are listed before the checksum
    is computed), so the line names the link rather than a checksum mismatch."""
    archive = tmp_path / "unsealed.vtc"
    shutil.copyfile(packed, archive)
    with h5py.File(archive, "r+") as f:
        _soft(CASE1, f"/{CASE0}")(f, archive)
    _refused(capsys, archive, f"error: {archive}: corrupt archive: {CASE1} is a soft link to "
                              f"'/{CASE0}'; {NO_LINKS}")


def test_a_link_nobody_can_print_is_named_on_one_line(capsys: pytest.CaptureFixture[str],
                                                      packed: Path, tmp_path: Path) -> None:
    """A link whose name and target hold a line break (an entry the reader would refuse as
    unexpected anyway): still one line, the name and the target quoted, the target cut at 100
    characters."""
    archive = tmp_path / "odd.vtc"
    shutil.copyfile(packed, archive)
    target = "/x\n" + "y" * 200
    with h5py.File(archive, "r+") as f:
        f["a\nb"] = h5py.SoftLink(target)
    _refused(capsys, archive, f"error: {archive}: corrupt archive: 'a\\nb' is a soft link to "
                              f"{target[:100]!r}; {NO_LINKS}")


def test_a_case_stored_under_two_names_reads_as_two_copies(capsys: pytest.CaptureFixture[str],
                                                           packed: Path, tmp_path: Path) -> None:
    """A hard link (one object, two names: how HDF5 names every object) is not refused: case 1
    made case 0 under a second name, re-sealed, reads as two equal cases, each checked."""
    archive = tmp_path / "hard.vtc"
    shutil.copyfile(packed, archive)
    with h5py.File(archive, "r+") as f:
        del f[CASE1]
        f[CASE1] = f[CASE0]
        assert isinstance(f.get(CASE1, getlink=True), h5py.HardLink)
    reseal(archive)
    code, out, err = verify(capsys, "inspect", archive)
    assert code == 0, err
    assert "integrity: verified" in out


def _kept_in(where: str, how: str) -> Edit:
    """`where` stored again with its bytes outside the archive, its attributes kept: in an
    external raw-data file holding exactly its bytes ("external"), or as a virtual dataset
    mapping the same dataset of `copy` ("virtual"). Followed, either reads the stored bytes, so
    its digest and the archive checksum still match."""
    def edit(f: h5py.File, copy: Path) -> None:
        ds = f[where]
        attrs, data = dict(ds.attrs), ds[()]
        del f[where]
        if how == "external":  # through the library's own calls: h5py's create_dataset
            raw = copy.with_name("raw.bin")  # drops `external` for a scalar (a record)
            raw.write_bytes(data.tobytes())
            dcpl = h5p.create(h5p.DATASET_CREATE)
            dcpl.set_external(str(raw).encode(), 0, data.nbytes)
            space = h5s.create_simple(data.shape) if data.shape else h5s.create(h5s.SCALAR)
            new = h5py.Dataset(h5d.create(f.id, where.encode(), h5t.py_create(data.dtype),
                                          space, dcpl=dcpl))
        else:
            layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
            layout[...] = h5py.VirtualSource(str(copy), where, shape=data.shape)
            new = f.create_virtual_dataset(where, layout)
        new.attrs.update(attrs)
    return edit


# a dataset of each kind the reader reads, its bytes kept elsewhere -> how
ELSEWHERE = {schema.MODEL: "external", schema.ATTR_PROVENANCE: "external",
             f"{CASE0}/{schema.INPUTS}/0": "external", f"{CASE1}/{schema.OUTPUTS}/1": "virtual",
             f"{CASE0}/{schema.LAYERS}/2": "virtual"}


@pytest.mark.parametrize("where", list(ELSEWHERE))
def test_a_dataset_whose_bytes_are_in_another_file_is_refused(
        capsys: pytest.CaptureFixture[str], packed: Path, tmp_path: Path, where: str) -> None:
    """HDF5's external storage and virtual datasets are links at the level of the bytes: a
    dataset read from a file the archive names. Refused by name and file, when the archive is
    opened, before any tensor is read."""
    archive, copy = tmp_path / "elsewhere.vtc", tmp_path / "copy.vtc"
    shutil.copyfile(packed, archive)
    shutil.copyfile(packed, copy)
    how = ELSEWHERE[where]
    with h5py.File(archive, "r+") as f:
        _kept_in(where, how)(f, copy)
        with h5py.File(packed, "r") as intact:  # followed, the bytes pack wrote
            assert f[where][()].tobytes() == intact[where][()].tobytes()
    named = {schema.MODEL: "the model", schema.ATTR_PROVENANCE: "the provenance record"}.get(
        where, where)
    what = (f"keeps its data in the external file '{tmp_path / 'raw.bin'}'" if how == "external"
            else f"is a virtual dataset, its data mapped from ['{copy}']")
    _refused(capsys, archive, f"error: {archive}: corrupt archive: {named} {what}; verify "
                              "archives hold their own data")


def test_names_past_100_characters_or_not_utf8_are_cut_and_escaped(
        capsys: pytest.CaptureFixture[str], packed: Path, tmp_path: Path) -> None:
    """What the refusals show of a name the archive carries: a name that is not UTF-8 escaped
    (never a UnicodeDecodeError), a file name cut at 100 characters, on one line. An entry at
    the root whose name is not UTF-8 (re-sealed) is an unexpected entry shown escaped; a tensor
    kept in a raw-data file whose name is not UTF-8 and 140 characters long, and a layer mapped
    from a file of such a name, show its first 100 characters."""
    archive = tmp_path / "odd.vtc"
    shutil.copyfile(packed, archive)
    with h5py.File(archive, "r+") as f:
        h5g.create(f.id, b"\xffq")
    reseal(archive)
    _refused(capsys, archive, f"error: {archive}: corrupt archive: unexpected entries "
                              "['\\\\xffq']")

    long_name = os.fsencode(tmp_path) + b"/\xff" + b"r" * 140 + b".bin"
    shown = long_name.decode("utf-8", "backslashreplace")
    assert len(shown) > 100
    where = f"{CASE0}/{schema.INPUTS}/0"
    shutil.copyfile(packed, archive)
    with h5py.File(archive, "r+") as f:
        data = f[where][()]
        attrs = dict(f[where].attrs)
        Path(os.fsdecode(long_name)).write_bytes(data.tobytes())
        del f[where]
        dcpl = h5p.create(h5p.DATASET_CREATE)
        dcpl.set_external(long_name, 0, data.nbytes)
        new = h5py.Dataset(h5d.create(f.id, where.encode(), h5t.py_create(data.dtype),
                                      h5s.create_simple(data.shape), dcpl=dcpl))
        new.attrs.update(attrs)
    _refused(capsys, archive, f"error: {archive}: corrupt archive: {where} keeps its data in "
                              f"the external file {shown[:100]!r}; verify archives hold their "
                              "own data")

    copy = tmp_path / ("c" * 120 + ".vtc")
    shutil.copyfile(packed, copy)
    where = f"{CASE0}/{schema.LAYERS}/2"
    shutil.copyfile(packed, archive)
    with h5py.File(archive, "r+") as f:
        _kept_in(where, "virtual")(f, copy)
    mapped = str([str(copy)])
    assert len(mapped) > 100
    _refused(capsys, archive, f"error: {archive}: corrupt archive: {where} is a virtual "
                              f"dataset, its data mapped from {mapped[:100]}; verify archives "
                              "hold their own data")
