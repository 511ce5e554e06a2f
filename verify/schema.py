"""Every path and attribute name of the `.vtc` testcase archive (an HDF5 file), in one place.

Layout (format version 2):
    /                   attrs: format, format_version, verify_version, created_utc,
                               checksum (sha256 over all of the metadata and every digest)
    /provenance, /tolerances, /tensor_order   JSON text (scalar fixed-length string datasets)
    /model              uint8 dataset: the ONNX model bytes; attr sha256 (of the bytes)
    /cases/<i>          attr source
    /cases/<i>/inputs/<k>   one dataset per input, attr `name` holds the tensor name,
                            attr `sha256` its digest (verify/digest.py)
    /cases/<i>/outputs/<k>  ground-truth outputs, attrs `name`, `sha256`
    /cases/<i>/layers/<k>   optional per-layer reference values, attrs `name`, `sha256`
Tensor names live in attributes, never in HDF5 paths: names may hold '/', '..' or unicode.
Every text attribute is a fixed-length UTF-8 string, stored in its object's header: a reader
never follows a pointer into HDF5's global heap, where a damaged file can make the HDF5
library loop forever. Version 1 held the JSON records as root attributes, every text as a
variable-length string, and no checksums (no `checksum`, no tensor `sha256`): it is read with
a warning that nothing in it can be verified.
"""

FORMAT_NAME = "verify-testcase"
SIGNATURE = b"\x89HDF\r\n\x1a\n"  # an archive's first 8 bytes (HDF5's own signature)
FORMAT_VERSION = 2     # what an archive without external data is written as
EXTERNAL_VERSION = 3   # with external data (an `external` group): older readers refuse it
NEWEST_VERSION = 3     # the newest this verify reads
UNCHECKED_VERSION = 1  # the last version without checksums: read, with a warning

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
ATTR_CHECKSUM = "checksum"

# the metadata the archive checksum covers, besides every case's source and dataset digest
META_ATTRS = (ATTR_FORMAT, ATTR_VERSION, ATTR_VERIFY_VERSION, ATTR_CREATED)
META_RECORDS = (ATTR_PROVENANCE, ATTR_TOLERANCES, ATTR_TENSOR_ORDER)  # v2: root datasets

MAX_TENSOR_MB_ENV = "VERIFY_MAX_TENSOR_MB"  # the largest dataset a reader accepts
DEFAULT_MAX_TENSOR_MB = 2048

MODEL = "model"
CASES = "cases"
INPUTS = "inputs"
OUTPUTS = "outputs"
LAYERS = "layers"
EXTERNAL = "external"  # format 3: the model's external data files, one uint8 dataset each,
                       # "name" its location, "sha256" of its bytes
TENSOR_KINDS = (INPUTS, OUTPUTS, LAYERS)

# Provenance (JSON) keys other modules read back: a PyTorch reference's check of onnxruntime on
# the packing host, how its FX nodes mapped onto the model's tensors, and given outputs' check.
PROV_HOST_CHECK = "host_vs_torch"
PROV_HOST_VS_GIVEN = "host_vs_given"  # `pack --expected`: onnxruntime here against the given
PROV_TORCH_MAP = "torch_map"


def case_path(index: int) -> str:
    return f"{CASES}/{index}"
