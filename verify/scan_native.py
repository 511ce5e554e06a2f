"""The comparison kernel compiled from C (`scan_native.c`), the auto engine's first choice.

The numba kernel runs at memory bandwidth but costs ~0.9 s to load in every process, which a
whole `verify diff` of det-640's dumps (1.2 s on numpy) never paid back. The same kernel in C,
built once per machine with the system's C compiler and cached, loads in about a millisecond
through ctypes: a process gets the fused one-pass kernel from its first tensor, with no numba.

Built on the first comparison: `$CC` (split into words, so `ccache gcc` works) or the first of
`cc`, `gcc`, `clang` on PATH (on macOS only once the developer tools are installed), with the
floating-point flags below, into verify's cache folder (`$XDG_CACHE_HOME/verify/kernels`),
named by the sha256 of the source, the flags and the machine. On Linux it is built for this CPU
(`-march=native`, and /proc/cpuinfo's flags in the name: a cache shared between machines builds
one library per CPU), falling back to the architecture's baseline where the compiler refuses
that; elsewhere for the baseline only. Written to a temporary name and renamed, so a process
never loads a half-written library. No compiler, a failed build, a library that will not load:
the engine is unavailable, `native_problem()` says why, and auto uses numba or numpy as before.
A build that failed is remembered (a `.failed` file beside the library, per compiler command),
so later processes do not run the compiler again; deleting the file retries.
`VERIFY_NO_NATIVE=1` turns the engine off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from verify.cache import verify_cache_dir

SOURCE = Path(__file__).with_name("scan_native.c")
# -ffp-contract=off: atol + rtol*|r| rounds as numpy's does (element counts agree). The rest
# let the float64 sums vectorize, as the numba kernel's reassoc/nsz do (scan_native.c says how
# the maxima vectorize with no fast-math).
FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
         "-fassociative-math", "-fno-signed-zeros", "-shared", "-fPIC"]
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
    """$CC as words (ValueError: not a command line), or the first C compiler on PATH."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        return shlex.split(cc)
    if sys.platform == "darwin" and not _developer_tools():
        return None  # /usr/bin/cc would only offer to install them
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def _developer_tools() -> bool:
    try:
        return subprocess.run(["xcode-select", "-p"], capture_output=True, timeout=30,
                              stdin=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.lru_cache(maxsize=1)
def _cpu_features() -> str:
    """What -march=native compiles for, where the cache's names can tell CPUs apart: the CPU
    flags line on Linux; '' elsewhere (the library is then built for the baseline)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line.strip()
    except OSError:
        pass
    return ""


def _flag_sets() -> list[list[str]]:
    """The builds to try, best first."""
    return [[*FLAGS, *NATIVE_CPU], FLAGS] if _cpu_features() else [FLAGS]


@functools.lru_cache(maxsize=1)
def _source() -> bytes:
    return SOURCE.read_bytes()


def library_path(flags: list[str]) -> Path:
    key = hashlib.sha256(_source())
    key.update("\0".join([*flags, platform.machine(), _cpu_features()]).encode())
    return verify_cache_dir() / "kernels" / f"scan-{key.hexdigest()[:24]}.so"


def _failure_path(library: Path, cc: list[str]) -> Path:
    """Where a failed build with `cc` is remembered: per library and compiler command."""
    who = hashlib.sha256("\0".join(cc).encode()).hexdigest()[:12]
    return library.with_name(f"{library.stem}-{who}.failed")


STALE_TMP_SECONDS = 3600


def _build(cc: list[str], flags: list[str], target: Path) -> str:
    """Compile into `target` (temporary name, then renamed); '' or why not, in one line.
    Raises OSError where the cache folder cannot be written or the compiler not started."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for old in target.parent.glob("*.tmp"):  # left by a build that was killed
        try:
            if time.time() - old.stat().st_mtime > STALE_TMP_SECONDS:
                old.unlink()
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        try:
            done = subprocess.run([*cc, *flags, "-o", tmp, str(SOURCE)], capture_output=True,
                                  timeout=BUILD_TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"{cc[0]} did not finish building the kernel in {BUILD_TIMEOUT} s"
        if done.returncode:
            text = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
            return (f"{cc[0]} cannot build the kernel: "
                    f"{text[0] if text else 'exit status %d' % done.returncode}")
        os.replace(tmp, target)
        return ""
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _open(path: Path) -> str:
    """Load the library's two kernels; '' or why not (a library that will not load is
    removed: the next build replaces it)."""
    try:
        lib = ctypes.CDLL(str(path))
        kernels = {}
        for name, dtype in (("verify_rows_f32", np.float32), ("verify_rows_f64", np.float64)):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                           ctypes.c_double, ctypes.c_int, ctypes.c_void_p]
            kernels[np.dtype(dtype)] = fn
    except (OSError, AttributeError) as exc:
        try:
            path.unlink()
        except OSError:
            pass
        return f"cannot load {path}: {exc}"
    _kernels.update(kernels)
    return ""


def _load() -> str:
    """Load the library, built first where no earlier process built it; '' or why it cannot be
    had, in one line."""
    try:
        flag_sets = _flag_sets()
        paths = [library_path(flags) for flags in flag_sets]
    except OSError as exc:
        return f"cannot read the kernel's source {SOURCE}: {exc.strerror or exc}"
    cc: list[str] | None = None
    try:
        for path in paths:  # built by an earlier process
            if path.exists() and not _open(path):
                return ""
        try:
            cc = _compiler()
        except ValueError as exc:  # shlex: unbalanced quotes
            return f"CC is not a command line ({exc})"
        if cc is None:
            return "no C compiler (set CC, or install cc, gcc or clang)"
        failed = _failure_path(paths[0], cc)
        if failed.exists():
            return failed.read_text(errors="replace").strip() or "an earlier build failed"
        why = ""
        for flags, path in zip(flag_sets, paths):
            why = _build(cc, flags, path) or _open(path)
            if not why:
                return ""
        why += f" (remembered in {failed}: delete it to build again)"
        _remember(failed, why)
        return why
    except OSError as exc:
        return f"cannot build the kernel with {cc[0] if cc else 'cc'}: {exc}"


def _remember(failed: Path, why: str) -> None:
    tmp = failed.with_name(failed.name + f".{os.getpid()}.tmp")
    try:
        tmp.write_text(why + "\n")
        os.replace(tmp, failed)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def native_available() -> bool:
    """Whether the compiled kernel can be used (builds or loads it on the first call)."""
    global _state, _problem
    if disabled():
        return False
    if _state != "unloaded":  # every comparison asks: no lock once it is settled
        return _state == "loaded"
    with _lock:
        if _state == "unloaded":
            _problem = _load()
            _state = "missing" if _problem else "loaded"
    return _state == "loaded"


def build_problem() -> str:
    """Why the compiled kernel was wanted and could not be had, where that is worth telling a
    user: a compiler is there (or CC is set) but the build or the load failed. '' when it
    loaded, was never wanted, is turned off, or there is no compiler at all."""
    if disabled() or _state != "missing" or _problem.startswith("no C compiler"):
        return ""
    return _problem


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
    if not (x.flags.aligned and y.flags.aligned):
        raise ValueError("the compiled kernel takes aligned arrays")
    if not (starts.dtype == stops.dtype == np.int64 and stops.size == n
            and starts.flags.c_contiguous and stops.flags.c_contiguous
            and rows.dtype == np.float64 and rows.shape == (n, NCOL)
            and rows.flags.c_contiguous):
        raise ValueError("the compiled kernel takes int64 block bounds and float64 rows")
    if not (math.isfinite(rtol) and math.isfinite(tiny) and atol >= 0):
        raise ValueError("the compiled kernel takes a finite rtol and tiny and atol >= 0")
    # the C code checks every block against the arrays' size before it reads anything (three
    # numpy reductions here cost more than the kernel on a small tensor)
    if _kernels[x.dtype](x.ctypes.data, y.ctypes.data, min(x.size, y.size), starts.ctypes.data,
                         stops.ctypes.data, n, atol, rtol, tiny, int(want_tr),
                         rows.ctypes.data):
        raise ValueError("a block outside the arrays")
