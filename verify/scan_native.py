"""The comparison kernel compiled from C (`scan_native.c`), the auto engine's first choice.

The numba kernel runs at memory bandwidth but costs ~0.9 s to load in every process, which a
whole `verify diff` of det-640's dumps (1.2 s on numpy) never paid back. The same kernel in C,
built once per machine with the system's C compiler and cached, loads in about a millisecond
through ctypes: a process gets the fused one-pass kernel from its first tensor, with no numba.

Built on first use: `$CC` (split into words, so `ccache gcc` works) or the first of `cc`,
`gcc`, `clang` on PATH, with `-O3 -march=native` (without `-march=native` where the compiler
refuses it) and the floating-point flags below, into verify's cache folder
(`$XDG_CACHE_HOME/verify/kernels`), named by the sha256 of the source, the flags and this
machine's CPU features (a cache shared between machines builds one library per CPU). Written
to a temporary name and renamed, so a process never loads a half-written library. No compiler,
a failed build or a library that will not load: the engine is unavailable (`native_problem()`
says why) and auto uses numba or numpy as before. `VERIFY_NO_NATIVE=1` turns it off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from verify.cache import verify_cache_dir

SOURCE = Path(__file__).with_name("scan_native.c")
# -ffp-contract=off: atol + rtol*|r| rounds as numpy's does (element counts agree). The rest
# let the maxima and the float64 sums vectorize, as the numba kernel's reassoc/nnan/nsz do
# (without -ffinite-math-only gcc keeps the maxima scalar: 3 GB/s instead of 11). Values are
# finite in every block whose row is kept (a block with NaN/Inf is redone in numpy); the one
# infinity the kernel is handed, atol=inf (the magnitude rule's first pass), meets only a
# comparison and a division, which the hardware does exactly.
FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
         "-fassociative-math", "-fno-signed-zeros", "-ffinite-math-only", "-shared", "-fPIC"]
NATIVE_CPU = ["-march=native"]
BUILD_TIMEOUT = 120  # seconds for one compiler run
NCOL = 15  # a row's columns: scan_native.c's NCOL, scan_numba's _NCOL

_lock = threading.Lock()
_state = "unloaded"  # unloaded | loaded | missing
_problem = ""
_kernels: dict[np.dtype, Any] = {}


def disabled() -> bool:
    return os.environ.get("VERIFY_NO_NATIVE", "") not in ("", "0")


def _compiler() -> list[str] | None:
    cc = os.environ.get("CC", "").strip()
    if cc:
        return shlex.split(cc)
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def _cpu_features() -> str:
    """What -march=native compiles for: the CPU flags line on Linux, else the processor."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line.strip()
    except OSError:
        pass
    return platform.processor()


def library_path(flags: list[str]) -> Path:
    key = hashlib.sha256(SOURCE.read_bytes())
    key.update("\0".join([*flags, platform.machine(), _cpu_features()]).encode())
    return verify_cache_dir() / "kernels" / f"scan-{key.hexdigest()[:24]}.so"


def _build(cc: list[str], flags: list[str], target: Path) -> str:
    """Compile into `target` (temporary name, then renamed); '' or the compiler's complaint."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([*cc, *flags, "-o", tmp, str(SOURCE)], capture_output=True,
                              text=True, timeout=BUILD_TIMEOUT, stdin=subprocess.DEVNULL)
        if done.returncode:
            lines = (done.stderr or done.stdout).strip().splitlines()
            return lines[0] if lines else f"{cc[0]} exited {done.returncode}"
        os.replace(tmp, target)
        return ""
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _open(path: Path) -> dict[np.dtype, Any]:
    lib = ctypes.CDLL(str(path))
    kernels = {}
    for name, dtype in (("verify_rows_f32", np.float32), ("verify_rows_f64", np.float64)):
        fn = getattr(lib, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_double, ctypes.c_double, ctypes.c_double,
                       ctypes.c_int, ctypes.c_void_p]
        kernels[np.dtype(dtype)] = fn
    return kernels


def _load() -> str:
    """Load the library, built first where no earlier process built it; '' or why it cannot be
    had. For this CPU if the compiler can, else for the architecture's baseline (kept too, so
    a compiler that refuses -march=native is asked once per machine, not once per process)."""
    try:
        best, plain = library_path([*FLAGS, *NATIVE_CPU]), library_path(FLAGS)
    except OSError as exc:
        return f"cannot read the kernel's source {SOURCE}: {exc.strerror or exc}"
    path = best if best.exists() else plain if plain.exists() else None
    if path is None:
        try:
            cc = _compiler()
        except ValueError as exc:  # shlex: unbalanced quotes
            return f"CC is not a command line ({exc})"
        if cc is None:
            return "no C compiler (set CC, or install cc, gcc or clang)"
        why = ""
        for flags, target in (([*FLAGS, *NATIVE_CPU], best), (FLAGS, plain)):
            try:
                why = _build(cc, flags, target)
            except (OSError, subprocess.SubprocessError) as exc:
                return f"cannot build the kernel with {cc[0]}: {exc}"
            if not why:
                path = target
                break
        else:
            return f"{cc[0]} cannot build the kernel: {why}"
    try:
        _kernels.update(_open(path))
    except (OSError, AttributeError) as exc:  # damaged: built again by the next process
        try:
            path.unlink()
        except OSError:
            pass
        return f"cannot load {path}: {exc}"
    return ""


def native_available() -> bool:
    """Whether the compiled kernel can be used (builds or loads it on the first call)."""
    global _state, _problem
    if disabled():
        return False
    with _lock:
        if _state == "unloaded":
            _problem = _load()
            _state = "missing" if _problem else "loaded"
    return _state == "loaded"


def native_problem() -> str:
    """Why the compiled kernel is not available ('' when it is, or was never asked for)."""
    return "VERIFY_NO_NATIVE is set" if disabled() else _problem


def native_fill(x: np.ndarray, y: np.ndarray, starts: np.ndarray, stops: np.ndarray,
                atol: float, rtol: float, tiny: float, want_tr: bool, rows: np.ndarray) -> None:
    """Fill rows[j] from the block x[starts[j]:stops[j]] for every j, on this thread (ctypes
    lets go of the GIL for the call): x and y 1-D, C-contiguous, float32 or float64 alike;
    starts and stops int64; rows float64, C-contiguous, one row of NCOL per block. Blocks
    holding NaN or Inf get a non-finite SAA + SRR, as from the numba kernel."""
    if not native_available():
        raise ImportError(f"the compiled kernel is not available: {native_problem()}; use "
                          "engine='numpy' or 'auto'")
    if y.dtype != x.dtype or not (x.flags.c_contiguous and y.flags.c_contiguous):
        raise ValueError("the compiled kernel takes two C-contiguous arrays of one dtype")
    n = starts.size
    if not (starts.dtype == stops.dtype == np.int64 and stops.size == n
            and starts.flags.c_contiguous and stops.flags.c_contiguous
            and rows.dtype == np.float64 and rows.shape == (n, NCOL)
            and rows.flags.c_contiguous):
        raise ValueError("the compiled kernel takes int64 block bounds and float64 rows")
    if n and (int(starts.min()) < 0 or int(stops.max()) > min(x.size, y.size)
              or bool(np.any(stops < starts))):
        raise ValueError("a block outside the arrays")  # C reads no further than told
    _kernels[x.dtype](x.ctypes.data, y.ctypes.data, starts.ctypes.data, stops.ctypes.data, n,
                      atol, rtol, tiny, int(want_tr), rows.ctypes.data)
