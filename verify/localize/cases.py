"""Which case localize searches with, what the device is judged against, how much memory a
per-layer reference of the case needs, the full run's errors on the path to a suspect found,
and the notes said of a suspect (control flow, rounding)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from verify.dtypes import float_eps
from verify.graph import graph_and_bodies, node_bodies
from verify.errors import DeviceError
from verify.localize.search import DeviceRounds, References, path_to
from verify.rules import MagnitudeRule
from verify.shapes import tensor_sizes
from verify.testcase import Testcase


def choose_case(tc: Testcase, asked: int | None, device: DeviceRounds, check: Any,
                 nodes: int) -> tuple[int, dict[str, np.ndarray] | None, tuple[str, ...]]:
    """The case to localize with: the one asked for, the only one, or the first whose outputs
    fail in one plain run of every case (whose outputs are returned for reuse)."""
    if asked is not None or len(tc.cases) == 1:
        return asked or 0, None, ()
    runs = device.run_cases(tc.model_bytes, [c.inputs for c in tc.cases],
                            f"the whole model, {len(tc.cases)} cases", nodes=nodes)
    for i, (case, outs) in enumerate(zip(tc.cases, runs)):
        if not all(d.passed for d in check(outs, case.outputs)):
            return i, runs[i], (f"case {i} is the first of {len(tc.cases)} whose outputs fail",)
    return 0, runs[0], (f"all {len(tc.cases)} cases pass at the outputs; using case 0",)


def activation_bytes(model: Any, tc: Any, case_index: int) -> tuple[int, int]:
    """What a per-layer reference of one case holds in memory, and how many tensor sizes were
    not derivable: sizes from shape inference with the case's concrete input shapes
    (`shapes.tensor_sizes`); one it cannot derive counts as the case's largest input."""
    inputs = tc.cases[case_index].inputs
    sizes = tensor_sizes(model, [{k: np.shape(v) for k, v in inputs.items()}])
    fallback = max((int(np.asarray(v).nbytes) for v in inputs.values()), default=1)
    unknown = sum(1 for v in sizes.values() if v is None)
    return sum(fallback if v is None else v for v in sizes.values()), unknown


def reference_outputs(given: Mapping[str, np.ndarray], refs: References, check: Any,
                      constants: Collection[str] = (), packed_by: str = ""
                      ) -> tuple[Mapping[str, np.ndarray], tuple[str, ...]]:
    """What the device's outputs are judged against: the archive's ground truth `given`,
    unless this host's own onnxruntime run, whose values judge every piece of the search,
    already fails it (an archive packed with --expected, or a PyTorch reference, whose
    numbers onnxruntime does not reproduce; `pack` warned). A healthy device was then told
    the whole model was a failing subgraph, a fusion bug, with a repro that passes. Then the
    host's outputs, and a note saying why; not for onnxruntime's own ground truth (see
    below). An output in `constants` (an initializer, a
    Constant's value: the host capture computes no such tensor and was asked for one), or one
    the host does not capture, is the archive's own."""
    host = {**given, **refs.get(n for n in given if n not in constants)}
    bad = [d for d in check(host, given) if not d.passed]
    if not bad:
        return given, ()
    d = bad[0]
    found = (f"is over tolerance against the archive's ground truth ({d.name!r}: max|a-r| "
             f"{d.max_abs:.3g}")
    if packed_by.startswith("onnxruntime"):
        # onnxruntime's own ground truth, which a plain run here reproduces: the capture's
        # values differ where marking every tensor as an output changed what onnxruntime
        # computes (an fp16 model's intermediates, kept in float32 unmarked, rounded to
        # float16). Judged against them, a healthy device at the packing settings was a
        # "failing subgraph".
        return given, (f"this host's per-layer capture {found}): marking every tensor as an "
                       "output can change what onnxruntime computes (an fp16 model's "
                       "intermediates are then rounded to float16), or the archive was packed "
                       "with another onnxruntime build or CPU; the device's outputs are judged "
                       "against the archive's, as `verify run` judges them, and its layers "
                       "against this capture",)
    return host, (f"this host's own onnxruntime run {found}; given with --expected or by a "
                  "PyTorch reference?): the device is judged against this host's outputs, as "
                  "every piece of the search is; `verify run` judges it against the archive's",)


