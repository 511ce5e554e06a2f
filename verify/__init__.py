"""verify: cross-platform correctness verification for ONNX models on ONNX Runtime."""

__version__ = "0.1.0"

DISTRIBUTION = "onnx-verify"
"""The name pip installs this project under (`verify` on the package index is an unrelated
project); the command and the import package are `verify`."""
