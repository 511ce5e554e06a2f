"""verify: cross-platform correctness verification for ONNX models on ONNX Runtime."""

__version__ = "0.1.0"
