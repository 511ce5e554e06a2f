"""The native runner against the Python runner (whole job) and a bare ONNX Runtime loop
(per iteration), measured in the same run.

    python benchmarks/bench_native_runner.py [--repeats 5] [--iterations 30]

1. Whole job: one runner process per job, as verify starts it (a new session, the job's folder
   as current directory): start, read the model, make the session (opt all), one iteration,
   write the outputs and the result file. Native runner (the linux-x86_64 bundle, ONNX Runtime
   1.30.0) vs verify/runner/runner.py (this Python's onnxruntime); the median wall and CPU time
   of --repeats jobs each, alternating; the ratio native/python. Targets (issue 17): <= 0.5x on
   a small model, <= 1.0x on YOLOv8n.
2. Per iteration: the native runner's timed iterations against a bare C++ loop over the same
   libonnxruntime (benchmarks/native/bare_loop.cpp, compiled here against the same headers);
   medians and their ratio (1.0 = no overhead).
Models: goldens/models/two_io.onnx (small) and YOLOv8n at 1x3x320x320 (scripts/fetch_models.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def build_module():
    spec = importlib.util.spec_from_file_location("build_native_runner",
                                                  ROOT / "scripts" / "build_native_runner.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_native_runner"] = module
    spec.loader.exec_module(module)
    return module


def bare_loop(bnr) -> Path:
    cache = bnr.verify_cache() / "native"
    headers, _ = bnr.aar_files(cache)
    lib = bnr.library_for(bnr.TARGETS["linux-x86_64"], cache)
    out = cache / "bench" / "bare_loop"
    src = [ROOT / "benchmarks" / "native" / "bare_loop.cpp", ROOT / "runner" / "native" / "src" / "npy.cpp"]
    if not out.exists() or any(s.stat().st_mtime > out.stat().st_mtime for s in src):
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["g++", "-O2", "-std=c++17", f"-I{headers}",
                        f"-I{ROOT / 'runner' / 'native' / 'src'}", *map(str, src), "-o", str(out),
                        str(lib), f"-Wl,-rpath,{lib.parent}"], check=True)
    return out


def make_job(folder: Path, model: Path, feeds: dict[str, np.ndarray], **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(model, folder / "model.onnx")
    inputs = {}
    for k, (name, value) in enumerate(feeds.items()):
        np.save(folder / f"in{k}.npy", value)
        inputs[name] = f"in{k}.npy"
    job = {"contract": "verify-runner", "version": 1, "model": "model.onnx",
           "cases": [{"inputs": inputs}], "providers": ["CPUExecutionProvider"],
           "opt_level": "all", "threads": 0, "session_config": {}, "warmup": 0,
           "iterations": 1, "outputs_dir": "out", "result": "result.json", "profile": None,
           **extra}
    (folder / "job.json").write_text(json.dumps(job))
    return folder / "job.json"


def timed_process(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one process, started in a session of its own as verify does."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, start_new_session=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {proc.stderr.decode()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def feeds_for(model: Path, shape: dict[str, list[int]]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    return {i.name: rng.random(shape.get(i.name) or [d if isinstance(d, int) else 1
                                                     for d in i.shape]).astype(np.float32)
            for i in sess.get_inputs()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=30)
    args = ap.parse_args()
    bnr = build_module()
    native = Path(bnr.build("linux-x86_64")) / "bin" / "verify-runner"
    bare = bare_loop(bnr)
    python = [sys.executable, str(ROOT / "verify" / "runner" / "runner.py")]
    from corpus import model_path

    models = [("two_io (small)", ROOT / "goldens" / "models" / "two_io.onnx", {}, 0.5),
              ("YOLOv8n 320", Path(model_path("yolov8n")), {"images": [1, 3, 320, 320]}, 1.0)]
    print(f"native runner: {native} (onnxruntime 1.30.0); python runner: onnxruntime "
          f"{__import__('onnxruntime').__version__}; load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, model, shape, target in models:
            feeds = feeds_for(model, shape)
            walls = {"native": [], "python": []}
            cpus = {"native": [], "python": []}
            for r in range(args.repeats):
                for kind, argv in (("native", [str(native)]), ("python", python)):
                    job = make_job(Path(tmp) / f"{kind}{r}{label[:3]}", model, feeds)
                    wall, cpu = timed_process([*argv, str(job)], job.parent)
                    walls[kind].append(wall)
                    cpus[kind].append(cpu)
            wn, wp = statistics.median(walls["native"]), statistics.median(walls["python"])
            cn, cp = statistics.median(cpus["native"]), statistics.median(cpus["python"])
            verdict = "meets" if wn / wp <= target else "MISSES"
            print(f"{label}: whole job (start, session, 1 iteration, result): native "
                  f"{wn * 1000:.0f} ms wall / {cn * 1000:.0f} ms CPU, python {wp * 1000:.0f} ms / "
                  f"{cp * 1000:.0f} ms; ratio wall {wn / wp:.2f}x, CPU {cn / cp:.2f}x "
                  f"({verdict} the {target}x target)")

            job = make_job(Path(tmp) / f"iters{label[:3]}", model, feeds, warmup=5,
                           iterations=args.iterations)
            subprocess.run([str(native), str(job)], cwd=job.parent, check=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           start_new_session=True)
            runner_ms = json.loads((job.parent / "result.json").read_text())["cases"][0]["iter_ms"]
            inputs = [f"{n}={job.parent / f'in{k}.npy'}" for k, n in enumerate(feeds)]
            out = subprocess.run([str(bare), str(job.parent / "model.onnx"), "5",
                                  str(args.iterations), *inputs], check=True, text=True,
                                 stdout=subprocess.PIPE, start_new_session=True).stdout
            bare_ms = json.loads(out)
            mr, mb = statistics.median(runner_ms), statistics.median(bare_ms)
            print(f"{label}: per iteration (median of {args.iterations}): native runner "
                  f"{mr:.4f} ms, bare ONNX Runtime loop {mb:.4f} ms; ratio {mr / mb:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
