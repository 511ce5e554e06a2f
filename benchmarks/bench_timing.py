"""What several benchmarks share: the median wall time of a call (scripts in this folder
import it; running `python benchmarks/NAME.py` puts this folder on sys.path)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_s(fn: Callable[[], object], runs: int) -> float:
    """Median wall time of `runs` calls of `fn`, in seconds."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