def control_flow_note(node: Any) -> tuple[str, ...]:
    """For a suspect that is an If, Loop or Scan: the search treats it as one node and does not
    look inside its bodies, and its repro holds them whole (it said nothing of either)."""
    if node.op_type not in ("If", "Loop", "Scan"):
        return ()

    inside = sum(len(g.node) for body in node_bodies(node) for g in graph_and_bodies(body))
    return (f"{node.name or node.op_type} is a control-flow node ({node.op_type}): localize "
            f"treats it as one node and does not search its bodies ({inside} nodes; onnxruntime "
            "cannot mark a body's tensors as outputs), so the repro holds the whole node",)


def rounding_note(label: str, own: "tuple[Any, ...]") -> tuple[str, ...]:
    """For a node (or subgraph) found over a tolerance tighter than its dtype's arithmetic:
    its own error is a few units in the last place of its output's peak, which is what a
    different summation order or a fused kernel gives, not a wrong result. Said only when every
    own difference over tolerance is that small (at most 16 ulps of the peak)."""
    over = [d for d in own if not d.passed]
    if not over:
        return ()
    ulps = []
    for d in over:
        try:
            eps = float_eps(np.dtype(d.actual_dtype))
        except TypeError:  # a dtype name numpy does not know
            eps = None
        if eps is None or not (np.isfinite(d.max_abs) and np.isfinite(d.ref_peak)
                               and d.ref_peak > 0):
            return ()  # an integer or unknown dtype: no rounding to speak of
        ulps.append(d.max_abs / (eps * d.ref_peak))
    if max(ulps) > 16:
        return ()
    d = over[int(np.argmax(ulps))]
    default = MagnitudeRule().k_for(np.dtype(d.actual_dtype))  # 2^9 eps: 2^-14 for float32
    return (f"{label}'s own error ({d.max_abs:.3g} at {d.name}) is {max(ulps):.1f} "
            f"{d.actual_dtype} ulp(s) of the output's peak ({d.ref_peak:.3g}): rounding, as a "
            "different summation order or a fused kernel gives, not a wrong result; the "
            f"tolerance is tighter than {d.actual_dtype} arithmetic keeps (the default rule "
            f"allows 2^{round(np.log2(default))} of the peak)",)


def path_errors(ng: Any, refs: References, device: DeviceRounds, judge: Any, lo: int, hi: int,
                known: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Full-run errors (TensorDiffs) on the way to the suspect `[lo, hi)`: known from a dump,
    else one prefix run on the device. That round only adds to what is found: a device
    failing in it leaves them unmeasured, said in a note, and keeps the suspect and its repro
    (a device lost there threw a whole search away, exit 3)."""
    from verify.subgraph import Segment, build_batch

    wanted = [t for t in dict.fromkeys([*path_to(ng, lo), *ng.segment_inputs(Segment(lo, hi)),
                                        *ng.makes(lo)]) if t in ng.producer]
    if all(t in known for t in wanted):
        return dict(known), ()
    prefix = Segment(0, max(hi, lo + 1), extra_outputs=tuple(wanted))
    values = refs.get([*ng.graph_inputs, *ng.segment_outputs(prefix), *wanted])
    batch = build_batch(ng, [prefix], values)
    try:
        outs = device.run(batch.model.SerializeToString(), batch.feeds(values),
                          "errors on the path to the suspect", nodes=len(prefix))
    except DeviceError as exc:
        return dict(known), (f"the full run's errors on the path to the suspect were not "
                             f"measured: the device failed in that last round ({exc})",)
    return {**known, **{t: judge(t, outs[t], values[t]) for t in wanted if t in outs}}, ()
