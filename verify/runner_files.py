"""The Python runner as a device receives it: runner.py and contract.py in one zip application.

The device runs `python BASE/cache/<sha256>.pyz JOB.json`: Python runs the archive's
`__main__.py` (runner.py) with the archive first on its import path, so runner.py finds
contract.py beside it, as it does when run from the source tree. One file keeps the push one
content-addressed transfer (sent once per device and version, like before) and the two halves of
a version together. The archive is built byte for byte the same from the same sources (fixed
member order and timestamps, stored uncompressed), so its hash, and the cache entry, stay put.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path

from verify.devices import verify_cache_dir

RUNNER_DIR = Path(__file__).resolve().parent / "runner"
RUNNER_SOURCE = RUNNER_DIR / "runner.py"
CONTRACT_SOURCE = RUNNER_DIR / "contract.py"
# archive member -> source: what the device's Python imports from the archive
MEMBERS = (("__main__.py", RUNNER_SOURCE), ("contract.py", CONTRACT_SOURCE))
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest timestamp: the same bytes on every build


def runner_bundle() -> bytes:
    """The zip application's bytes, built from the sources as they are now."""
    return _bundle(tuple((name, src.read_bytes()) for name, src in MEMBERS))


@lru_cache(maxsize=4)
def _bundle(members: tuple[tuple[str, bytes], ...]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return buf.getvalue()


def runner_file() -> Path:
    """The zip application as a file to push (`Driver.push_cached`), named by its sha256 in
    the user's cache (verify/runner/), written atomically the first time; a file there whose
    bytes differ (damaged, or planted) is replaced, never pushed."""
    data = runner_bundle()
    folder = verify_cache_dir() / "runner"
    path = folder / f"{hashlib.sha256(data).hexdigest()}.pyz"
    try:
        if path.is_file() and path.read_bytes() == data:
            return path
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".runner-", suffix=".tmp")
    except OSError:  # no writable cache: a private folder of this process's own
        folder = Path(tempfile.mkdtemp(prefix="verify-runner-"))
        path = folder / path.name
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".runner-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
