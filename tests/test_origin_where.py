"""Where a divergence is said to start, against PyTorch: "only on the device: onnxruntime on the
packing host matches PyTorch at this tensor" was said of tensors never judged against PyTorch
(a layer of an archive packed without --layers, a tensor the TorchScript exporter's mapping
left out), from the mere absence of the tensor in the failing list (found by a review)."""

from __future__ import annotations

from verify import schema
from verify.origin import DEVICE, HOST, attribute


def _where(check: dict, tensor: str) -> str | None:
    found = attribute(None, {schema.PROV_HOST_CHECK: check}, tensor, "n")
    return found.where if found is not None else None


def test_where_is_said_only_of_tensors_judged_against_pytorch() -> None:
    check = {"compared": "outputs", "failing": ["out"], "tensors": ["out", "out2"]}
    assert _where(check, "out") == HOST
    assert _where(check, "out2") == DEVICE
    assert _where(check, "gelu") is None  # a layer nobody compared: nothing to say
    # an archive packed before the compared tensors were recorded: as it was read then
    assert _where({"compared": "outputs", "failing": []}, "gelu") == DEVICE
