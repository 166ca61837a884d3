"""fusegrad: lazy tensors fused into few kernels, compiled and run. Public names only (docs/api.md)."""

from fusegrad.tensor import Tensor
from fusegrad.dtype import dtypes
from fusegrad.runtime.device import Device
from fusegrad.helpers import Context, GlobalCounters, getenv
from fusegrad.engine.jit import TinyJit
from fusegrad.uop.sint import Variable

__all__ = ["Tensor", "dtypes", "Device", "Context", "GlobalCounters", "getenv", "TinyJit", "Variable"]
