"""The NULL device: kernels are lowered and "built" but never run; useful to measure scheduling and codegen."""

from __future__ import annotations
from fusegrad.renderer import Renderer
from fusegrad.runtime.ops_cpu import host_capabilities
from fusegrad.runtime.device import Buffer, Compiled, HostAllocator


class NullProgram:
    def __call__(self, buffers: list[Buffer]) -> None:
        pass


class NullDevice(Compiled):
    def __init__(self, name: str):
        # codegen plans for the host CPU's vectors, as for the CPU device (the same kernels, the same opts)
        super().__init__(name, HostAllocator(), Renderer(host_capabilities(Renderer.capabilities)), None, NullProgram)

    def build(self, info) -> NullProgram:
        return NullProgram()
