"""The dump folder's life: made ready (a previous dump kept whole meanwhile), the tensor files
staged inside it, then swapped in with the manifest last (`commit_dump`), or the staged files
removed after a failure (`discard_dump`). The format itself is `dump`'s."""

from __future__ import annotations

import os
import re
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verify.dump import MANIFEST, is_tensor_file, write_manifest
from verify.errors import UsageError
from verify.files import output_errors

_STAGING = ".verify-staging-"  # + host, pid, random: a dump being written, inside its folder
_PART_RE = re.compile(r"\.(?:c\d+_t\d+\.npy|manifest\.json)\..+\.part")  # atomic writes


def _ours(name: str) -> bool:
    """A dump's own entry: its manifest, a tensor file, an atomic write's temporary file or a
    staging folder. Anything else (a user's .env or .gitignore included) is not ours."""
    return (name == MANIFEST or is_tensor_file(name)
            or _PART_RE.fullmatch(name) is not None or name.startswith(_STAGING))


def prepare_dir(path: Path, *, stage: bool = True) -> Path | None:
    """Make `path` ready to receive a dump and return the staging folder inside it that the
    tensor files go to (None without `stage`: a dump of stats only has no files). A previous dump in `path` stays whole until `commit_dump` replaces it,
    so a run that fails (a bad filter, an unreachable device, a full disk) loses nothing. A
    folder holding anything that is not a dump's is refused rather than mixed into; staging
    folders left by a killed run on this host are removed."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path}: exists and is not a folder; give a folder for the dump")
    path.mkdir(parents=True, exist_ok=True)
    entries = list(path.iterdir())
    foreign = [p.name for p in entries if not _ours(p.name)]
    if foreign:
        raise UsageError(f"{path}: folder is not empty and not a verify dump (holds "
                         f"{', '.join(sorted(foreign)[:3])}); give an empty or new folder")
    for p in entries:
        if p.name.startswith(_STAGING) and p.is_dir() and _abandoned(p.name):
            _remove_staging(p)
    if not stage:
        return None
    mine = f"{_STAGING}{_host()}-{os.getpid()}-"
    with output_errors(path):  # the folder named, not the staging folder inside it
        return Path(tempfile.mkdtemp(prefix=mine, dir=path))


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:64] or "host"


def _abandoned(name: str) -> bool:
    """A staging folder of this host whose process is gone (another host's is left alone)."""
    parts = name[len(_STAGING):].rsplit("-", 2)
    if os.name == "nt" or len(parts) != 3 or parts[0] != _host() or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def _remove_staging(staging: Path) -> None:
    """A staging folder and the dump files in it (nothing else is ever put there)."""
    for p in staging.iterdir() if staging.is_dir() else ():
        if p.is_file() and (is_tensor_file(p.name) or _PART_RE.fullmatch(p.name)):
            p.unlink(missing_ok=True)
    try:
        staging.rmdir()
    except OSError:  # something else is in it: leave it
        pass


def commit_dump(path: Path, staging: Path | None, manifest: Mapping[str, Any]) -> Path:
    """After a run that succeeded: the previous dump in `path` goes (its manifest first, so an
    interrupted swap reads as incomplete), the staged tensor files move in, and the manifest
    is written last, completing the folder."""
    path = Path(path)
    (path / MANIFEST).unlink(missing_ok=True)
    for p in path.iterdir():
        if p.is_file() and (is_tensor_file(p.name) or _PART_RE.fullmatch(p.name)):
            p.unlink()
    if staging is not None:
        for p in staging.iterdir():
            if is_tensor_file(p.name):
                os.replace(p, path / p.name)
        _remove_staging(staging)
    return write_manifest(path, manifest)


def discard_dump(path: Path, staging: Path | None, *, remove_dir: bool) -> None:
    """After a failed run: the staged files go, and the folder too when the run made it and
    nothing else is in it; a previous dump in it is left as it was."""
    if staging is not None:
        _remove_staging(staging)
    if remove_dir:
        try:
            Path(path).rmdir()
        except OSError:  # something else is in it now: leave it
            pass
