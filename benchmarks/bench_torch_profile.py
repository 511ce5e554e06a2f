"""Does `verify profile --torch` account for the model's time? The FX per-node profiler on
torchvision's resnet18 (random weights, input 1x3x64x64).

    python benchmarks/bench_torch_profile.py [--warmup 3] [--iterations 20] [--threads 1]

Prints, from the same process and interleaved rounds: the sum of the per-node times (each FX
node timed alone by the interpreter `profile --torch` uses), the whole interpreted run timed
around the same runs, and the whole model run without the interpreter (the same decomposed
graph module called directly, and the original exported program), with the ratios of the
per-node sum to each. The target: the per-node sum within 10% of the whole-model time.
--threads sets torch's intra-op threads (default 1: on a loaded 2-core machine two threads wait
on each other and on other processes, and the wall times then measure the queue, not the model;
0 keeps torch's own default).
Needs torch (pip install 'onnx-verify[torch]') and torchvision.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("needs torch: pip install 'onnx-verify[torch]'", file=sys.stderr)
        return 2
    from verify.torchref import TorchProgram

    if args.threads:
        torch.set_num_threads(args.threads)

    program = TorchProgram(f"{ROOT / 'tests' / 'torch_models.py'}:resnet18")
    feeds = program.example_inputs()
    tensors = [torch.from_numpy(a) for a in feeds]
    plain = program.graph_module
    original = program.program.module()
    per_node_sums, interpreted, direct, exported = [], [], [], []
    with torch.no_grad():
        for i in range(args.warmup + args.iterations):
            per_node, totals = program.timed(feeds, 0, 1)
            start = time.perf_counter()
            plain(*tensors)
            t_direct = time.perf_counter() - start
            start = time.perf_counter()
            original(*tensors)
            t_exported = time.perf_counter() - start
            if i >= args.warmup:
                per_node_sums.append(sum(v[0] for v in per_node.values()))
                interpreted.append(totals[0])
                direct.append(t_direct)
                exported.append(t_exported)
    med = statistics.median
    node_sum = med(per_node_sums)
    print(f"resnet18 1x3x64x64, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{len(program.nodes)} FX nodes, {args.iterations} rounds after {args.warmup} warmup "
          "(medians)")
    print(f"  per-node times summed        {node_sum * 1e3:9.3f} ms")
    for label, values in (("whole interpreted run", interpreted),
                          ("graph module, no interpreter", direct),
                          ("exported program (as packed)", exported)):
        whole = med(values)
        ratio = node_sum / whole
        verdict = "within 10%" if abs(ratio - 1) <= 0.10 else "OUTSIDE 10%"
        print(f"  {label:<29} {whole * 1e3:9.3f} ms   per-node sum / this = {ratio:.3f} "
              f"({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
