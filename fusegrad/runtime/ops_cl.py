"""The CL device: OpenCL C from the renderer, built by the OpenCL driver (PoCL on a CPU-only machine) through pyopencl;
binaries are cached on disk per OpenCL device, kernels launch over the work groups of codegen/gpu_dims.py."""

from __future__ import annotations
import functools
from typing import Any, NamedTuple
import numpy as np
from fusegrad.codegen.gpu_dims import launch_dims
from fusegrad.helpers import DEBUG
from fusegrad.renderer.gpu import OpenCLKernelRenderer
from fusegrad.runtime.device import Allocator, Buffer, Compiled, Compiler


class CompileError(RuntimeError):
    pass


@functools.cache
def _opencl() -> Any:
    try:
        import pyopencl
    except ImportError as e:
        raise RuntimeError(
            "the CL device needs pyopencl (`pip install 'fusegrad[cl]'`) and an OpenCL driver, e.g. PoCL on a CPU: "
            f"`apt-get install pocl-opencl-icd ocl-icd-libopencl1` ({e})"
        ) from None
    return pyopencl


def _open_device(index: int) -> tuple[Any, Any]:
    cl = _opencl()
    try:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as e:  # no ICD loader or no platform: pyopencl says "PLATFORM_NOT_FOUND_KHR"
        devices, reason = [], str(e)
    else:
        reason = "no OpenCL platform lists a device"
    if index >= len(devices):
        raise RuntimeError(
            f"CL:{index} not found: {len(devices)} OpenCL device(s) on this machine ({reason}); install a driver, "
            "e.g. `apt-get install pocl-opencl-icd`"
        )
    return devices[index], cl


class CLAllocator(Allocator):
    """cl.Buffer handles in one context; copies are blocking enqueue_copy calls on the device's in-order queue."""

    def __init__(self, dev: ClDevice):
        self.dev = dev

    def alloc(self, nbytes: int) -> Any:
        cl = self.dev.cl
        try:
            return cl.Buffer(self.dev.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
        except cl.Error as e:
            raise MemoryError(f"{self.dev.device}: cannot allocate {nbytes} bytes: {e}") from None

    def free(self, handle: Any) -> None:
        handle.release()

    def copyin(self, handle: Any, src: np.ndarray) -> None:
        self.dev.cl.enqueue_copy(self.dev.queue, handle, np.ascontiguousarray(src), is_blocking=True)

    def copyout(self, dst: np.ndarray, handle: Any) -> None:
        self.dev.cl.enqueue_copy(self.dev.queue, dst, handle, is_blocking=True)

    def can_transfer_from(self, src: Allocator) -> bool:
        return isinstance(src, CLAllocator) and src.dev.context is self.dev.context

    def transfer(self, dst: Any, src: Any, nbytes: int, src_allocator: Allocator) -> None:
        self.dev.cl.enqueue_copy(self.dev.queue, dst, src, byte_count=nbytes)


class CLCompiler(Compiler):
    """OpenCL C -> the driver's program binary for one device; the cache key names the device and driver."""

    def __init__(self, dev: ClDevice):
        super().__init__("cl")
        self.dev = dev

    def identity(self) -> str:
        d = self.dev.cl_device
        return f"{d.platform.name}|{d.name}|{d.version}|{d.driver_version}"

    def compile(self, src: str, name: str) -> bytes:
        cl = self.dev.cl
        program = cl.Program(self.dev.context, src)
        try:
            program.build(devices=[self.dev.cl_device])
        except cl.RuntimeError as e:
            numbered = "\n".join(f"{i + 1:4d} {ln}" for i, ln in enumerate(src.splitlines()))
            raise CompileError(
                f"OpenCL build of kernel {name} failed on {self.dev.device}:\n{e}\n--- source ---\n{numbered}"
            )
        return program.get_info(cl.program_info.BINARIES)[0]


class CLProgram:
    """A built kernel and its launch: global and local sizes from gpu_dims, one cl.Buffer argument per parameter."""

    def __init__(self, dev: ClDevice, info: Any, binary: bytes):
        cl = dev.cl
        self.dev, self.name, self.nparams = dev, info.name, info.nparams
        self.dims = launch_dims(info.lin, dev.renderer.capabilities.group_reduce)
        program = cl.Program(dev.context, [dev.cl_device], [binary]).build()
        self.kernel = getattr(program, info.name)

    def __call__(self, buffers: list[Buffer], wait: bool = False) -> float | None:
        if len(buffers) != self.nparams:
            raise RuntimeError(f"kernel {self.name} takes {self.nparams} buffers, got {len(buffers)}")
        event = self.kernel(self.dev.queue, self.dims.global_size, self.dims.local_size, *[b.handle for b in buffers])
        if wait:
            event.wait()
            return (event.profile.end - event.profile.start) * 1e-9 if self.dev.profiling else None
        return None


class RawDims(NamedTuple):
    """A raw kernel's launch, as the user gave it (global_size counts work items, as OpenCL does)."""

    global_size: tuple[int, ...]
    local_size: tuple[int, ...]


class ClDevice(Compiled):
    def __init__(self, name: str):
        index = int(name.partition(":")[2] or 0)
        self.cl_device, self.cl = _open_device(index)
        self.context = self.cl.Context([self.cl_device])
        self.profiling = DEBUG >= 2
        props = self.cl.command_queue_properties.PROFILING_ENABLE if self.profiling else 0
        self.queue = self.cl.CommandQueue(self.context, properties=props)
        half = "cl_khr_fp16" in self.cl_device.extensions
        gpu = bool(self.cl_device.type & (self.cl.device_type.GPU | self.cl.device_type.ACCELERATOR))
        renderer = OpenCLKernelRenderer(half, group_reduce=gpu)
        super().__init__(name, CLAllocator(self), renderer, CLCompiler(self), CLProgram)
        if DEBUG >= 1:
            print(f"{name}: {self.cl_device.platform.name} / {self.cl_device.name}")

    def render(self, info: Any) -> str:
        return self.renderer.render(info.name, info.lin, info.packs)

    def build_raw(self, raw: Any, nparams: int) -> CLProgram:
        """A user's OpenCL C kernel (RawKernel) launched on raw.global_size / raw.local_size work items."""
        program = CLProgram.__new__(CLProgram)
        program.dev, program.name, program.nparams = self, raw.entry, nparams
        program.dims = RawDims(tuple(raw.global_size), tuple(raw.local_size))
        binary = self.compiler.compile_cached(raw.src, raw.entry)
        program.kernel = getattr(self.cl.Program(self.context, [self.cl_device], [binary]).build(), raw.entry)
        return program

    def synchronize(self) -> None:
        self.queue.finish()
