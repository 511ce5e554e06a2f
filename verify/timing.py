"""Latency statistics over per-iteration samples (milliseconds), shared by run, bench and ci."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Two-sided 95% Student t quantiles by degrees of freedom (1..30); 1.96 beyond the table.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


@dataclass(frozen=True)
class Timing:
    """Latency of one inference, milliseconds; ci_* is the 95% interval of the mean (its low
    end held at 0)."""

    n: int
    avg: float
    sd: float
    min: float
    max: float
    median: float
    ci_low: float
    ci_high: float

    @staticmethod
    def of(ms: Sequence[float]) -> "Timing":
        n = len(ms)
        avg = math.fsum(ms) / n
        sd = statistics.stdev(ms) if n > 1 else 0.0
        t = _T975[n - 2] if 2 <= n <= len(_T975) + 1 else 1.96
        half = t * sd / math.sqrt(n)
        # a latency is never below zero: with few samples (t = 12.7 for two) the interval's
        # low end would be
        return Timing(len(ms), avg, sd, min(ms), max(ms), statistics.median(ms),
                      max(avg - half, 0.0), avg + half)

    def overlaps(self, other: "Timing") -> bool:
        return self.ci_low <= other.ci_high and other.ci_low <= self.ci_high

    def to_dict(self) -> dict[str, Any]:
        return {f"{k}_ms" if k != "n" else k: v for k, v in self.__dict__.items()}


def timing_summary(ms: Sequence[float]) -> dict[str, Any]:
    """`Timing.of(ms).to_dict()` plus the total, as `verify run --json` reports a case."""
    return {**Timing.of(ms).to_dict(), "total_ms": math.fsum(ms)}
