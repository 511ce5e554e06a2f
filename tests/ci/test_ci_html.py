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


def test_the_latency_plot_shows_what_the_gate_judged() -> None:
    """With a control, the gate compares the fastest tenth of the iterations over the fastest
    tenth of the probes, each run on its own. The plot drew each iteration over the probe beside
    it and a "median +25%" line: on a busy night a passing job's whole box sat above it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from verify.ci import gates
    from verify.ci.html import _latency_axes
    from verify.ci.results import Latency
    from verify.ci.suite import GateSettings

    base = Latency(tuple([10.0 + 0.01 * i for i in range(30)]), tuple([1.0] * 30))
    # a busy night: most iterations descheduled while the probe beside them was not, and the
    # other way round for a few; the work itself costs what it did
    now = Latency(tuple([10.2] * 8 + [30.0] * 22), tuple([1.0] * 8 + [1.02] * 18 + [9.0] * 4))
    settings = GateSettings(latency_control="probe")
    gate = gates.latency(now, base, settings, "m/dev/opt", "bl")
    assert gate.status == "pass", gate.message
    r = SimpleNamespace(baseline_latency=base, latency=now, gates=(gate,),
                        job=SimpleNamespace(settings=settings))
    fig, ax = plt.subplots()
    try:
        _latency_axes(ax, r, settings.latency_threshold)
        judged = [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_marker() == "_"]
        [limit] = [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        assert len(judged) == 2
        assert math.isclose(judged[1] / judged[0], gate.details["ratio"], rel_tol=1e-4)
        assert math.isclose(limit, judged[0] * 1.25, rel_tol=1e-9)
        assert judged[1] < limit     # the job passed: its statistic sits under the line
        assert "fastest tenth" in " ".join(t.get_text() for t in ax.get_legend().get_texts())
    finally:
        plt.close(fig)
