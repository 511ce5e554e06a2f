"""The repro archive: the failing node (or smallest failing subgraph) as an ordinary `.vtc`."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verify.external import inline_external
from verify.files import check_output_file
from verify.graph import sha256_bytes, tensor_order
from verify.reference import reference_session, run_reference
from verify.subgraph import NodeGraph, Segment, build_batch, sanitize
from verify.testcase import Case, Testcase, write_archive


def repro_label(first: str, last: str | None = None) -> str:
    """A node's name, or a subgraph's first and last, each made safe for a file name on its
    own (`/model.6/.../Sigmoid-/model.6/.../Mul` kept the second's leading '/' as '_')."""
    return first if last is None else f"{sanitize(first, 29)}-{sanitize(last, 29)}"  # 60 in all


def repro_path(archive: Path, label: str, out_dir: Path | None = None,
               case: int | None = None) -> Path:
    """`<dir>/<archive stem>.repro-<node>.vtc`, the node name made safe for a file name, and
    `.case<N>` before `.vtc` where the archive holds several cases (each case's repro holds
    its own boundary values: the search of case 1 overwrote case 0's)."""
    folder = out_dir if out_dir is not None else archive.parent
    which = "" if case is None else f".case{case}"
    path = folder / f"{archive.stem}.repro-{sanitize(label)}{which}.vtc"
    check_output_file(path, "the repro", [("the archive", archive)])  # not a link or device
    return path


def write_repro(path: Path, ng: NodeGraph, segment: Segment, reference: Mapping[str, Any],
                source: Testcase, case_index: int, tolerances: Mapping[str, Any],
                found: Mapping[str, Any], external_dir: Path | None = None) -> Testcase:
    """Cut `segment` out with its boundary inputs; ground truth is recomputed on this host.

    The ground truth comes from the same reference `pack` uses (ONNX Runtime CPU, graph
    optimizations off) run on the cut model, so `verify run --device local` passes it.
    `found` (device, node, errors) goes into the provenance beside where the cut came from.
    `external_dir`: where the source model's external data lies; the repro holds the weights
    its nodes read (one self-contained message, as long as they fit in 2 GiB).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = build_batch(ng, [segment], reference, name=f"repro-{sanitize(found.get('node', ''))}")
    if external_dir is not None:
        inline_external(batch.model, external_dir, path.name)
    model_bytes = batch.model.SerializeToString()
    feeds = batch.feeds(reference)
    outputs = run_reference(reference_session(model_bytes, path.name), feeds, path.name)
    prov = dict(source.provenance)
    prov.update({
        "model_file": path.name,
        "model_sha256": sha256_bytes(model_bytes),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "repro_of": {
            "archive": str(source.path) if source.path else "",
            "model_sha256": source.provenance.get("model_sha256", sha256_bytes(source.model_bytes)),
            "case": case_index,
            "nodes": [ng.labels[i] for i in range(segment.lo, segment.hi)],
            "inputs_from": "reference values of the original model's tensors",
            **dict(found),
        },
    })
    tc = Testcase(model_bytes=model_bytes,
                  cases=(Case(inputs=feeds, outputs=outputs,
                              source=f"boundary reference values from {source.path} "
                                     f"case {case_index}"),),
                  tensor_order=tuple(tensor_order(batch.model)),
                  tolerances=dict(tolerances), provenance=prov)
    write_archive(path, tc)
    return tc
