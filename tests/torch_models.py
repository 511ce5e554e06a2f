"""Real torchvision architectures for the PyTorch-reference tests, random weights (no download).

The torchvision wheel on the package index is a CUDA build: its compiled ops (`_C.so`, linked
against libtorch_cuda) cannot load against the CPU-only torch (`torch==2.13.0+cpu`), and
torchvision 0.28's import then fails on registering a fake kernel for `torchvision::nms`. The
architectures themselves are pure Python and need none of those ops, so when the compiled ops
are missing the two op schemas that import expects are declared (schemas only: no kernel, nms
stays unusable) and torchvision's own model code is used unchanged.

Factories for `verify pack --reference torch:tests/torch_models.py:resnet18`.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

SIZE = (1, 3, 64, 64)
_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_LIBRARY: list[Any] = []  # the declared schemas live as long as the process


def torchvision_models() -> Any:
    """`torchvision.models`, importable with the CPU-only torch (see the module doc)."""
    import torch

    try:
        return importlib.import_module("torchvision.models")
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        library.define(schema)
    _LIBRARY.append(library)
    return importlib.import_module("torchvision.models")


def example(seed: int = 0) -> Any:
    import torch

    return torch.randn(*SIZE, generator=torch.Generator().manual_seed(seed))


def build(arch: str, seed: int = 0) -> Any:
    import torch

    torch.manual_seed(seed)
    return getattr(torchvision_models(), arch)(weights=None).eval()


def resnet18() -> tuple[Any, tuple[Any, ...]]:
    return build("resnet18"), (example(),)


def mobilenet_v3_small() -> tuple[Any, tuple[Any, ...]]:
    return build("mobilenet_v3_small"), (example(),)
