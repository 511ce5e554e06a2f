"""How long `verify localize` takes on a ResNet-50-sized model, against one plain `verify run`.

Builds the ResNet-50-like model (scripts/build_resnet50_like.py: 122 nodes, ~102 MB) in a temp
folder, packs it with random input, then for a Conv weight fault (x1.001, tests/faulty_runner.py)
at 25%, 50% and 75% depth runs localize in per-layer mode and in bisection mode on the local
device. Prints per run: the node found, device round trips, wall time and its ratio to one
plain `verify run --iter 1` of the same archive measured in the same process.

    python benchmarks/bench_localize.py [--fanout 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fanout", type=int, default=2)
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-localize-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        return _bench(folder, args.fanout)


def _bench(folder: Path, fanout: int) -> int:
    import onnx

    from verify.cli import main as cli
    from verify.execute import RunRequest, run
    from verify.localize import LocalizeRequest, localize
    from verify.options import ArchiveSelection, DeviceTarget, TimedRuns

    model_path = folder / "resnet50_like.onnx"
    if not model_path.exists():
        subprocess.run([sys.executable, str(REPO / "scripts" / "build_resnet50_like.py"),
                        str(model_path)], check=True)
    vtc = folder / "resnet50_like.vtc"
    if not vtc.exists():
        assert cli(["pack", str(model_path), "-o", str(vtc)]) == 0
    convs = [n.name for n in onnx.load(model_path, load_external_data=False).graph.node
             if n.op_type == "Conv"]
    profiles = folder / "profiles"
    profiles.mkdir(exist_ok=True)
    os.environ["VERIFY_DEVICES"] = str(profiles)
    os.environ["CI"] = "1"

    once = RunRequest(ArchiveSelection(vtc), timed=TimedRuns(1, 0))
    run(once)  # warm the device cache
    t0 = time.perf_counter()
    run(once)
    baseline = time.perf_counter() - t0
    print(f"baseline: verify run --iter 1 of {vtc.name}: {baseline:.2f} s")
    print(f"{'fault at':<10} {'node':<22} {'mode':<7} {'found':<22} {'trips':>5} "
          f"{'seconds':>8} {'x run':>6}")
    for depth in (0.25, 0.5, 0.75):
        node = convs[int(len(convs) * depth)]
        name = f"faulty{int(depth * 100)}"
        runner = [sys.executable, str(REPO / "tests" / "faulty_runner.py"), "--fault", "weight",
                  "--node", node, "--value", "1.001"]
        (profiles / f"{name}.toml").write_text(
            'transport = "local"\nrunner = [' + ", ".join(f'"{w}"' for w in runner) + "]\n")
        for mode in ("dump", "bisect"):
            t0 = time.perf_counter()
            result = localize(LocalizeRequest(ArchiveSelection(vtc), DeviceTarget(name),
                                              mode=mode, fanout=fanout, out_dir=folder))
            took = time.perf_counter() - t0
            found = result.suspect.name if result.suspect else "-"
            print(f"{int(depth * 100):>3}%       {node:<22} {mode:<7} {found:<22} "
                  f"{len(result.rounds):>5} {took:>8.2f} {took / baseline:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
