"""Pack the testcases the sample CI suite runs (goldens/suites/sample.toml) into goldens/testcases/.

Usage:
    python scripts/build_ci_goldens.py            # write goldens/testcases/*.vtc
    python scripts/build_ci_goldens.py --out DIR  # write into DIR
    python scripts/build_ci_goldens.py --check    # are the committed archives current?

The inputs are the golden image and seeded random data, so a rebuild reproduces the model bytes
and inputs exactly; the ground truth is recomputed by this host's onnxruntime, and `--check`
accepts it within the default tolerance (a different CPU may round the last bits differently).
Archives carry provenance (time, host), so the files themselves are not byte-identical.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from verify.archive_reader import read_archive
from verify.compare import ToleranceSet, compare
from verify.inputs import Preprocess
from verify.pack import PackOptions, pack

MODELS = ROOT / "goldens" / "models"
OUT = ROOT / "goldens" / "testcases"
SEED = 7
# archive name -> (model file, -d specs, preprocessing, with per-layer references)
TESTCASES: dict[str, tuple[str, list[str], Preprocess, bool]] = {
    "cnn": ("cnn.onnx", [f"data:{ROOT / 'goldens' / 'images' / 'sample.png'}"],
            Preprocess(scale=1 / 255), True),
    "two_io": ("two_io.onnx", [], Preprocess(), False),
    "int_bool": ("int_bool.onnx", [], Preprocess(), False),
}


def build(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (model, data, pre, layers) in TESTCASES.items():
        path = out / f"{name}.vtc"
        pack(MODELS / model, path, PackOptions(data=data, seed=SEED, pre=pre, layers=layers))
        written.append(path)
    return written


def check(committed: Path) -> list[str]:
    """Differences between the committed archives and a fresh build, as messages."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for fresh_path in build(Path(tmp)):
            old_path = committed / fresh_path.name
            if not old_path.is_file():
                problems.append(f"{old_path}: missing")
                continue
            old, fresh = read_archive(old_path), read_archive(fresh_path)
            if old.model_bytes != fresh.model_bytes:
                problems.append(f"{old_path}: the model differs from goldens/models")
            if old.has_layers != fresh.has_layers:
                problems.append(f"{old_path}: per-layer references {'missing' if fresh.has_layers else 'unexpected'}")
            if len(old.cases) != len(fresh.cases):
                problems.append(f"{old_path}: {len(old.cases)} case(s), expected {len(fresh.cases)}")
                continue
            for i, (a, b) in enumerate(zip(old.cases, fresh.cases)):
                for k in b.inputs:
                    if k not in a.inputs or not np.array_equal(a.inputs[k], b.inputs[k]):
                        problems.append(f"{old_path}: case {i} input {k!r} differs")
                for k, ref in b.outputs.items():
                    rule = ToleranceSet().rule_for(k, ref.dtype, 1 / 16)
                    if k not in a.outputs or not compare(k, a.outputs[k], ref, rule).passed:
                        problems.append(f"{old_path}: case {i} ground truth {k!r} differs")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.check:
        problems = check(args.out)
        for p in problems:
            print(p, file=sys.stderr)
        print("goldens/testcases are current" if not problems else
              "rebuild with: python scripts/build_ci_goldens.py", file=sys.stderr)
        return 1 if problems else 0
    for path in build(args.out):
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
