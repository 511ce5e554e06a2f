"""The four gates. Each takes measured figures (and a baseline) and returns a GateResult.

- accuracy: every output (and, when captured, every layer) within tolerance of the ground truth.
- regression: no output's (layer's) max|x - r| grew past `factor * max(baseline, min_units *
  threshold)`; the `min_units` floor keeps an error of 0 in the baseline from turning the
  last-bit noise of a new build into a "regression".
- latency: the median of this run's per-iteration samples against the baseline's; fails only
  when, with the stated one-sided confidence, the median ratio exceeds 1 + threshold (a seeded
  bootstrap over both sets of samples) and the median grew by at least `min_delta_ms`. With
  `control = "probe"` the runner times a fixed CPU probe just before each iteration, in the
  same process, and the gate compares the fastest tenth of the iterations over the fastest
  tenth of the probes: a machine busy with other work slows both, and descheduled iterations
  (which only ever add time) stay out of it.
- determinism: a second run on the same device gave bit-identical outputs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from verify.ci.results import (
    FAIL,
    NO_BASELINE,
    RECORDED,
    PASS,
    GateResult,
    Latency,
    TensorError,
    fmt3,
    num,
)
from verify.ci.suite import GateSettings

BOOTSTRAP_ROUNDS = 2000
CONTROL_QUANTILE = 0.1    # the quantile judged over the control probe (see latency())


def _controlled(samples: Sequence[float], control: Sequence[float], q: float) -> float:
    return float(np.quantile(samples, q) / max(float(np.quantile(control, q)), 1e-12))


def _controlled_bound(current: Latency, base: Latency, confidence: float, seed: int,
                      q: float, rounds: int = BOOTSTRAP_ROUNDS) -> float:
    """Lower one-sided bootstrap bound of the controlled ratio (each of the four sample sets
    resampled on its own)."""
    rng = np.random.default_rng(seed)

    def stat(x: Sequence[float]) -> np.ndarray:
        a = np.asarray(x, float)
        return np.quantile(rng.choice(a, (rounds, a.size)), q, axis=1)

    now = stat(current.samples_ms) / np.maximum(stat(current.control_ms), 1e-12)
    then = stat(base.samples_ms) / np.maximum(stat(base.control_ms), 1e-12)
    return float(np.quantile(now / np.maximum(then, 1e-12), 1.0 - confidence))


def accuracy(outputs: Sequence[TensorError], layers: Sequence[TensorError] = ()) -> GateResult:
    bad = [t for t in outputs if not t.passed]
    bad_layers = [t for t in layers if not t.passed]
    first_layer = min(bad_layers, key=lambda t: (t.case, t.index)) if bad_layers else None
    details = {"outputs_checked": len(outputs), "outputs_failed": len(bad),
               "layers_checked": len(layers), "layers_failed": len(bad_layers),
               "first_failing_output": bad[0].to_dict() if bad else None,
               "first_divergent_layer": first_layer.to_dict() if first_layer else None}
    if not bad and not bad_layers:
        what = f"{len(outputs)} output(s)" + (f", {len(layers)} layer(s)" if layers else "")
        return GateResult("accuracy", PASS, f"{what} within tolerance", details)
    parts = []
    if bad:
        parts.append(f"{len(bad)} of {len(outputs)} output(s) over tolerance; first "
                     f"{bad[0].name} (case {bad[0].case}): {bad[0].numbers()}")
    if first_layer:
        parts.append(f"first divergent layer {first_layer.describe()}")
    return GateResult("accuracy", FAIL, "; ".join(parts), details)


def _worse(rows: Sequence[TensorError], base: Mapping[str, float],
           settings: GateSettings) -> tuple[list[dict[str, object]], list[str]]:
    worse, new = [], []
    for t in rows:
        if t.key not in base:
            new.append(t.key)
            continue
        b = base[t.key]
        slack = settings.regression_min_units * t.threshold if math.isfinite(t.threshold) else 0.0
        limit = settings.regression_factor * max(b, slack) if math.isfinite(b) else math.inf
        if math.isnan(t.max_abs) or t.max_abs > limit:
            worse.append({"tensor": t.name, "op": t.op, "case": t.case, "index": t.index,
                          "max_abs": num(t.max_abs), "baseline_max_abs": num(b),
                          "limit": num(limit), "ratio": num(t.max_abs / b) if b else "inf"})
    return worse, new


def regression(outputs: Sequence[TensorError], layers: Sequence[TensorError],
               base_outputs: Mapping[str, float] | None, base_layers: Mapping[str, float],
               settings: GateSettings, baseline_name: str) -> GateResult:
    if base_outputs is None:
        return GateResult("regression", NO_BASELINE, f"no baseline at {baseline_name}")
    worse, new = _worse(outputs, base_outputs, settings)
    worse_layers, new_layers = _worse(layers, base_layers, settings)
    details = {"factor": settings.regression_factor, "min_units": settings.regression_min_units,
               "worse_outputs": worse, "worse_layers": worse_layers,
               "not_in_baseline": new + new_layers, "baseline": baseline_name}
    if layers and not base_layers:  # every layer unjudged, not one word said of it
        note = (f" ({len(layers)} layer(s) not judged: the baseline was recorded without "
                "layers; refresh it with --update-goldens)")
    else:
        unknown = len(new + new_layers)
        note = f" ({unknown} tensor(s) not in the baseline)" if unknown else ""
    if not worse and not worse_layers:
        return GateResult("regression", PASS, f"no error grew beyond "
                          f"{settings.regression_factor:g}x the baseline{note}", details)
    first = first_worse(details)
    kind = f"layer #{first['index']} {first['op']}" if worse_layers else "output"
    return GateResult(
        "regression", FAIL,
        f"{len(worse)} output(s), {len(worse_layers)} layer(s) worse than "
        f"{settings.regression_factor:g}x the baseline; first {kind} {first['tensor']}: "
        f"max_abs={fmt3(first['max_abs'])} vs baseline {fmt3(first['baseline_max_abs'])} "
        f"(limit {fmt3(first['limit'])}){note}", details)


def first_worse(details: Mapping[str, Any]) -> dict[str, Any] | None:
    """The tensor a failed regression gate is named by: its first worse layer (where the error
    starts to grow), else its first worse output. Every report names the same one."""
    found = [*details.get("worse_layers", []), *details.get("worse_outputs", [])]
    return found[0] if found else None


def _seed(job_id: str) -> int:
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")


def median_ratio_bound(current: Sequence[float], base: Sequence[float], confidence: float,
                       seed: int, rounds: int = BOOTSTRAP_ROUNDS, q: float = 0.5) -> float:
    """Lower one-sided bootstrap bound of quantile_q(current) / quantile_q(base) (the median
    by default)."""
    rng = np.random.default_rng(seed)
    c, b = np.asarray(current, float), np.asarray(base, float)
    mc = np.quantile(rng.choice(c, (rounds, c.size)), q, axis=1)
    mb = np.quantile(rng.choice(b, (rounds, b.size)), q, axis=1)
    ratios = mc / np.maximum(mb, 1e-12)
    return float(np.quantile(ratios, 1.0 - confidence))


def no_latency_baseline(machine: str, where: str, recorded: bool) -> GateResult:
    """The latency gate's verdict when this machine has no latency baseline."""
    if recorded:
        return GateResult("latency", RECORDED,
                          f"no latency baseline for machine {machine}: this run's samples were "
                          f"recorded as one at {where} (judged from the next run on)",
                          {"machine": machine, "baseline": where})
    return GateResult("latency", NO_BASELINE, f"no latency baseline for machine {machine} "
                      f"at {where}", {"machine": machine, "baseline": where})


