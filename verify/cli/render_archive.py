"""Rendering the archive commands (`pack`, `inspect`, `inspect MODEL`): summaries of a testcase
or a model as JSON documents, and their text form. Part of the CLI layer, like render.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from verify.cli.render import console, fmt_bytes, fmt_shape, session_flags
from verify.tolerance import describe_record

if TYPE_CHECKING:
    from verify.testcase import Testcase


# --- pack / inspect -----------------------------------------------------------------------------
def _model_info(model_bytes: bytes, where: str, external: Sequence[Any] = ()) -> dict[str, Any]:
    import onnx

    from verify.graph import count_ops, graph_and_bodies, opset_of, parse_model

    model = parse_model(model_bytes, where, external)  # corrupt: one ModelError line, exit 2
    g = model.graph
    inits = {i.name for i in g.initializer}
    graphs = list(graph_and_bodies(g))  # bodies too: silero VAD's weights are in If bodies
    initializers = [i for sub in graphs for i in sub.initializer]
    constants = [n for sub in graphs for n in sub.node
                 if n.op_type == "Constant" and n.domain in ("", "ai.onnx")]

    def io(values: Any) -> list[dict[str, Any]]:
        out = []
        for v in values:
            if v.name in inits:
                continue
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                    else (d.dim_param or "?") for d in t.shape.dim]
            out.append({"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(
                t.elem_type).name if t.elem_type else "?", "shape": dims})
        return out

    return {"ir_version": model.ir_version, "opset": opset_of(model),
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "nodes": len(g.node), "subgraph_nodes": sum(len(sub.node) for sub in graphs[1:]),
            "initializers": len(initializers),
            "constant_nodes": len(constants),
            # weights held by Constant nodes count too (PaddlePaddle's exports keep them there)
            "parameters": int(sum(np.prod(i.dims, dtype=np.int64) for i in initializers)
                              + sum(_constant_elements(n) for n in constants)),
            "ops": count_ops(g.node), "inputs": io(g.input), "outputs": io(g.output),
            "size_bytes": len(model_bytes),
            "external_data": [{"location": f.location, "bytes": f.size} for f in external]}


def _constant_elements(node: Any) -> int:
    """How many values a Constant node holds (its one value attribute, of whichever kind)."""
    for a in node.attribute:
        if a.name == "value":
            return int(np.prod(a.t.dims, dtype=np.int64))
        if a.name == "sparse_value":
            return int(np.prod(a.sparse_tensor.dims, dtype=np.int64))
        if a.name in ("value_floats", "value_ints", "value_strings"):
            return len(a.floats or a.ints or a.strings)
        if a.name in ("value_float", "value_int", "value_string"):
            return 1
    return 0


def _array_info(a: np.ndarray) -> dict[str, Any]:
    """dtype, shape, and over the finite values min, max and mean; a float array's NaN and
    Inf counts too, where it has any (the range alone hid them)."""
    info: dict[str, Any] = {"dtype": a.dtype.name, "shape": list(a.shape)}
    if a.size and a.dtype.kind in "fiub":
        # reductions in place, the mean accumulated in float64 chunk by chunk: copying the
        # finite values and casting them whole took 9x a 2 GB uint8 input's size (18.9 GB)
        mask = np.isfinite(a) if a.dtype.kind == "f" else None
        count = int(np.count_nonzero(mask)) if mask is not None else a.size
        kw: dict[str, Any] = {} if mask is None or count == a.size else {"where": mask}
        if count:
            info["min"] = float(np.min(a, initial=np.inf, **kw) if kw else a.min())
            info["max"] = float(np.max(a, initial=-np.inf, **kw) if kw else a.max())
            info["mean"] = float(np.mean(a, dtype=np.float64, **kw))
        del kw, mask  # gone before np.isnan's own mask is made
        if a.dtype.kind == "f" and count < a.size:
            info["nan"] = int(np.count_nonzero(np.isnan(a)))
            info["inf"] = int(a.size - count - info["nan"])
    return info


def _values(a: Mapping[str, Any], stats: str) -> str:
    """` range …` (`stats`, formatted from `a`) and the NaN/Inf counts, as pack and inspect
    print them after a tensor's dtype and shape."""
    text = stats.format(**a) if "min" in a else ""
    counts = [f"{a[key]} {label}" for key, label in (("nan", "NaN"), ("inf", "Inf"))
              if a.get(key)]
    if counts:
        text += (("; " if text else "  ") + ", ".join(counts)
                 + ("" if "min" in a else " (no finite value)"))
    return text


