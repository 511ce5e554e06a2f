"""Per-layer judging that does not blame a tensor for the error its sources hand it (see
`LayerJudge`): `diff`, `ci`'s per-layer gate and `localize`'s full run judge through it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from verify.compare import TensorDiff, ToleranceSet, compare
from verify.rules import SOURCE_FACTORS, MagnitudeRule, Rule


class LayerJudge:
    """Per-layer judging (diff, ci, localize's full run), where a tensor is not blamed for the
    error its sources hand it. A tensor whose op only selects, moves or averages values
    (`graph.value_sources`: a ReLU6 after a convolution) passes on its source's absolute error
    however small its own peak, and a saturating op at most the share its slope allows
    (SOURCE_FACTORS of `ops`, each name's producing op): its threshold is at least that share
    of its sources' measured max|a-r|, known once they are judged (their error, not their
    tolerance: a mask of -1e4 before a Softmax made the tolerance lent 0.3 on probabilities).
    A source the actual side lacks (fused away, filtered out) lends nothing: its tolerance,
    lent instead, let a Relu off by 1000 pass behind a float32-min mask. Call it as `compare`
    with `tolerances`' rule; `plain` judges with `floors` alone (a piece fed the reference
    inputs inherits no error)."""

    def __init__(self, tolerances: ToleranceSet, floors: Mapping[str, float],
                 sources: Mapping[str, Sequence[str]], ops: Mapping[str, str]) -> None:
        self.tolerances, self.floors, self.sources, self.ops = tolerances, floors, sources, ops
        self.error: dict[str, float] = {}  # judged tensors: their max|a-r|

    def rule(self, name: str, dtype: Any, floor: float | None = None) -> Rule:
        """`name`'s rule: on its own floor (`floor`, else from `floors`), raised to what its
        sources lend."""
        own = self.floors.get(name, 0.0) if floor is None else floor
        rule = self.own_rule(name, dtype, floor)
        srcs = self.sources.get(name, ())
        if not srcs or not isinstance(rule, MagnitudeRule):
            return rule
        op = self.ops.get(name, "")
        k = rule.k_for(np.dtype(dtype))
        lent = [f for f in (SOURCE_FACTORS.get(op, 1.0) * self.error[s] / k
                            for s in srcs if s in self.error) if f > own and math.isfinite(f)]
        return self.tolerances.rule_for(name, dtype, max(lent)) if lent else rule

    def own_rule(self, name: str, dtype: Any, floor: float | None = None) -> Rule:
        """`name`'s rule on its own floor alone, lent nothing: as `run` judges an output."""
        return self.tolerances.rule_for(name, dtype, self.floors.get(name, 0.0)
                                        if floor is None else floor)

    def judged(self, d: TensorDiff) -> TensorDiff:
        """Note `d`'s error for the tensors it is a source of."""
        if math.isfinite(d.max_abs):
            self.error[d.name] = d.max_abs
        return d

    def __call__(self, name: str, actual: Any, reference: Any) -> TensorDiff:
        return self.judged(compare(name, actual, reference,
                                   self.rule(name, np.asarray(reference).dtype)))

    def plain(self, name: str, actual: Any, reference: Any) -> TensorDiff:
        return compare(name, actual, reference,
                       self.own_rule(name, np.asarray(reference).dtype))
