"""What the archive's checksums cost, on a ~100 MB archive: writing and reading with verify's
per-dataset sha256 against plain h5py (no checks), and against HDF5's Fletcher32 filter.

    python benchmarks/bench_archive_integrity.py [--mb 100] [--rounds 3]

Prints medians of `--rounds` and ratios measured in the same run. The archive holds a 20 MB
"model" (random bytes: the reader does not parse it) and one case of float32 inputs and
outputs making up the rest. Fletcher32 needs chunked storage (1 MB chunks here); it catches
damage to a chunk's stored bytes only, not to names, shapes or metadata, which is why verify
records sha256 digests instead.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench_timing import median_s

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from verify.archive_reader import read_archive  # noqa: E402
from verify.testcase import Case, Testcase, write_archive  # noqa: E402


def make_testcase(total_mb: int) -> Testcase:
    rng = np.random.default_rng(0)
    model = rng.integers(0, 256, 20 << 20, dtype=np.uint8).tobytes()
    rest = max(1, total_mb - 20) << 20
    n = rest // 4 // 4  # four float32 tensors
    tensors = {f"t{i}": rng.standard_normal(n, dtype=np.float32).reshape(-1, 1024) for i in range(4)}
    case = Case(inputs={k: v for k, v in list(tensors.items())[:2]},
                outputs={k: v for k, v in list(tensors.items())[2:]})
    return Testcase(model_bytes=model, cases=(case,), tensor_order=(),
                    provenance={"model_sha256": ""})


def write_plain(path: Path, tc: Testcase, fletcher: bool) -> None:
    opts = {"chunks": True, "fletcher32": True} if fletcher else {}
    with h5py.File(path, "w") as f:
        f.create_dataset("model", data=np.frombuffer(tc.model_bytes, np.uint8), **(
            {"chunks": (1 << 20,), "fletcher32": True} if fletcher else {}))
        for kind, values in (("inputs", tc.cases[0].inputs), ("outputs", tc.cases[0].outputs)):
            for k, v in enumerate(values.values()):
                f.create_dataset(f"cases/0/{kind}/{k}", data=v,
                                 **({"chunks": (min(256, len(v)), 1024), "fletcher32": True}
                                    if fletcher else opts))


def read_plain(path: Path) -> None:
    with h5py.File(path, "r") as f:
        f["model"][()].tobytes()
        for kind in ("inputs", "outputs"):
            for k in f[f"cases/0/{kind}"]:
                f[f"cases/0/{kind}/{k}"][()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tc = make_testcase(args.mb)
    with tempfile.TemporaryDirectory() as tmp:
        plain, fl, ours = (Path(tmp) / n for n in ("plain.h5", "fletcher.h5", "verify.vtc"))
        w_plain = median_s(lambda: write_plain(plain, tc, False), args.rounds)
        w_fl = median_s(lambda: write_plain(fl, tc, True), args.rounds)
        w_ours = median_s(lambda: write_archive(ours, tc), args.rounds)
        r_plain = median_s(lambda: read_plain(plain), args.rounds)
        r_fl = median_s(lambda: read_plain(fl), args.rounds)
        r_ours = median_s(lambda: read_archive(ours), args.rounds)
        size = ours.stat().st_size / 2**20
    print(f"archive: {size:.0f} MB, medians of {args.rounds} rounds")
    print(f"{'':28} {'write s':>8} {'x plain':>8} {'read s':>8} {'x plain':>8}")
    for label, w, r in (("plain h5py (no checks)", w_plain, r_plain),
                        ("Fletcher32 (chunked)", w_fl, r_fl),
                        ("verify sha256 per dataset", w_ours, r_ours)):
        print(f"{label:28} {w:8.3f} {w / w_plain:8.2f} {r:8.3f} {r / r_plain:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