def inspect_summary(tc: "Testcase") -> dict[str, Any]:
    return {
        "archive": str(tc.path), "format_version": tc.format_version,
        "model": _model_info(tc.model_bytes, f"{tc.path}: the archive's model", tc.external),
        "cases": [{"index": i, "source": c.source,
                   "inputs": {k: _array_info(v) for k, v in c.inputs.items()},
                   "outputs": {k: _array_info(v) for k, v in c.outputs.items()}}
                  for i, c in enumerate(tc.cases)],
        "per_layer_references": tc.has_layers,
        "tensors": len(tc.tensor_order),
        "tolerances": dict(tc.tolerances),
        "tolerance_rule": describe_record(tc.tolerances),
        "provenance": tc.provenance,
    }


def model_summary(path: Path, model_bytes: bytes, external: Sequence[Any] = ()) -> dict[str, Any]:
    """`inspect` of a plain .onnx file: the model part of an archive's summary."""
    return {"model_file": str(path), "model": _model_info(model_bytes, str(path), external)}


def print_model(s: Mapping[str, Any]) -> None:
    con = console()
    con.print(f"[bold]{s['model_file']}[/bold]  (an ONNX model, not an archive: "
              "verify pack it to add inputs and ground truth)")
    _print_model_part(con, s["model"])


def pack_summary(tc: "Testcase", out: Path) -> dict[str, Any]:
    return {**inspect_summary(tc), "archive": str(out), "archive_bytes": out.stat().st_size}


def pack_text(s: Mapping[str, Any]) -> str:
    m = s["model"]
    lines = [f"packed {s['archive']} ({fmt_bytes(s['archive_bytes'])}): "
             f"{len(s['cases'])} case(s), {m['nodes']} nodes, opset {m['opset']}"
             + (", per-layer references" if s["per_layer_references"] else "")]
    for case in s["cases"]:
        for name, o in case["outputs"].items():
            rng = _values(o, " range [{min:.4g}, {max:.4g}]")
            lines.append(f"  case {case['index']}: {name} {o['dtype']}{fmt_shape(o['shape'])}{rng}")
    prov = s["provenance"]
    ref = str(prov.get("reference", ""))
    if "torch" in prov:
        lines.append(f"ground truth: {ref}")
        lines.extend(torch_pack_lines(prov))
    else:
        lines.append(f"ground truth: {ref}" + ("" if ref.startswith("given") else
                     f" (onnxruntime {prov.get('onnxruntime', '?')})"))
        lines.extend(given_pack_lines(prov))
    return "\n".join(lines)


def given_pack_lines(prov: Mapping[str, Any]) -> list[str]:
    """What onnxruntime on this host gave against `pack --expected`'s outputs."""
    from verify import schema

    check = prov.get(schema.PROV_HOST_VS_GIVEN)
    if not isinstance(check, Mapping):
        return []
    ort = f"onnxruntime {prov.get('onnxruntime', '?')} on this host"
    first = check.get("first")
    if not first:
        return [f"{ort} matches the given outputs within the archive's tolerances"]
    err = first.get("max_abs")
    err_text = f"max abs err {err:.3g}" if isinstance(err, (int, float)) else "non-finite values"
    return [f"WARNING: {ort} already differs from the given outputs: {first['tensor']!r} of "
            f"case {first['case']}, {err_text}; {len(check.get('failing', []))} output(s) over "
            "tolerance. A device will likely differ there too: check that the given outputs "
            "come from this model and these inputs (or widen the tolerances)"]


def torch_pack_lines(prov: Mapping[str, Any]) -> list[str]:
    """What a PyTorch reference found: the mapping of FX nodes, and onnxruntime on this host."""
    from verify import schema

    lines = []
    mapping = prov.get(schema.PROV_TORCH_MAP)
    if mapping:
        unmapped = mapping.get("unmapped", [])
        lines.append(f"per-layer: {mapping['mapped']} of {mapping['onnx_tensors']} ONNX tensors "
                     f"hold PyTorch's value (mapped by {mapping['how']}); {len(unmapped)} FX "
                     "node(s) map onto no tensor (listed in the provenance: verify inspect "
                     "--json)")
    check = prov.get(schema.PROV_HOST_CHECK) or {}
    first = check.get("first")
    if first:
        where = f" ({first['module']})" if first.get("module") else ""
        lines.append(f"WARNING: onnxruntime {prov.get('onnxruntime', '?')} on this host already "
                     f"differs from PyTorch: the export changed the numbers; first at "
                     f"{first['tensor']!r} (node {first['node']}, op {first['op']}){where}, "
                     f"max abs err {first['max_abs']:.3g}; {len(check.get('failing', []))} "
                     "tensor(s) over tolerance")
    elif check:
        lines.append(f"onnxruntime {prov.get('onnxruntime', '?')} on this host matches PyTorch "
                     f"({check.get('compared', 'outputs')}) within the archive's tolerances")
    return lines


