"""fusegrad: lazy tensors fused into few kernels, compiled and run. Public names only (docs/api.md)."""

from fusegrad.tensor import Tensor
from fusegrad.dtype import dtypes
from fusegrad.runtime.device import Device
from fusegrad.helpers import PROFILE, VIZ, Context, GlobalCounters, getenv
from fusegrad.engine.jit import TinyJit
from fusegrad.function import function
from fusegrad.uop.sint import Variable
from fusegrad.uop.ops import UOp
from fusegrad.uop.kernel import AxisType, KernelInfo
from fusegrad.dtype import AddrSpace
from fusegrad.viz import profile

if PROFILE or VIZ:  # recording from the start, written (and served) at exit
    from fusegrad.viz import start_from_env

    start_from_env()

__all__ = [
    "Tensor",
    "dtypes",
    "Device",
    "Context",
    "GlobalCounters",
    "getenv",
    "TinyJit",
    "Variable",
    "profile",
    "function",
]
__all__ += ["UOp", "AxisType", "AddrSpace", "KernelInfo"]
