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
