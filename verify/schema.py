"""Every path and attribute name of the `.vtc` testcase archive (an HDF5 file), in one place.

Layout (format version 1):
    /                   attrs: format, format_version, verify_version, created_utc,
                               provenance (JSON), tolerances (JSON), tensor_order (JSON)
    /model              uint8 dataset: the ONNX model bytes; attrs sha256
    /cases/<i>/inputs/<k>   one dataset per input, attr `name` holds the tensor name
    /cases/<i>/outputs/<k>  ground-truth outputs, attr `name`
    /cases/<i>/layers/<k>   optional per-layer reference values, attr `name`
Tensor names live in attributes, never in HDF5 paths: names may hold '/', '..' or unicode.
"""

FORMAT_NAME = "verify-testcase"
SIGNATURE = b"\x89HDF\r\n\x1a\n"  # an archive's first 8 bytes (HDF5's own signature)
FORMAT_VERSION = 1

ATTR_FORMAT = "format"
ATTR_VERSION = "format_version"
ATTR_VERIFY_VERSION = "verify_version"
ATTR_CREATED = "created_utc"
ATTR_PROVENANCE = "provenance"
ATTR_TOLERANCES = "tolerances"
ATTR_TENSOR_ORDER = "tensor_order"
ATTR_NAME = "name"
ATTR_SHA256 = "sha256"
ATTR_SOURCE = "source"

MODEL = "model"
CASES = "cases"
INPUTS = "inputs"
OUTPUTS = "outputs"
LAYERS = "layers"


def case_path(index: int) -> str:
    return f"{CASES}/{index}"
