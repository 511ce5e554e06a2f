"""A model's weights in external data files: found and checked beside the model, streamed into
and out of an archive, never held whole in memory.

A model whose initializers are stored as external data (`location` files beside the .onnx) is
kept that way when its weights do not fit protobuf's 2 GiB limit for one message (or when
`pack --keep-external-data` asks): the archive then holds the small model proto and, beside it,
each external file as a byte dataset with its sha256 (`schema.EXTERNAL`). On a device the files
are pushed through the content-addressed cache and linked under their locations in one folder,
which onnxruntime is pointed at (`EXTERNAL_FOLDER_KEY`); on the host they are extracted into a
scratch folder for the sessions verify makes there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from verify.errors import ModelError

if TYPE_CHECKING:
    import h5py
    import onnx

# onnxruntime's session option: the folder external data is read from when the model is given
# as bytes or lies elsewhere (the runner's job key "external_data" names it).
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"
PROTO_LIMIT = 2**31 - 1  # protobuf's limit on one serialized message
CHUNK = 64 << 20  # bytes copied and hashed at a time


@dataclass(frozen=True)
class ExternalFile:
    """One external data file: the location the model names, its size and sha256, and where
    its bytes are on this host (None for one still inside an archive)."""

    location: str
    size: int
    sha256: str = ""
    path: Path | None = None


def external_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """The initializers (and tensor attributes, subgraphs included) stored as external data."""
    import onnx

    def walk(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else
                            list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []):
                    yield from walk(sub)

    for t in walk(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            yield t


def location_of(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def safe_location(location: str) -> bool:
    """A relative path inside the model's folder: no root, no '..', no backslash."""
    p = PurePosixPath(location)
    return bool(location) and not p.is_absolute() and ".." not in p.parts and "\\" not in location


def find_external(model: onnx.ModelProto, model_path: Path) -> tuple[ExternalFile, ...]:
    """The external data files `model` (read from `model_path`) refers to, each checked to lie
    beside it; ModelError naming the tensor otherwise."""
    files: dict[str, ExternalFile] = {}
    for t in external_tensors(model):
        location = location_of(t)
        if location and not safe_location(location):
            raise ModelError(f"{model_path}: initializer '{t.name}' points outside the model's "
                             f"folder ('{location}'); external data must lie beside the model")
        where = model_path.parent / location
        if not location or not where.is_file():
            raise ModelError(f"{model_path}: initializer '{t.name}' is stored in external file "
                             f"'{location}', which is not beside the model")
        key = same_file(location)  # one file named two ways ('w.bin', './w.bin') is stored once
        if key not in files:
            files[key] = ExternalFile(key, where.stat().st_size, "", where)
    return tuple(files.values())


def same_file(location: str) -> str:
    """`location` as the file system resolves it in one folder: 'a/./b' and 'a//b' are 'a/b'."""
    return str(PurePosixPath(location))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def check_locations(model: onnx.ModelProto, stored: Sequence[ExternalFile], where: str) -> None:
    """Every external reference of an archive's `model` names a file the archive holds."""
    have = {same_file(f.location) for f in stored}
    for t in external_tensors(model):
        if same_file(location_of(t)) not in have:
            raise ModelError(f"{where}: initializer '{t.name}' is stored in external file "
                             f"'{location_of(t)}', which the archive does not hold")


def inline_external(model: onnx.ModelProto, folder: Path, where: str) -> None:
    """Read `model`'s external data from `folder` into the model (for a piece small enough to
    be one message: a localize repro); ModelError when it is over protobuf's limit."""
    total = sum(int(next((e.value for e in t.external_data if e.key == "length"), "0") or 0)
                for t in external_tensors(model))
    if total + model.ByteSize() > PROTO_LIMIT:
        raise ModelError(f"{where}: its weights make {total / 2**30:.1f} GiB, over protobuf's "
                         "2 GiB limit for one model")
    from onnx.external_data_helper import load_external_data_for_model

    try:
        load_external_data_for_model(model, str(folder))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{where}: cannot read its external data: {exc}") from None


@dataclass(frozen=True)
class ExternalData:
    """A model's external data on this host: the folder its locations resolve in, and the
    files (each with its `path`)."""

    folder: Path
    files: tuple[ExternalFile, ...]


def write_dataset(group: h5py.Group, key: str, f: ExternalFile) -> str:
    """Stream `f`'s bytes into a new uint8 dataset `key` of `group`; return their sha256."""
    import numpy as np

    assert f.path is not None
    ds = group.create_dataset(key, shape=(f.size,), dtype=np.uint8)
    h = hashlib.sha256()
    done = 0
    with open(f.path, "rb") as fh:
        while done < f.size:
            block = fh.read(min(CHUNK, f.size - done))
            if not block:
                raise ModelError(f"{f.path}: external data file shrank while it was read")
            ds[done:done + len(block)] = np.frombuffer(block, np.uint8)
            h.update(block)
            done += len(block)
    return h.hexdigest()


def read_dataset(ds: h5py.Dataset, dest: Path) -> str:
    """Stream a uint8 dataset into the file `dest` (never whole in memory); its sha256."""
    import numpy as np

    h = hashlib.sha256()
    size = int(ds.shape[0])
    buf = np.empty(min(CHUNK, max(size, 1)), np.uint8)
    with open(dest, "wb") as out:
        for start in range(0, size, CHUNK):
            n = min(CHUNK, size - start)
            part = buf[:n]
            ds.read_direct(part, np.s_[start:start + n])
            h.update(part)
            out.write(memoryview(part))
    return h.hexdigest()
