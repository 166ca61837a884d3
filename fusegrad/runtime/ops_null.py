"""The NULL device: kernels are lowered and "built" but never run; useful to measure scheduling and codegen."""

from __future__ import annotations
from fusegrad.runtime.device import Buffer, HostAllocator


class NullProgram:
    def __call__(self, buffers: list[Buffer]) -> None:
        pass


class NullDevice:
    def __init__(self, name: str):
        self.device = name
        self.allocator = HostAllocator()
        self.renderer = None
        self.compiler = None

    def build(self, info) -> NullProgram:
        return NullProgram()

    def synchronize(self) -> None:
        pass
