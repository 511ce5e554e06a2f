"""Reading and rewriting a dump folder's tensors as a test (or a user with numpy) would: a
format-2 dump keeps a case's tensors as .npy images in one pack file, `c<case>.npys`, each at
its manifest entry's offset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def manifest(folder: Path) -> dict[str, Any]:
    return json.loads((Path(folder) / "manifest.json").read_text())


def write_manifest(folder: Path, m: dict[str, Any]) -> None:
    (Path(folder) / "manifest.json").write_text(json.dumps(m))


def get_tensor(folder: Path, t: dict[str, Any]) -> np.ndarray:
    """The values of manifest entry `t`, as any numpy reads them: seek, then np.load."""
    with open(Path(folder) / t["file"], "rb") as fh:
        fh.seek(t.get("offset") or 0)
        return np.load(fh, allow_pickle=False)


def put_tensor(folder: Path, m: dict[str, Any], t: dict[str, Any], value: np.ndarray, *,
               pickle: bool = False) -> int:
    """Append `value`'s .npy image to entry `t`'s pack and point `t` at it (the manifest `m`,
    holding `t`, rewritten; its dtype and shape left as they were); the new offset."""
    with open(Path(folder) / t["file"], "ab") as fh:
        end = fh.tell()
        fh.write(b"\0" * (-end % 64))
        t["offset"] = end + (-end % 64)
        np.save(fh, value, allow_pickle=pickle)
    write_manifest(folder, m)
    return int(t["offset"])


def to_format_1(folder: Path) -> None:
    """Rewrite a dump as format 1 wrote it: one c<case>_t<index>.npy per tensor, no offsets."""
    folder = Path(folder)
    m = manifest(folder)
    packs = set()
    for case in m["cases"]:
        for t in case["tensors"]:
            if t.get("file") is None:
                continue
            name = f"c{case.get('case', 0)}_t{t['index']:05d}.npy"
            np.save(folder / name, get_tensor(folder, t), allow_pickle=False)
            packs.add(t["file"])
            t["file"] = name
            t.pop("offset", None)
    for name in packs:
        (folder / name).unlink()
    m["format_version"] = 1
    write_manifest(folder, m)
