"""Where an ONNX node came from in PyTorch: its module path (`layer3.1.conv2`) and source line.

Read from what the exporters leave in the model, so it needs no torch:
- torch.onnx's dynamo exporter (the default since torch 2.9) puts on every node the metadata
  `pkg.torch.onnx.name_scopes` (the module path, then the FX node's name) and
  `pkg.torch.onnx.stack_trace` (the Python frames that made it);
- the TorchScript exporter names nodes `/layer1/layer1.0/conv1/Conv` (the module scopes, then
  the op). A module called twice shows there as `relu_1`: that is the exporter's naming of the
  second call, reported as written, not guessed back.
A node whose parameters (initializers named `<module>.weight` / `.bias`) belong to another
module than its scope was fused by the exporter (a BatchNorm folded into the Conv before it):
both modules are named. A model from elsewhere has no origins (an empty map).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # diff of two dumps must not pay for importing onnx (test_imports)
    import onnx

SCOPES_KEY = "pkg.torch.onnx.name_scopes"
STACK_KEY = "pkg.torch.onnx.stack_trace"
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_PARAM = re.compile(r"^(.+)\.(weight|bias|running_mean|running_var)$")


@dataclass(frozen=True)
class Origin:
    """The PyTorch module(s) a node computes and the source line that called it."""

    modules: tuple[str, ...]   # module paths, '' for the top-level module itself
    source: str = ""           # 'mobilenetv3.py:112' (innermost frame outside torch itself)

    @property
    def module(self) -> str:
        return self.modules[-1] if self.modules else ""

    def describe(self) -> str:
        names = " + ".join(m or "(top-level module)" for m in self.modules)
        return f"{names} ({self.source})" if self.source else names

    def to_dict(self) -> dict[str, object]:
        return {"modules": list(self.modules), "source": self.source}


def torch_origins(model: onnx.ModelProto) -> dict[str, Origin]:
    """ONNX node name → its PyTorch origin, for the nodes an exporter left one on."""
    params = {init.name for init in model.graph.initializer}
    found: dict[str, Origin] = {}
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        scope = _dynamo_scope(meta.get(SCOPES_KEY))
        if scope is None:
            scope = _torchscript_scope(node.name)
        if scope is None:
            continue
        owners = []
        for name in node.input:
            hit = _PARAM.match(name) if name in params else None
            if hit and hit.group(1) != scope and hit.group(1) not in owners:
                owners.append(hit.group(1))
        found[node.name] = Origin(tuple(owners) + (scope,), source_line(meta.get(STACK_KEY, "")))
    return found


def tensor_origins(model: onnx.ModelProto) -> dict[str, Origin]:
    """ONNX tensor name → the origin of the node producing it."""
    by_node = torch_origins(model)
    return {out: by_node[node.name] for node in model.graph.node if node.name in by_node
            for out in node.output if out}


def _dynamo_scope(text: str | None) -> str | None:
    if not text:
        return None
    try:
        scopes = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(scopes, list) or len(scopes) < 2:
        return None
    return str(scopes[-2])  # the last is the FX node's own name


def _torchscript_scope(name: str) -> str | None:
    if not name.startswith("/") or name.count("/") < 2:
        return None
    path = ""
    for part in name.strip("/").split("/")[:-1]:
        path = part if not path or part.startswith(path + ".") else f"{path}.{part}"
    return path


def source_line(stack: str) -> str:
    """The innermost frame of a Python stack trace outside torch itself, as file:line."""
    frames = _FRAME.findall(stack)
    for file, line, _func in reversed(frames):
        if "/torch/" not in file.replace("\\", "/"):
            return f"{file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}"
    return ""


HOST = "host"      # onnxruntime on the packing host already differed from PyTorch there
DEVICE = "device"  # the packing host matched PyTorch there: the divergence is the device's


@dataclass(frozen=True)
class Attribution:
    """A divergent tensor in the user's terms: the PyTorch module(s) and source line of its
    node, and (an archive packed with a PyTorch reference) whether onnxruntime on the packing
    host already differed from PyTorch at that tensor."""

    origin: Origin | None
    where: str | None   # HOST, DEVICE, or None (no PyTorch reference to judge by)

    def lines(self) -> list[str]:
        out = []
        if self.origin is not None:
            out.append(f"PyTorch module: {self.origin.describe()}")
        if self.where == HOST:
            out.append("differs from PyTorch already on the host: onnxruntime on the packing "
                       "host gives the same divergence (the export changed the numbers)")
        elif self.where == DEVICE:
            out.append("only on the device: onnxruntime on the packing host matches PyTorch "
                       "at this tensor")
        return out

    def to_dict(self) -> dict[str, object]:
        return {"origin": self.origin.to_dict() if self.origin else None, "where": self.where}


def attribute(model: onnx.ModelProto | None, provenance: Mapping[str, Any] | None,
              tensor: str, node: str) -> Attribution | None:
    """The attribution of `tensor` (produced by `node`); None when there is nothing to say."""
    from verify import schema

    origin = torch_origins(model).get(node) if model is not None else None
    check = (provenance or {}).get(schema.PROV_HOST_CHECK)
    where = None
    if isinstance(check, Mapping):
        compared = check.get("tensors")  # absent in archives packed before it was recorded
        if tensor in set(check.get("failing") or ()):
            where = HOST
        elif compared is None or tensor in set(compared):
            where = DEVICE  # never said of a tensor not judged against PyTorch (unmapped, or
        # a layer of an archive packed without --layers): "matches PyTorch" was claimed there
    if origin is None and where is None:
        return None
    return Attribution(origin, where)
