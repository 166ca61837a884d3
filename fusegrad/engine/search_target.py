"""What BEAM search (codegen/opt/beam.py) needs of a device, handed over by the engine so codegen imports no device:
its renderer, an identity for the cache key, a build, buffers for the kernel's parameters and a synchronize."""

from __future__ import annotations
from typing import TYPE_CHECKING, Callable
from fusegrad.runtime.device import Buffer, Device
from fusegrad.uop.ops import UOp

if TYPE_CHECKING:
    from fusegrad.codegen import KernelInfo
    from fusegrad.renderer import Renderer


class DeviceSearchTarget:
    """One device as BEAM times candidates on it (beam.SearchTarget)."""

    def __init__(self, device: str):
        self.name = device

    @property
    def renderer(self) -> Renderer:
        return Device[self.name].renderer  # read each time: a test may give the device another renderer

    def identity(self) -> str:
        """The compiler and device a winner was timed with: one timed with another is stale."""
        from fusegrad.runtime import ops_cpu

        dev = Device[self.name]
        if isinstance(getattr(dev, "compiler", None), ops_cpu.ClangCompiler):
            return ops_cpu.compiler_identity(ops_cpu.find_compiler())
        if callable(identity := getattr(dev.compiler, "identity", None)):
            return identity()  # a GPU compiler names its device and driver
        return type(dev).__name__

    def build(self, info: KernelInfo) -> Callable[[list[Buffer]], None]:
        return Device[self.name].build(info)

    def allocate(self, params: list[UOp]) -> list[Buffer]:
        """One buffer of the device per DEFINE_GLOBAL, of its size and dtype (never the user's)."""
        return [Buffer(self.name, u.arg[1], u.dtype).ensure_allocated() for u in params]

    def synchronize(self) -> None:
        if hasattr(dev := Device[self.name], "synchronize"):
            dev.synchronize()