def latency(current: Latency | None, base: Latency | None, settings: GateSettings,
            job_id: str, baseline_name: str, machine: str = "") -> GateResult:
    if base is None or not base.samples_ms:
        return no_latency_baseline(machine, baseline_name, recorded=False)
    if current is None or not current.samples_ms:
        return GateResult("latency", FAIL, "no timing samples from this run")
    controlled = settings.latency_control == "probe"
    note = ""
    if controlled and not (current.has_control and base.has_control):
        controlled = False
        note = (" [control probe missing " + ("from the baseline: re-record it with "
                "--update-goldens" if current.has_control else "from this run: the runner "
                "does not time it") + "; compared as measured]")
    if controlled:
        # Over the control, low quantiles of the iterations and of the probes, each on its own:
        # other work only ever adds time, and on a machine busy enough most iterations are
        # descheduled while the probe beside them was not (or the other way round, which would
        # put outliers on both sides of a per-pair ratio); the fastest tenth of each is what
        # the work costs at this moment's CPU speed
        q = CONTROL_QUANTILE
        cm = _controlled(current.samples_ms, current.control_ms, q)
        bm = _controlled(base.samples_ms, base.control_ms, q)
        scale = float(np.quantile(base.control_ms, q))   # back to ms on the baseline's machine
        bound = _controlled_bound(current, base, settings.latency_confidence, _seed(job_id), q)
    else:
        q, scale = 0.5, 1.0
        cm, bm = float(np.median(current.samples_ms)), float(np.median(base.samples_ms))
        bound = median_ratio_bound(current.samples_ms, base.samples_ms,
                                   settings.latency_confidence, _seed(job_id))
    ratio = cm / bm if bm > 0 else math.inf
    limit = 1.0 + settings.latency_threshold
    slower = bound > limit and (cm - bm) * scale >= settings.latency_min_delta_ms
    details = {"median_ms": num(current.median_ms), "baseline_median_ms": num(base.median_ms),
               "ratio": num(ratio), "ratio_lower_bound": num(bound),
               "confidence": settings.latency_confidence,
               "threshold": settings.latency_threshold,
               "min_delta_ms": settings.latency_min_delta_ms,
               "control": "probe" if controlled else "none", "statistic": f"p{q * 100:g}",
               "machine": machine,
               "samples": len(current.samples_ms), "baseline_samples": len(base.samples_ms)}
    if controlled:
        details.update(control_median_ms=num(current.control_median_ms),
                       baseline_control_median_ms=num(base.control_median_ms))
    conf = f"{settings.latency_confidence:.0%}"
    text = (f"median {current.median_ms:.4g} ms vs baseline {base.median_ms:.4g} ms")
    if controlled:
        text += (f", control probe {current.control_median_ms:.4g} ms vs "
                 f"{base.control_median_ms:.4g} ms ({ratio:.2f}x over the control, fastest "
                 "tenths")
    else:
        text += f" ({ratio:.2f}x"
    text += f"; {conf} lower bound {bound:.2f}x, limit {limit:.2f}x){note}"
    return GateResult("latency", FAIL if slower else PASS,
                      ("slower: " if slower else "") + text, details)


def determinism(first: Sequence[Mapping[str, np.ndarray]],
                second: Sequence[Mapping[str, np.ndarray]]) -> GateResult:
    """Bit-identical outputs across two runs (NaNs with the same bits count as equal)."""
    differing = []
    for ci, (a_case, b_case) in enumerate(zip(first, second)):
        for name, a in a_case.items():
            b = b_case.get(name)
            if b is None or a.shape != b.shape or a.dtype != b.dtype \
                    or a.tobytes() != b.tobytes():
                diff = math.nan
                if b is not None and a.shape == b.shape and a.dtype.kind in "fiu":
                    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)),
                                        initial=0.0))
                differing.append({"case": ci, "tensor": name, "max_abs": num(diff)})
    details = {"differing": differing}
    if not differing:
        return GateResult("determinism", PASS, "two runs gave bit-identical outputs", details)
    d = differing[0]
    return GateResult("determinism", FAIL,
                      f"{len(differing)} output(s) differ between two runs; first {d['tensor']} "
                      f"(case {d['case']}) by max_abs={fmt3(d['max_abs'])}", details)
