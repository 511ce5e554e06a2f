"""Checking a run's final outputs against the archive's ground truth."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from verify.compare import TensorDiff, ToleranceSet, compare
from verify.errors import RunnerError


@dataclass(frozen=True)
class CaseCheck:
    """The per-output verdicts of one case; `diffs` is None when there was nothing to check."""

    index: int
    diffs: tuple[TensorDiff, ...] | None

    @property
    def passed(self) -> bool | None:
        return None if self.diffs is None else all(d.passed for d in self.diffs)


def require_outputs(actual: Mapping[str, object], names: Iterable[str], where: str) -> None:
    """A device that returns no value for an output it was asked for has a broken runner:
    RunnerError (exit 3), never a silently shorter comparison."""
    missing = [name for name in names if name not in actual]
    if missing:
        raise RunnerError(f"{where}: the runner returned no value for output(s) "
                          f"{', '.join(repr(m) for m in missing)}")


def check_outputs(actual: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                  tolerances: ToleranceSet, floors: Mapping[str, float],
                  where: str = "device") -> list[TensorDiff]:
    """Compare every reference output with the device's; a missing output is a runner fault.

    `floors` maps a tensor name to its magnitude floor (`graph.saturation_floors`).
    """
    require_outputs(actual, reference, where)
    return [compare(name, actual[name], ref,
                    tolerances.rule_for(name, ref.dtype, floors.get(name, 0.0)), topk=True)
            for name, ref in reference.items()]
