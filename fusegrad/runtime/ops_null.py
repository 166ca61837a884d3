"""The NULL device: kernels are lowered and "built" but never run; useful to measure scheduling and codegen."""

from __future__ import annotations
from fusegrad.runtime.device import Buffer, Compiled, HostAllocator


class NullProgram:
    def __call__(self, buffers: list[Buffer]) -> None:
        pass


class NullDevice(Compiled):
    def __init__(self, name: str):
        super().__init__(name, HostAllocator(), None, None, NullProgram)

    def build(self, info) -> NullProgram:
        return NullProgram()
