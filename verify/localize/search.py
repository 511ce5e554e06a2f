"""The two searches for the faulty node, on top of device round trips that batch many pieces.

`DeviceRounds` sends one model (any number of pieces side by side) per round trip and counts the
trips. `References` hands out reference values of intermediate tensors, from the archive's
per-layer goldens or a host run. `rank_candidates` and `isolate` work from a per-layer
comparison; `bisect` needs none.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from verify.capture import HostCapture
from verify.check import require_outputs
from verify.compare import TensorDiff, tol_rank
from verify.devices import Profile
from verify.errors import DeviceError
from verify.external import ExternalData
from verify.pipeline import RunOptions, Status, run_model
from verify.session import DeviceSession
from verify.subgraph import Batch, NodeGraph, Segment, build_batch, split_points

Judge = Callable[[str, np.ndarray, np.ndarray], TensorDiff]


@dataclass(frozen=True)
class Round:
    """One device round trip: what it was for, how many pieces and nodes it ran."""

    purpose: str
    pieces: int
    nodes: int
    seconds: float
    bytes_sent: int
    failing: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"purpose": self.purpose, "pieces": self.pieces, "nodes": self.nodes,
                "seconds": round(self.seconds, 3), "bytes_sent": self.bytes_sent,
                "failing": list(self.failing)}


class References:
    """Reference values of one case's tensors: archive goldens first, else a host run, cached."""

    def __init__(self, model_bytes: bytes, feeds: Mapping[str, np.ndarray],
                 archive: Path | None = None, case: int = 0,
                 budget_bytes: int | None = None, fetch_all: bool = False,
                 model: onnx.ModelProto | None = None, external_dir: Path | None = None
                 ) -> None:
        """`archive`: read per-layer references from it (packed with --layers); `fetch_all`:
        everything fits in memory, so the first request reads (or computes) every tensor once
        and later rounds need no host run; otherwise only the tensors asked for are kept.
        `model`: `model_bytes` already parsed, for the host capture (not parsed again)."""
        self._model_bytes = model_bytes
        self._feeds = dict(feeds)
        self._values: dict[str, np.ndarray] = dict(feeds)
        self._archive = archive
        self._case = case
        self._budget = budget_bytes
        self._fetch_all = fetch_all
        self._model = model
        self._external_dir = external_dir
        self._host: HostCapture | None = None  # set up on the first host run, then reused
        self.source = "archive" if archive is not None else "host"

    def __enter__(self) -> References:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None

    def get(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        wanted = list(dict.fromkeys(names))
        missing = [n for n in wanted if n not in self._values]
        if missing:
            keep = None if self._fetch_all else set(missing)
            self._fetch_all = False
            if self._archive is not None:
                self._read_archive(keep)
                missing = [n for n in missing if n not in self._values]
            if missing:
                self._compute(None if keep is None else missing)
        return {n: self._values[n] for n in wanted if n in self._values}

    def _read_archive(self, keep: set[str] | None) -> None:
        from verify.archive_reader import iter_layers

        assert self._archive is not None
        for name, value in iter_layers(self._archive, self._case, keep):
            self._values.setdefault(name, value)

    def _compute(self, names: list[str] | None) -> None:
        if self._host is None:  # the model parsed and copied once per search, not per round
            self._host = HostCapture(self._model_bytes, budget_bytes=self._budget,
                                     model=self._model, external_dir=self._external_dir)
            self._model = None  # the capture keeps what it needs
        for name, value in self._host.layers(self._feeds, names):
            self._values.setdefault(name, np.asarray(value))


class DeviceRounds:
    """Runs models on one device, one round trip each, and keeps the count. A context manager:
    one device session (one connection, one serving runner where the runner offers it) for
    every round of the search, opened on the first round."""

    def __init__(self, profile: Profile, options: RunOptions, status: Status | None = None,
                 external: ExternalData | None = None):
        """`external`: the model's external data, sent with every piece (their weights
        point into it)."""
        self.profile = profile
        self.external = external
        self.options = options
        self.status = status
        self.rounds: list[Round] = []
        self.device_info: Mapping[str, object] = {}
        self.session: DeviceSession | None = None

    def __enter__(self) -> DeviceRounds:
        return self

    def __exit__(self, *exc: object) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.__exit__(*exc)  # type: ignore[arg-type]

    def run(self, model_bytes: bytes, feeds: Mapping[str, np.ndarray], purpose: str,
            pieces: int = 1, nodes: int = 0) -> dict[str, np.ndarray]:
        return self.run_cases(model_bytes, [feeds], purpose, pieces, nodes)[0]

    def run_cases(self, model_bytes: bytes, cases: Sequence[Mapping[str, np.ndarray]],
                  purpose: str, pieces: int = 1, nodes: int = 0) -> list[dict[str, np.ndarray]]:
        """One round trip running the model once per case; the outputs of each case."""
        if self.status:
            self.status(f"round {len(self.rounds) + 1}: {purpose}")
        t0 = time.perf_counter()
        if self.session is None:
            session = DeviceSession(self.profile, status=self.status, serve=True)
            self.session = session.__enter__()
        before = self.session.stats["bytes_put"]
        try:
            run = run_model(self.session, model_bytes, cases, self.options,
                            external=self.external)
        except DeviceError as exc:  # how far the search got: its progress shows on terminals only
            if exc.args and isinstance(exc.args[0], str):
                exc.args = (f"{exc.args[0]} (in round {len(self.rounds) + 1} of the search: "
                            f"{purpose})", *exc.args[1:])
            raise
        self.device_info = run.device
        sent = self.session.stats["bytes_put"] - before
        self.rounds.append(Round(purpose, pieces, nodes, time.perf_counter() - t0, sent))
        return [dict(c.outputs) for c in run.cases]

    def mark_failing(self, failing: Sequence[str]) -> None:
        last = self.rounds[-1]
        self.rounds[-1] = Round(last.purpose, last.pieces, last.nodes, last.seconds,
                                last.bytes_sent, tuple(failing))

    def run_batch(self, batch: Batch, refs: Mapping[str, np.ndarray], judge: Judge,
                  purpose: str) -> list[tuple[TensorDiff, ...]]:
        """Run every piece of `batch` in one trip; per piece, the diffs of its outputs."""
        nodes = sum(len(p.segment) for p in batch.pieces)
        outputs = self.run(batch.model.SerializeToString(), batch.feeds(refs), purpose,
                           pieces=len(batch.pieces), nodes=nodes)
        require_outputs(outputs, [t for p in batch.pieces for t in p.outputs], self.profile.spec)
        return [tuple(judge(t, outputs[t], refs[t]) for t in piece.outputs)
                for piece in batch.pieces]


@dataclass(frozen=True)
class BisectResult:
    lo: int
    hi: int
    diffs: tuple[TensorDiff, ...]    # the failing segment's outputs, fed reference inputs


def piece_io(ng: NodeGraph, segments: Sequence[Segment]) -> list[str]:
    return [t for s in segments for t in (*ng.segment_inputs(s), *ng.segment_outputs(s))]


def bisect(ng: NodeGraph, refs: References, device: DeviceRounds, judge: Judge,
           lo: int, hi: int, diffs: tuple[TensorDiff, ...], fanout: int = 2) -> BisectResult:
    """Narrow a failing range `[lo, hi)` to the smallest part that fails on its own.

    Each round cuts the range into about `fanout` parts (on single-tensor cuts where there are
    some, so a cut does not split a residual branch), runs them all side by side with reference
    boundary inputs in ONE device trip, and keeps the first failing part: O(log n) trips. When
    no part fails alone (the failure needs errors from several parts to add up), the range is
    trimmed from both ends to the smallest failing subgraph.
    """
    while hi - lo > 1:
        cuts = split_points(ng, lo, hi, fanout)
        bounds = [lo, *cuts, hi]
        segments = [Segment(a, b) for a, b in zip(bounds, bounds[1:])]
        values = refs.get(piece_io(ng, segments))
        batch = build_batch(ng, segments, values)
        what = _range_label(ng, Segment(lo, hi))
        results = device.run_batch(batch, values, judge,
                                   f"bisect {what} ({_nodes(hi - lo)}) in {len(segments)} parts")
        failing = [(seg, d) for seg, d in zip(segments, results) if not all(x.passed for x in d)]
        device.mark_failing([_range_label(ng, seg) for seg, _ in failing])
        if not failing:
            passed = {(seg.lo, seg.hi) for seg in segments}
            return _shrink(ng, refs, device, judge, lo, hi, diffs, passed)
        seg, diffs = failing[0]
        lo, hi = seg.lo, seg.hi
    return BisectResult(lo, hi, diffs)


def _shrink(ng: NodeGraph, refs: References, device: DeviceRounds, judge: Judge,
            lo: int, hi: int, diffs: tuple[TensorDiff, ...],
            passed: set[tuple[int, int]]) -> BisectResult:
    """Trim a failing range no part of which fails alone: binary-search the latest start that
    still fails, then the earliest end (O(log n) more trips, one piece each; ranges in `passed`
    are known to pass and not run again)."""
    def fails(a: int, b: int) -> tuple[TensorDiff, ...] | None:
        if (a, b) in passed:
            return None
        seg = Segment(a, b)
        values = refs.get(piece_io(ng, [seg]))
        result = device.run_batch(build_batch(ng, [seg], values), values, judge,
                                  f"trim to {_range_label(ng, seg)} ({_nodes(b - a)})")[0]
        failed = not all(d.passed for d in result)
        device.mark_failing([_range_label(ng, seg)] if failed else [])
        return result if failed else None

    # [lo, hi) fails and an empty range does not: move each end inwards while it still fails
    start, diffs = _edge(lo, hi, lambda mid: fails(mid, hi), diffs)
    end, diffs = _edge(hi, start, lambda mid: fails(start, mid), diffs)
    return BisectResult(start, end, diffs)


def _edge(failing: int, passing: int, fails_at: Callable[[int], tuple[TensorDiff, ...] | None],
          diffs: tuple[TensorDiff, ...]) -> tuple[int, tuple[TensorDiff, ...]]:
    """Binary search between a position that fails and one that does not (either side)."""
    while abs(passing - failing) > 1:
        mid = (failing + passing) // 2
        found = fails_at(mid)
        if found is not None:
            failing, diffs = mid, found
        else:
            passing = mid
    return failing, diffs


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def _range_label(ng: NodeGraph, seg: Segment) -> str:
    if len(seg) == 1:
        return ng.labels[seg.lo]
    return f"{ng.labels[seg.lo]} .. {ng.labels[seg.hi - 1]}"


def isolate(ng: NodeGraph, refs: References, device: DeviceRounds, judge: Judge,
            indices: Sequence[int], purpose: str) -> dict[int, tuple[TensorDiff, ...]]:
    """Run each node alone, fed reference inputs, all in ONE device trip."""
    segments = [Segment(i, i + 1) for i in sorted(set(indices))]
    values = refs.get(piece_io(ng, segments))
    batch = build_batch(ng, segments, values)
    results = device.run_batch(batch, values, judge, purpose)
    out = {seg.lo: d for seg, d in zip(segments, results)}
    device.mark_failing([ng.labels[i] for i, d in out.items() if not all(x.passed for x in d)])
    return out


def outputs_pass_note(outputs: Iterable[TensorDiff]) -> tuple[str, ...]:
    """What a report says of a node found over tolerance while every output passes (`run` of
    the same archive and tolerance exits 0): the fault is in a layer, not yet in a result."""
    outputs = list(outputs)
    if outputs and all(d.passed for d in outputs):
        return ("every output is within tolerance (verify run would pass): the node found is "
                "over it in the layers only",)
    return ()


def worst(diffs: Iterable[TensorDiff]) -> float:
    """The largest error in units of the tolerance (0 when there is nothing, or no figure)."""
    return max((max(tol_rank(d), 0.0) for d in diffs), default=0.0)


def rank_candidates(ng: NodeGraph, cumulative: Mapping[str, TensorDiff]) -> list[int]:
    """Nodes with an output over tolerance, where the error jumps most first.

    A node whose inputs are all within tolerance while an output is not comes before any node
    that inherited a failing input; within each group the larger jump (own / inherited) first.
    """
    scored = []
    for i in range(len(ng)):
        outs = [cumulative[t] for t in ng.makes(i) if t in cumulative]
        if not outs or all(d.passed for d in outs):
            continue
        ins = [cumulative[t] for t in ng.reads(i) if t in cumulative]
        inherited_ok = all(d.passed for d in ins)
        before, after = max(worst(ins), 1e-3), worst(outs)
        # NaN in, NaN out (both +inf tolerance units) is no jump: inf/inf would be NaN, which
        # no sort can place
        jump = 1.0 if math.isinf(before) and math.isinf(after) else after / before
        scored.append((not inherited_ok, -jump, i))
    return [i for *_, i in sorted(scored)]


def path_to(ng: NodeGraph, index: int, error_of: Callable[[str], float] | None = None) -> list[str]:
    """Tensors from a graph input to node `index`'s input, walking back along the inputs with
    the largest error (the first computed input when errors are unknown)."""
    chain: list[str] = []
    current = index
    seen: set[str] = set()
    while True:
        reads = [t for t in ng.reads(current) if t not in seen]
        if not reads:
            break
        pick = max(reads, key=error_of) if error_of else reads[0]
        chain.append(pick)
        seen.add(pick)
        if pick not in ng.producer:
            break
        current = ng.producer[pick]
    return list(reversed(chain))
