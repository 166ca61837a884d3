"""Run ONNX models on fusegrad: `OnnxRunner(path_or_bytes_or_proto)({"input": array})` → {output name: Tensor}."""

from fusegrad.onnx.runner import OnnxRunner

__all__ = ["OnnxRunner"]
