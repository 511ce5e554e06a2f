"""What checking a `--layers` archive's per-layer references costs a plain `verify run`: the
same run with the background check (as shipped), without any check of them (as before), and the
check alone, serially (what hashing them all before the run would add).

    python benchmarks/bench_layer_check.py [--rounds 3] [--archive det.vtc]

By default packs PP-OCR det (`scripts/fetch_models.py`) with `--shape x:1x3x320x320 --layers`
(about 700 MB) into a temporary folder. Runs are in this process through verify's run on the
local device (one iteration, no warmup), so wall time and CPU time (this process and its
runner subprocess) are measured alike; medians of --rounds, interleaved, ratios from this run.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from verify import execute  # noqa: E402
from verify.archive_verify import LayerCheck  # noqa: E402
from verify.options import ArchiveSelection, TimedRuns  # noqa: E402


def cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure(fn: Callable[[], object]) -> tuple[float, float]:
    w, c = time.perf_counter(), cpu()
    fn()
    return time.perf_counter() - w, cpu() - c


def plain_run(archive: Path) -> Callable[[], object]:
    request = execute.RunRequest(ArchiveSelection(archive), timed=TimedRuns(1, 0))

    def go() -> object:
        outcome = execute.run(request)
        assert all(d.passed for c in outcome.checks for d in (c.diffs or ())), "run failed"
        return outcome
    return go


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--archive", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="verify-bench-") as tmp:
        archive = args.archive
        if archive is None:
            import fetch_models

            from verify.cli import main as cli

            archive = Path(tmp) / "det.vtc"
            model = fetch_models.model_path("ppocr_det")
            assert cli(["pack", str(model), "--shape", "x:1x3x320x320", "--layers",
                        "-o", str(archive)]) == 0
        size = archive.stat().st_size / 2**20
        shipped = execute.LayerCheck
        results: dict[str, list[tuple[float, float]]] = {"no check": [], "background": [],
                                                          "check alone": []}
        run = plain_run(archive)
        run()  # warm the page cache and onnxruntime's imports once
        for _ in range(args.rounds):
            execute.LayerCheck = lambda path, start=True: LayerCheck(None)  # type: ignore
            results["no check"].append(measure(run))
            execute.LayerCheck = shipped  # type: ignore[misc]
            results["background"].append(measure(run))
            results["check alone"].append(measure(lambda: LayerCheck(archive).result()))
        execute.LayerCheck = shipped  # type: ignore[misc]
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
           for k, v in results.items()}
    base_w, base_c = med["no check"]
    print(f"archive: {size:.0f} MB, verify run --iter 1 --warmup 0 on local, "
          f"medians of {args.rounds} rounds")
    print(f"{'':34} {'wall s':>7} {'x none':>7} {'CPU s':>7} {'x none':>7}")
    serial_w, serial_c = base_w + med["check alone"][0], base_c + med["check alone"][1]
    rows = [("run, layers not checked (before)", *med["no check"]),
            ("run, background check (now)", *med["background"]),
            ("run + the check up front (serial)", serial_w, serial_c),
            ("the check alone", *med["check alone"])]
    for label, w, c in rows:
        print(f"{label:34} {w:7.2f} {w / base_w:7.2f} {c:7.2f} {c / base_c:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