def _print_model_part(con: Any, m: Mapping[str, Any]) -> None:
    from rich.table import Table

    held = (f" + {m['constant_nodes']} Constant nodes" if m.get("constant_nodes") else "")
    inner = (f" (+ {m['subgraph_nodes']} in If/Loop/Scan bodies)" if m.get("subgraph_nodes")
             else "")
    con.print(f"model: {m['nodes']} nodes{inner}, {m['initializers']} initializers{held} "
              f"({m['parameters']:,} parameters), opset {m['opset']}, IR {m['ir_version']}, "
              f"{fmt_bytes(m['size_bytes'])}, producer {m['producer'] or '?'}")
    if m.get("external_data"):
        files = m["external_data"]
        con.print(f"external data: {len(files)} file(s), "
                  f"{fmt_bytes(sum(f['bytes'] for f in files))} "
                  f"({', '.join(f['location'] for f in files[:4])}{' …' if len(files) > 4 else ''})")
    ops = ", ".join(f"{k} {v}" for k, v in list(m["ops"].items())[:12])
    con.print(f"ops: {ops}{' …' if len(m['ops']) > 12 else ''}")
    table = Table(title=None, show_edge=False, pad_edge=False)
    for col in ("", "name", "dtype", "shape"):
        table.add_column(col)
    for kind, items in (("input", m["inputs"]), ("output", m["outputs"])):
        for item in items:
            table.add_row(kind, item["name"], item["dtype"], fmt_shape(item["shape"]))
    con.print(table)


def print_inspect(s: Mapping[str, Any]) -> None:
    con = console()
    m = s["model"]
    con.print(f"[bold]{s['archive']}[/bold]  (archive format v{s['format_version']})")
    _print_model_part(con, m)
    for case in s["cases"]:
        con.print(f"case {case['index']}: {case['source'] or ''}")
        for role in ("inputs", "outputs"):
            for name, a in case[role].items():
                rng = _values(a, "  min {min:.4g} max {max:.4g} mean {mean:.4g}")
                con.print(f"  {role[:-1]:6} {name}: {a['dtype']}{fmt_shape(a['shape'])}{rng}")
    inside = s["model"].get("subgraph_nodes", 0)  # onnxruntime marks no body's tensor
    con.print(f"per-layer references: {'yes' if s['per_layer_references'] else 'no'} "
              f"({s['tensors']} tensors in graph order"
              + (f"; the tensors of the {inside} nodes inside If/Loop/Scan bodies are not "
                 "among them" if inside else "") + ")")
    con.print(f"tolerances: {s['tolerance_rule']}")
    if "integrity" in s:
        con.print(f"integrity: {s['integrity']}")
    p = s["provenance"]
    con.print(f"provenance: {p.get('reference', '')}; onnxruntime {p.get('onnxruntime')}, "
              f"onnx {p.get('onnx')}, numpy {p.get('numpy')}, verify {p.get('verify')}; "
              f"{p.get('host_arch')} {p.get('host_os')}; {p.get('created_utc')}; "
              f"model sha256 {str(p.get('model_sha256', ''))[:16]}…")
    origin = p.get("repro_of")
    if isinstance(origin, Mapping):
        nodes = ", ".join(map(str, origin.get("nodes", ()))) or "?"
        con.print(f"repro of: {origin.get('archive') or '?'} case {origin.get('case', '?')}, "
                  f"node(s) {nodes}", soft_wrap=True)
        if origin.get("device"):
            con.print(f"  {origin.get('verdict') or 'found'} on device {origin['device']} at "
                      f"--opt-level {origin.get('opt_level') or '?'}: reproduce with "
                      f"`verify run {s['archive']} --device {origin['device']} "
                      f"{_replay_flags(origin)}`", soft_wrap=True)


def _replay_flags(origin: Mapping[str, Any]) -> str:
    """The session options a repro's search ran with, as `run` takes them (a provenance
    written before providers and threads were recorded has neither)."""
    providers = origin.get("providers")
    threads = origin.get("threads")
    return session_flags(str(origin.get("opt_level") or "all"),
                         [str(p) for p in providers] if isinstance(providers, list) else [],
                         threads if isinstance(threads, int) else 0)
