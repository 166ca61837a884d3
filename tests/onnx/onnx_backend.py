"""fusegrad as an onnx.backend.base.Backend, so that ONNX's own backend test suite can drive it."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.backend.base
from ml_dtypes import bfloat16, float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz

from fusegrad import Tensor, dtypes
from fusegrad.onnx import OnnxRunner

_NUMPY_OF = {
    dtypes.bfloat16: bfloat16,
    dtypes.fp8e4m3: float8_e4m3fn,
    dtypes.fp8e4m3fnuz: float8_e4m3fnuz,
    dtypes.fp8e5m2: float8_e5m2,
    dtypes.fp8e5m2fnuz: float8_e5m2fnuz,
}


def to_numpy(t: Tensor) -> np.ndarray:
    """A Tensor's value, with bfloat16 and fp8 given back as the ml_dtypes types ONNX's reference data uses."""
    out = t.numpy()
    return out.astype(_NUMPY_OF[t.dtype]) if t.dtype in _NUMPY_OF else out


class FusegradRep(onnx.backend.base.BackendRep):
    def __init__(self, runner: OnnxRunner):
        self.runner = runner

    def run(self, inputs, **kwargs):
        names = self.runner.required if len(inputs) <= len(self.runner.required) else list(self.runner.input_specs)
        outs = self.runner(dict(zip(names, inputs)))
        return [[to_numpy(x) for x in v] if isinstance(v, list) else to_numpy(v) for v in outs.values()]


class FusegradBackend(onnx.backend.base.Backend):
    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        return FusegradRep(OnnxRunner(model))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"
