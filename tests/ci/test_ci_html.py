"""The HTML report's per-layer plot puts each tensor at its own index: a layer at its
topological index, as the text's "#237" says (x was its position among the compared tensors,
so the first divergent layer #237 sat at x=1), each case a line of its own over it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from verify.ci.results import TensorError

pytest.importorskip("matplotlib")


def _layer(case: int, index: int, name: str, err: float) -> TensorError:
    return TensorError(case, index, name, "Conv", err <= 1e-3, "magnitude", err, 1e-3,
                       err / 1e-3)


def test_layers_sit_at_their_topological_index_one_line_per_case() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from verify.ci.html import _error_axes

    layers = [_layer(c, i, f"t{i}", e) for c in (0, 1)
              for i, e in ((3, 1e-6), (237, 5e-2), (240, 8e-2))]
    first = layers[1]
    r = SimpleNamespace(layers=tuple(layers), outputs=(), baseline_errors={},
                        first_divergent=first, gates=())
    fig, ax = plt.subplots()
    try:
        _error_axes(ax, r)
        curves = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]
        assert [list(ln.get_xdata()) for ln in curves] == [[3, 237, 240], [3, 237, 240]]
        [marker] = [ln for ln in ax.get_lines() if ln.get_marker() == "X"]
        assert list(marker.get_xdata()) == [237]
        assert math.isclose(marker.get_ydata()[0], 5e-2)
        assert "layer index (topological order)" == ax.get_xlabel()
    finally:
        plt.close(fig)
